"""Logs in, a `Diagnosis` out: read every input, merge what they say, run the rules.

Several inputs are one server (one log per TP rank, a launcher log plus worker logs): facts
merge by priority across files, events keep their file and line.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vramdoctor.diagnose import marks, tail
from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.extract import KINDS, FileExtractor
from vramdoctor.diagnose.findings import (
    ARGS,
    INFERRED,
    RUNTIME,
    SEVERITY_RANK,
    Diagnosis,
    Evidence,
    Facts,
    FileSummary,
    LogEvent,
)
from vramdoctor.diagnose.normalize import clean
from vramdoctor.diagnose.reader import ReadStats, display_name, scan
from vramdoctor.errors import InputError
from vramdoctor.redact import redact_text

_FACT_FIELDS = set(Facts.__dataclass_fields__) - {"evidence"}


def extract_file(path: str | Path) -> tuple[FileExtractor, ReadStats]:
    """Stream one input through the extractor."""
    name = display_name(path)
    stats = ReadStats(name)
    ex = FileExtractor(name)
    for hit in scan(path, stats, ex):
        ex.feed(hit)
    _sniff(ex, stats.head)
    tail.read(ex, stats.tail, stats.lines)
    if not ex.events:
        _unread_memory_line(ex, stats.head)
    return ex, stats


def _unread_memory_line(ex: FileExtractor, head: bytes) -> None:
    """The safety net: a log whose lines gave no event but hold a memory failure in a
    wording diagnose does not read ("out of memory", "insufficient memory", ...) gets one
    `memory_error_unread` event quoting that line, so it is never refused as "not a server log" nor
    reported healthy. The line must carry a log's mark (P.LOG_LINE_MARK: an exception name, a level,
    a time, an errno): prose about memory is not a log. Request echoes (user text) are left out.
    Only the first MiB is searched (the first occurrence of each wording)."""
    low = head.lower()
    if not any(k in low for k in P.ANY_MEMORY_FAILURE):
        return  # (the common case; request echoes are only stripped when it matters)
    text = P.without_echo_lines(head)
    low = text.lower()  # (ASCII lowering keeps every byte offset)
    hits = [(i, k) for k in P.ANY_MEMORY_FAILURE if (i := low.find(k)) >= 0]
    if not hits:
        return
    for pos, key in sorted(hits):
        start = text.rfind(b"\n", 0, pos) + 1
        end = text.find(b"\n", pos + len(key))
        raw = text[start : end if end >= 0 else len(text)]
        if P.LOG_LINE_MARK.search(raw):
            break  # a log's line; prose about memory ("out of memory after N requests") is not
    else:
        return
    line = raw.decode("utf-8", "replace")
    # the line number in the file: head is the file's first MiB, less any request-echo lines
    lineno = (
        head.count(b"\n", 0, head.find(line.encode("utf-8", "replace")[:200]) if line else 0) + 1
    )
    ex.add_event(
        LogEvent(
            "memory_error_unread",
            ex.name,
            lineno,
            ex.cut(clean(line).text.strip()),
            None,
            {"matched": text[pos : pos + len(key)].decode("utf-8", "replace")},
        )
    )


OTHER_KINDS = KINDS  # marks.py's marks (SGLang's and vLLM's add to their own sniff below)
# a platform mark's priority (marks.PLATFORM_MARKS) as a fact priority: a line that states it beats a path
PLATFORM_PRIO = {3: RUNTIME, 2: ARGS, 1: INFERRED}

# facts that say where the server ran, not how it was set up (an excerpt with only these still lacks the start-up lines)
CONTEXT_FACTS = ("platform",)

PREFIX_LINES_RECOGNISED = (
    3  # lines with a server's own process/rank prefix that make a file its log
)


def _sniff(ex: FileExtractor, head: bytes) -> None:
    """Weak votes from the first MiB: package paths and names in tracebacks and banners, and the
    servers' own line prefixes (vLLM's process tags, SGLang's rank tags). Request-echo lines are
    left out: what a logged prompt quotes is user text."""
    head = P.without_echo_lines(head)
    low = head.lower()
    ex.votes["sglang"] += min(20, low.count(b"sglang"))
    ex.votes["vllm"] += min(20, low.count(b"/vllm/") + low.count(b"vllm "))
    vllm_lines = sum(1 for _ in itertools.islice(P.VLLM_PREFIX_SNIFF.finditer(head), 50))
    # the ranks of every prefix too (lines no pattern needs are never fed); a log repeats a few
    # distinct tags thousands of times, so each distinct one is read once
    tags = P.SGL_PREFIX_SNIFF.findall(head)
    for tag in set(tags):
        for kind, rank in P.SGL_RANKS.findall(tag.decode("ascii", "replace")):
            ex.ranks.setdefault(kind, set()).add(int(rank))
    sglang_lines = min(len(tags), 50)
    ex.votes["vllm"] += min(20, vllm_lines)
    ex.votes["sglang"] += min(20, sglang_lines)
    ex.prefix_lines = max(vllm_lines, sglang_lines)
    sgl_own = sum(1 for _ in itertools.islice(P.SGL_OWN_SNIFF.finditer(head), 20))
    vllm_own = sum(1 for _ in itertools.islice(P.VLLM_OWN_SNIFF.finditer(head), 20))
    ex.votes["sglang"] += sgl_own
    ex.votes["vllm"] += vllm_own
    ex.own_marks = max(sgl_own, vllm_own)
    # the other servers' own marks (and vLLM's bare logger prefix, its forks): marks.py
    for kind in OTHER_KINDS:
        n, variants = marks.count(head, kind)
        if n:
            ex.votes[kind] = ex.votes.get(kind, 0) + n
            ex.own_marks = max(ex.own_marks, n)
            for name, k in variants.items():
                ex.variants[name] = ex.variants.get(name, 0) + k
    if (found := marks.platform_in(head)) is not None:
        name, prio, shown = found
        lineno, text = _line_at(head, shown)
        ex.put("platform", name, PLATFORM_PRIO[prio], Evidence(ex.name, lineno, ex.cut(text)))
    # (tag, pid) pairs, each distinct one once and in order: the first tag seen names a pid
    for raw_tag, pid in dict.fromkeys(P.PROC_PID_SNIFF.findall(head)):
        if len(ex.pids) >= 1024:
            break
        tag = raw_tag.decode("ascii", "replace")
        ex.pids.setdefault(int(pid), tag)
        for k, v, w in P.VLLM_PROC_RANKS.findall("(" + tag):
            ex.ranks.setdefault(k or "WORLD", set()).add(int(v or w))


def _line_at(head: bytes, shown: bytes) -> tuple[int, str]:
    """(line number from 1, the cleaned line) of the first line of `head` holding `shown`."""
    i = max(head.find(shown), 0)
    start = head.rfind(b"\n", 0, i) + 1
    end = head.find(b"\n", i)
    raw = head[start : end if end >= 0 else len(head)].decode("utf-8", "replace")
    return head.count(b"\n", 0, start) + 1, clean(raw).text


def _server(votes: dict[str, int]) -> str | None:
    """The kind with the most votes (SGLang before vLLM on a tie, as before; then kind order). A kind
    that embeds another (Ollama runs llama.cpp) takes that kind's votes once it has its own."""
    votes = _folded(votes)
    best = max(KINDS, key=lambda k: (votes.get(k, 0), -KINDS.index(k)))
    return best if votes.get(best, 0) > 0 else None


