"""Keep secrets out of everything we print or record.

API keys, bearer tokens and passwords in URLs must never reach the terminal, a report or a
run file. All output paths go through these helpers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"

_SECRET_KEYS = re.compile(
    r"(api[_-]?key|token|secret|password|passwd|pwd|auth|authorization|credential|access[_-]?key|sig|signature)",
    re.IGNORECASE,
)
_SECRET_FLAG = re.compile(r"^--?(api[-_]?key|token|password|secret|auth)(=.*)?$", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_SK_KEY = re.compile(r"\b(sk|hf|xox[abp]|ghp|gho|glpat)[-_][A-Za-z0-9_-]{8,}\b")


def redact_url(url: str) -> str:
    """Drop user:password from the netloc and blank secret-looking query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, REDACTED if _SECRET_KEYS.search(k) else v) for k, v in pairs], safe="*"
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Blank known secret values and anything shaped like a bearer token or API key."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _SK_KEY.sub(REDACTED, text)
    return re.sub(r"(?<=://)[^/\s:@]+:[^/\s@]+@", "", text)


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Redact a command line: values of --api-key style flags, URLs, known secrets."""
    out: list[str] = []
    hide_next = False
    secrets = list(secrets)
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _SECRET_FLAG.match(arg)
        if m:
            if m.group(2) is not None:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        if "://" in arg:
            arg = redact_url(arg)
        out.append(redact_text(arg, secrets))
    return out
