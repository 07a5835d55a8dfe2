"""Stream a log (file, .gz, stdin) and hand over only the lines that can matter.

Server logs reach gigabytes, so the reader never holds a whole file: it reads fixed blocks,
runs ONE prefilter (RE2, a DFA: linear time whatever the number of anchors) over each block,
and yields the candidate lines with their line numbers. Everything else is skipped at C
speed. A window of history before and lookahead after each block stays in memory so that
event extractors can read the traceback that precedes an error and the continuation of a
terminal-wrapped line, without re-reading the file.

Bad input never raises a traceback: a missing file, a directory, binary data or an empty file
raise `InputError` (one line, exit 2); a truncated or corrupt gzip and an over-long line are
read as far as they are valid and recorded in `notes`; UTF-16 text (with or without a BOM) is
decoded and NUL padding skipped, each with a note.
"""

from __future__ import annotations

import codecs
import gzip
import io
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from vramdoctor.diagnose.patterns import READ_FRAME_ANCHORS, fast_bytes
from vramdoctor.diagnose.vocabulary import ANCHORS
from vramdoctor.errors import InputError

# Any one of the anchors. The line around a hit is found with find/rfind (memchr): a regex that
# spans the whole line (`^.*(?:...).*$`) makes RE2 run its reverse DFA back over every candidate.
_ANCHOR = b"|".join(re.escape(a) for a in ANCHORS)
_PREFILTER = fast_bytes(_ANCHOR)  # RE2 keeps the prefilter linear and fast

# The binding's Match(anchor, text, pos, endpos) returns spans directly: the wrapper's Match
# objects cost more than the match itself on dense logs. None with another binding or no RE2.
_RE2_MATCH: Callable[..., Any] | None
_UNANCHORED: Any = None
try:
    from re2 import _re2 as _binding

    _UNANCHORED = _binding.RE2.Anchor.UNANCHORED
    _RE2_MATCH = _PREFILTER._regexp.Match
except (ImportError, AttributeError):
    _RE2_MATCH = None


def _first_anchor_generic(buf: bytes, pos: int, end: int) -> int:
    """Offset of the first anchor in buf[pos:end], -1 when there is none (any regex engine)."""
    m = _PREFILTER.search(buf, pos, end)
    return -1 if m is None else m.start()


# A frame in a vision model file or encoder call: yielded (it says the log is multimodal, also in
# an excerpt without the traceback's header), as is a frame of SGLang's CUDA IPC transport; other
# frames are read only through lookback.
_MM_FRAME = re.compile(b"|".join(re.escape(a) for a in READ_FRAME_ANCHORS))


# bytes read per step: small enough that a block is scanned and its lines counted while it is
# still in the CPU's cache after the read (8 MiB blocks measured 5-8 % slower, docs/diagnose.md)
BLOCK = 2 << 20
HISTORY = 256 << 10  # kept before the current window, for lookback into tracebacks
LOOKAHEAD = 256 << 10  # kept after each candidate, for wrapped lines and args dumps
MAX_LINE = 1 << 20  # a longer line is cut: its first MiB is read, the rest skipped
TAIL = 32 << 10  # kept after the last block: a traceback the excerpt ends in

STDIN = "-"