def _folded(votes: dict[str, int]) -> dict[str, int]:
    out = dict(votes)
    for kind in KINDS:
        for inner in marks.marks_of(kind).embeds:
            if out.get(kind, 0) > 0 and out.get(inner, 0) > 0:
                out[kind] += out[inner]
                out[inner] = 0
    return out


CLEAR_VOTES = (
    5  # a file this many votes for one server, twice the other's, is clearly that server's
)


def _clearly(votes: dict[str, int], server: str) -> bool:
    votes = _folded(votes)
    other = max((n for k, n in votes.items() if k != server), default=0)
    return votes.get(server, 0) >= CLEAR_VOTES and votes.get(server, 0) > 2 * other


def _only(votes: dict[str, int], server: str) -> bool:
    """Every vote of the file is for `server` (a vLLM traceback excerpt: its package paths, no
    SGLang mark at all). Such a file is that server's when logs are split by server, however few
    its votes; a file with no vote (a bare torch traceback) belongs to neither."""
    votes = _folded(votes)
    return votes.get(server, 0) > 0 and all(n == 0 for k, n in votes.items() if k != server)


def _merge_facts(exs: Sequence[FileExtractor]) -> tuple[Facts, dict[str, Any]]:
    best: dict[str, tuple[float, Any, Evidence]] = {}
    for ex in exs:
        for name, (prio, value, ev) in ex.facts.items():
            cur = best.get(name)
            if cur is None or prio > cur[0]:
                best[name] = (prio, value, ev)
    facts = Facts()
    extra: dict[str, Any] = {}
    for name, (_prio, value, ev) in best.items():
        if name in _FACT_FIELDS:
            setattr(facts, name, value)
            if name != "server_args":
                facts.evidence[name] = ev
        else:
            extra[name] = value
    return facts, extra


