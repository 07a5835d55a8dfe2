"""Turn a line as users paste it into the server's own text plus where it came from.

Pasted logs carry layers of wrapping: markdown quote markers, stray backticks, ANSI colours,
CR line ends, docker-compose or journald prefixes, vLLM process tags, and the servers' own
timestamps. Extractors search anywhere in a line, so this is for display (evidence shows the
message, not the noise) and for the rank tags (TP0, rank=1) that say which process spoke.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from . import patterns as P

# Error-dense logs repeat the same lines (an OOM traceback per request): `clean` is pure, so
# short lines are memoised. Both bounds keep memory flat: entries and the length of a key.
CACHE_LINES = 2048
CACHE_LINE_CHARS = 4096


@dataclass(frozen=True)
class Clean:
    text: str  # the message without prefixes
    ranks: tuple[tuple[str, int], ...] = ()  # e.g. (("TP", 3),) from an SGLang prefix


def strip_noise(line: str) -> str:
    """Remove CR, ANSI colour codes, quote markers and backticks; keep the content."""
    if "\r" in line:
        line = line.replace("\r", "")
    if "\x1b" in line:
        line = P.ANSI.sub("", line)
    if line[:1] in (">", " ") and ">" in line[:8]:
        line = P.QUOTE.sub("", line, count=1)
    return line.strip("`")


def clean(line: str) -> Clean:
    """Strip the wrappers in the order they are applied outside-in (memoised for short lines)."""
    return _clean_cached(line) if len(line) <= CACHE_LINE_CHARS else _clean(line)


def _clean(line: str) -> Clean:
    s = strip_noise(line)
    for rx in (P.COMPOSE, P.JOURNALD):
        m = rx.match(s)
        if m:
            s = s[m.end() :]
            break
    m = P.PROC.match(s)
    if m:
        s = s[m.end() :]
    m = P.RANKTAG.match(s)
    if m:
        s = s[m.end() :]
    ranks: tuple[tuple[str, int], ...] = ()
    m = P.SGL_PREFIX.search(s, 0, 200)
    if m and m.start() < 120:  # tqdm output may precede the prefix on the same line
        ranks = tuple((k, int(v)) for k, v in P.SGL_RANKS.findall(m.group(2)))
        s = s[m.end() :]
        lm = P.SGL_LEVEL.match(s)
        if lm:
            s = s[lm.end() :]
    else:
        for rx in (P.VLLM_PREFIX, P.PYLOG, P.OLD_SGL):
            m = rx.match(s)
            if m:
                s = s[m.end() :]
                break
    return Clean(s.strip(), ranks)


_clean_cached = lru_cache(maxsize=CACHE_LINES)(_clean)


def is_continuation(raw: str) -> bool:
    """Whether a line right after an error message looks like its terminal-wrapped tail."""
    s = strip_noise(raw)
    if not s.strip():
        return False
    return P.RECORD_START.match(s) is None
