"""Read facts off one log's candidate lines (events: events.py, a mixin of this class).

One `FileExtractor` per input file is fed the reader's hits in order. Each handler is guarded
by a cheap substring test before its regex runs, so the cost is per candidate line, not per
pattern. Facts carry a priority: a runtime line ("Use triton backend") outranks the argument
dump it contradicts, an effective value ("Automatically reduce --mem-fraction-static to
0.630") outranks the configured one.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from vramdoctor import servers
from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.args import balanced_end, parse_dump
from vramdoctor.diagnose.cmdline import parse_command
from vramdoctor.diagnose.events import EventsMixin, autotune_choice, gib_text_to_mib
from vramdoctor.diagnose.findings import (
    ARGS,
    CMDLINE,
    EFFECTIVE,
    EVIDENCE_CHARS,
    INFERRED,
    MAX_EVENTS_PER_KIND,
    RUNTIME,
    Evidence,
    LogEvent,
)
from vramdoctor.diagnose.normalize import (
    CACHE_LINE_CHARS,
    CACHE_LINES,
    clean,
    is_continuation,
    short_line_memo,
    strip_noise,
)
from vramdoctor.diagnose.others import OthersMixin
from vramdoctor.diagnose.reader import Hit
from vramdoctor.diagnose.vocabulary import GATES, passed
from vramdoctor.redact import REDACTED, redact_tail, redact_text

# Argument names whose values are secrets (api_key, hf_token, admin_api_key, ssl_keyfile_password).
SECRET_ARG = re.compile(
    r"^(?:\w+_)?(?:api_key|token|password|passwd|secret|secret_key|access_key)$"
)

INERT_CHARS = 8 << 20  # characters of inert lines remembered (feed), at most
MAX_DUMP_CHARS = 2 << 20  # an argument dump longer than this is parsed as far as it goes
MAX_DUMPS = 8  # argument dumps parsed per file
WRAP_MIN_COLUMNS = 80  # a pasted command at least this wide may continue on terminal-wrapped rows

# Argument dumps and vLLM's engine-config line: long lines that name memory settings
# (gpu_memory_utilization=, mem_fraction_static=) but never report a memory event.

# Facts whose later value wins at equal priority (the last runtime line is the one in force).
LAST_WINS = {"attention_backend"}

# What a remembered line does again (FileExtractor.feed): votes and counts added, stores replayed
# (fact, value, priority, evidence text), and how many secrets were known when its text was blanked.
_Effect = tuple[
    tuple[tuple[str, int], ...],
    tuple[tuple[str, int], ...],
    tuple[tuple[str, Any, float, str], ...],
    int,
]
# Effects of a run of lines joined (FileExtractor.join): the memo's generation, votes, counts.
_Joined = tuple[int, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]


_VLLM_BACKEND_NAMES = {
    "flash attention": "FLASH_ATTN",
    "flashattention": "FLASH_ATTN",
    "flash_attn": "FLASH_ATTN",
    "xformers": "XFORMERS",
    "flashinfer": "FLASHINFER",
    "torch sdpa": "TORCH_SDPA",
    "torch_sdpa": "TORCH_SDPA",
    "rocmflashattention": "ROCM_FLASH",
    "rocm flash attention": "ROCM_FLASH",
    "triton": "TRITON_ATTN",
    "pallas": "PALLAS",
}


# The CUDA IPC pool line of each SGLang generation (facts.md): (pattern, group of the configured
# budget in MiB, group of the tokenizer worker count, total MiB the pools reserve or None).
# The last item: the oldest version that prints the line.
_IPC_POOL_LINES: tuple[
    tuple[re.Pattern[str], int, int, Callable[[re.Match[str]], float] | None, str], ...
] = (
    # 0.5.17+: "Using CUDA IPC ... reserving up to N MiB ... across W tokenizer worker(s)": N in total
    (P.IPC_USING_017, 1, 3, lambda m: float(m.group(1)), "0.5.17"),
    (
        P.IPC_POOL_016,
        5,
        4,
        lambda m: float(m.group(1)),
        "0.5.16",
    ),  # 0.5.16: "... reserve N MiB total ..."
    (
        P.IPC_POOL_015,
        2,
        3,
        lambda m: float(m.group(1)) * int(m.group(3)),
        "0.5.15",
    ),  # 0.5.15: per worker
)


# The server kinds diagnose reads (the registry's, less the OpenAI-compatible fallback, which prints no
# log of its own), in identification order: a tie goes to the first.
KINDS = tuple(k.name for k in servers.kinds() if not k.identity.fallback)


@dataclass
class FileExtractor(EventsMixin, OthersMixin):
    """Facts and events of one input file."""

    name: str
    facts: dict[str, tuple[float, Any, Evidence]] = field(default_factory=dict)
    events: list[LogEvent] = field(default_factory=list)
    event_counts: dict[str, int] = field(default_factory=dict)
    votes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    variants: dict[str, int] = field(default_factory=dict)  # a fork's or wrapper's marks ("LoRAX")
    gpu_buffers: dict[str, float] = field(
        default_factory=dict
    )  # llama.cpp model buffer MiB per GPU
    _stores: int = field(default=0, repr=False)  # facts stored so far (see feed)
    _inert_chars: int = field(default=0, repr=False)
    # lines whose handlers changed nothing but votes and capped counts, or only stored again a fact
    # whose last line wins: (votes, counts deltas, stores to replay, secrets known then) (feed)
    _inert: dict[bytes, _Effect] = field(default_factory=dict, repr=False)
    # pasted command lines remembered (key: the line and its command with its continuation rows):
    # votes and counts deltas, and the flags the command sets (feed)
    _commands: dict[
        bytes, tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...], dict[str, Any]]
    ] = field(default_factory=dict, repr=False)
    # the stores of the line being fed (name, value, priority, evidence), while feed records them
    _stored: list[tuple[str, Any, float, Evidence]] | None = field(default=None, repr=False)
    _forgotten: int = field(default=0, repr=False)  # times `_inert` was cleared (join's tokens)
    version: tuple[str, Evidence] | None = None
    ranks: dict[str, set[int]] = field(default_factory=dict)
    model_files: set[str] = field(default_factory=set)
    slow_processor: Evidence | None = None
    fast_only_processor: Evidence | None = None
    mm_evidence: Evidence | None = None
    # the server serves text only: SGLang "Multimodal is disabled for X" / enable_multimodal=False, vLLM's
    # "`limit_mm_per_prompt` is only supported for multimodal models" (it treats the model as text-only)
    mm_disabled: Evidence | None = None
    dumps_parsed: int = 0
    secrets: set[str] = field(default_factory=set)  # values to blank in every output
    cmd_args: dict[str, Any] = field(default_factory=dict)  # flags of a pasted launch command
    tracebacks_read: int = 0
    prefix_lines: int = 0  # lines of the first MiB with a server's own process/rank prefix
    own_marks: int = (
        0  # a server's own traceback paths / crash lines in the first MiB (no log line needed)
    )
    pids: dict[int, str] = field(default_factory=dict)  # pid -> the server's process tag naming it
    # redact_text results for the current secrets (the set only grows: its size names it)
    _redacted: dict[str, str] = field(default_factory=dict, repr=False)
    _redacted_for: int = field(default=0, repr=False)
    _tags_seen: set[str] = field(
        default_factory=set, repr=False
    )  # process-tag prefixes already read
    # lines whose rank tags and pid were already read: a repeated line adds nothing (bounded)
    _rank_lines: set[str] = field(default_factory=set, repr=False)

    # -- helpers -----------------------------------------------------------------------
    def ev(self, hit: Hit, text: str | None = None) -> Evidence:
        t = text if text is not None else clean(hit.text).text
        return Evidence(self.name, hit.lineno, self.cut(t))

    def cut(self, t: str) -> str:
        """`t` cut to EVIDENCE_CHARS, blanked first when secrets are known, so no partial
        secret survives the cut (a secret across the cut would no longer match it later)."""
        if self.secrets:
            t = self._redact(t)
        return t[:EVIDENCE_CHARS]

    def _redact(self, t: str) -> str:
        """redact_text with this file's secrets, memoised for repeated lines (bounded)."""
        if len(self.secrets) != self._redacted_for:
            self._redacted.clear()
            self._redacted_for = len(self.secrets)
        r = self._redacted.get(t)
        if r is None:
            r = redact_text(t, self.secrets)
            if len(t) <= CACHE_LINE_CHARS:
                if len(self._redacted) >= CACHE_LINES:
                    self._redacted.clear()
                self._redacted[t] = r
        return r

    def put(self, name: str, value: Any, prio: float, evidence: Evidence | Hit) -> None:
        """Keep `value` unless a value of higher priority is known; evidence built only then."""
        if value is None:
            return
        cur = self.facts.get(name)
        if cur is None or prio > cur[0] or (prio == cur[0] and name in LAST_WINS):
            ev = self.ev(evidence) if isinstance(evidence, Hit) else evidence
            self.facts[name] = (prio, value, ev)
            self._stores += 1
            if self._stored is not None:
                self._stored.append((name, value, prio, ev))

    def add_event(self, event: LogEvent) -> None:
        if self.secrets and len(event.text) >= EVIDENCE_CHARS:
            # cut before it was blanked: a known secret across the cut leaves its start
            event.text = redact_tail(event.text, self.secrets)
        n = self.event_counts.get(event.kind, 0)
        self.event_counts[event.kind] = n + 1
        if n < MAX_EVENTS_PER_KIND:
            self.events.append(event)

    # -- the dispatcher ----------------------------------------------------------------
    def feed(self, hit: Hit) -> None:
        """Run, in order, the handlers whose gates the line passes (see `dispatch`).

        A line whose handlers changed nothing but votes and the counts of events past their cap is
        remembered (`_inert`, bounded by the text it holds): the same text again has the same effect,
        so it is applied without running them (an error-dense log repeats its lines thousands of
        times). So is a line that only stored again a fact whose last line wins (the attention
        backend of "Using X backend", read off the text alone): the same store is replayed with the
        new line's number (`_REPLAYABLE`). A new fact forgets every remembered line: a handler that
        reads which facts are known may now act on a line that did nothing before. Every other state
        handlers read (caps, events kept once, the version, the dumps parsed) only ever turns an
        effect into none."""
        t = hit.text
        if len(t) > CACHE_LINE_CHARS:
            for step in dispatch(t):
                step(self, hit, t)
            return
        raw = hit.raw or t.encode()
        if self.skip_inert(raw, hit.lineno):
            return  # (the reader asks first: this is for a caller that feeds hits itself)
        steps = _dispatch_memo(
            t
        )  # (the memo called directly: dispatch's wrapper is one frame more)
        if not steps:
            self._remember(raw, len(t), (), (), ())  # no handler: the same text does nothing again
            return
        key = self._context_key(hit, t, raw, steps)
        if key is None:
            # what these do depends on the lines around (a dump continued on the next rows):
            # never remembered (a dump line past MAX_DUMPS is not read at all)
            for step in steps:
                step(self, hit, t)
            return
        command = FileExtractor._command in steps
        if key is not raw and self._replay_context(key, command):
            return  # (a line read with what it reads around it, seen before with the same)
        major, stores, facts = self._state(), self._stores, len(self.facts)
        votes0, counts0 = dict(self.votes), dict(self.event_counts)
        stored: list[tuple[str, Any, float, Evidence]] = []
        self._stored = stored
        try:
            for step in steps:
                step(self, hit, t)
        finally:
            self._stored = None
        if len(self.facts) != facts:
            # a new fact: a handler that reads which facts are known may now do something on a line
            # that did nothing before (SGLang's weights from the load lines); every other state a
            # handler reads only turns effects into none (caps, "once" events, the version)
            self._forget()
            return
        if self._state() != major:
            return
        replay: tuple[tuple[str, Any, float, str], ...] = ()
        if self._stores != stores:
            # stored again (an existing fact): replayable when the steps read the text alone and
            # every store's evidence is this line as read
            if not _REPLAYABLE.issuperset(steps) or any(
                ev.line != hit.lineno or ev.file != self.name for _n, _v, _p, ev in stored
            ):
                return
            replay = tuple((name, value, prio, ev.text) for name, value, prio, ev in stored)
        votes = tuple(
            (k, n - votes0.get(k, 0)) for k, n in self.votes.items() if n != votes0.get(k, 0)
        )
        counts = tuple(
            (k, n - counts0.get(k, 0))
            for k, n in self.event_counts.items()
            if n != counts0.get(k, 0)
        )
        if command:
            # a pasted command's flags set again (their values may have changed since: another
            # command in between): the update is replayed with the votes
            flags = _parse_command(key.split(b"\n", 1)[1].decode())[0]
            self._count_chars(len(key))
            self._commands[key] = (votes, counts, flags)
            return
        self._remember(key, len(t) if key is raw else len(key), votes, counts, replay)

    def _replay_context(self, key: bytes, command: bool) -> bool:
        """Apply the remembered effect of a line keyed with its context (see `_context_key`)."""
        if command:
            c = self._commands.get(key)
            if c is None:
                return False
            votes, counts, flags = c
            self.cmd_args.update(flags)
        else:
            effect = self._inert.get(key)
            if effect is None:
                return False
            votes, counts = effect[0], effect[1]
        for server, n in votes:
            self.votes[server] += n
        for kind, n in counts:
            self.event_counts[kind] += n
        return True

    def _context_key(self, hit: Hit, t: str, raw: bytes, steps: tuple[Step, ...]) -> bytes | None:
        """What a line's effect is a function of: its text (`raw`), or its text with what its steps
        read around it (a pasted command's continuation rows, whether a Triton limit sits in torch
        inductor's autotune message), after a newline no line holds. None: not to be remembered."""
        if FileExtractor._args in steps and self.dumps_parsed < MAX_DUMPS:
            return None  # (the dump's parse reads the rows it continues on: read once, not again)
        oor = "out of resource" in t
        if FileExtractor._command in steps:
            if oor:
                return None
            return raw + b"\n" + command_text(hit, t).encode()
        if oor:
            return raw + (b"\n\x01" if autotune_choice(hit) else b"\n\x00")
        return raw

    def _remember(
        self,
        raw: bytes,
        chars: int,
        votes: tuple[tuple[str, int], ...],
        counts: tuple[tuple[str, int], ...],
        replay: tuple[tuple[str, Any, float, str], ...],
    ) -> None:
        """Remember a line's effect (see `feed`), within INERT_CHARS of text: memory stays flat."""
        self._count_chars(chars)
        self._inert[raw] = (votes, counts, replay, len(self.secrets))

    def _count_chars(self, chars: int) -> None:
        if self._inert_chars + chars > INERT_CHARS:
            self._forget()
        self._inert_chars += chars

    def _forget(self) -> None:
        self._inert.clear()
        self._commands.clear()
        self._inert_chars = 0
        self._forgotten += 1

    def skip_inert(self, raw: bytes, lineno: int = 0) -> bool:
        """Whether a line is remembered (see `feed`); if so its known effect has been applied."""
        return self.known(raw, lineno) is not None

    # -- what the reader asks (reader.Known) ---------------------------------------------
    def known(self, raw: bytes, lineno: int) -> object:
        """The reader's question for each candidate line (its raw bytes and number) before it decodes
        it: a line remembered (see `feed`) has its known effect applied here, and is not read again.
        None: not remembered; True: applied (a stored fact replayed with this line's number); else
        the line's effect, which `join` can merge with its neighbours'."""
        memo = self._inert.get(raw)
        if memo is None:
            return None
        votes, counts, replay, secrets = memo
        if replay:
            if secrets != len(self.secrets):
                return None  # (the evidence text was blanked for fewer secrets: read it again)
            for name, value, prio, text in replay:
                self.put(name, value, prio, Evidence(self.name, lineno, text))
        for server, n in votes:
            self.votes[server] += n
        for kind, n in counts:
            self.event_counts[kind] += n
        return True if replay else memo

    def join(self, tokens: list[object]) -> object:
        """The effect of a run of remembered lines (votes and counts added up), valid while the memo
        that gave them is not forgotten (`_forgotten`)."""
        votes: dict[str, int] = {}
        counts: dict[str, int] = {}
        for token in tokens:
            v, c, _replay, _secrets = cast(_Effect, token)  # (known()'s effects)
            for k, n in v:
                votes[k] = votes.get(k, 0) + n
            for k, n in c:
                counts[k] = counts.get(k, 0) + n
        return (self._forgotten, tuple(votes.items()), tuple(counts.items()))

    def apply(self, token: object) -> bool:
        """Apply a joined effect again; False when the memo was forgotten since it was joined."""
        forgotten, votes, counts = cast(_Joined, token)  # (join's tokens)
        if forgotten != self._forgotten:
            return False
        for server, n in votes:
            self.votes[server] += n
        for kind, n in counts:
            self.event_counts[kind] += n
        return True

    def _state(self) -> tuple[object, ...]:
        """What handlers read or keep, besides votes and capped counts (see `feed`)."""
        return (
            len(self.facts),
            len(self.events),
            self.version is None,
            self.mm_evidence is None,
            self.slow_processor is None,
            self.fast_only_processor is None,
            self.mm_disabled is None,
            self.dumps_parsed,
            self.tracebacks_read,
            len(self.cmd_args),
            len(self.secrets),
            len(self.model_files),
            len(self.pids),
            sum(len(r) for r in self.ranks.values()),
            len(self.gpu_buffers),
            len(self.variants),
        )

    def _echo_rank_tags(self, hit: Hit, t: str) -> None:
        """The rank/process tags of a request-echo line, read off its prefix only (the rest is user text)."""
        self._rank_tags(hit, t[: P.request_echo(t)])

    def _rank_tags(self, hit: Hit, t: str) -> None:
        if t in self._rank_lines:
            return
        if len(t) <= CACHE_LINE_CHARS:
            if len(self._rank_lines) >= 4096:
                self._rank_lines.clear()
            self._rank_lines.add(t)
        for kind, rank in clean(t).ranks:
            self.ranks.setdefault(kind, set()).add(rank)
        i = t.find(" pid=", 0, 80)
        if i >= 0 and len(self.pids) < 1024:
            end = t.find(")", i, i + 48) + 1  # (Ray's tag adds ", ip=10.0.16.95")
            if end and t.startswith(" (", end) and (j := t.find(" pid=", end, end + 60)) >= 0:
                end = (
                    t.find(")", j, j + 48) + 1 or end
                )  # nested: "(EngineCore_0 pid=7) (VllmWorker TP0 pid=9)"
            tag = t[:end]  # the line's prefix up to its process tag(s): one per process
            if tag and tag not in self._tags_seen:
                if (
                    len(self._tags_seen) >= 4096
                ):  # a varying wrapper (timestamps) before the tag: stay bounded
                    self._tags_seen.clear()
                self._tags_seen.add(tag)
                for m in P.PROC_PID.finditer(tag):
                    self.pids.setdefault(int(m.group(2)), m.group(1))

    def _mm_frame(self, hit: Hit, t: str) -> None:
        """A traceback frame only a multimodal model runs (a vision model file, the encoder's call):
        the log is multimodal, with or without the traceback's header above it."""
        if self.mm_evidence is not None:
            return
        s = clean(t).text
        m = P.MODEL_FILE.search(s)
        if (m and P.MM_MODEL_FILE.search(m.group(1))) or P.MM_MODEL_FRAMES.search(s):
            self.mm_evidence = self.ev(hit, "traceback frame: " + s[:200])

    def _logo_model(self, hit: Hit, t: str) -> None:
        m = P.VLLM_LOGO_MODEL.search(strip_noise(t))
        if m:
            self.put("model", m.group(1), RUNTIME, hit)
            self.votes["vllm"] += 5

    def _slow_processor(self, hit: Hit, t: str) -> None:
        self.slow_processor = self.slow_processor or self.ev(hit)
        self.mm_evidence = self.mm_evidence or self.ev(hit)

    def _world_size(self, hit: Hit, t: str) -> None:
        m = P.VLLM_TP_RANK.search(t)
        if m:
            self.put("world_size", int(m.group(1)), INFERRED, hit)

    def _blocks(self, hit: Hit, t: str) -> None:
        m = P.VLLM_BLOCKS.search(t)
        if m:
            self.put("gpu_blocks", int(m.group(1)), RUNTIME, hit)
            self.votes["vllm"] += 2

    def _weights(self, hit: Hit, t: str) -> None:
        m = P.VLLM_WEIGHTS.search(t)
        if m:
            self.put("weights_mib", gib_text_to_mib(m.group(1)), RUNTIME, hit)
        m = P.VLLM_REQUESTED.search(t)
        if m:
            self.votes["vllm"] += 3
            self.put("gpu_memory_utilization", float(m.group(1)), RUNTIME, hit)

    def _architecture(self, hit: Hit, t: str) -> None:
        m = P.VLLM_ARCH.search(t) or P.VLLM_ARCH_V1.search(t)
        if m:
            self.put("architecture", m.group(1), RUNTIME, hit)

    def _load_model(self, hit: Hit, t: str) -> None:
        m = P.VLLM_LOAD_MODEL.search(t)
        if m:
            self.put("model", m.group(1), INFERRED + 1, hit)
            self.votes["vllm"] += 3

    def _swap(self, hit: Hit, t: str) -> None:
        m = P.VLLM_SWAP.search(t)
        if m:
            self.votes["vllm"] += 3
            self.put("swap_space_mib", gib_text_to_mib(m.group(1)), RUNTIME, hit)
            self.put("host_memory_mib", gib_text_to_mib(m.group(2)), RUNTIME, hit)

    def _long_context(self, hit: Hit, t: str) -> None:
        m = P.VLLM_LONG_CTX.search(t)
        if m:
            self.votes["vllm"] += 3
            self.put("long_context_length", int(m.group(1)), RUNTIME, hit)

    def _ready(self, hit: Hit, t: str) -> None:
        self.votes["sglang"] += 5

    # -- arguments ---------------------------------------------------------------------
    def _dump(self, hit: Hit, t: str, opener_at: int) -> dict[str, Any]:
        text = t
        if balanced_end(text, opener_at, text[opener_at]) < 0:
            for nxt in hit.following(400):
                piece = strip_noise(nxt)
                text += piece  # a terminal wrap splits anywhere: join as is
                if len(text) > MAX_DUMP_CHARS:
                    break
                # The dump can only close on a closing bracket of the new piece: rescanning
                # the whole text after every piece without one made wrapped dumps quadratic.
                if ("]" in piece or ")" in piece or "}" in piece) and balanced_end(
                    text, opener_at, text[opener_at]
                ) > 0:
                    break
        args, _complete = parse_dump(text, opener_at)
        for key, value in args.items():
            if not SECRET_ARG.match(key):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            found = [v for v in values if isinstance(v, str) and v and v != REDACTED]
            if not found:  # api_key=None, hf_token=True: settings, not secrets
                continue
            self.secrets.update(v for v in found if len(v) >= 4)
            args[key] = REDACTED
        return args

    def _args(self, hit: Hit, t: str) -> None:
        if self.dumps_parsed >= MAX_DUMPS:
            return  # restarts repeat the same dump; the first ones carry the facts
        t = strip_noise(t)
        m = P.SGL_ARGS.search(t)
        if m:
            args = self._dump(hit, t, m.end() - 1)
            if args:
                self.dumps_parsed += 1
                self.votes["sglang"] += 10
                e = self.ev(hit)
                self._apply_sglang_args(args, e)
                if m.group(1) == "{":
                    # engine.py prints `server_args={server_args.resolved_dict()}` from 0.5.19; up to
                    # 0.5.18 `logger.info(f"{server_args=}")`, the dataclass repr ServerArgs(...)
                    self.put(
                        "version_at_least",
                        SGL_DICT_ARGS_SINCE,
                        ARGS,
                        Evidence(
                            e.file,
                            e.line,
                            "server_args={...} (the dict form SGLang prints from 0.5.19)",
                        ),
                    )
            return
        m = P.VLLM_NONDEFAULT.search(t) or P.VLLM_NAMESPACE.search(t)
        if m:
            args = self._dump(hit, t, m.end() - 1)
            if args:
                self.dumps_parsed += 1
                self.votes["vllm"] += 10
                self._apply_vllm_args(args, self.ev(hit))

    def _put_number(self, a: dict[str, Any], key: str, fact: str, e: Evidence, kind: type) -> None:
        """A numeric server argument as a fact: ints stay ints, fractions become floats."""
        v = a.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else int):
            return
        self.put(fact, kind(v), ARGS, e)

    def _apply_sglang_args(self, a: dict[str, Any], e: Evidence) -> None:
        self.put("server_args", a, ARGS, e)
        self.put("model", a.get("model_path"), ARGS, e)
        for key in (
            "tp_size",
            "dp_size",
            "pp_size",
            "tokenizer_worker_num",
            "cuda_graph_max_bs",
            "chunked_prefill_size",
            "max_running_requests",
            "max_total_tokens",
            "context_length",
        ):
            self._put_number(a, key, key, e, int)
        self._put_number(a, "mem_fraction_static", "mem_fraction_static", e, float)
        v = a.get("attention_backend")
        if isinstance(v, str) and v:
            self.put("attention_backend", v, ARGS, e)
        if isinstance(a.get("disable_cuda_graph"), bool):
            self.put("disable_cuda_graph", a["disable_cuda_graph"], ARGS, e)
        if isinstance(a.get("enable_torch_compile"), bool):
            self.put("torch_compile", a["enable_torch_compile"], ARGS, e)
        if a.get("mm_feature_transport") is not None:
            self.put("cuda_ipc_transport", a["mm_feature_transport"] == "cuda_ipc", ARGS, e)
        if (
            a.get("enable_multimodal") is False
        ):  # (True proves nothing: a no-op on text-only models)
            self.mm_disabled = self.mm_disabled or Evidence(
                e.file, e.line, "server_args=...enable_multimodal=False..."
            )

    def _apply_vllm_args(self, a: dict[str, Any], e: Evidence) -> None:
        self.put("server_args", a, ARGS, e)
        model = a.get("model_tag") or a.get("model")
        if isinstance(model, str):
            self.put("model", model, ARGS, e)
        for key, fact in (
            ("tensor_parallel_size", "tp_size"),
            ("data_parallel_size", "dp_size"),
            ("pipeline_parallel_size", "pp_size"),
            ("max_model_len", "max_model_len"),
            ("max_num_seqs", "max_running_requests"),
        ):
            self._put_number(a, key, fact, e, int)
        self._put_number(a, "gpu_memory_utilization", "gpu_memory_utilization", e, float)
        if isinstance(a.get("enforce_eager"), bool):
            self.put("disable_cuda_graph", a["enforce_eager"], ARGS, e)
        v = a.get("attention_backend")
        if isinstance(v, str) and v:
            self.put("attention_backend", v.upper(), ARGS, e)
        limits = a.get("limit_mm_per_prompt")
        if mm_items_allowed(limits):
            # vLLM refuses the argument for a text-only model ("only supported for multimodal models")
            self.mm_evidence = self.mm_evidence or Evidence(
                e.file, e.line, f"args: ...limit_mm_per_prompt={limits!r}..."
            )

    def _command(self, hit: Hit, t: str) -> None:
        """A pasted launch command: what the user asked for (the server's dump wins)."""
        line = command_text(hit, t)
        flags, env, secrets = _parse_command(line)  # read only: the memo shares them
        self.secrets.update(secrets)
        if not flags and not env:
            return
        self.votes[
            "sglang"
            if "sglang" in t
            else "lmdeploy"
            if "lmdeploy serve" in t
            else "tgi"
            if "text-generation-launcher" in t
            else "vllm"
        ] += 5
        self.cmd_args.update(flags)
        for fact in (
            "model",
            "tp_size",
            "dp_size",
            "pp_size",
            "mem_fraction_static",
            "gpu_memory_utilization",
            "attention_backend",
            "tokenizer_worker_num",
            "cuda_graph_max_bs",
            "chunked_prefill_size",
            "max_running_requests",
            "max_total_tokens",
            "context_length",
            "max_model_len",
            "kv_share",
        ):
            if fact in flags:
                self.put(fact, flags[fact], CMDLINE, hit)
        if flags.get("disable_cuda_graph") or flags.get("enforce_eager"):
            self.put("disable_cuda_graph", True, CMDLINE, hit)
        if mm_items_allowed(flags.get("limit_mm_per_prompt")):
            self.mm_evidence = self.mm_evidence or self.ev(hit)
        transport = flags.get("mm_feature_transport")
        if transport is not None:
            self.put("cuda_ipc_transport", transport == "cuda_ipc", CMDLINE, hit)
        elif env.get("SGLANG_USE_CUDA_IPC_TRANSPORT") in ("1", "true", "True"):
            self.put("cuda_ipc_transport", True, CMDLINE, hit)
        if env.get("SGLANG_MM_FEATURE_CACHE_MB", "").isdigit():
            self.put("mm_feature_cache_mb", float(env["SGLANG_MM_FEATURE_CACHE_MB"]), CMDLINE, hit)

    def _vllm_engine(self, hit: Hit, t: str) -> None:
        parsed = engine_config(t)
        if parsed is None:
            return
        version, cfg = parsed
        e = self.ev(hit)
        self.votes["vllm"] += 10
        if version and self.version is None:
            self.version = (version, e)
        if "model" in cfg:
            self.put("model", cfg["model"].strip("'"), RUNTIME, e)
        for key, fact in (
            ("tensor_parallel_size", "tp_size"),
            ("pipeline_parallel_size", "pp_size"),
            ("data_parallel_size", "dp_size"),
            ("max_seq_len", "max_model_len"),
        ):
            if cfg.get(key, "").isdigit():
                self.put(fact, int(cfg[key]), RUNTIME, e)
        with contextlib.suppress(KeyError, ValueError):
            self.put("gpu_memory_utilization", float(cfg["gpu_memory_utilization"]), RUNTIME, e)
        if cfg.get("enforce_eager") in ("True", "False"):
            self.put("disable_cuda_graph", cfg["enforce_eager"] == "True", RUNTIME, e)

    def _versions(self, hit: Hit, t: str) -> None:
        m = P.VLLM_VERSION.search(t)
        if m:
            self.votes["vllm"] += 10
            if self.version is None:
                self.version = (m.group(1), self.ev(hit))
            if m.group(2):
                self.put("model", m.group(2), RUNTIME, hit)
            return
        if "\u2588" in t:
            m = P.VLLM_LOGO_VERSION.search(strip_noise(t))
            if m:
                self.votes["vllm"] += 10
                if self.version is None:
                    self.version = (m.group(1), self.ev(hit))
            return
        if P.FAST_ONLY_PROCESSOR.search(t):
            # SGLang chose the model's (fast-only) image processor: the model has one, so it is multimodal
            self.fast_only_processor = self.fast_only_processor or self.ev(hit)
            self.mm_evidence = self.mm_evidence or self.fast_only_processor

    # -- SGLang startup ----------------------------------------------------------------
    def _sgl_load(self, hit: Hit, t: str) -> None:
        m = P.SGL_LOAD_END.search(t)
        if m:
            e = hit
            self.votes["sglang"] += 5
            self.put("architecture", m.group(1), RUNTIME, e)
            self.put("avail_after_load_mib", gib_text_to_mib(m.group(2)), RUNTIME, e)
            if m.group(3):
                self.put("weights_mib", gib_text_to_mib(m.group(3)), RUNTIME, e)
            elif "avail_before_load_mib" in self.facts:
                before = self.facts["avail_before_load_mib"][1]
                self.put("weights_mib", round(before - gib_text_to_mib(m.group(2)), 1), INFERRED, e)
            return
        m = P.SGL_LOAD_BEGIN.search(t)
        if m:
            self.votes["sglang"] += 3
            if m.group(1):
                self.put("avail_before_load_mib", gib_text_to_mib(m.group(1)), RUNTIME, hit)
            mr = P.OLD_SGL.match(strip_noise(t))
            if mr and mr.group().startswith("Rank "):
                self.ranks.setdefault("TP", set()).add(int(mr.group().split()[1].rstrip(":")))

    def _kv(self, hit: Hit, t: str) -> None:
        m = P.SGL_KV.search(t)
        if m:
            e = hit
            if m.group(1):
                self.put("kv_tokens", int(m.group(1)), RUNTIME, e)
            if m.group(2):
                self.put(
                    "kv_cache_mib",
                    round(
                        (gib_text_to_mib(m.group(2)) or 0.0) + (gib_text_to_mib(m.group(3)) or 0.0),
                        1,
                    ),
                    RUNTIME,
                    e,
                )
            elif m.group(4):
                self.put("kv_cache_mib", gib_text_to_mib(m.group(4)), RUNTIME, e)
            return
        m = P.VLLM_KV_TOKENS.search(t)
        if m:
            self.put("kv_tokens", int(m.group(1).replace(",", "")), RUNTIME, hit)
            return
        m = P.VLLM_KV_MEM.search(t) or P.VLLM_KV_RESERVED.search(t)
        if m:
            mib = gib_text_to_mib(m.group(1))
            if mib is not None and mib < 0:
                # vLLM V1 gpu_worker "Available KV cache memory: -3.31 GiB": the share is used up before
                # the KV cache (it then refuses with "No available memory for the cache blocks")
                self.votes["vllm"] += 3
                self.add_event(
                    LogEvent(
                        "kv_budget_negative",
                        self.name,
                        hit.lineno,
                        self.ev(hit).text,
                        "kv_cache_alloc",
                        {"reason": "vllm_available_kv_negative", "kv_cache_memory_mib": mib},
                    )
                )
                return
            self.put("kv_cache_mib", mib, RUNTIME, hit)

    def _sgl_summary(self, hit: Hit, t: str) -> None:
        m = P.SGL_SUMMARY.search(t)
        if not m:
            return
        e = hit
        self.votes["sglang"] += 5
        self.put("kv_tokens", int(m.group(1)), RUNTIME, e)
        self.put("chunked_prefill_size", int(m.group(2)), RUNTIME, e)
        self.put("max_running_requests", int(m.group(4)), RUNTIME, e)
        self.put("context_length", int(m.group(5)), RUNTIME, e)

    def _graphs(self, hit: Hit, t: str) -> None:
        m = P.SGL_GRAPH_END.search(t)
        if m:
            e = hit
            if m.group(2):
                self.put("cuda_graph_mib", gib_text_to_mib(m.group(2)), RUNTIME, e)
                self.put("avail_after_graph_mib", gib_text_to_mib(m.group(3)), RUNTIME, e)
            return
        m = P.SGL_GRAPH_FAILED.search(t)
        if m:
            self.votes["sglang"] += 3
            self.add_event(
                LogEvent(
                    "cuda_graph_capture_failed",
                    self.name,
                    hit.lineno,
                    self.ev(hit).text,
                    "cuda_graph",
                    {"cause": m.group(1)[:300]},
                )
            )
            return
        m = P.VLLM_GRAPH_DONE.search(t)
        if m:
            self.put("cuda_graph_mib", gib_text_to_mib(m.group(1)), RUNTIME, hit)

    def _backend(self, hit: Hit, t: str) -> None:
        s = clean(t).text
        m = P.SGL_USE_BACKEND.search(s)
        if m:
            self.put("attention_backend", m.group(1), RUNTIME, hit)
            return
        m = P.VLLM_USING_BACKEND.search(s)
        if m and "JIT" not in m.group(1):
            name = m.group(1)
            norm = _VLLM_BACKEND_NAMES.get(name.lower(), name.upper().replace(" ", "_"))
            self.put("attention_backend", norm, RUNTIME, hit)

    def _multimodal(self, hit: Hit, t: str) -> None:
        m = P.SGL_MM_REDUCE.search(t)
        if m:
            e = self.ev(hit)
            self.put("mem_fraction_static", float(m.group(1)), EFFECTIVE, e)
            self.mm_evidence = self.mm_evidence or e
            self.votes["sglang"] += 5
            return
        if P.VLLM_MM_PROFILE.search(t):
            self.mm_evidence = self.mm_evidence or self.ev(hit)
            return
        if P.SGL_MM_PROCESSOR.search(t):
            self.mm_evidence = self.mm_evidence or self.ev(hit)
            return
        if P.SGL_MM_DISABLED.search(t) or P.VLLM_MM_REFUSED.search(t):
            self.mm_disabled = self.mm_disabled or self.ev(hit)

    def _encoder_cache(self, hit: Hit, t: str) -> None:
        """vLLM's encoder-cache budget line: only a multimodal model profiles its encoder."""
        self.votes["vllm"] += 3
        self.mm_evidence = self.mm_evidence or self.ev(hit)

    def _ipc(self, hit: Hit, t: str) -> None:
        e = self.ev(hit)
        for pattern, budget, workers, total, since in _IPC_POOL_LINES:
            m = pattern.search(t)
            if m:
                self.put("ipc_min_version", since, RUNTIME, e)
                self.votes["sglang"] += 3
                self.put("cuda_ipc_transport", True, RUNTIME, e)
                self.put("mm_feature_cache_mb", float(m.group(budget)), RUNTIME, e)
                self.put("tokenizer_worker_num", int(m.group(workers)), RUNTIME, e)
                if total is not None:
                    self.put("ipc_pool_total_mib", total(m), RUNTIME, e)
                return
        if "[reconstruct][IPC]" in t:
            # SGLang's CUDA IPC transport reconstructing a feature tensor from its handle (debug prints
            # of the transport, sglang#13940): the transport is on
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.votes["sglang"] += 1
            return
        if P.IPC_AUTO.search(t):
            self.votes["sglang"] += 3
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            return
        m = P.IPC_POOL_FULL.search(t)
        if m:
            self.votes["sglang"] += 3
            self.put("cuda_ipc_transport", True, RUNTIME, e)
            self.add_event(
                LogEvent(
                    "mm_feature_pool_full",
                    self.name,
                    hit.lineno,
                    e.text,
                    None,
                    {"tensor_mib": float(m.group(1)), "pool_mib": float(m.group(2))},
                )
            )

    # -- failures ----------------------------------------------------------------------