def _tp_from_ranks(
    exs: Sequence[FileExtractor], pp_size: int | None
) -> tuple[int, bool, str] | None:
    """A lower bound of the TP size from the rank tags seen: (bound, ranks 0..bound-1 all seen, how).

    A log shows the ranks that printed something, so the highest TP rank seen + 1 is a lower bound
    (SGLang "[... DP0 TP7]", vLLM "(Worker_TP3 pid=...)"). vLLM's "(VllmWorker rank=N pid=...)" is a
    world rank (TP x PP): it bounds TP only without pipeline parallelism.
    """
    tp: set[int] = set()
    world: set[int] = set()
    for ex in exs:
        tp |= ex.ranks.get("TP", set())
        world |= ex.ranks.get("WORLD", set())
    if tp and max(tp) >= 1:
        n = max(tp) + 1
        whole = tp == set(range(n))
        seen = _ranks_said(tp)
        return n, whole, f"TP {seen} in the rank tags, so tp >= {n}"
    if world and max(world) >= 1 and (pp_size or 1) == 1:
        n = max(world) + 1
        assume = "" if pp_size == 1 else ", assuming no pipeline parallelism"
        whole = world == set(range(n))
        return (
            n,
            whole,
            (
                f"vLLM worker {_ranks_said(world)} in the process tags, so world size >= {n}"
                f" (TP x PP; tp >= {n}{assume})"
            ),
        )
    return None


def _ranks_said(ranks: set[int]) -> str:
    """Exactly the ranks that appeared: 'rank 7 appears', 'ranks 0..7 appear', 'ranks 0, 2, 7 appear'."""
    r = sorted(ranks)
    if len(r) == 1:
        return f"rank {r[0]} appears"
    if r == list(range(r[0], r[-1] + 1)) and len(r) > 2:
        return f"ranks {r[0]}..{r[-1]} appear"
    shown = ", ".join(str(x) for x in r[:12]) + (", ..." if len(r) > 12 else "")
    return f"ranks {shown} appear"