@dataclass(slots=True)  # one per candidate line: slots make it cheap to build
class Hit:
    """One candidate line, with access to the text around it in the current buffer."""

    lineno: int
    text: str
    _buf: bytes
    _start: int
    _end: int
    raw: bytes = b""  # the line's bytes as read (the key of the extractor's memo of inert lines)

    def before(self, max_bytes: int = HISTORY) -> str:
        """Text before this line (up to `max_bytes`, whole lines), for traceback lookback."""
        lo = max(0, self._start - max_bytes)
        if lo:
            nl = self._buf.find(b"\n", lo, self._start)
            lo = self._start if nl < 0 else nl + 1
        return self._buf[lo : self._start].decode("utf-8", "replace")

    def since_last(self, marker: bytes, max_bytes: int = HISTORY) -> str:
        """Text from the last `marker` before this line (within `max_bytes`), "" when there is none:
        only that part is decoded (a traceback's header, for its frames)."""
        lo = max(0, self._start - max_bytes)
        i = self._buf.rfind(marker, lo, self._start)
        return "" if i < 0 else self._buf[i : self._start].decode("utf-8", "replace")

    def since_last_own(self, marker: bytes, max_bytes: int, foreign: Callable[[str], int]) -> str:
        """`since_last`, skipping a `marker` inside a line that `foreign` claims (it gets the line's
        text up to the marker, its first KiB, and returns >= 0 for a foreign line): a request echo
        (patterns.request_echo) that quotes a traceback or a shutdown line is user text."""
        lo = max(0, self._start - max_bytes)
        hi = self._start
        while True:
            i = self._buf.rfind(marker, lo, hi)
            if i < 0:
                return ""
            ls = self._buf.rfind(b"\n", lo, i) + 1 or lo
            if foreign(self._buf[ls : min(i, ls + 1024)].decode("utf-8", "replace")) < 0:
                return self._buf[i : self._start].decode("utf-8", "replace")
            hi = ls

    def after(self, max_lines: int) -> list[str]:
        """Up to `max_lines` raw lines after this one (fewer at the end of the buffer)."""
        return list(self.following(max_lines))

    def following(self, max_lines: int) -> Iterator[str]:
        """`after`, decoded one line at a time: for a reader that stops at the first line it does
        not want (a wrapped message's tail, a command's continuation rows)."""
        pos = self._end + 1
        limit = min(len(self._buf), self._end + LOOKAHEAD)
        buf = self._buf
        for _ in range(max_lines):
            if pos >= limit:
                return
            nl = buf.find(b"\n", pos, limit)
            if nl < 0:
                yield buf[pos:limit].decode("utf-8", "replace")
                return
            yield buf[pos:nl].decode("utf-8", "replace")
            pos = nl + 1


@dataclass
class ReadStats:
    """What the reader saw of one input: size, lines, and what it could not read."""

    name: str
    bytes_read: int = 0
    lines: int = 0
    candidates: int = 0
    head: bytes = b""  # the first bytes, for sniffing which server wrote the log
    tail: bytes = b""  # the last bytes (TAIL), for a traceback the excerpt ends in (tail.py)
    notes: list[str] = field(default_factory=list)


def display_name(path: str | Path) -> str:
    return "<stdin>" if str(path) == STDIN else str(path)


def _open(path: str | Path) -> BinaryIO:
    """Open a path, '-' (stdin) or a gzip (by magic bytes, whatever its name)."""
    if str(path) == STDIN:
        raw: BinaryIO = (
            io.BufferedReader(sys.stdin.buffer.raw)
            if hasattr(sys.stdin.buffer, "raw")
            else sys.stdin.buffer
        )
    else:
        p = Path(path)
        if not p.exists():
            raise InputError(f"{p}: no such file")
        if p.is_dir():
            raise InputError(f"{p}: is a directory, not a log file")
        try:
            raw = open(p, "rb")  # noqa: SIM115 - the caller closes it
        except OSError as exc:
            raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    peek = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if peek == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _utf16(sample: bytes) -> str | None:
    """'utf-16-le' / 'utf-16-be' when the bytes are UTF-16 text (with or without a BOM), else None.

    Without a BOM, text that is mostly ASCII has a NUL in every other byte: the high byte of each
    code unit (odd positions for little-endian, even ones for big-endian).
    """
    if sample[:2] == b"\xff\xfe":
        return "utf-16-le"
    if sample[:2] == b"\xfe\xff":
        return "utf-16-be"
    pairs = len(sample) // 2
    if pairs < 2:
        return None
    odd_nul = sample[1 : 2 * pairs : 2].count(0)
    even_nul = sample[0 : 2 * pairs : 2].count(0)
    for nul, other, enc in (
        (odd_nul, sample[0 : 2 * pairs : 2], "utf-16-le"),
        (even_nul, sample[1 : 2 * pairs : 2], "utf-16-be"),
    ):
        if nul >= 0.4 * pairs and other.count(0) <= 0.05 * pairs:
            printable = sum(1 for b in other if b >= 32 or b in (9, 10, 13))
            if printable >= 0.9 * (pairs - other.count(0)):
                return enc
    return None


