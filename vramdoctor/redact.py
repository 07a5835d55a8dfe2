"""Keep secrets out of everything we print or record, and control bytes off the terminal.

API keys, bearer tokens and passwords must never reach the terminal, a report or a run file.
There is one pass, `redact_text` (strings) / `redact_obj` (records, JSON documents) /
`redact_argv` (command lines), and every output path goes through it: the terminal consoles
and the JSON printer (`vramdoctor.report.console`) and the run-file writer
(`vramdoctor.record.RunWriter`); reports are rendered from run files, so they inherit it.

What is masked (docs/threat-model.md lists the same rules):

- every value registered with `register_secret` (the `--api-key`, the key variables) and every
  value one of the rules below masked once, anywhere it appears later (a key echoed back by a
  server in a model id or an error body); values of 8+ characters anywhere, 3-7 characters
  where they stand alone (not inside a longer word); 1-2 characters are never searched for;
- URL userinfo in any form (`user:pw@`, `:pw@`, `token@`): removed;
- URL query and fragment parameters whose name looks secret (see `_SECRET_WORDS` and
  `_URL_ONLY_WORDS`: key, token, secret, password, auth, credential, code, jwt, sig, ...);
  each URL of a comma-separated list separately;
- flags and `NAME=value` / `name: value` pairs whose name has a secret word as one of its parts
  (`--hf-token=V`, `--admin-api-key V`, `--auth-token V`, `SOME_KEY=V`, `HF_TOKEN=V`,
  `"api_key": "V"`); `--max-tokens 16` is not masked (`tokens` is not a secret word); in free
  text a value after a space (`--api-key V`, `key: V`) is masked only when it looks like a value:
  not a common English word or placeholder (`--api-key or OPENAI_API_KEY`, `a key: pass it`,
  `--api-key KEY`), not an environment variable's name, not another flag. Command lines
  (`redact_argv`) stay strict: there the word after a secret flag is always masked;
- `Bearer X` / `Basic X` credentials and well-known key shapes (`sk-...`, `hf_...`, `ghp_...`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = [
    "REDACTED",
    "escape_control",
    "forget_secrets",
    "redact_argv",
    "redact_obj",
    "redact_text",
    "redact_url",
    "register_secret",
    "safe_text",
    "secret_name",
]

REDACTED = "***"

# Words that make a flag, variable, JSON key or URL parameter name secret when they are one of
# its parts (split on -, _, ., space and camelCase): `--admin-api-key`, `HF_TOKEN`, `apiKey`.
_SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "auth",
        "authorization",
        "authentication",
        "credential",
        "credentials",
        "bearer",
        "cookie",
        "accesskey",
        "jwt",
        "signature",
        "oauth",
    }
)
# Only in URL query/fragment parameters, where they carry secrets (OAuth codes, signed URLs).
_URL_ONLY_WORDS = frozenset(
    {"code", "sig", "sign", "signed", "hmac", "otp", "nonce", "state", "assertion"}
)
_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# A URL runs to whitespace, a quote or bracket, or a comma that starts the next URL of a list.
_URL = re.compile(_SCHEME + r"(?:(?!," + _SCHEME + r")[^\s\"'<>`])*")
_USERINFO = re.compile(r"(?<=://)[^/?#\s\"'<>`]*@")
_PARAM = re.compile(r"([?&#;])([^=&#;?\s]+)=([^&#;\s]*)")
# --flag=value, --flag value, NAME=value, name: value, "name": "value" (value up to a space/quote).
_PAIR = re.compile(
    r"(?P<name>(?<![\w-])--?[A-Za-z][\w.-]*|(?<![\w-])[A-Za-z_][\w.-]*)"
    r"(?P<q1>[\"']?)(?P<sep>\s*[=:]\s*|\s+)(?P<q2>[\"']?)(?P<value>(?!--?[A-Za-z])[^\s\"',;}]+)"
)
_BEARER = re.compile(
    r"\b([Bb]earer|BEARER)(\s+)[A-Za-z0-9._~+/=-]{3,}"
    r"|\b(Basic)(\s+)[A-Za-z0-9+/]{8,}=*"
)
_KEY_SHAPE = re.compile(
    r"\b(?:sk|rk|pk)-[A-Za-z0-9_-]{8,}|\b(?:hf|ghp|gho|ghs|ghu|github_pat|glpat|xox[abprs])[-_][A-Za-z0-9_-]{8,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
)
_NUMBER = re.compile(r"^[-+]?[\d.,:%]+$")
_FLAG = re.compile(r"^(--?[A-Za-z][\w.-]*)(=(.*))?$", re.DOTALL)
# A fast pre-check: strings without any of these cannot need a rule (most metric keys, numbers).
_SUSPECT = re.compile(
    r"[@=:]|bearer|basic|sk-|rk-|pk-|hf_|gh[pousr]_|github_pat|glpat|xox|AKIA|--", re.IGNORECASE
)

_known: set[str] = set()
_known_lock = threading.Lock()
_known_re: re.Pattern[str] | None = None


def _parts(name: str) -> list[str]:
    return [p.lower() for p in _SPLIT.split(name.strip("-\"' ")) if p]


def secret_name(name: str, *, url_param: bool = False) -> bool:
    """True when a flag, variable, key or (with url_param) URL parameter name looks secret."""
    parts = _parts(name)
    joined = "".join(parts)
    words = _SECRET_WORDS | _URL_ONLY_WORDS if url_param else _SECRET_WORDS
    if any(p in words for p in parts):
        return True
    # apikey / accesstoken / authtoken written as one word
    return any(
        w in joined for w in ("apikey", "accesstoken", "authtoken", "secretkey", "accesskey")
    )


def register_secret(value: str | None) -> None:
    """Mask `value` wherever it appears in output from now on (3+ characters; see module doc)."""
    global _known_re
    if not value:
        return
    value = value.strip()
    if len(value) < 3 or value == REDACTED or value in _known:
        return
    with _known_lock:
        _known.add(value)
        long = sorted((re.escape(s) for s in _known if len(s) >= 8), key=len, reverse=True)
        short = sorted((re.escape(s) for s in _known if len(s) < 8), key=len, reverse=True)
        alts = []
        if long:
            alts.append("(?:" + "|".join(long) + ")")
        if short:
            alts.append(r"(?<![A-Za-z0-9])(?:" + "|".join(short) + r")(?![A-Za-z0-9])")
        _known_re = re.compile("|".join(alts))


def forget_secrets() -> None:
    """Clear the registry (tests; a long-lived library process between unrelated runs)."""
    global _known_re
    with _known_lock:
        _known.clear()
        _known_re = None


def _mask(value: str) -> str:
    register_secret(value)
    return REDACTED


def _redact_one_url(url: str) -> str:
    m = _USERINFO.search(url)
    if m:
        info = m.group(0)[:-1]
        for piece in info.split(":"):
            register_secret(piece)
        url = url[: m.start()] + url[m.end() :]

    def param(m: re.Match[str]) -> str:
        if secret_name(m.group(2), url_param=True) and m.group(3) and m.group(3) != REDACTED:
            return f"{m.group(1)}{m.group(2)}={_mask(m.group(3))}"
        return m.group(0)

    return _PARAM.sub(param, url)


def _url_in_text(m: re.Match[str]) -> str:
    """A URL in free text; punctuation that ends the sentence around it stays outside
    ("--url http://h/?token=X: give ..." keeps its colon)."""
    url = m.group(0)
    core = url.rstrip(".,:;!?)")
    return _redact_one_url(core) + url[len(core) :]


def redact_url(url: str) -> str:
    """Drop userinfo from a URL (or each URL of a list) and blank secret-looking parameters."""
    return redact_text(url)


# Words that follow a flag in prose ("pass a key with --api-key or OPENAI_API_KEY", "--api-key
# is missing", "set --hf-token to your token"): function words and the placeholders help texts
# use. A spaced flag value in free text that is one of them (any case) is not masked.
_PROSE_WORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "or",
        "nor",
        "but",
        "not",
        "no",
        "yes",
        "the",
        "to",
        "of",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "then",
        "than",
        "if",
        "else",
        "when",
        "where",
        "which",
        "who",
        "what",
        "how",
        "so",
        "also",
        "only",
        "just",
        "via",
        "into",
        "onto",
        "per",
        "each",
        "every",
        "any",
        "all",
        "some",
        "none",
        "null",
        "nil",
        "empty",
        "unset",
        "set",
        "given",
        "missing",
        "required",
        "optional",
        "default",
        "instead",
        "too",
        "either",
        "neither",
        "both",
        "etc",
        "like",
        "such",
        "see",
        "use",
        "using",
        "used",
        "pass",
        "passed",
        "flag",
        "option",
        "options",
        "value",
        "values",
        "key",
        "keys",
        "token",
        "tokens",
        "secret",
        "secrets",
        "password",
        "passwords",
        "your",
        "you",
        "my",
        "our",
        "their",
        "them",
        "they",
        "we",
        "us",
        "he",
        "she",
        "his",
        "her",
        "must",
        "may",
        "can",
        "will",
        "should",
        "would",
        "could",
        "has",
        "have",
        "had",
        "does",
        "do",
        "did",
        "needs",
        "need",
        "wants",
        "want",
    }
)
# An environment variable's NAME ($OPENAI_API_KEY, ${HF_TOKEN}, OPENAI_API_KEY): a reference
# to a secret, not one.
_ENV_NAME = re.compile(r"^(?:\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)$")
_PROSE_EDGES = "()[]<>{}.,:;!?`"


def _looks_like_value(value: str) -> bool:
    """Free text only: whether the word after a secret flag (`--api-key WORD`) can be its
    value. Not: a common English word or placeholder (`or`, `is`, `KEY`), an environment
    variable's name (`OPENAI_API_KEY`, `$HF_TOKEN`), a bracketed placeholder (`<key>`).
    Command lines (`redact_argv`) never ask: there the word after the flag is masked."""
    word = value.strip(_PROSE_EDGES)
    if not word or (value[:1] in "<[{" and value[-1:] in ">]}"):
        return False
    if _ENV_NAME.match(word):
        return False
    return not (
        word.isalpha()
        and (word.islower() or word.isupper() or word.istitle())
        and word.lower() in _PROSE_WORDS
    )


def _pair(m: re.Match[str]) -> str:
    name, value = m.group("name"), m.group("value")
    if value == REDACTED or _NUMBER.match(value) or not secret_name(name):
        return m.group(0)  # numbers are counts ("#token: 1234" in SGLang's logs), not secrets
    if m.group("sep").strip() == "" and not name.startswith("-"):
        return m.group(0)  # "word value" in prose is not a pair; only flags take a spaced value
    if (
        m.group("sep") != m.group("sep").strip()
        and not m.group("q1")
        and not m.group("q2")
        and not _looks_like_value(value)
    ):
        return m.group(0)  # "--api-key or OPENAI_API_KEY", "a key: pass it": prose, not a value
    # Free-text guesses are masked here; only long ones are remembered for elsewhere.
    masked = _mask(value) if len(value) >= 8 else REDACTED
    return f"{name}{m.group('q1')}{m.group('sep')}{m.group('q2')}{masked}"


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """The one redaction pass for free text (see the module doc for the rules)."""
    for secret in secrets:
        register_secret(secret)
    if not text:
        return text
    if _SUSPECT.search(text):
        if "://" in text:
            text = _URL.sub(_url_in_text, text)
        text = _BEARER.sub(
            lambda m: (m.group(1) or m.group(3)) + (m.group(2) or m.group(4)) + REDACTED, text
        )
        text = _KEY_SHAPE.sub(REDACTED, text)
        text = _PAIR.sub(_pair, text)
    pattern = _known_re
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    return text


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Redact a command line: values of secret-named flags (`--x-token V`, `--x-key=V`),
    `NAME=V` with a secret name, URLs, known secrets. Other arguments are kept."""
    for secret in secrets:
        register_secret(secret)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(_mask(arg))
                continue
        m = _FLAG.match(arg)
        if m and secret_name(m.group(1)):
            if m.group(2) is not None:
                out.append(m.group(1) + "=" + (_mask(m.group(3)) if m.group(3) else ""))
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def _looks_like_argv(items: list[Any]) -> bool:
    return (
        len(items) > 1
        and all(isinstance(i, str) for i in items)
        and any(i.startswith("-") for i in items)
    )


def redact_obj(obj: Any) -> Any:
    """A JSON-like value with every string redacted; values under secret-named keys masked;
    lists of strings that look like a command line redacted as one (flag, value) sequence."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            key = redact_text(k) if isinstance(k, str) else k
            if isinstance(k, str) and isinstance(v, str) and v and secret_name(k):
                out[key] = _mask(v)
            else:
                out[key] = redact_obj(v)
        return out
    if isinstance(obj, (list, tuple)):
        if _looks_like_argv(list(obj)):
            return redact_argv(obj)
        return [redact_obj(v) for v in obj]
    return obj


# --- terminal safety --------------------------------------------------------------------

# C0 controls except newline and tab, DEL, C1 controls, and the bidi overrides that reorder
# what a terminal shows (Trojan-source style).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_char(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str) -> str:
    """Show control characters instead of executing them: ESC becomes the four characters
    `\\x1b`; newline and tab are kept. For terminal output only (JSON escapes on its own)."""
    return _CONTROL.sub(_escape_char, text) if _CONTROL.search(text) else text


def safe_text(text: str) -> str:
    """What may reach a terminal: redacted, then control characters escaped."""
    return escape_control(redact_text(text))
