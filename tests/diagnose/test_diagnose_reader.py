"""The reader: pasted-log wrappers, big and broken inputs, gzip and stdin, exact line numbers."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from vramdoctor.diagnose import diagnose
from vramdoctor.diagnose.normalize import clean
from vramdoctor.diagnose.reader import BLOCK, MAX_LINE, ReadStats, scan
from vramdoctor.errors import InputError

FIX = Path(__file__).parents[1] / "fixtures" / "logs"
# Real lines (file 05 and file 16 of the corpus).
SGL_OOM = (
    (FIX / "05_sglang_llama4-scout-vlm_oom-prefill-long-input.log").read_text().splitlines()[30]
)
VLLM_VERSION = (
    "INFO 11-05 03:21:18 api_server.py:526] vLLM API server version 0.6.1.dev238+ge2c6e0a82"
)
FILLER = "[2025-01-07 20:16:02 TP0] Prefill batch. #new-seq: 1, #new-token: 48, #cached-token: 0, cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0"


def test_wrappers_are_stripped() -> None:
    cases = {
        "functionary  | INFO 05-11 08:17:50 selector.py:28] Using FlashAttention backend.": "Using FlashAttention backend.",
        "> [rank0]: torch.OutOfMemoryError: CUDA out of memory.": "torch.OutOfMemoryError: CUDA out of memory.",
        "\x1b[32mINFO\x1b[0m 05-02 10:11:12 [core.py:69] hello\r": "hello",
        "(VllmWorker rank=1 pid=420568) ERROR 04-16 11:12:31 [multiproc_executor.py:380] boom": "boom",
        "Mar 18 11:23:46 sgl-router-janus-pro-7b[931930]: [2025-03-18 11:23:46] server_args=x": "server_args=x",
        "2025-03-18 10:24:07,565 - __main__ - INFO - Using a slow image processor": "Using a slow image processor",
        "[2026-03-02 22:23:32] INFO server_args.py:1970: Attention backend not specified.": "Attention backend not specified.",
    }
    for raw, want in cases.items():
        assert clean(raw).text == want, raw
    assert clean("[2025-03-07 21:49:33 DP1 TP13] x").ranks == (("DP", 1), ("TP", 13))


def test_crlf_ansi_quotes_in_a_whole_file(tmp_path: Path) -> None:
    src = (FIX / "16_vllm_llama3.2-11b-vision-tp2_oom-mm-profiling.log").read_text()
    wrapped = "".join(f"> \x1b[1m{line}\x1b[0m\r\n" for line in src.splitlines())
    p = tmp_path / "pasted.log"
    p.write_text(wrapped)
    a, b = diagnose([FIX / "16_vllm_llama3.2-11b-vision-tp2_oom-mm-profiling.log"]), diagnose([p])
    assert (b.server, b.version, b.facts.tp_size, b.facts.gpu_memory_utilization) == (
        a.server,
        a.version,
        a.facts.tp_size,
        a.facts.gpu_memory_utilization,
    )
    assert [e.line for e in b.events] == [e.line for e in a.events]
    assert [e.phase for e in b.events] == [e.phase for e in a.events]


def test_line_numbers_exact_across_blocks(tmp_path: Path) -> None:
    n_before = (BLOCK // len(FILLER)) + 123  # the OOM lands past the first block
    p = tmp_path / "big.log"
    with open(p, "w") as f:
        f.write(VLLM_VERSION + "\n")
        for _ in range(n_before):
            f.write(FILLER + "\n")
        f.write(SGL_OOM + "\n")
        f.write(FILLER + "\n")
    st = ReadStats("big")
    hits = list(scan(p, st))
    assert [h.lineno for h in hits] == [1, n_before + 2]
    assert st.lines == n_before + 3
    assert st.candidates == 2


def test_gzip_and_truncated_gzip(tmp_path: Path) -> None:
    src = FIX / "17_vllm_e5-mistral-bnb-v1_oom-cuda-graph-capture.log"
    data = gzip.compress(src.read_bytes())
    whole = tmp_path / "x.log.gz"
    whole.write_bytes(data)
    d = diagnose([whole])
    assert d.version == "0.9.1.dev287+g89b1388d8" and d.events_of("cuda_oom")
    cut = tmp_path / "cut.gz"
    cut.write_bytes(data[: len(data) // 2])
    d = diagnose([cut])
    assert d.version == "0.9.1.dev287+g89b1388d8"  # read as far as valid
    assert any("truncated gzip" in n for n in d.files[0].notes)


def test_long_single_line(tmp_path: Path) -> None:
    p = tmp_path / "long.log"
    with open(p, "wb") as f:
        f.write(VLLM_VERSION.encode() + b"\n")
        f.write(b"x" * (50 << 20))  # 50 MB without a newline
        f.write(b"\n" + SGL_OOM.encode() + b"\n")
    st = ReadStats("long")
    hits = list(scan(p, st))
    assert [h.lineno for h in hits] == [1, 3]
    assert st.lines == 3
    assert any(str(MAX_LINE >> 20) + " MiB" in n for n in st.notes)


def test_invalid_utf8_is_read(tmp_path: Path) -> None:
    p = tmp_path / "latin.log"
    p.write_bytes(b"caf\xe9 \xff\xfe\n" + SGL_OOM.encode() + b" \xc3\n")
    d = diagnose([p])
    assert d.events_of("cuda_oom")[0].line == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 50, "binary"),
        (b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    with pytest.raises(InputError, match=message):
        diagnose([p])


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        diagnose([tmp_path / "nope.log"])
    with pytest.raises(InputError, match="directory"):
        diagnose([tmp_path])


def test_terminal_wrapped_oom_message_is_joined(tmp_path: Path) -> None:
    # Verbatim from vllm-project/vllm#26863: the terminal wrapped "this proce|ss has" mid-word.
    p = tmp_path / "wrapped.log"
    p.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 232.00 MiB. GPU 0 has a total capacity of "
        "23.57 GiB of which 154.25 MiB is free. Including non-PyTorch memory, this proce\n"
        "ss has 23.40 GiB memory in use. Of the allocated memory 22.88 GiB is allocated by PyTorch, and 188.29 MiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
    )
    e = diagnose([p]).events_of("cuda_oom")[0]
    assert e.data["this_process_mib"] == round(23.40 * 1024, 2)
    assert e.data["reserved_unallocated_mib"] == 188.29


@pytest.mark.parametrize(
    ("name", "encode"),
    [
        # A Windows redirect writes UTF-16LE, often without a BOM; a rotated log
        # (copytruncate while the server writes at its old offset) starts with a run of NULs.
        ("utf16le-no-bom", lambda t: t.encode("utf-16-le")),
        ("utf16-bom", lambda t: t.encode("utf-16")),
        ("utf16be-no-bom", lambda t: t.encode("utf-16-be")),
        ("nul-padded-head", lambda t: b"\x00" * 20000 + t.encode()),
        ("nul-padded-head-and-tail", lambda t: b"\x00" * 300 + t.encode() + b"\x00" * 4096),
        ("nul-padding-past-first-block", lambda t: b"\x00" * (BLOCK + 10) + t.encode()),
    ],
)
def test_utf16_and_nul_padded_logs_are_read(tmp_path: Path, name: str, encode) -> None:
    src = FIX / "16_vllm_llama3.2-11b-vision-tp2_oom-mm-profiling.log"
    want = diagnose([src])
    p = tmp_path / f"{name}.log"
    p.write_bytes(encode(src.read_text()))
    got = diagnose([p])
    assert (got.server, got.version, got.facts.tp_size) == (
        want.server,
        want.version,
        want.facts.tp_size,
    )
    assert [(e.kind, e.line, e.phase) for e in got.events] == [
        (e.kind, e.line, e.phase) for e in want.events
    ]
    assert got.files[0].notes, "the decoding or the skipped padding is said in a note"


def test_small_nul_padded_log_is_not_binary(tmp_path: Path) -> None:
    p = tmp_path / "small.log"
    p.write_bytes(SGL_OOM.encode() + b"\n" + b"\x00" * 64)
    assert diagnose([p]).events_of("cuda_oom")


def _candidates_by_hand(data: bytes) -> list[tuple[int, bytes]]:
    """(line number, line) of every line with an anchor, frames left out: the prefilter's contract,
    written the slow and obvious way."""
    from vramdoctor.diagnose.patterns import ANCHORS, MM_FRAME_ANCHORS

    out = []
    for i, line in enumerate(data.split(b"\n"), 1):
        if not any(a in line for a in ANCHORS):
            continue
        if b'File "' in line and not any(a in line for a in MM_FRAME_ANCHORS):
            continue
        out.append((i, line))
    return out


@pytest.mark.parametrize("engine", ["re2-binding", "re2-wrapper", "stdlib"])
def test_prefilter_finds_exactly_the_lines_with_an_anchor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """Every engine the reader can run on yields the same lines as a line-by-line scan: the real
    corpus, plus anchors on the first and the last line (no newline after it), CR line ends,
    adjacent candidate lines, two anchors on one line and frames with and without a vision file."""
    import re

    from vramdoctor.diagnose import reader

    if engine != "re2-binding":
        monkeypatch.setattr(reader, "_RE2_MATCH", None)
    if engine == "stdlib":
        monkeypatch.setattr(reader, "_PREFILTER", re.compile(reader._ANCHOR))
    corpus = b"".join(p.read_bytes() for p in sorted(FIX.glob("*.log")))
    edges = (
        b"KV cache memory: first line\r\n"
        b"plain\n"
        b"Using FlashAttention backend. and Memory profiling\n"
        b"server_args=ServerArgs(x=1)\n"
        b'  File "/srv/sglang/srt/mem_cache/memory_pool.py", line 3, in alloc\n'
        b'  File "/srv/models/qwen2_5_vl.py", line 9, in forward\n'
        b"\n"
        b"no anchor at all\n"
    )
    data = edges + corpus + b"\nlast line: out of memory"
    p = tmp_path / "mixed.log"
    p.write_bytes(data)
    st = ReadStats("mixed")
    got = [(h.lineno, h.text) for h in scan(p, st)]
    want = [(n, line.decode("utf-8", "replace")) for n, line in _candidates_by_hand(data)]
    assert got == want
    assert st.lines == data.count(b"\n") + 1 and st.candidates == len(want)


class _Remembers:
    """A consumer that knows every line it was shown once (each line's token is the line itself):
    what the reader's successor and chain memos are for. It records, in order, the lines it was
    asked about (with their numbers) and the lines of each chain applied at once (no number)."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.lines: list[tuple[int | None, bytes]] = []
        self.chains = 0

    def known(self, raw: bytes, lineno: int) -> object:
        self.lines.append((lineno, raw))
        if raw in self.seen:
            return raw
        self.seen.add(raw)
        return None

    def join(self, tokens: list[object]) -> object:
        return tuple(tokens)

    def apply(self, token: object) -> bool:
        assert isinstance(token, tuple)
        self.lines.extend((None, raw) for raw in token)
        self.chains += 1
        return True


@pytest.mark.parametrize("engine", ["re2-binding", "stdlib"])
def test_repeated_text_gives_the_same_lines_through_the_memos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """An error-dense log repeats its excerpts: the reader then finds the next candidate by comparing
    the text after a line with what followed it before, and applies a run of known lines at once.
    Every line a line-by-line scan finds is still seen, in order, with its number when it is asked
    about; repeats cross block boundaries, and a repeat with one byte changed is found again."""
    import re

    from vramdoctor.diagnose import reader

    if engine == "stdlib":
        monkeypatch.setattr(reader, "_RE2_MATCH", None)
        monkeypatch.setattr(reader, "_PREFILTER", re.compile(reader._ANCHOR))
    corpus = b"".join(p.read_bytes() for p in sorted(FIX.glob("*.log")))
    changed = corpus.replace(b"out of memory", b"out of mem0ry", 3)
    data = corpus * 8 + changed + corpus * 8 + b"last line: out of memory"
    assert len(data) > 2 * BLOCK
    p = tmp_path / "repeated.log"
    p.write_bytes(data)
    st = ReadStats("repeated")
    consumer = _Remembers()
    hits = [(h.lineno, h.text) for h in scan(p, st, consumer)]
    want = _candidates_by_hand(data)
    assert [raw for _n, raw in consumer.lines] == [line for _n, line in want]
    assert all(n is None or n == m for (n, _), (m, _) in zip(consumer.lines, want, strict=True))
    assert consumer.chains > 0, "repeated runs of known lines are applied at once"
    first = {}
    for n, line in want:
        first.setdefault(line, n)
    assert hits == [(n, line.decode("utf-8", "replace")) for line, n in first.items()]
    assert st.lines == data.count(b"\n") + 1 and st.candidates == len(want)


@pytest.mark.parametrize("engine", ["re2-set", "substrings"])
def test_gates_passed_are_each_gates_own_test(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """The one-pass selection of gates (RE2's Set, or one substring test per fragment) gives, for every
    line of the corpus and lines built to hit the edges (a fragment inside another, the logo's block
    glyph, invalid text), exactly the gates whose own `passes` is true, in table order."""
    from vramdoctor.diagnose import vocabulary

    if engine == "substrings":
        monkeypatch.setattr(vocabulary, "_FRAGMENTS", None)
    lines = [
        line
        for p in sorted(FIX.rglob("*.log"))
        for line in p.read_text("utf-8", "replace").splitlines()
    ]
    lines += [
        "Memory access fault by GPU node-2",
        "\u2588\u2588 model   Qwen/Qwen2-VL",
        "IPC handle IPC transport",
        "broken \udcff surrogate: out of memory",
        "",
    ]
    for t in lines:
        want = [i for i, g in enumerate(vocabulary.GATES) if g.passes(t)]
        assert vocabulary.passed(t) == want, t
