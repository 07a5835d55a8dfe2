"""Keep secrets out of everything we print or record, and control bytes off the terminal.

API keys, bearer tokens and passwords must never reach the terminal, a report or a run file.
There is one pass, `redact_text` (strings) / `redact_obj` (records, JSON documents) /
`redact_argv` (command lines), and every output path goes through it: the terminal consoles
and the JSON printer (`vramdoctor.render.console`) and the run-file writer
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
  `"api_key": "V"`); `--max-tokens 16` is not masked (`tokens` is not a secret word), nor an
  exception's name (`KeyError: 'rid'`); in free text a value after a space (`--api-key V`,
  `key: V`) is masked only when it looks like a value: not a common English word or placeholder
  (`--api-key or OPENAI_API_KEY`, `a key: pass it`, `--api-key KEY`), not an environment
  variable's name, not another flag. A QUOTED value is masked whole, spaces and all, to its
  closing quote (`api_key='correct horse battery staple'`, `--api-key "a b"`, `HF_TOKEN="a b"`;
  backslash-escaped quotes inside it, a shell word `'it'\\''s'`), or to the end of the line when
  the line does not close it (a value cut off by a length limit or a terminal wrap); a list or
  tuple (`api_key=['a b', 'c d']`) to its closing bracket. Command lines (`redact_argv`) stay
  strict: there the word after a secret flag is always masked, and `NAME=value` whole;
- `Bearer X` / `Basic X` credentials and well-known key shapes (`sk-...`, `hf_...`, `ghp_...`).
- curl/wget `-u user:password` / `--user user:password` / `-U` (the password, to the end of its
  shell word or closing quote; a uid:gid of digits is kept) and headers under a secret name: in
  quotes (`-H "api-key: zebra crossing 9"`, `"Cookie: a=b; c=d"`) the whole value to the closing
  quote, unquoted after `-H`/`--header` (`--header=Cookie:session=X`) to the end of the word; an
  auth scheme word stays (`Authorization: Bearer ***`).

Registered values are masked first, so a rule can never mask part of one and leave the rest
unrecognisable. `redact_tail` is for a text that was cut before it was redacted: the start of a
known secret left at its end is masked. Every rule is one left-to-right pass (linear in the text:
1 MiB of adversarial input takes under a second, `benchmarks/redact_adversarial.py`).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = [
    "REDACTED",
    "escape_control",
    "forget_secrets",
    "one_line",
    "redact_argv",
    "redact_obj",
    "redact_tail",
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
_EXCEPTION_NAME = re.compile(r"^[A-Z]\w*(?:Error|Exception|Warning)$")
_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# A URL runs to whitespace, a quote or bracket, or a comma that starts the next URL of a list.
_URL = re.compile(_SCHEME + r"(?:(?!," + _SCHEME + r")[^\s\"'<>`])*")
_USERINFO = re.compile(r"(?<=://)[^/?#\s\"'<>`]*@")
_PARAM = re.compile(r"([?&#;])([^=&#;?\s]+)=([^&#;\s]*)")
# --flag=value, --flag value, NAME=value, name: value, "name": "value". The regex stops at an
# opening quote or bracket: `_redact_pairs` reads a quoted value to its closing quote (a secret
# with spaces is one value) and a bracketed one to its closing bracket, only after a secret name.
_PAIR = re.compile(
    r"(?P<name>(?<![\w-])--?[A-Za-z][\w.-]*|(?<![\w-])[A-Za-z_][\w.-]*)"
    r"(?P<q1>[\"']?)(?P<sep>\s*[=:]\s*|\s+)"
    r"(?:(?P<q2>[\"'])|(?P<value>(?!--?[A-Za-z])[^\s\"',;}]+))"
)
# The rest of a shell word after a closing quote ('it'\''s', "a b"c): up to a space, quote or
# backslash, or the punctuation that closes a Python/JSON value.
_WORD_REST = re.compile(r"[^\s'\"\\,;)\]}]*")
# A quoted item of a list (backslash escapes kept): what a masked list registers.
_QUOTED_ITEM = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
# What a bracketed value's scanner stops at.
_BRACKET_STOP = re.compile(r"[\[\](){}'\"\n]")
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
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)  # NAME=value, one argv word
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
    if _EXCEPTION_NAME.match(name):
        return False  # KeyError: 'rid', InvalidTokenError: ...: an exception, not a secret
    parts = _parts(name)
    joined = "".join(parts)
    words = _SECRET_WORDS | _URL_ONLY_WORDS if url_param else _SECRET_WORDS
    if any(p in words for p in parts):
        return True
    # apikey / accesstoken / authtoken written as one word
    return any(
        w in joined for w in ("apikey", "accesstoken", "authtoken", "secretkey", "accesskey")
    )


@functools.lru_cache(maxsize=4096)
def _secret_name_cached(name: str) -> bool:
    return secret_name(name)


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


# Python / JSON literals an unset or boolean argument prints (`api_key=None`, `hf_token=True`).
_LITERALS = frozenset({"None", "True", "False", "null", "true", "false"})
# A command line printed as a Python or JSON list: `['vllm', 'serve', '--api-key', 'a b']`.
_ARGV_ITEM = re.compile(r"(['\"])(--?[A-Za-z][\w.-]*)\1\s*,\s*(?=['\"])")
# "Authorization: Bearer ***": the scheme word is not the secret (`_BEARER` masked what follows).
_AUTH_SCHEMES = frozenset({"bearer", "basic", "digest"})


def _line_end(text: str, i: int) -> int:
    k = text.find("\n", i)
    return len(text) if k < 0 else k


def _quoted_end(text: str, i: int) -> int:
    """`text[i]` is a quote: the index just past its closing quote (a backslash escapes one,
    as in Python reprs, JSON and double-quoted shell words), or -1 when the line ends first
    (a value cut off by a length limit, a terminal wrap, a stray quote)."""
    q = text[i]
    j = i + 1
    while True:
        k = text.find(q, j)
        if k < 0 or "\n" in text[j:k]:
            return -1
        b = k - 1
        while b > i and text[b] == "\\":
            b -= 1
        if (k - 1 - b) % 2 == 0:  # an even number of backslashes: the quote is not escaped
            return k + 1
        j = k + 1


def _shell_word_end(text: str, j: int) -> int:
    """The end of a shell word that goes on after a closing quote at `j` ('it'\\''s'), or -1
    when a quote in it is not closed on the line."""
    n = len(text)
    while j < n:
        c = text[j]
        if c in "'\"":
            j = _quoted_end(text, j)
            if j < 0:
                return -1
        elif c == "\\":
            j += 2
        else:
            rest = _WORD_REST.match(text, j)
            k = rest.end() if rest else j
            if k == j:
                break
            j = k
    return min(j, n)


def _bracket_end(text: str, i: int) -> int:
    """`text[i]` opens a list or tuple (`['a b', 'c d']`): the index just past its closing
    bracket (quotes honoured), or -1 when the line ends first."""
    depth = 0
    j = i
    n = len(text)
    while j < n:
        m = _BRACKET_STOP.search(text, j)
        if m is None:
            return -1
        c = m.group(0)
        j = m.end()
        if c == "\n":
            return -1
        if c in "'\"":
            j = _quoted_end(text, m.start())
            if j < 0:
                return -1
        elif c in "[({":
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return j
    return -1


# A masked value longer than this is not searched for elsewhere: a key, even a JWT, is shorter,
# and a megabyte-long "value" (a hostile or broken line) would make every later search slow.
_REMEMBER_MAX_CHARS = 4096


def _remember(value: str) -> None:
    """Register a value a free-text rule masked, when it is long enough to be worth searching
    for elsewhere (shorter guesses are masked where they stand only)."""
    value = value.strip()
    if 8 <= len(value) <= _REMEMBER_MAX_CHARS and REDACTED not in value:
        register_secret(value)


def _redact_pairs(text: str) -> str:
    """Rule 4 of the module doc over free text: values after a secret name are masked; a quoted
    value to its closing quote (`api_key='correct horse battery staple'`, `--api-key "a b"`,
    `"token": "a \\"b\\" c"`, a shell word `'it'\\''s'`), or to the end of the line when the
    quote is not closed there (the rest of a value cut off by a length limit); a list or tuple
    (`api_key=['a b', 'c d']`) to its closing bracket. One pass, left to right: every character
    is scanned a bounded number of times (linear in the text, whatever its shape)."""
    out: list[str] = []
    last = 0
    pos = 0
    n = len(text)
    search = _PAIR.search
    while pos < n:
        m = search(text, pos)
        if m is None:
            break
        name, sep = m.group("name"), m.group("sep")
        spaced = not sep.strip()
        if spaced and not name.startswith("-"):
            # "word value" in prose is not a pair (only flags take a spaced value); the value
            # may be the name of the next pair ("set api_key=V")
            pos = m.end("sep")
            continue
        if not _secret_name_cached(name):
            pos = m.end()
            continue
        if m.group("q2"):
            last, pos = _mask_quoted_value(text, m, out, last)
            continue
        value = m.group("value")
        vstart = m.start("value")
        if value[0] in "[(" and (
            sep == sep.strip() or text[vstart + 1 : vstart + 2] in ("'", '"')
        ):  # a list or tuple (of strings: `'api_key': ['a b']`); not "key: (see docs)"
            last, pos = _mask_bracketed_value(text, m, out, last)
            continue
        if value[0] == "{":
            pos = vstart + 1  # a dict under a secret name: its own pairs are read one by one
            continue
        if _no_secret_value(m, value, sep):
            pos = m.end()
            continue
        out.append(text[last:vstart])
        out.append(REDACTED)
        last = m.end()
        _remember(value)  # free-text guesses: only long ones are remembered for elsewhere
        pos = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _mask_quoted_value(text: str, m: re.Match[str], out: list[str], last: int) -> tuple[int, int]:
    """A quoted value after a secret name (`m` matched the opening quote): appends to `out` the
    text since `last` and the mask, unless the value is empty or masked already; returns (where
    the text not yet copied begins, where the next search starts)."""
    n = len(text)
    start = m.end()
    close = _quoted_end(text, m.start("q2"))
    if close > 0 and close < n and (text[close] in "'\"\\" or text[close].isalnum()):
        close = _shell_word_end(text, close)  # 'it'\''s': one shell word
    if close < 0:  # not closed on this line: everything to its end is the value
        end = stop = _line_end(text, start)
        tail = ""
    else:
        end = close - 1 if text[close - 1] in "'\"" else close
        stop = close
        tail = text[end:close]
    value = text[start:end]
    if value and value != REDACTED:
        out.append(text[last:start])
        out.append(REDACTED + tail)
        last = stop
        _remember(value)
    return last, max(stop, m.end())


def _mask_bracketed_value(
    text: str, m: re.Match[str], out: list[str], last: int
) -> tuple[int, int]:
    """A list or tuple after a secret name: appends to `out` the text since `last` and one mask
    for it all (to its closing bracket, or the end of the line), unless it is empty or masked
    already, and remembers its quoted items; returns (where the text not yet copied begins,
    where the next search starts)."""
    vstart = m.start("value")
    close = _bracket_end(text, vstart)
    end = _line_end(text, vstart) if close < 0 else close
    body = text[vstart:end]
    if body.strip("[]() ") and body != REDACTED:
        out.append(text[last:vstart])
        out.append(REDACTED)
        last = end
        for item in _QUOTED_ITEM.findall(body):
            _remember(item[0] or item[1])
    return last, max(end, m.end())


def _no_secret_value(m: re.Match[str], value: str, sep: str) -> bool:
    """True when the word after a secret name is no secret: a literal, a number, a masked value,
    an auth scheme's name, or prose after a spaced separator."""
    if value in _LITERALS:
        return True  # api_key=None, hf_token=True: no key set, or a switch; nothing secret
    if value == REDACTED or _NUMBER.match(value) or value.lower() in _AUTH_SCHEMES:
        return True  # numbers are counts ("#token: 1234" in SGLang's logs), not secrets
    # "--api-key or OPENAI_API_KEY", "--api-key KEY": prose, not a value
    return sep != sep.strip() and not m.group("q1") and not _looks_like_value(value)


def _redact_argv_lists(text: str) -> str:
    """A command line printed as a list (`['--api-key', 'a b']`, a subprocess call in a
    traceback): the quoted item after a secret flag is masked whole, as `redact_argv` would."""
    out: list[str] = []
    last = 0
    pos = 0
    while True:
        m = _ARGV_ITEM.search(text, pos)
        if m is None:
            break
        pos = m.end()
        if not _secret_name_cached(m.group(2)) or text[pos + 1 : pos + 2] == "-":
            continue
        close = _quoted_end(text, pos)
        end = _line_end(text, pos) if close < 0 else close - 1
        value = text[pos + 1 : end]
        if value and value != REDACTED:
            out.append(text[last : pos + 1])
            out.append(REDACTED)
            last = end
            _remember(value)
        pos = max(pos + 1, end)
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


# curl/wget credentials on a command line: `-u user:password`, `--user user:password`,
# `--proxy-user`/`-U` (curl), quoted or not (`-u 'admin:pass word'`, `--user=admin:pw`). The user
# name stays; the password (after the first colon) is masked to the end of the shell word.
_USER_ARG = re.compile(
    r"(?<![\w-])(?:-u|-U|--user|--proxy-user)(?:[ \t]+|=)(?P<q>[\"']?)(?P<user>[^\s:\"']*):"
)
# A header given as a quoted string (`-H "api-key: zebra crossing 9"`, `"Cookie: a=b; c=d"`) or an
# unquoted curl/wget header argument (`--header=Cookie:session=abc`, `-H X-Api-Key:abc`): under a
# secret-looking name its whole value is masked, spaces and all, to the closing quote (or the end of
# the word when unquoted; the end of the line when the quote is not closed there).
_HEADER_QUOTED = re.compile(r"(?P<q>[\"'])(?P<name>[A-Za-z][\w-]*)[ \t]*:[ \t]*")
_HEADER_ARG = re.compile(
    r"(?<![\w-])(?:-H|--header|--proxy-header)(?:[ \t]+|=)(?P<name>[A-Za-z][\w-]*)[ \t]*:[ \t]*"
)
_WORD_END = re.compile(r"\S*")
# Header names that are secret on their own (a one-word name other than these needs a value-like
# first word: "key: see the docs" in quotes is prose).
_HEADER_WORDS = frozenset({"authorization", "cookie", "apikey", "x-api-key", "api-key"})


def _mask_span(text: str, out: list[str], last: int, start: int, end: int) -> int:
    """Append text[last:start] and the mask for text[start:end] (remembered when long enough):
    the new `last`, or `last` unchanged when there is nothing to mask."""
    value = text[start:end]
    if not value.strip() or value == REDACTED or _NUMBER.match(value.strip()):
        return last
    out.append(text[last:start])
    out.append(REDACTED)
    _remember(value)
    return end


def _redact_credentials(text: str) -> str:
    """curl/wget `-u user:password` and secret headers (see `_USER_ARG`, `_HEADER_QUOTED`,
    `_HEADER_ARG`). Left to right, each match is skipped past once handled: linear in the text."""
    out: list[str] = []
    last = 0
    if "-u" in text or "-U" in text:
        pos = 0
        while (m := _USER_ARG.search(text, pos)) is not None:
            start = m.end()
            if m.group("q"):
                close = _quoted_end(text, m.start("q"))
                end = _line_end(text, start) if close < 0 else close - 1
            else:
                end = _WORD_END.match(text, start).end()  # type: ignore[union-attr]
            password = text[start:end]
            if not (m.group("user").isdigit() and password.isdigit()):  # docker -u 1000:1000
                last = _mask_span(text, out, last, start, end)
            pos = max(end, m.end())
        if out:
            out.append(text[last:])
            text, out, last = "".join(out), [], 0
    if "-H" in text or "-header" in text:
        pos = 0
        while (m := _HEADER_ARG.search(text, pos)) is not None:
            pos = m.end()
            if text[pos : pos + 1] in ("'", '"') or not _secret_name_cached(m.group("name")):
                continue  # a quoted value after an unquoted name: the quoted-header rule's case
            end = _WORD_END.match(text, pos).end()  # type: ignore[union-attr]
            last = _mask_span(text, out, last, _after_scheme(text, pos, end), end)
            pos = max(pos, end)
        if out:
            out.append(text[last:])
            text, out, last = "".join(out), [], 0
    if "'" in text or '"' in text:
        pos = 0
        while (m := _HEADER_QUOTED.search(text, pos)) is not None:
            pos = m.end()
            name = m.group("name")
            if not _secret_name_cached(name):
                pos = m.start() + 1
                continue
            close = _quoted_end(text, m.start("q"))
            end = _line_end(text, pos) if close < 0 else close - 1
            if (
                "-" not in name
                and name.lower() not in _HEADER_WORDS
                and not _looks_like_value(text[pos:end].split(" ", 1)[0])
            ):
                continue  # prose in quotes ("key: see the docs"), not a header
            last = _mask_span(text, out, last, _after_scheme(text, pos, end), end)
            pos = max(pos, end + 1)
        if out:
            out.append(text[last:])
            text = "".join(out)
    return text


def _after_scheme(text: str, start: int, end: int) -> int:
    """`Authorization: Bearer X` / `Basic X`: the scheme word stays, what follows is the secret."""
    i = text.find(" ", start, end)
    if i > start and text[start:i].lower() in _AUTH_SCHEMES:
        return i + 1
    return start


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """The one redaction pass for free text (see the module doc for the rules)."""
    for secret in secrets:
        register_secret(secret)
    if not text:
        return text
    # Known secrets first: a registered value is masked whole (`'correct horse battery
    # staple'`) before a rule could mask its first word and leave the rest unrecognisable.
    pattern = _known_re
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    if _SUSPECT.search(text):
        if "://" in text:
            text = _URL.sub(_url_in_text, text)
        text = _BEARER.sub(
            lambda m: (m.group(1) or m.group(3)) + (m.group(2) or m.group(4)) + REDACTED, text
        )
        text = _KEY_SHAPE.sub(REDACTED, text)
        if ":" in text:
            text = _redact_credentials(text)
        text = _redact_pairs(text)
        if "', " in text or '", ' in text:
            text = _redact_argv_lists(text)
        # a value the rules just masked may appear again elsewhere in this text
        if _known_re is not pattern and _known_re is not None:
            text = _known_re.sub(REDACTED, text)
    return text


def redact_tail(text: str, secrets: Iterable[str], min_chars: int = 2) -> str:
    """A text already cut at a length limit may end inside a secret (`... caller zeb` of
    `zebra7 quokka9`): once cut, the secret no longer matches. The end of `text` that is the
    start of one of `secrets` (at least `min_chars` characters, shorter than the secret) is
    masked. Only for texts known to be cut: a whole text may end with such letters by chance."""
    best = 0
    for secret in secrets:
        for k in range(min(len(secret) - 1, len(text)), min_chars - 1, -1):
            if k <= best:
                break
            if text.endswith(secret[:k]):
                best = k
                break
    return text[: len(text) - best] + REDACTED if best else text


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
        m = _ASSIGN.match(arg)
        if m and m.group(2) and secret_name(m.group(1)):
            out.append(m.group(1) + "=" + _mask(m.group(2)))  # HF_TOKEN=a b: the whole word
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
            elif (
                isinstance(k, str)
                and isinstance(v, (list, tuple))
                and v
                and all(isinstance(i, str) for i in v)
                and secret_name(k)
            ):
                out[key] = [_mask(i) if i else i for i in v]  # vLLM's api_key: list[str]
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


# Characters that end a line on a terminal or in a text viewer (Unicode's line boundaries).
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_SHOWN_BREAK = {"\n": "\\n", "\r": "\\r"}


def _show_break(m: re.Match[str]) -> str:
    ch = m.group(0)
    return _SHOWN_BREAK.get(ch) or _escape_char(m)


def one_line(text: str) -> str:
    """A value that must stay on one line, with every line break shown, not obeyed.

    For one-line fields whose text comes from outside (a model id, a Prometheus label, a
    process name, a file name): a newline inside one becomes the two characters `\\n`, so a
    sender cannot start a line of its choosing ("STABLE: no leak ...") in a table, a note or
    an error message. Returns `text` unchanged when it has no line break (the usual case).
    The table renderer (`vramdoctor.render.table`) and the one-line messages
    (`vramdoctor.render.console.error` / `note`) apply it to everything they print.
    """
    return _LINE_BREAKS.sub(_show_break, text) if _LINE_BREAKS.search(text) else text
