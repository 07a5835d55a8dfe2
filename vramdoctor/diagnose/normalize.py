"""Turn a line as users paste it into the server's own text plus where it came from.

Pasted logs carry layers of wrapping: markdown quote markers, stray backticks, ANSI colours,
CR line ends, docker-compose or journald prefixes, vLLM process tags, and the servers' own
timestamps. Extractors search anywhere in a line, so this is for display (evidence shows the
message, not the noise) and for the rank tags (TP0, rank=1) that say which process spoke.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import TypeVar

from vramdoctor.diagnose import patterns as P

# Error-dense logs repeat the same lines (an OOM traceback per request): `clean` is pure, so
# short lines are memoised. Both bounds keep memory flat: entries and the length of a key.
CACHE_LINES = 2048
CACHE_LINE_CHARS = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class Clean:
    text: str  # the message without prefixes
    ranks: tuple[
        tuple[str, int], ...
    ] = ()  # e.g. (("TP", 3),) from an SGLang prefix or a vLLM Worker_TP3 tag


def strip_noise(line: str) -> str:
    """Remove CR, ANSI colour codes, quote markers and backticks; keep the content."""
    if "\r" in line:
        line = line.replace("\r", "")
    if "\x1b" in line:
        line = P.ANSI.sub("", line)
    if line[:1] in (">", " ") and ">" in line[:8]:
        line = P.QUOTE.sub("", line, count=1)
    return line.strip("`")


def short_line_memo(
    maxsize: int = CACHE_LINES,
) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """Memoise a pure function of one line, for lines up to CACHE_LINE_CHARS: an error repeated
    10^5 times is parsed once, and a megabyte argument dump is never kept."""

    def wrap(fn: Callable[[str], T]) -> Callable[[str], T]:
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(line: str) -> T:
            return cached(line) if len(line) <= CACHE_LINE_CHARS else fn(line)

        call.cached = cached  # type: ignore[attr-defined]  # for hot loops that check the length themselves
        return call

    return wrap


@short_line_memo()
def clean(line: str) -> Clean:
    """Strip the wrappers in the order they are applied outside-in."""
    s = strip_noise(line)
    if s[:1] in "[12\u2502" and (w := P.WRAPPER.match(s)) is not None:
        s = s[w.end() :]
        if s.endswith("\u2502"):  # a TUI border's right edge, after its padding
            s = s[:-1].rstrip()
    for rx in (P.COMPOSE, P.JOURNALD):
        m = rx.match(s)
        if m:
            s = s[m.end() :]
            break
    ranks: tuple[tuple[str, int], ...] = ()
    m = P.PROC.match(s)
    if m:
        tag = m.group()
        if ("_" in tag or "rank=" in tag or " TP" in tag or " PP" in tag) and P.VLLM_PROC.match(
            tag
        ):
            # vLLM's process tag: Worker_DP1_TP3 -> DP 1, TP 3; VllmWorker PP1_TP3 -> PP 1, TP 3;
            # VllmWorker rank=N -> world rank N. Nested tags ("(EngineCore_0 pid=715) (VllmWorker TP0
            # pid=720) ") are all stripped; the ranks are read from each.
            ranks = tuple(
                (k, int(v)) if k else ("WORLD", int(w))
                for k, v, w in P.VLLM_PROC_RANKS.findall(tag)
            )
        s = s[m.end() :]
    m = P.RANKTAG.match(s)
    if m:
        s = s[m.end() :]
    m = P.SGL_PREFIX.search(s, 0, 200)
    if m and m.start() < 120:  # tqdm output may precede the prefix on the same line
        ranks = ranks + tuple((k, int(v)) for k, v in P.SGL_RANKS.findall(m.group(2)))
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


def is_continuation(raw: str) -> bool:
    """Whether a line right after an error message looks like its terminal-wrapped tail."""
    s = strip_noise(raw)
    if not s.strip():
        return False
    # a logged request (SGLang's request logger prints "Receive: obj=..." with no prefix) starts its own
    # record: its user text is never an error message's tail
    return P.RECORD_START.match(s) is None and P.request_echo(s) < 0
