"""Run `ab-test --server`: each variant launched, soaked with the same seeded traffic, stopped.

    from vramdoctor.abtest.server import ServerExperiment, build_variants
    variants, kind = build_variants(argv, ["arena2=MALLOC_ARENA_MAX=2"], ["expandable-segments"])
    exp = ServerExperiment(argv, variants, traffic=SoakConfig(rounds=4, requests=30), out=Path("runs/ab"))
    results = exp.run()       # one VariantResult per variant, flushed to runs/ab/abtest.jsonl as each ends

The variants run one after another on the same GPUs, baseline first and again last. Each is a
`SoakSession` with `launch` (its own process group under the keeper, the agent in its env, its
log beside its run file): `OUT/<name>.jsonl`, `OUT/<name>.server.log`. The experiment's own run
file `OUT/abtest.jsonl` (command "ab-test", mode "server") gets one `abtest_variant` event per
variant the moment it ends, so a crash or Ctrl-C keeps every finished variant, and
`vramdoctor report OUT/abtest.jsonl` re-renders the table offline.

Reliability:
- a variant that fails to start (`LaunchFailed`), crashes mid-soak (its server died) or answers
  mostly errors is recorded as such, with its last log lines, and the next variant runs;
- between variants, what the previous one left is checked (`Leftovers`): processes of its tree
  still alive, the port still served, and with NVML a process on the GPUs that was not there
  before the first variant, or GPU memory not back to where it was. A leftover is named (pid,
  name, MiB) and the run stops: the next variant would measure on a dirty GPU;
- Ctrl-C ends the variant in progress (its partial soak is kept and reported as interrupted) and
  the experiment; nothing it launched survives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramdoctor.abtest.server.variants import ServerVariant
from vramdoctor.errors import InputError, Interrupted, SourceUnavailable
from vramdoctor.record import RunWriter, make_header
from vramdoctor.samples import Event, now
from vramdoctor.soak.config import SoakConfig
from vramdoctor.soak.traffic.client import Outcome
from vramdoctor.soak.traffic.workload import PlannedRequest

__all__ = [
    "ABTEST_FILE",
    "CHECK_EVENT",
    "VARIANT_EVENT",
    "GpuBaseline",
    "ServerExperiment",
    "VariantResult",
]

ABTEST_FILE = "abtest.jsonl"
VARIANT_EVENT = "abtest_variant"
CHECK_EVENT = "abtest_check"
MODE = "server"
# A variant "answers errors" when more than this share of its requests failed.
ERROR_SHARE = 0.5
# GPU memory back within max(this, GPU_TOLERANCE_SHARE of the GPU) of the level before the first
# variant counts as free (NVML whole MiB, the driver's own small allocations).
GPU_TOLERANCE_MIB = 256.0
GPU_TOLERANCE_SHARE = 0.02
SETTLE_S = 30.0  # how long a stopped variant's memory may take to come back


@dataclass
class VariantResult:
    """How one variant went. `status`: "complete", "failed_to_start", "crashed", "errors",
    "interrupted", "not_run" (the run stopped before it), "leftover" (it left a process: the run
    stopped after it). `run_file`/`log_file` are relative to the experiment folder. `latency`
    p50/p99 in seconds of the successful requests, `throughput_rps` successful requests per
    second of load; `log_tail` the server's last log lines when it failed."""

    name: str
    status: str
    message: str = ""
    run_file: str | None = None
    log_file: str | None = None
    log_tail: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    latency: dict[str, float | None] = field(default_factory=dict)
    throughput_rps: float | None = None
    wall_s: float = 0.0
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    stopped: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Traffic:
    """The outcomes of one variant's requests, as they come (the session's on_result)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.sent = 0
        self.ok = 0

    def on_result(self, _req: PlannedRequest, outcome: Outcome) -> None:
        self.sent += 1
        if outcome.ok:
            self.ok += 1
            self.latencies.append(outcome.latency_s)

    def latency(self) -> dict[str, float | None]:
        import numpy as np

        if not self.latencies:
            return {"p50_s": None, "p99_s": None, "n": 0}
        xs = np.asarray(self.latencies)
        return {
            "p50_s": float(np.percentile(xs, 50)),
            "p99_s": float(np.percentile(xs, 99)),
            "n": len(self.latencies),
        }


def _load_seconds(run_path: Path) -> float:
    """Seconds the variant spent sending (round_start -> round_end), from its run file."""
    from vramdoctor.record import read_run

    total = 0.0
    start: float | None = None
    for r in read_run(run_path).records:
        if isinstance(r, Event) and r.name == "round_start":
            start = r.t
        elif isinstance(r, Event) and r.name == "round_end" and start is not None:
            total += r.t - start
            start = None
    return total


@dataclass
class GpuBaseline:
    """The GPUs before the first variant: used MiB per GPU and the pids on them (NVML)."""

    used_mib: dict[int, float]
    total_mib: dict[int, float]
    pids: set[int]

    @classmethod
    def take(cls, gpus: Sequence[int] | None) -> GpuBaseline | None:
        """Now, from NVML; None without a driver (then only host-side leftovers are checked)."""
        try:
            from vramdoctor.sources.nvml import NvmlSource

            with NvmlSource(list(gpus) if gpus else None) as src:
                s = src.sample()
        except (SourceUnavailable, Exception):  # no NVML here: the host checks still run
            return None
        return cls(
            {g.index: g.used_mib for g in s.gpus},
            {g.index: g.total_mib for g in s.gpus},
            {p.pid for p in s.processes},
        )

    def leftovers(self, gpus: Sequence[int] | None) -> tuple[list[dict[str, Any]], str]:
        """(processes on the GPUs that were not there before, words on the GPU memory)."""
        from vramdoctor.sources.nvml import NvmlSource

        with NvmlSource(list(gpus) if gpus else None) as src:
            s = src.sample()
        new = [
            {"pid": p.pid, "name": p.name, "gpu": p.gpu, "used_mib": p.used_mib, "where": "gpu"}
            for p in s.processes
            if p.pid not in self.pids
        ]
        over = []
        for g in s.gpus:
            before = self.used_mib.get(g.index)
            if before is None:
                continue
            tol = max(GPU_TOLERANCE_MIB, GPU_TOLERANCE_SHARE * g.total_mib)
            if g.used_mib > before + tol:
                over.append(f"GPU {g.index} {g.used_mib:.0f} MiB used (was {before:.0f} MiB)")
        return new, "; ".join(over)


Say = Callable[[str], None]


class ServerExperiment:
    """The experiment (see the module docstring). `base` the server's command, `variants` in
    run order (`build_variants`), `traffic` the soak settings every variant gets (its url,
    out, launch and adapt are set per variant), `out` the experiment folder (created; must not
    hold an earlier experiment)."""

    def __init__(
        self,
        base: Sequence[str],
        variants: Sequence[ServerVariant],
        *,
        traffic: SoakConfig,
        out: Path,
        kind: str = "openai",
        say: Say | None = None,
        argv: list[str] | None = None,
        settle_s: float = SETTLE_S,
    ) -> None:
        self.base = tuple(base)
        self.variants = list(variants)
        self.traffic = traffic
        self.out = out
        self.kind = kind
        self.say: Say = say or (lambda _m: None)
        self.argv = argv
        self.settle_s = settle_s
        self.results: list[VariantResult] = []
        self.path = out / ABTEST_FILE
        self.writer: RunWriter | None = None
        self.gpu: GpuBaseline | None = None

    # --- the whole run ---------------------------------------------------------------------

    def run(self) -> list[VariantResult]:
        """Every variant in order; the results. Raises InputError before anything runs when
        the folder cannot be used or the server's port is already served; Interrupted (the
        results file kept) on Ctrl-C."""
        self._prepare()
        assert self.writer is not None
        status = "complete"
        try:
            for i, variant in enumerate(self.variants):
                result = self._run_variant(variant)
                self._record(result)
                if result.status == "interrupted":
                    status = "interrupted"
                    self._not_run(self.variants[i + 1 :], "the run was interrupted")
                    raise KeyboardInterrupt
                left = self._check_after(variant, result)
                if left:
                    status = "failed"
                    self._not_run(
                        self.variants[i + 1 :],
                        f"not run: {variant.name} left {left[0]['what']}",
                    )
                    break
        except KeyboardInterrupt:
            status = "interrupted"
            self.writer.close(status, stopped_by="interrupt")
            raise Interrupted(
                f"interrupted; finished variants are kept: {self.path} (again: vramdoctor "
                f"report {self.path})"
            ) from None
        finally:
            if not self.writer.closed:
                self.writer.close(status)
        return self.results

    def _prepare(self) -> None:
        from vramdoctor.sources.discover import listening_pids, url_port

        url = self._url()
        port = url_port(url)
        owners, _why = listening_pids(port)
        if owners:
            raise InputError(
                f"port {port} is already served by {_who(owners)}: stop it first (every "
                "variant launches its own server there)"
            )
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create {self.out}: {exc.strerror}") from None
        if self.path.exists():
            raise InputError(f"{self.path} exists: give ab-test a new --out folder")
        self.gpu = GpuBaseline.take(self.traffic.gpus)
        header = make_header(
            "ab-test",
            argv=self.argv,
            target=url,
            config={
                "mode": MODE,
                "server": self._shown(self.base),
                "kind": self.kind,
                "variants": [v.to_dict() for v in self.variants],
                "traffic": self.traffic.to_record(),
                "gpu_check": self.gpu is not None,
            },
        )
        self.writer = RunWriter(self.path, header)

    def _url(self) -> str:
        if self.traffic.url:
            return self.traffic.url
        from vramdoctor.soak.launch import url_from_argv

        url = url_from_argv(self.base)
        if url is None:
            raise InputError("--server: the command names no --port; give --url")
        return url

    @staticmethod
    def _shown(argv: Sequence[str]) -> list[str]:
        from vramdoctor.redact import redact_argv

        return list(redact_argv(list(argv)))

    def _record(self, result: VariantResult) -> None:
        assert self.writer is not None
        self.results.append(result)
        self.writer.write(Event(*now(), name=VARIANT_EVENT, data=result.to_dict()))

    def _not_run(self, variants: Sequence[ServerVariant], why: str) -> None:
        for v in variants:
            self._record(VariantResult(v.name, "not_run", why))

    # --- one variant ---------------------------------------------------------------------------

    def _config(self, variant: ServerVariant) -> SoakConfig:
        change = variant.change
        return dataclasses.replace(
            self.traffic,
            url=self._url(),
            out=self.out / f"{variant.name}.jsonl",
            launch=variant.argv(self.base),
            launch_env=dict(change.env),
            launch_unset_env=tuple(change.unset_env),
            adapt=False,
        ).validate()

    def _run_variant(self, variant: ServerVariant) -> VariantResult:
        from vramdoctor.soak.launch import LaunchFailed
        from vramdoctor.soak.session import SoakSession

        cfg = self._config(variant)
        assert cfg.out is not None
        traffic = _Traffic()
        started = time.monotonic()
        self.say(f"{variant.name}: {variant.change.describe()}")
        session = SoakSession(
            cfg,
            notify=lambda m: self.say(f"  {variant.name}: {m}"),
            on_result=traffic.on_result,
            progress=self._progress(variant.name),
        )
        log_file = f"{variant.name}.server.log"
        try:
            outcome = session.run()
        except LaunchFailed as exc:
            return VariantResult(
                variant.name,
                "failed_to_start",
                str(exc),
                log_file=log_file,
                log_tail=list(exc.log_tail),
                wall_s=round(time.monotonic() - started, 1),
                stopped=session.launched.stopped.to_dict()
                if session.launched is not None and session.launched.stopped
                else None,
            )
        except Interrupted as exc:
            kept = cfg.out.name if cfg.out.exists() else None
            return VariantResult(
                variant.name,
                "interrupted",
                str(exc),
                run_file=kept,
                log_file=log_file,
                wall_s=round(time.monotonic() - started, 1),
            )
        except (InputError, SourceUnavailable) as exc:  # the server answered, but not usably
            launched = session.launched
            return VariantResult(
                variant.name,
                "failed_to_start",
                str(exc),
                log_file=log_file,
                log_tail=launched.tail() if launched is not None else [],
                wall_s=round(time.monotonic() - started, 1),
            )
        return self._result(variant, outcome, traffic, started, log_file)

    def _result(
        self,
        variant: ServerVariant,
        outcome: Any,
        traffic: _Traffic,
        started: float,
        log_file: str,
    ) -> VariantResult:
        run_path: Path = outcome.run_path
        status, message = "complete", ""
        errors = traffic.sent - traffic.ok
        if outcome.status == "interrupted":
            status, message = "interrupted", "interrupted during its soak"
        elif outcome.server_died is not None:
            status = "crashed"
            message = f"the server died during the soak ({outcome.server_died.get('reason')})"
        elif traffic.sent and errors > ERROR_SHARE * traffic.sent:
            status = "errors"
            message = f"{errors} of {traffic.sent} requests failed"
        load_s = _load_seconds(run_path)
        launched = outcome.launched or {}
        from vramdoctor.soak.launch import log_tail

        tail = log_tail(self.out / log_file) if status in ("crashed", "errors") else []
        result = VariantResult(
            variant.name,
            status,
            message,
            run_file=run_path.name,
            log_file=log_file,
            log_tail=tail,
            requests={"sent": traffic.sent, "ok": traffic.ok, "errors": errors},
            latency=traffic.latency(),
            throughput_rps=(traffic.ok / load_s) if load_s > 0 else None,
            wall_s=round(time.monotonic() - started, 1),
            stopped=launched.get("stopped"),
        )
        return result

    def _progress(self, name: str) -> Callable[[Any], None]:
        seen: set[tuple[str, int]] = set()

        def progress(state: Any) -> None:
            key = (state.phase, state.round)
            if key in seen or state.phase not in ("load", "baseline"):
                return
            seen.add(key)
            what = "baseline (idle)" if state.phase == "baseline" else f"round {state.round}"
            self.say(f"  {name}: {what}")

        return progress

    # --- between variants --------------------------------------------------------------------

    def _check_after(self, variant: ServerVariant, result: VariantResult) -> list[dict[str, Any]]:
        """What the variant left: named in an `abtest_check` event; [] when all is free."""
        from vramdoctor.sources.discover import listening_pids, url_port

        assert self.writer is not None
        deadline = time.monotonic() + self.settle_s
        port = url_port(self._url())
        while True:
            left: list[dict[str, Any]] = []
            for pid in (result.stopped or {}).get("leftovers") or []:
                left.append({"pid": pid, "name": _name(pid), "where": "tree", "what": _what(pid)})
            owners, _why = listening_pids(port)
            for pid in owners:
                left.append(
                    {
                        "pid": pid,
                        "name": _name(pid),
                        "where": "port",
                        "what": f"{_what(pid)} still serving port {port}",
                    }
                )
            gpu_note = ""
            if self.gpu is not None:
                with contextlib.suppress(Exception):
                    procs, gpu_note = self.gpu.leftovers(self.traffic.gpus)
                    for p in procs:
                        mib = f"{p['used_mib']:.0f} MiB" if p.get("used_mib") else "memory"
                        left.append(
                            {
                                **p,
                                "what": f"{_what(p['pid'])} holding {mib} on GPU {p['gpu']}",
                            }
                        )
            if (not left and not gpu_note) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if gpu_note and not left:
            left.append({"pid": None, "name": None, "where": "gpu", "what": gpu_note})
        data = {"after": variant.name, "free": not left, "leftovers": left}
        self.writer.write(Event(*now(), name=CHECK_EVENT, data=data))
        if left:
            result.leftovers = left
            result.status = "leftover" if result.status == "complete" else result.status
            self.say(
                f"{variant.name} left "
                + "; ".join(str(x["what"]) for x in left)
                + ": the next variants would measure on a dirty machine, the run stops"
            )
            # the result event was written already: write it again with the leftovers (last wins)
            self.writer.write(Event(*now(), name=VARIANT_EVENT, data=result.to_dict()))
        return left


def _name(pid: int) -> str | None:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:
        return None


def _what(pid: int) -> str:
    return f"pid {pid} ({_name(pid) or '?'})"


def _who(pids: Sequence[int]) -> str:
    return ", ".join(_what(p) for p in pids)
