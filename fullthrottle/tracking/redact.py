"""Secrets never reach MLflow params or tags.

Owns: masking passwords in URIs (``https://user:pw@host`` -> ``https://user:***@host``), secret
query parameters (``?token=...``), and values whose key names a secret (``password``, ``token``,
``api_key``, ...). Refuses nothing: a value that looks harmless is returned unchanged.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# Whole words of a field name: `api_token` and `password` are secrets, `tokenizer` and
# `max_tokens` are not.
_SECRET_KEY = re.compile(
    r"^(?:.*[_-])?(?:password|passwd|pass|pwd|secret|token|api[_-]?key|apikey|credentials?|private[_-]?key)(?:[_-].*)?$",
    re.I,
)
# scheme://user:password@host  -> keep the user, mask the password.
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*):(?P<pw>[^@/\s]+)@")
# scheme://token@host (no colon): a bare userinfo is usually a token.
_URI_BARE_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/:@\s]{16,})@")
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:[A-Za-z0-9_.-]*?)(?:pass(?:word|wd)?|secret|token|api[_-]?key|sig(?:nature)?|credential)[A-Za-z0-9_.-]*=)(?P<value>[^&;#\s]+)",
    re.I,
)


# --flag=value command-line arguments (e.g. Beam args) whose flag names a secret.
_FLAG_SECRET = re.compile(
    r"(?P<key>--[A-Za-z0-9_.-]*(?:pass(?:word|wd)?|secret|token|api[_-]?key|credential)[A-Za-z0-9_.-]*=)(?P<value>[^\s\"',]+)",
    re.I,
)


def is_secret_key(key: str) -> bool:
    """True when a field name says its value is a secret (e.g. `tracking.api_token`)."""
    last = key.rsplit(".", 1)[-1]
    return bool(_SECRET_KEY.search(last))


def redact_text(value: str) -> str:
    """Masks credentials embedded in a string (URIs, query parameters)."""
    value = _URI_PASSWORD.sub(lambda m: f"{m.group('head')}:{MASK}@", value)
    value = _URI_BARE_USERINFO.sub(lambda m: f"{m.group('head')}{MASK}@", value)
    value = _FLAG_SECRET.sub(lambda m: f"{m.group('key')}{MASK}", value)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('key')}{MASK}", value)


def redact_value(key: str, value: Any) -> Any:
    """The value to record under `key`: masked entirely when the key names a secret."""
    if value is None:
        return None
    if is_secret_key(key):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_mapping(data: Any, key: str = "") -> Any:
    """A deep copy of `data` (dicts, lists) with every secret masked."""
    if isinstance(data, dict):
        return {k: redact_mapping(v, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_mapping(v, key) for v in data]
    return redact_value(key, data)