Step = Callable[[FileExtractor, Hit, str], None]
# Steps whose stores are a function of the line's text alone (and of the facts' priorities), so a
# line of only these that stored a fact again does the same store, with its own line, when it repeats.
_REPLAYABLE: frozenset[Step] = frozenset((FileExtractor._rank_tags, FileExtractor._backend))
# the vocabulary's gates with their steps resolved (a gate naming no method fails at import)
_GATED: tuple[tuple[Any, Step], ...] = tuple((g, getattr(FileExtractor, g.step)) for g in GATES)


def _rank_tagged(head: str) -> bool:
    """A line's prefix that may carry rank or process tags (SGLang "TP0"/"DP1", vLLM "rank=", "pid=")."""
    return "TP" in head or "DP" in head or "rank=" in head or "pid=" in head


@short_line_memo()
def dispatch(t: str) -> tuple[Step, ...]:
    """The handlers a line's text selects, in order: the structural steps (a request echo, the line's
    rank/process tags), then every gate of the line vocabulary (vocabulary.GATES) the line passes.
    Every gate is a pure function of the text, so the choice is memoised."""
    echo = P.request_echo(t)
    if echo >= 0:
        # a logged request/response (vLLM RequestLogger, SGLang --log-requests) echoes user
        # text: nothing in it is an event or a fact; only the line's own prefix (rank/process tags)
        return (FileExtractor._echo_rank_tags,) if _rank_tagged(t[:echo]) else ()
    steps: list[Step] = [FileExtractor._rank_tags] if _rank_tagged(t[:80]) else []
    steps.extend(_GATED[i][1] for i in passed(t))
    return tuple(steps)