def _multimodal(facts: Facts, exs: Sequence[FileExtractor]) -> tuple[bool | None, Evidence | None]:
    """True on a multimodal sign, False only when the log shows the server serving text only, None when
    the log cannot tell.

    True: a multimodal line or frame the server printed (SGLang's multimodal mem-fraction reduction,
    vLLM's multi-modal profile run, an encoder frame, transformers' image-processor warning, vLLM's
    `limit_mm_per_prompt` with a non-zero count in its argument dump or the pasted command), a
    multimodal architecture class, a vision model file in the traceback, a name only multimodal
    releases carry. False: SGLang turned multimodality off ("Multimodal is disabled for gemma3",
    `enable_multimodal=False`), or a text-only architecture class the log prints
    (`type=LlamaForCausalLM`, `Resolved architecture: Qwen2ForCausalLM`), and last a text model's
    own name (TEXT_NAME), read only when no multimodal sign is found and the name is not one of the
    vision releases of a text family (MM_NAME: Mistral-Small-3.1, gemma-3n, Magistral-Small-2509).
    A language-model file in a traceback never says text-only (the VLMs run their language model in
    llama.py, qwen2.py).
    """
    for ex in exs:  # the server's own word that it serves text only outranks the rest
        if ex.mm_disabled is not None:
            return False, ex.mm_disabled
    for ex in exs:
        if ex.mm_evidence is not None:
            return True, ex.mm_evidence
    arch_ev = facts.evidence.get("architecture")
    if facts.architecture and P.is_mm_arch(facts.architecture):
        return True, arch_ev
    files = set().union(*(ex.model_files for ex in exs)) if exs else set()
    mm_files = sorted(f for f in files if P.MM_MODEL_FILE.search(f))
    if mm_files:
        return True, Evidence(exs[0].name, 0, f"traceback model file: models/{mm_files[0]}.py")
    if facts.architecture and (
        P.TEXT_ARCH.search(facts.architecture) or P.TEXT_CONDGEN.match(facts.architecture)
    ):  # the class the server runs outranks the name (a text-only conversion of a VLM checkpoint)
        return False, arch_ev
    return None, None


def _name_hint(facts: Facts) -> tuple[bool, str] | None:
    """What the model's name suggests about multimodality, when no line of the log says it
    (nothing is asserted from a name or a path: a hint, never the fact). MM_NAME names the vision
    releases of text families first (Mistral-Small-3.1, gemma-3n, Qwen2.5-VL); TEXT_NAME text families."""
    if not facts.model:
        return None
    if P.MM_NAME.search(facts.model):
        return (
            True,
            f"the model name {facts.model!r} is that of a multimodal release (a name, not a line of the log)",
        )
    if P.TEXT_NAME.search(facts.model):
        return (
            False,
            f"the model name {facts.model!r} is that of a text model family (a name, not a line of the log)",
        )
    return None


def _audio_only(facts: Facts) -> bool:
    """An audio model (Qwen2-Audio, Ultravox, Whisper, Voxtral): multimodal without an image processor."""
    if facts.architecture:
        return bool(P.AUDIO_ONLY_ARCH.search(facts.architecture))
    return bool(facts.model and P.AUDIO_ONLY_NAME.search(facts.model))


def _fast_processor(
    server: str | None, facts: Facts, exs: Sequence[FileExtractor]
) -> tuple[bool | None, Evidence | None]:
    """Whether SGLang's fast (GPU) image processor is in use: True, False, or None when not shown.

    False on transformers' "Using a slow image processor" warning, on `--image-processor-backend pil` /
    `disable_fast_image_processor=True`, and when the log shows the server serving text only (a
    text-only architecture, multimodality turned off): no image processor runs then. Never False
    because multimodality is merely unknown. True on `image_processor_backend='torchvision'`, SGLang's
    "does not have a slow version. Automatically use fast version" line, or (SGLang up to 0.5.17, whose
    dump has no `image_processor_backend`) `disable_fast_image_processor=False`, the flag that then
    asked transformers for the fast class. `image_processor_backend='auto'` (0.5.18+, the default)
    proves nothing: SGLang passes no backend and transformers picks one (sglang
    utils/hf_transformers/processor.py `_apply_image_processor_backend` leaves 'auto' alone), fast or
    slow by the transformers version and torchvision. Audio-only models have no image processor: None.
    """
    for ex in exs:
        if ex.slow_processor is not None:
            return False, ex.slow_processor
    off = _processor_turned_off(server, facts, exs)
    if off is not None:  # the flag says no fast processor runs, whatever the model is
        return False, off
    if facts.multimodal is False:
        # only real evidence makes multimodal False (a text-only architecture, multimodality off)
        return False, facts.evidence.get("multimodal")
    args = facts.server_args or {}
    args_ev = None
    for ex in exs:
        if "server_args" in ex.facts:
            args_ev = ex.facts["server_args"][2]
            break
    if server != "sglang" or facts.multimodal is not True or _audio_only(facts):
        return None, None

    def quote(key: str, value: object) -> Evidence | None:
        if args_ev is None:
            return None
        return Evidence(args_ev.file, args_ev.line, f"server_args=...{key}={value!r}...")

    fast_only = next((ex.fast_only_processor for ex in exs if ex.fast_only_processor), None)
    cmd: dict[str, object] = {}
    for ex in exs:
        cmd.update(ex.cmd_args)
    if "image_processor_backend" not in args and "disable_fast_image_processor" not in args:
        cmd_ev = next(
            (ex.facts["model"][2] for ex in exs if ex.cmd_args and "model" in ex.facts), None
        )
        if cmd.get("disable_fast_image_processor"):
            return False, cmd_ev
        if "image_processor_backend" in cmd:
            chosen = str(cmd["image_processor_backend"]).lower()
            if chosen != "auto":
                return chosen != "pil", cmd_ev
            return (True, fast_only) if fast_only is not None else (None, None)
    flag = args.get("disable_fast_image_processor")
    if flag is True:
        return False, quote("disable_fast_image_processor", flag)
    backend = args.get("image_processor_backend")
    if backend is not None:
        chosen = str(backend).lower()
        if chosen != "auto":
            return chosen != "pil", quote("image_processor_backend", backend)
        return (True, fast_only) if fast_only is not None else (None, None)
    if flag is False:
        return True, quote("disable_fast_image_processor", flag)
    if fast_only is not None:
        return True, fast_only
    return None, None


