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
from typing import Any, BinaryIO

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
        out: list[str] = []
        pos = self._end + 1
        limit = min(len(self._buf), self._end + LOOKAHEAD)
        while len(out) < max_lines and pos < limit:
            nl = self._buf.find(b"\n", pos, limit)
            if nl < 0:
                out.append(self._buf[pos:limit].decode("utf-8", "replace"))
                break
            out.append(self._buf[pos:nl].decode("utf-8", "replace"))
            pos = nl + 1
        return out


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


Skip = Callable[[bytes], bool]


def scan(
    path: str | Path, stats: ReadStats | None = None, skip: Skip | None = None
) -> Iterator[Hit]:
    """Yield the candidate lines of one input, numbered from 1, streaming in blocks.

    `skip(raw)`, when given, is asked about each candidate line's raw bytes before it is decoded: True
    means the caller has taken the line into account already (a line it knows to repeat an effect)
    and it is not yielded."""
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
    src: BinaryIO, name: str, st: ReadStats, skip: Skip | None = None
) -> Iterator[Hit]:
    buf = b""
    start = 0  # first unprocessed byte in buf; buf[:start] is history
    lineno = 0  # lines fully processed so far
    skipping = False  # inside an over-long line whose head was already read
    first = True
    mode = "text"
    decoder: codecs.IncrementalDecoder | None = None
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
            yield from _emit(buf, start, end, pos, st, skip)
            seg_lines = buf.count(b"\n", pos[0], end)
            if final and buf[end - 1 : end] != b"\n":
                seg_lines += 1
            lineno = pos[1] + seg_lines
            start = end
        if final:
            break
    st.lines = lineno
    st.tail = bytes(buf[-TAIL:])


def _emit(
    buf: bytes, start: int, end: int, pos: list[int], st: ReadStats, skip: Skip | None = None
) -> Iterator[Hit]:
    """Candidate lines of buf[start:end]; pos = [offset, lines before it], updated as it goes.

    Newlines are counted only between hits (one pass over the window in total), and the caller
    counts the rest from the last hit, so a block is never counted twice.
    """
    p, line = pos
    n = 0
    count, find, rfind = buf.count, buf.find, buf.rfind
    match, unanchored = _RE2_MATCH, _UNANCHORED
    mm_frame = _MM_FRAME.search
    q = start  # always the start of a line
    try:
        while q < end:
            # the RE2 matcher called here directly: no Python frame per line
            a = (
                match(unanchored, buf, q, end)[0][0]
                if match
                else _first_anchor_generic(buf, q, end)
            )
            if a < 0:
                break
            s = rfind(b"\n", q, a) + 1 or q
            e = find(b"\n", a, end)
            if e < 0:
                e = end
            q = e + 1  # step past the newline that ends this line
            raw = buf[s:e]
            f = raw.find(b'File "')
            if 0 <= f < a - s and mm_frame(raw) is None:
                # a traceback frame (read through lookback when an error needs it); a line whose
                # first anchor comes before the frame holds more than the frame: rows a container's
                # log squashed onto one line ("HIP out of memory. ...  ERROR ... File ...")
                continue
            if skip is not None and skip(raw):
                n += 1
                continue  # the caller applied this line's known effect (no decode, no Hit)
            line += count(b"\n", p, s)
            p = s
            n += 1
            yield Hit(line + 1, raw.decode("utf-8", "replace"), buf, s, e, raw)
    finally:  # written back once, not per line (also when the consumer stops early)
        pos[0], pos[1] = p, line
        st.candidates += n