_dispatch_memo: Callable[[str], tuple[Step, ...]] = dispatch.cached  # type: ignore[attr-defined]

# A pasted command repeats in an error-dense paste (the same excerpt quoted again): parsed once.
_parse_command = short_line_memo(maxsize=64)(parse_command)


def command_text(hit: Hit, t: str) -> str:
    """A pasted launch command with the rows it continues on (backslash continuations, or a
    terminal's wrap): all that `FileExtractor._command` reads of the line and the lines after it."""
    line = strip_noise(t).rstrip()
    if line.endswith("\\"):  # a command continued with backslashes over several lines
        for nxt in hit.following(60):
            part = strip_noise(nxt).rstrip()
            line = line[:-1] + " " + part
            if not part.endswith("\\"):
                break
    elif len(t) >= WRAP_MIN_COLUMNS:
        # a terminal wrapped the command mid-word: every row but the last is exactly as wide as
        # the first; joined as is (the wrap splits anywhere)
        width = len(t.rstrip("\r\n"))
        for nxt in hit.following(20):
            row = nxt.rstrip("\r\n")
            if not row or not is_continuation(row) or P.STARTS_COMMAND.match(row):
                break  # (a row that starts a command of its own is the next command)
            line += strip_noise(row)
            if len(row) != width:
                break
    return line