def _processor_turned_off(
    server: str | None, facts: Facts, exs: Sequence[FileExtractor]
) -> Evidence | None:
    """SGLang's own flag turning the fast image processor off (disable_fast_image_processor=True,
    image_processor_backend='pil', in the dump or the pasted command): the line that says so, or None."""
    if server != "sglang":
        return None
    args = facts.server_args or {}
    for ex in exs:
        if "server_args" in ex.facts:
            e = ex.facts["server_args"][2]
            if args.get("disable_fast_image_processor") is True:
                return Evidence(
                    e.file, e.line, "server_args=...disable_fast_image_processor=True..."
                )
            if str(args.get("image_processor_backend", "")).lower() == "pil":
                return Evidence(e.file, e.line, "server_args=...image_processor_backend='pil'...")
    if "disable_fast_image_processor" in args or "image_processor_backend" in args:
        return None  # the dump says what runs; the command line is what was asked
    for ex in exs:
        cmd = ex.cmd_args
        if (
            cmd.get("disable_fast_image_processor")
            or str(cmd.get("image_processor_backend", "")).lower() == "pil"
        ):
            return ex.facts["model"][2] if "model" in ex.facts else None
    return None


def _path_key(path: str | Path) -> str:
    """One key per file, however it is spelled (./a.log, a.log, a symlink to it); stdin is '-'."""
    text = str(path)
    return text if text == "-" else os.path.realpath(text)


def diagnose(paths: Sequence[str | Path]) -> Diagnosis:
    """Read, merge and evaluate.

    Files of one server merge their facts; files of different servers (an SGLang log and a vLLM log
    given together) are never merged: each server's files are diagnosed as their own group
    (`Diagnosis.groups`), and the top level only gathers their events and findings (server None).

    An input that cannot be read (missing, empty, binary, a directory) is listed in `files` with the
    reason in its notes while the others are diagnosed; InputError is raised only when no input can be
    read. The same file given twice is read once (a note says so).
    """
    exs, summaries, errors = _read_inputs(paths)
    if errors and len(errors) == len(summaries):
        raise errors[0]  # nothing could be read: the first reason, exit 2
    servers = _split_servers(exs, summaries)
    secrets = set().union(*(ex.secrets for ex in exs)) if exs else set()
    if len(servers) > 1:
        return _diagnose_by_server(exs, summaries, servers, secrets)
    used = [ex for ex, fs in zip(exs, summaries, strict=True) if fs.recognised]
    d = _diagnose_group(used, summaries, None)
    _redact(d, secrets)
    return d