def _check_text(name: str, first: bytes) -> str:
    """How to read the input: 'text', 'nul' (text padded with NUL bytes) or a UTF-16 codec name.

    Rejects what is certainly not a text log, with the reason and the fix. NUL padding (a log
    pre-allocated, or rotated with copytruncate while the server kept writing at its old offset)
    is dropped, and UTF-16 (a Windows console redirect, PowerShell's `>`) is decoded, BOM or not.
    """
    if not first:
        raise InputError(f"{name}: the file is empty, there is no log to read")
    sample = first[:8192]
    enc = _utf16(sample)
    if enc is not None:
        return enc
    mode = "text"
    if b"\x00" in sample:
        sample = sample.replace(b"\x00", b"")
        if not sample:  # padding longer than the sample: judge the text after it
            sample = first.replace(b"\x00", b"")[:8192]
        mode = "nul"
    bad = sum(1 for b in sample if b < 9 or 13 < b < 32)
    if bad > len(sample) // 10:
        raise InputError(f"{name}: binary data (control bytes), not a text server log")
    return mode


class Known(Protocol):
    """What the consumer of the hits knows of lines already seen (the extractor's memo of lines that
    repeat an effect), asked by the reader before it decodes a line."""

    def known(self, raw: bytes, lineno: int) -> object:
        """None: not known (the line is decoded and yielded). Otherwise its effect has been applied
        and it is not yielded: True, or a token that `join` can merge with its neighbours' (an
        effect that neither needs the line's number nor depends on the order of lines)."""

    def join(self, tokens: list[object]) -> object:
        """One token with the effect of all of `tokens` (a run of consecutive lines)."""

    def apply(self, token: object) -> bool:
        """Apply a joined token's effect again; False (nothing applied) when it no longer holds."""


def scan(
    path: str | Path, stats: ReadStats | None = None, skip: Known | None = None
) -> Iterator[Hit]:
    """Yield the candidate lines of one input, numbered from 1, streaming in blocks.

    `skip.known(raw, lineno)`, when given, is asked about each candidate line (its raw bytes and
    line number) before it is decoded: a line the caller has taken into account already (a line it
    knows to repeat an effect) is not yielded, and a run of such lines that repeats is applied at
    once (`Successors`)."""
    name = display_name(path)
    st = stats if stats is not None else ReadStats(name)
    src = _open(path)
    try:
        yield from _scan_stream(src, name, st, skip)
    finally:
        if str(path) != STDIN:
            src.close()


