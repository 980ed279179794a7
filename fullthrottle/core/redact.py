"""Secrets out of everything fullthrottle writes down: tracked params, run summaries, messages.

One helper for every writer. `redact(value)` returns a copy of a JSON-like value (dicts, lists,
tuples, strings) in which

- the value of any key that names a secret (``password``, ``api_key``, ``MLFLOW_TRACKING_TOKEN``,
  ``aws_secret_access_key``, ...) is replaced by ``REDACTED``;
- inside strings, a URL's password (``https://user:pw@host``), ``--flag=value`` and
  ``NAME=value`` pairs whose name is secret-like, ``Authorization: Bearer ...`` headers and a few
  self-identifying token formats (AWS access key ids, GitHub and Hugging Face tokens, JWTs) are
  replaced.

Keys are matched by their words (split at ``_``, ``-``, ``.`` and case changes), so
``tokenizer`` and ``max_tokens`` stay readable while ``token`` and ``access_token`` do not.
It refuses nothing: unknown types pass through unchanged. What it cannot know (a secret under an innocent name, in free text) it does not find.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "REDACTED"

# Single words that make a key secret wherever they appear in it.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "cookie",
        "signature",
        "dsn",
    }
)
# Word pairs that are secret only together ("key" alone is a dictionary key, a column name...).
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"),
        ("access", "key"),
        ("private", "key"),
        ("secret", "key"),
        ("account", "key"),
        ("encryption", "key"),
        ("client", "secret"),
        ("sas", "key"),
    }
)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(name: str) -> bool:
    """True when a key or flag name says its value is a secret."""
    words = _words(str(name))
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False))


_URL_PASSWORD = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@"
)
_ASSIGNMENT = re.compile(
    r"(?P<prefix>(?:--)?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]\s*)(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_QUERY_SECRET = re.compile(
    r"(?i)([?&](?:access_token|token|sig|signature|api_key|apikey|key|password)=)[^&\s]+"
)
_TOKEN_FORMATS = (
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),  # GitHub
    re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),  # Hugging Face
    re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b"),  # OpenAI-style secret keys
    re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\b"),  # JWT
)


# scheme://token@host (no colon): a long bare userinfo is usually a token.
_URL_BARE_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/:@\s]{16,})@")


def redact_text(text: str) -> str:
    """Replaces the secrets this module can recognise inside a free-form string."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    text = _URL_BARE_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _ASSIGNMENT.sub(
        lambda m: f"{m['prefix']}{REDACTED}" if is_secret_key(m["name"]) else m.group(0), text
    )
    for pattern in _TOKEN_FORMATS:
        text = pattern.sub(REDACTED, text)
    return text


def redact(value: Any) -> Any:
    """A redacted copy of a JSON-like value; see the module docstring for what is replaced."""
    if isinstance(value, Mapping):
        return {
            key: (REDACTED if is_secret_key(str(key)) and item not in (None, "") else redact(item))
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_value(key: str, value: Any) -> Any:
    """The value to record under the (possibly dotted) field name `key`: all of it when the
    name says it is a secret, else whatever `redact` finds inside it."""
    if value is None:
        return None
    if is_secret_key(str(key).rsplit(".", 1)[-1]) and value != "":
        return REDACTED
    return redact(value)