def _read_inputs(
    paths: Sequence[str | Path],
) -> tuple[list[FileExtractor], list[FileSummary], list[InputError]]:
    """(extractors, summaries, errors) of the inputs: one extractor and summary per distinct file."""
    exs: list[FileExtractor] = []
    summaries: list[FileSummary] = []
    errors: list[InputError] = []
    seen: dict[str, FileSummary] = {}
    for path in paths:
        key = _path_key(path)
        if key in seen:  # the same file again: its events must not count twice
            again = "given more than once on the command line: read once"
            if again not in seen[key].notes:
                seen[key].notes.append(again)
            continue
        try:
            ex, st = extract_file(path)
        except InputError as exc:
            errors.append(exc)
            name = display_name(path)
            reason = str(exc).removeprefix(f"{name}: ")
            fs = FileSummary(name, 0, 0, None, False, [f"not read: {reason}"])
            exs.append(FileExtractor(name))
            summaries.append(fs)
            seen[key] = fs
            continue
        exs.append(ex)
        summaries.append(_file_summary(ex, st))
        seen[key] = summaries[-1]
    return exs, summaries, errors


def _file_summary(ex: FileExtractor, st: ReadStats) -> FileSummary:
    """The summary of one file read: whether it is a server's log, whose, and its notes."""
    recognised = bool(
        ex.facts
        or ex.events
        or ex.version
        or ex.slow_processor
        or ex.prefix_lines >= PREFIX_LINES_RECOGNISED
        or ex.own_marks
    )
    server = _server(ex.votes) if recognised else None
    notes = list(st.notes)
    # what the excerpt lacks, said only where it is so (never a missing error message claimed
    # on a log that has one, nor on a healthy log): the error message only when a crash or a
    # cut traceback shows one was due; the settings only when no setting was read (nor a command)
    failure_lines = any(e.kind not in ("server_crash", "traceback_cut") for e in ex.events)
    crashed = [e for e in ex.events if e.kind in ("server_crash", "traceback_cut")]
    lacks = []
    if (
        recognised
        and not failure_lines
        and crashed
        and not any(e.data.get("error") for e in crashed)
    ):
        lacks.append("the error message after the traceback")
    if (
        recognised
        and not failure_lines
        and not (any(k not in CONTEXT_FACTS for k in ex.facts) or ex.version or ex.cmd_args)
    ):
        lacks.append("the start-up lines with settings and memory figures")
    if lacks:
        notes.append(
            "an excerpt recognised by the server's own marks (traceback paths, crash lines, argument "
            "names, rank prefixes); it lacks the lines a diagnosis needs: " + ", ".join(lacks)
        )
    return FileSummary(st.name, st.bytes_read, st.lines, server, recognised, notes)


def _split_servers(exs: list[FileExtractor], summaries: list[FileSummary]) -> set[str]:
    """The servers whose files are diagnosed apart (more than one: the inputs are split by server)."""
    # Files are split by server only when each side has a file that is its server's: clearly (many
    # votes, twice the other's), or with votes for that server alone (a vLLM traceback excerpt with
    # vLLM package paths and no SGLang mark, given with an SGLang log). A file with mixed weak votes,
    # or none (a bare torch traceback), joins the others as before.
    return {
        fs.server
        for ex, fs in zip(exs, summaries, strict=True)
        if fs.recognised
        and fs.server
        and (_clearly(ex.votes, fs.server) or _only(ex.votes, fs.server))
    }


def _diagnose_by_server(
    exs: list[FileExtractor], summaries: list[FileSummary], servers: set[str], secrets: set[str]
) -> Diagnosis:
    """The diagnosis of inputs from several servers: one redacted group per server, gathered."""
    groups = []
    # files with no server mark at all (a bare torch traceback) cannot be given to either server:
    # they are diagnosed as a group of their own (server None) rather than dropped
    unmarked = any(fs.recognised and fs.server is None for fs in summaries)
    for srv in [*sorted(servers), *([None] if unmarked else [])]:
        pairs = [
            (ex, fs)
            for ex, fs in zip(exs, summaries, strict=True)
            if fs.recognised and fs.server == srv
        ]
        g = _diagnose_group([p[0] for p in pairs], [p[1] for p in pairs], srv)
        _redact(g, secrets)
        groups.append(g)
    events = [e for g in groups for e in g.events]
    counts: dict[str, int] = {}
    for g in groups:
        for k, n in g.event_counts.items():
            counts[k] = counts.get(k, 0) + n
    findings = sorted(
        (f for g in groups for f in g.findings), key=lambda f: (SEVERITY_RANK[f.severity], f.id)
    )
    return Diagnosis(summaries, None, None, Facts(), events, counts, findings, groups=groups)


