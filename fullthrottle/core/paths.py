"""Host paths a user names, and whether this process can see them.

In `bin/envrun`'s Debian 13 userland (rootfs mode) the host's folders are shown at their own
paths, filesystems mounted below them included: every top-level folder the userland does not
have itself (/home, /root, /mnt, /srv, /data, ...), /tmp, the repo, the working directory, and
any path a command-line argument names under the userland's own folders (/var, /opt, /usr...).
envrun lists them in `FULLTHROTTLE_HOST_PATHS`, and those of them it shows only because an
argument names them in `FULLTHROTTLE_NAMED_PATHS` (a later command has to name them too). A path
outside them (named only in a config file, say) is not "missing": the userland hides it, and the
message says so and what to do.
Outside envrun's userland (a venv, a container) the variable is unset and every path is what it
is.
"""

from __future__ import annotations

import os
from pathlib import Path

HOST_PATHS_VARIABLE = "FULLTHROTTLE_HOST_PATHS"
NAMED_PATHS_VARIABLE = "FULLTHROTTLE_NAMED_PATHS"


def _roots(variable: str) -> tuple[str, ...] | None:
    value = os.environ.get(variable)
    if not value:
        return None
    return tuple(path for path in value.split(":") if path)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def visible_roots() -> tuple[str, ...] | None:
    """The host folders visible here, or None when every path is (not in envrun's userland)."""
    return _roots(HOST_PATHS_VARIABLE)


def shown_because_named(path: str | Path) -> bool:
    """`path` is visible here only because this command's arguments name it: a command that
    only reads it from a config file will not see it."""
    named = _roots(NAMED_PATHS_VARIABLE)
    if not named:
        return False
    absolute = os.path.abspath(path)
    always = tuple(root for root in visible_roots() or () if root not in named)
    return _under(absolute, named) and not _under(absolute, always)


def hidden_reason(path: str | Path) -> str | None:
    """Why `path` cannot be reached here when envrun's userland hides it; None otherwise."""
    roots = visible_roots()
    if roots is None or "://" in str(path):
        return None
    absolute = os.path.abspath(path)
    if _under(absolute, roots):
        return None
    top = "/" + absolute.strip("/").split("/")[0]
    return (
        f"{absolute} is on the host, not inside bin/envrun's Debian 13 userland: {top} there is "
        "the userland's own folder, and a host path under it is shown only when a command-line "
        f"argument names it (e.g. --data {absolute}, --set data.path={absolute}), not when only a "
        "config file does. Name it on the command line, or keep it under a folder that is "
        f"always shown: {', '.join(roots)}"
    )


def missing_path_message(path: str | Path, what: str, hint: str) -> str:
    """`what` (e.g. "data path") does not exist, or why it cannot be seen here, and `hint`."""
    reason = hidden_reason(path)
    if reason is not None:
        return f"{what} {path} cannot be reached: {reason}"
    return f"{what} {path} does not exist{hint}"


def user_cache_dir() -> Path:
    """fullthrottle's folder in the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``): what
    is made once and reused between runs (generated benchmark data, an empty tracking store)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fullthrottle"