def _read(src: BinaryIO, name: str, st: ReadStats) -> tuple[bytes, bool]:
    """One block; a truncated or corrupt gzip ends the stream with a note, never raises.

    Compressed input is read in small steps so that the valid part before a truncation
    or corruption is kept (one big read would lose the whole block).
    """
    gz = isinstance(src, gzip.GzipFile)
    step = 1 << 16 if gz else BLOCK
    # read1: one decompression step, so little is lost
    read = src.read1 if isinstance(src, gzip.GzipFile) else src.read
    parts: list[bytes] = []
    got = 0
    try:
        while got < BLOCK:
            data = read(step)
            if not data:
                break
            parts.append(data)
            got += len(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        if st.bytes_read == 0 and not parts:
            raise InputError(f"{name}: not a readable gzip file ({exc})") from None
        st.notes.append(
            "compressed data ends early or is damaged (truncated gzip): read as far as it is valid"
        )
        return b"".join(parts), True
    except OSError as exc:
        raise InputError(f"{name}: read error ({exc})") from None
    data = b"".join(parts)
    return data, not data


def _scan_stream(
    src: BinaryIO, name: str, st: ReadStats, skip: Known | None = None
) -> Iterator[Hit]:
    buf = b""
    start = 0  # first unprocessed byte in buf; buf[:start] is history
    lineno = 0  # lines fully processed so far
    skipping = False  # inside an over-long line whose head was already read
    first = True
    mode = "text"
    decoder: codecs.IncrementalDecoder | None = None
    succ = Successors()
    while True:
        data, final = _read(src, name, st)
        st.bytes_read += len(data)
        if first:
            mode = _check_text(name, data)
            if mode.startswith("utf-16"):
                decoder = codecs.getincrementaldecoder(mode)("replace")
                if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
                    data = data[2:]
                st.notes.append(f"{mode.upper()} text: decoded to UTF-8 to read it")
            elif mode == "nul":
                st.notes.append(
                    "NUL bytes in the file (padding, or a log rotated with copytruncate): skipped"
                )
        if decoder is not None:
            data = decoder.decode(data, final).encode("utf-8")
        elif mode == "nul":
            data = data.replace(b"\x00", b"")
        if first:
            st.head = data[: 1 << 20]
            first = False
        if skipping and data:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            data = data[nl + 1 :]
            skipping = False
        if start:  # keep HISTORY bytes before the unprocessed text: one copy, not a slice then +=
            lo = max(0, start - HISTORY)
            buf = b"".join((memoryview(buf)[lo:], data))
            start -= lo
        else:
            buf += data
        if final:
            end = len(buf)
        else:
            end = buf.rfind(b"\n", start, max(start, len(buf) - LOOKAHEAD)) + 1
            if end <= 0:
                if buf.find(b"\n", start) >= 0 or len(buf) - start <= MAX_LINE:
                    continue  # not enough text yet for a window with lookahead
                # An over-long line: read its first MiB, skip the rest of it.
                head = buf[start : start + MAX_LINE]
                st.notes.append(
                    f"line {lineno + 1} is longer than {MAX_LINE >> 20} MiB: "
                    "only its first MiB was read"
                )
                yield from _emit(head, 0, len(head), [0, lineno], st, skip)
                lineno += 1
                buf, start, skipping = b"", 0, True
                continue
        if end > start:
            pos = [start, lineno]  # _emit leaves the last hit's offset and line number here
            yield from _emit(buf, start, end, pos, st, skip, succ)
            seg_lines = buf.count(b"\n", pos[0], end)
            if final and buf[end - 1 : end] != b"\n":
                seg_lines += 1
            lineno = pos[1] + seg_lines
            start = end
        if final:
            break
    st.lines = lineno
    st.tail = bytes(buf[-TAIL:])


# Successor memo (per input): after a candidate line X, the text up to and including the next
# candidate line Y that is handed on (the lines between, frames skipped ones included) and Y itself.
# An error-dense log repeats its excerpts, so the same text follows X again: one memcmp
# (`startswith`) of that text stands for the RE2 search, the frame checks and the slice of Y, and
# gives the same lines (the first anchor after X's line is a function of the bytes up to the end of
# the line holding it: no anchor holds a newline). A line that recurs in several contexts (the same
# error line in different excerpts) keeps its last few successors. Only short runs are kept (a long
# gap costs RE2 per byte, where the memo would save little).
#
# Chains: after X, a run of consecutive candidates whose effects the consumer knew and could join
# (Known.known returned a token for each): the same text after X again has their joined effect,
# applied at once (Known.apply), without looking at each line. Both memos are bounded by the bytes
# they hold: memory stays flat.
SUCCESSOR_RUN = 8 << 10  # bytes from after X to the end of Y, at most, for a run to be kept
SUCCESSOR_BYTES = 2 << 20  # bytes of runs and chains held per input (then the memo starts again)
SUCCESSORS_PER_LINE = 4  # successors kept per line X, the latest first
CHAIN_BYTES = 32 << 10  # a chain is closed at this many bytes of text ...
CHAIN_LINES = 256  # ... or this many candidate lines

# a successor: (run, offset of Y in the run, Y, newlines in the run before Y)
Successor = tuple[bytes, int, bytes, int]
# a chain: (run, offset of its last line Y in the run, Y, newlines in the run before Y, the joined
# token, candidate lines in it)
Chain = tuple[bytes, int, bytes, int, object, int]


@dataclass(slots=True)
class Successors:
    """One input's successor and chain memos (see above), and the bytes they hold."""

    runs: dict[bytes, list[Successor]] = field(default_factory=dict)
    chains: dict[bytes, Chain] = field(default_factory=dict)
    held: int = 0

    def _room(self) -> None:
        if self.held > SUCCESSOR_BYTES:
            self.runs.clear()
            self.chains.clear()
            self.held = 0

    def add(self, x: bytes, run: bytes, off: int, y: bytes) -> None:
        self._room()
        entry = (run, off, y, run.count(b"\n", 0, off))
        known = self.runs.get(x)
        if known is None:
            self.runs[x] = [entry]
        else:
            known.insert(0, entry)
            if len(known) > SUCCESSORS_PER_LINE:
                self.held -= len(known.pop()[0])
        self.held += len(run)

    def chain(self, x: bytes, run: bytes, off: int, y: bytes, token: object, lines: int) -> None:
        self._room()
        old = self.chains.get(x)
        if old is not None:
            self.held -= len(old[0])
        self.chains[x] = (run, off, y, run.count(b"\n", 0, off), token, lines)
        self.held += len(run)


def _close(
    succ: Successors, skip: Known, x: bytes, run: bytes, off: int, y: bytes, tokens: list[object]
) -> None:
    """Keep the chain built after `x` (its run of text and last line `y`), if it links lines."""
    if len(tokens) > 1:
        succ.chain(x, run, off, y, skip.join(tokens), len(tokens))


def _emit(
    buf: bytes,
    start: int,
    end: int,
    pos: list[int],
    st: ReadStats,
    skip: Known | None = None,
    succ: Successors | None = None,
) -> Iterator[Hit]:
    """Candidate lines of buf[start:end]; pos = [offset, lines before it], updated as it goes.

    Newlines are counted only between candidates (one pass over the window in total), and the caller
    counts the rest from the last one, so a block is never counted twice. `succ` (the input's
    successor and chain memos, see `Successors`) is consulted after each candidate and filled as
    RE2 finds them.
    """
    p, line = pos
    n = 0
    count, find, rfind, startswith = buf.count, buf.find, buf.rfind, buf.startswith
    match, unanchored = _RE2_MATCH, _UNANCHORED
    mm_frame = _MM_FRAME.search
    if succ is None:
        succ = Successors()
    memo, chains = succ.runs, succ.chains
    prev: bytes | None = None  # the last candidate handed on (it starts at p), in this window
    # the chain being built: the line it follows (None: none), where its text starts, the tokens of
    # its lines, and the end of its last line, that line's start and the line itself
    head: bytes | None = None
    hq = 0
    tokens: list[object] = []
    last_q = last_s = 0
    last_raw = b""
    q = start  # always the start of a line
    try:
        while q < end:
            q_here = q
            if prev is not None and skip is not None:
                c = chains.get(prev)
                if c is not None and startswith(c[0], q, end) and skip.apply(c[4]):
                    if head is not None:  # the chain being built ends where this one starts
                        _close(succ, skip, head, buf[hq:last_q], last_s - hq, last_raw, tokens)
                    head, tokens = None, []
                    run, off, prev, k, _token, lines = c
                    p = q + off
                    q += len(run)
                    line += k + 1  # (the newline that ends X, and those between)
                    n += lines
                    continue
            found = memo.get(prev) if prev is not None else None
            if found is not None:
                for run, off, raw, k in found:  # noqa: B007 - raw: the line found
                    if startswith(run, q, end):
                        s = q + off
                        e = q + len(run) - 1  # (the run ends with Y's newline)
                        q = e + 1
                        line += k + 1  # (the newline that ends X, and those between)
                        break
                else:
                    found = None
            if found is None:
                while True:
                    # the RE2 matcher called here directly: no Python frame per line
                    a = (
                        match(unanchored, buf, q, end)[0][0]
                        if match
                        else _first_anchor_generic(buf, q, end)
                    )
                    if a < 0:
                        return
                    s = rfind(b"\n", q, a) + 1 or q
                    e = find(b"\n", a, end)
                    if e < 0:
                        e = end
                    q = e + 1  # step past the newline that ends this line
                    raw = buf[s:e]
                    f = raw.find(b'File "')
                    if 0 <= f < a - s and mm_frame(raw) is None:
                        # a traceback frame (read through lookback when an error needs it); a line
                        # whose first anchor comes before the frame holds more than the frame: rows a
                        # container's log squashed onto one line ("HIP out of memory. ... File ...")
                        continue
                    break
                if prev is not None and e < end and q - q_here <= SUCCESSOR_RUN:
                    succ.add(prev, buf[q_here:q], s - q_here, raw)
                line += count(b"\n", p, s)
            p = s
            n += 1
            token = None if skip is None else skip.known(raw, line + 1)
            if token is None or token is True or e >= end or prev is None:
                # not a link of a chain: the chain being built ends before this line
                if head is not None and skip is not None:
                    _close(succ, skip, head, buf[hq:last_q], last_s - hq, last_raw, tokens)
                head, tokens = None, []
                prev = raw
                if token is None:
                    yield Hit(line + 1, raw.decode("utf-8", "replace"), buf, s, e, raw)
                continue
            if head is None:
                head, hq = prev, q_here
            tokens.append(token)
            last_q, last_s, last_raw = q, s, raw
            prev = raw
            if (len(tokens) >= CHAIN_LINES or q - hq > CHAIN_BYTES) and skip is not None:
                _close(succ, skip, head, buf[hq:q], s - hq, raw, tokens)
                head, tokens = None, []
    finally:  # written back once, not per line (also when the consumer stops early)
        pos[0], pos[1] = p, line
        st.candidates += n