def _diagnose_group(
    used: list[FileExtractor], summaries: list[FileSummary], server: str | None
) -> Diagnosis:
    """One server's files: merged facts, their events, the rules' findings (not yet redacted)."""
    if server is None and used:
        server = _group_server(used)
    facts, extra = _merge_facts(used)
    _tp_size(facts, extra, used)
    variant = _group_variant(used, server)
    if variant is not None:
        facts.variant = variant
    if facts.platform is None:
        # an OOM message that names HIP or the NPU says the platform too
        oom = next(
            (e for ex in used for e in ex.events if e.data.get("device") in ("HIP", "NPU")), None
        )
        if oom is not None:
            facts.platform = "rocm" if oom.data["device"] == "HIP" else "npu"
            facts.evidence["platform"] = oom.evidence
    mm, mm_ev = _multimodal(facts, used)
    facts.multimodal = mm
    if mm_ev is not None:
        facts.evidence["multimodal"] = mm_ev
    elif (hint := _name_hint(facts)) is not None:
        facts.hints["multimodal"] = {"value": hint[0], "rests_on": hint[1]}
    fast, fast_ev = _fast_processor(server, facts, used)
    facts.fast_image_processor = fast
    if fast_ev is not None:
        facts.evidence["fast_image_processor"] = fast_ev
    version = None
    version_ev = None
    for ex in used:
        if ex.version is not None:
            version, version_ev = ex.version
            break
    events, counts = _group_events(used, facts)
    d = Diagnosis(summaries, server, version, facts, events, counts, version_evidence=version_ev)
    from vramdoctor.diagnose.rules import evaluate

    d.findings = evaluate(d)
    return d


def _group_server(used: list[FileExtractor]) -> str | None:
    """The server the group's files vote for, all their votes added up."""
    votes: dict[str, int] = {}
    for ex in used:
        for k, n in ex.votes.items():
            votes[k] = votes.get(k, 0) + n
    return _server(votes)


def _tp_size(facts: Facts, extra: dict[str, Any], used: list[FileExtractor]) -> None:
    """None; sets the TP size (or its lower bound) from the world size or the ranks the logs show."""
    if facts.tp_size is not None:
        facts.tp_size_is_lower_bound = False
        return
    tp: int | None = None
    note = ""
    world = extra.get("world_size")
    if world:
        # vLLM's world size is TP x PP: it gives TP only when it is 1 or PP is known.
        if int(world) == 1:
            tp = 1
        elif facts.pp_size:
            tp = int(world) // facts.pp_size
        note = f"world size {world}" + (
            f" / pp_size {facts.pp_size}" if tp and int(world) > 1 else ""
        )
        facts.tp_size_is_lower_bound = False if tp is not None else None
    bound = _tp_from_ranks(used, facts.pp_size) if tp is None else None
    if bound is not None:
        facts.tp_size_at_least = bound[0]
        facts.evidence["tp_size_at_least"] = Evidence(used[0].name, 0, bound[2])
        if bound[1]:  # every rank below the highest one printed: the size itself, as a lower bound
            tp, note = bound[0], bound[2]
            facts.tp_size_is_lower_bound = True
    if tp is not None:
        facts.tp_size = tp
        facts.evidence["tp_size"] = Evidence(used[0].name, 0, note)


def _group_variant(used: list[FileExtractor], server: str | None) -> str | None:
    """The server variant (a fork) seen most often in the group's files, or None."""
    variants: dict[str, int] = {}
    for ex in used:
        for name, n in ex.variants.items():
            variants[name] = variants.get(name, 0) + n
    for name, _n in sorted(variants.items(), key=lambda kv: -kv[1]):
        if marks.variant_kind(name) == server:
            return name
    return None