SGL_DICT_ARGS_SINCE = "0.5.19"  # the first SGLang release printing server_args={...}


def mm_items_allowed(limits: Any) -> bool:
    """Whether vLLM's limit_mm_per_prompt allows any multimodal item: a dict of modality -> count
    ({'image': 10}; 0.11+ also {'image': {'count': 5, ...}}), or the flag's text ('image=10,video=1'
    up to 0.8, JSON '{"image": 10}' from 0.9). All zeros (text-only use of a VLM) or unreadable: False."""
    if isinstance(limits, str):
        text = limits.strip()
        if text.startswith("{"):
            try:
                limits = json.loads(text)
            except ValueError:
                return False
        else:
            limits = dict(part.partition("=")[::2] for part in text.split(",") if "=" in part)
    if not isinstance(limits, dict):
        return False
    for value in limits.values():
        if isinstance(value, dict):
            value = value.get("count", 1)
        with contextlib.suppress(TypeError, ValueError):
            if not isinstance(value, bool) and int(str(value).strip()) > 0:
                return True
    return False


@short_line_memo(maxsize=64)
def engine_config(t: str) -> tuple[str | None, dict[str, str]] | None:
    """(version, config key -> value) of vLLM's "Initializing an LLM engine" line (read only;
    memoised: the line is long and repeats on every engine restart)."""
    m = P.VLLM_ENGINE.search(t)
    return None if m is None else (m.group(1), dict(P.VLLM_CONFIG_KV.findall(m.group(2))))