def _group_events(used: list[FileExtractor], facts: Facts) -> tuple[list[LogEvent], dict[str, int]]:
    """(events, counts) of the group's files, each OOM's listed processes tagged with their rank."""
    pids: dict[int, str] = {}
    for ex in used:
        pids.update(ex.pids)
    owners = _oom_owners([e for ex in used for e in ex.events if e.kind == "cuda_oom"])
    events = []
    counts: dict[str, int] = {}
    for ex in used:
        for e in ex.events:
            if e.phase == "profiling" and facts.multimodal:
                e.phase = "mm_profiling"
            for proc in e.data.get("processes", ()):
                tag = pids.get(proc.get("pid"))
                if tag is not None:  # a pid the server's own process tags name: one of its ranks
                    proc["server_process"] = tag
                elif (own := owners.get(proc.get("pid"))) is not None and own[0] != e.data.get(
                    "gpu"
                ):
                    # the failing process of another GPU's OOM in this log: a sibling rank's context here
                    proc["server_process"] = f"the rank on GPU {own[0]}"
                    proc["server_process_evidence"] = own[1]
            events.append(e)
        for k, n in ex.event_counts.items():
            counts[k] = counts.get(k, 0) + n
    return events, counts


def _oom_owners(ooms: Sequence[Any]) -> dict[int, tuple[int, str]]:
    """pid -> (GPU, why) for each pid an OOM message of the log shows as the failing process of its
    GPU: the only listed process holding at least what PyTorch itself reserved there (allocated +
    reserved-unallocated, 2 % and 64 MiB of slack) in a message without "this process has X" (which
    names the failing process itself, making every listed pid another one), or the failing line's own
    process tag (`pid`). Such a pid is one of the server's ranks, so its CUDA context on another GPU is
    the server's own, not another program.
    """
    out: dict[int, tuple[int, str]] = {}
    for e in ooms:
        d = e.data
        gpu = d.get("gpu")
        if gpu is None:
            continue
        if isinstance(d.get("pid"), int):
            why = f"pid {d['pid']} is the failing process of the OOM on GPU {gpu} (line {e.line}), by its tag"
            out.setdefault(d["pid"], (gpu, why))
        alloc = d.get("allocated_mib")
        procs = [p for p in d.get("processes", ()) if p.get("mib") is not None]
        if alloc is None or not procs or d.get("this_process_mib") is not None:
            continue  # with "this process has X" the failing process is that one: listed pids are others
        own = alloc + (d.get("reserved_unallocated_mib") or 0.0)
        fits = [p for p in procs if p["mib"] >= own * 0.98 - 64]
        if len(fits) == 1:  # exactly one listed process can be the failing one
            big = fits[0]
            why = (
                f"GPU {gpu}'s OOM message (line {e.line}) shows pid {big['pid']} holding "
                f"{big['mib'] / 1024:.2f} GiB, the failing rank there"
            )
            out.setdefault(big["pid"], (gpu, why))
    return out


def _redact(d: Diagnosis, secrets: set[str]) -> None:
    """Blank secrets (API keys from argument dumps, bearer tokens, sk-... keys) in every text.

    vramdoctor.redact.redact_text does the work; a text repeated (the same OOM message on every
    rank, in an event and a finding's evidence) is redacted once.
    """
    done: dict[str, str] = {}

    def red(text: str) -> str:
        r = done.get(text)
        if r is None:
            r = done[text] = redact_text(text, secrets)
        return r

    def ev(e: Evidence | None) -> Evidence | None:
        return None if e is None else dataclasses.replace(e, text=red(e.text))

    d.facts.evidence = {k: ev(v) for k, v in d.facts.evidence.items()}  # type: ignore[misc]
    d.version_evidence = ev(d.version_evidence)
    for e in d.events:
        e.text = red(e.text)
    for f in d.findings:
        f.evidence = [ev(x) for x in f.evidence]  # type: ignore[misc]
        f.explanation = red(f.explanation)
        f.fix = red(f.fix)
    if d.facts.model:
        d.facts.model = red(d.facts.model)
