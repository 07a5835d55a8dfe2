"""The IPC arm: does the consumer-device redirect keep consumers off the producer's GPU?

On N GPUs, a producer on GPU 0 shares a pooled feature slice and a plain tensor over CUDA IPC,
and one consumer on each of GPUs 1..N-1 opens them: once without the redirect (torch's way:
the handle is opened on the producer's device, creating a CUDA context there) and once with it
(`vramdoctor.fixes.open_cuda_tensor(..., redirect=True)`). Every consumer checks the data it
read back against the producer's checksums.

The orchestration, in the parent (which never touches CUDA):
1. start the consumers; each creates its own context and says "ready";
2. NVML census of every process on every GPU ("before");
3. start the producer; it shares the memory and hands the message to every consumer;
4. wait until EVERY consumer has said "opened": the barrier. A consumer then holds the memory
   until the parent sets `stop` (or its own hold limit runs out, which the parent reports);
5. census again ("opened"), with every consumer holding, then check that none let go or died
   before the census ended;
6. set `stop`, collect each consumer's "released", stop the producer.

A consumer or producer that fails, hangs or dies is named in the arm's `error` (which GPU, what
it said or its exit code), and what the others measured is kept. Children talk to the parent
through one status queue; each message carries the member's id, so nothing is lost when
messages arrive out of phase.

The CUDA work lives in `CudaIpcPayload`; `run_mode` takes any `IpcPayload`, which is how the
CPU tests drive the same orchestration with host shared memory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vramdoctor.samples import MIB

__all__ = [
    "CudaIpcPayload",
    "IpcPayload",
    "cuda_visible_count",
    "main",
    "run_ipc_arm",
    "run_ipc_subprocess",
    "run_mode",
]

FEATURE_ELEMS = 4 * MIB  # int32: 16 MiB feature placed in the pooled buffer
TENSOR_ELEMS = 2 * MIB  # int32: 8 MiB plain tensor shared on its own
POOL_TOTAL_BYTES = 128 * MIB
POOL_WORKERS = 4  # -> max(32 MiB, 128 MiB) = 128 MiB: shows the floor of the split
OVERSIZE_BYTES = 130 * MIB  # does not fit the buffer: must go by CPU
SETTLE_S = 0.3  # after the last "opened", before the census: NVML's process list catches up
PRODUCER = 0  # member id of the producer; consumers are 1..N-1

Census = Callable[[], dict[str, Any]]
Sink = Callable[
    [dict[str, Any]], object
]  # e.g. RunWriter.write: gets each record as it is measured


class IpcPayload(Protocol):
    """What the producer shares and what each consumer does with it; picklable (it is sent
    to spawned processes). The orchestration around it does not change."""

    def share(self, gpu: int) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """In the producer: (the message for every consumer, facts for the record, what must
        stay alive while consumers hold it)."""
        ...

    def prepare(self, gpu: int, producer_gpu: int) -> dict[str, Any]:
        """In a consumer, before anything is shared: create its own context; facts for the
        record ("peer_access", "uuid")."""
        ...

    def open(
        self, message: dict[str, Any], gpu: int, producer_gpu: int, redirect: bool
    ) -> tuple[dict[str, Any], Any]:
        """In a consumer: open the shared memory, check it; (facts: "tensor_device",
        "redirect_applied", "slice_correct", "tensor_correct", "warnings"; what it holds)."""
        ...

    def release(self, held: Any) -> None:
        """In a consumer: let go of what `open` returned."""
        ...


def _uuid(torch: Any, gpu: int) -> str | None:
    """The device's UUID as NVML writes it ("GPU-..."): maps a CUDA ordinal to an NVML index
    whatever CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER say."""
    try:
        raw = str(torch.cuda.get_device_properties(gpu).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


@dataclass(frozen=True)
class CudaIpcPayload:
    """The real thing: a FeatureBufferPool slice and a plain tensor shared over CUDA IPC."""

    def share(self, gpu: int) -> tuple[dict[str, Any], dict[str, Any], Any]:
        from vramdoctor.fixes import FeatureBufferPool, share_cuda_tensor, to_transport
        from vramdoctor.fixes._torch import load_torch

        torch = load_torch("ab-test IPC arm")
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        pool = FeatureBufferPool(POOL_TOTAL_BYTES, POOL_WORKERS, dev)
        feature = (torch.arange(FEATURE_ELEMS, dtype=torch.int32, device=dev) * 7) % 1000003
        plain = (torch.arange(TENSOR_ELEMS, dtype=torch.int32, device=dev) * 13) % 65521
        piece = pool.put(feature)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            oversize = to_transport(
                pool, torch.zeros(OVERSIZE_BYTES, dtype=torch.uint8, device=dev)
            )
        message = {
            "slice": piece,
            "tensor": share_cuda_tensor(plain),
            "expected_slice": int(feature.to(torch.int64).sum().item()),
            "expected_tensor": int(plain.to(torch.int64).sum().item()),
        }
        torch.cuda.synchronize(dev)
        oversize_device = getattr(oversize, "device", None)
        facts = {
            "uuid": _uuid(torch, gpu),
            "pool_bytes": pool.capacity,
            "oversize_went_cpu": oversize_device is not None and oversize_device.type == "cpu",
            "pool_warning": [str(w.message) for w in caught][:1],
        }
        return message, facts, (pool, feature, plain, piece)

    def prepare(self, gpu: int, producer_gpu: int) -> dict[str, Any]:
        from vramdoctor.fixes import peer_access
        from vramdoctor.fixes._torch import load_torch

        torch = load_torch("ab-test IPC arm")
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize(gpu)
        return {"peer_access": peer_access(gpu, producer_gpu), "uuid": _uuid(torch, gpu)}

    def open(
        self, message: dict[str, Any], gpu: int, producer_gpu: int, redirect: bool
    ) -> tuple[dict[str, Any], Any]:
        from vramdoctor.fixes import open_cuda_tensor, open_slice
        from vramdoctor.fixes._torch import load_torch

        torch = load_torch("ab-test IPC arm")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sliced = open_slice(message["slice"], gpu, redirect=redirect)
            plain = open_cuda_tensor(message["tensor"], gpu, redirect=redirect)
        got_slice = int(sliced.to(torch.int64).sum().item())
        got_tensor = int(plain.to(torch.int64).sum().item())
        torch.cuda.synchronize()
        facts = {
            "tensor_device": plain.device.index,
            "redirect_applied": plain.device.index == gpu and gpu != producer_gpu,
            "slice_correct": got_slice == message["expected_slice"],
            "tensor_correct": got_tensor == message["expected_tensor"],
            "warnings": [str(w.message) for w in caught][:2],
        }
        return facts, [sliced, plain]

    def release(self, held: Any) -> None:
        from vramdoctor.fixes._torch import load_torch
        from vramdoctor.fixes.feature_pool import forget_opened

        held.clear()
        forget_opened()
        load_torch("ab-test IPC arm").cuda.synchronize()


def _error(member: int, gpu: int, phase: str, exc: BaseException) -> dict[str, Any]:
    return {
        "member": member,
        "event": "error",
        "pid": os.getpid(),
        "gpu": gpu,
        "phase": phase,
        "message": f"{type(exc).__name__}: {exc}",
        "trace": traceback.format_exc(limit=3),
    }


def _producer(
    payload: IpcPayload, gpu: int, inboxes: list[Any], status: Any, stop: Any, hold_s: float
) -> None:
    try:
        message, facts, keep = payload.share(gpu)
        status.put({"member": PRODUCER, "event": "ready", "pid": os.getpid(), "gpu": gpu, **facts})
        for q in inboxes:
            q.put(message)
        stop.wait(hold_s)  # the producer outlives its consumers: they hold its memory
        del keep
    except Exception as exc:
        status.put(_error(PRODUCER, gpu, "share", exc))


def _consumer(
    payload: IpcPayload,
    member: int,
    gpu: int,
    producer_gpu: int,
    redirect: bool,
    inbox: Any,
    status: Any,
    stop: Any,
    wait_s: float,
    hold_s: float,
) -> None:
    phase = "prepare"
    try:
        facts = payload.prepare(gpu, producer_gpu)
        status.put({"member": member, "event": "ready", "pid": os.getpid(), "gpu": gpu, **facts})
        phase = "wait"
        message = inbox.get(timeout=wait_s)  # the parent sends None when it gives up sooner
        if message is None:  # the parent gave up on this mode (another member failed)
            return
        phase = "open"
        opened, held = payload.open(message, gpu, producer_gpu, redirect)
        status.put({"member": member, "event": "opened", "pid": os.getpid(), "gpu": gpu, **opened})
        phase = "hold"
        # The barrier: hold until the parent's census is done (it sets stop), at most hold_s.
        on_stop = stop.wait(hold_s)
        phase = "release"
        payload.release(held)
        del held
        status.put(
            {
                "member": member,
                "event": "released",
                "pid": os.getpid(),
                "gpu": gpu,
                "on_stop": on_stop,
            }
        )
    except queue.Empty:
        status.put(
            {
                "member": member,
                "event": "error",
                "pid": os.getpid(),
                "gpu": gpu,
                "phase": phase,
                "message": f"no message from the producer within {wait_s:g} s",
            }
        )
    except Exception as exc:
        status.put(_error(member, gpu, phase, exc))


@dataclass
class _Member:
    member: int
    gpu: int
    proc: Any
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    hung: bool = False  # said nothing within the timeout: it will not answer `stop` either

    @property
    def name(self) -> str:
        return f"{'producer' if self.member == PRODUCER else 'consumer'} on GPU {self.gpu}"


class _Status:
    """The one status queue, read into each member's events as messages arrive."""

    def __init__(self, q: Any, members: list[_Member]) -> None:
        self.q = q
        self.by_id = {m.member: m for m in members}

    def _take(self, msg: dict[str, Any]) -> None:
        m = self.by_id.get(msg.get("member", -1))
        if m is None:
            return
        if msg.get("event") == "error":
            if m.error is None:
                m.error = f"{msg.get('phase')}: {msg.get('message')}"
            m.events["error"] = msg
        else:
            m.events[str(msg.get("event"))] = msg

    def drain(self, wait_s: float = 0.0) -> None:
        """Read everything queued now; wait up to wait_s for the first message."""
        try:
            self._take(self.q.get(timeout=wait_s) if wait_s > 0 else self.q.get_nowait())
            while True:
                self._take(self.q.get_nowait())
        except queue.Empty:
            pass

    def wait(self, event: str, members: list[_Member], timeout_s: float) -> list[_Member]:
        """Until each of `members` said `event` or failed (or another member failed: then
        nobody waits for the rest). A child that exited without saying it is failed by its
        exit code. Returns the failed members of the whole arm."""
        deadline = time.monotonic() + timeout_s
        others = [m for m in self.by_id.values() if m not in members]
        while True:
            pending = [m for m in members if event not in m.events and m.error is None]
            if not pending or any(m.error for m in others):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                for m in pending:
                    m.error = f"did not report '{event}' within {timeout_s:g} s"
                    m.hung = True
                break
            self.drain(min(0.2, left))
            for m in pending:
                if m.proc.exitcode is not None and event not in m.events and m.error is None:
                    self.drain(1.0)  # its last message may still be in the pipe
                    if event not in m.events and m.error is None:
                        m.error = f"exited with code {m.proc.exitcode} before '{event}'"
        return [m for m in self.by_id.values() if m.error]


def _census_gpu(uuid: str | None, gpu: int, census: Mapping[str, Any]) -> int:
    """The census's (NVML's) index of the GPU a child ran on as CUDA ordinal `gpu`."""
    for g in census.get("gpus") or []:
        if uuid is not None and g.get("uuid") == uuid:
            return int(g["index"])
    return gpu


def run_mode(
    redirect: bool,
    producer_gpu: int,
    consumer_gpus: Sequence[int],
    census: Census,
    timeout_s: float = 120.0,
    *,
    payload: IpcPayload | None = None,
    hold_s: float | None = None,
) -> dict[str, Any]:
    """One producer and one consumer per GPU in `consumer_gpus`, census before and while EVERY
    consumer holds the shared memory.

    timeout_s bounds each phase (ready, shared, opened); hold_s (default 2 x timeout_s) is how
    long a consumer holds at most before letting go on its own. Returns the `abtest.ipc` record
    body: "producer" and "consumers" (one dict per consumer, by GPU: pid, uuid, peer_access,
    redirect_applied, *_correct, census_gpu, held_during_census, error), "census_before" and
    "census_opened" (GpuSample dicts), and "error" (None, or which members failed and why).
    """
    payload = payload or CudaIpcPayload()
    hold = 2 * timeout_s if hold_s is None else hold_s
    ctx = mp.get_context("spawn")
    status_q = ctx.Queue()
    stop = ctx.Event()
    producer_stop = ctx.Event()
    inboxes = [ctx.Queue() for _ in consumer_gpus]
    producer = _Member(
        PRODUCER,
        producer_gpu,
        ctx.Process(
            target=_producer,
            args=(payload, producer_gpu, inboxes, status_q, producer_stop, hold + 3 * timeout_s),
            daemon=True,
        ),
    )
    consumers = _consumer_members(
        ctx,
        payload,
        redirect,
        producer_gpu,
        consumer_gpus,
        inboxes,
        status_q,
        stop,
        timeout_s,
        hold,
    )
    status = _Status(status_q, [producer, *consumers])
    result: dict[str, Any] = {
        "redirect": redirect,
        "producer_gpu": producer_gpu,
        "consumer_gpus": list(consumer_gpus),
    }
    try:
        _share_and_census(status, census, result, producer, consumers, timeout_s)
    finally:
        _end_mode(status, stop, producer_stop, status_q, inboxes, producer, consumers, timeout_s)
    opened_census = result.get("census_opened") or {}
    producer_row = _producer_row(producer, producer_gpu, opened_census)
    if producer_row is not None:
        result["producer"] = producer_row
    result["consumers"] = _consumer_rows(consumers, "census_opened" in result, opened_census)
    result["error"] = _mode_error(producer, consumers, result)
    return result


def _consumer_members(
    ctx: Any,
    payload: IpcPayload,
    redirect: bool,
    producer_gpu: int,
    consumer_gpus: Sequence[int],
    inboxes: list[Any],
    status_q: Any,
    stop: Any,
    timeout_s: float,
    hold: float,
) -> list[_Member]:
    """One consumer member (not started) per GPU in `consumer_gpus`, members 1..N, each with
    its own inbox."""
    return [
        _Member(
            i + 1,
            g,
            ctx.Process(
                target=_consumer,
                args=(
                    payload,
                    i + 1,
                    g,
                    producer_gpu,
                    redirect,
                    inboxes[i],
                    status_q,
                    stop,
                    3 * timeout_s,
                    hold,
                ),
                daemon=True,
            ),
        )
        for i, g in enumerate(consumer_gpus)
    ]


def _share_and_census(
    status: _Status,
    census: Census,
    result: dict[str, Any],
    producer: _Member,
    consumers: list[_Member],
    timeout_s: float,
) -> None:
    """Starts the consumers, takes the census before anything is shared, starts the producer,
    waits until every consumer opened the shared memory and takes the census while they hold
    it (into `result`); a consumer that let go before the census ended gets an error.
    Returns nothing; stops at the first failure."""
    for m in consumers:
        m.proc.start()
    failed = status.wait("ready", consumers, timeout_s)
    # consumers have their own contexts, nothing is shared yet
    if not failed and _take_census(census, result, "census_before"):
        producer.proc.start()
        failed = status.wait("ready", [producer], timeout_s)
        if not failed:
            failed = status.wait("opened", consumers, timeout_s)
        if not failed:
            time.sleep(SETTLE_S)
            if _take_census(census, result, "census_opened"):
                status.drain()
                for m in consumers:  # each must still hold what it opened when the census ended
                    if "released" in m.events or m.proc.exitcode is not None:
                        m.error = "stopped holding the shared memory before the census ended"


def _end_mode(
    status: _Status,
    stop: Any,
    producer_stop: Any,
    status_q: Any,
    inboxes: list[Any],
    producer: _Member,
    consumers: list[_Member],
    timeout_s: float,
) -> None:
    """Lets every consumer go (stop set, inboxes woken), waits for their release, ends them,
    then the producer (only after: they mapped its memory); returns nothing."""
    stop.set()
    for q in inboxes:
        q.put(None)  # wakes consumers still waiting for a message that will not come
    opened = [m for m in consumers if "opened" in m.events]
    status.wait("released", opened, min(timeout_s, 30.0))
    for m in opened:  # a consumer whose hold ran out let go before stop was set
        if not m.events.get("released", {}).get("on_stop", True) and m.error is None:
            m.error = "stopped holding the shared memory before the census ended"
    _end(consumers)
    producer_stop.set()  # only now: the consumers mapped the producer's memory
    _end([producer])
    for q in [status_q, *inboxes]:
        q.cancel_join_thread()


def _producer_row(
    producer: _Member, producer_gpu: int, opened_census: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The record's "producer": what it reported when ready (with its census GPU), or its GPU
    and error; None when it neither got ready nor failed (never started)."""
    prod = producer.events.get("ready")
    if prod is not None:
        row = {k: v for k, v in prod.items() if k not in ("member", "event")}
        row["census_gpu"] = _census_gpu(prod.get("uuid"), producer_gpu, opened_census)
        return row
    if producer.error:
        return {"gpu": producer_gpu, "error": producer.error}
    return None


def _consumer_rows(
    consumers: list[_Member], measured: bool, opened_census: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The record's "consumers": per consumer its GPU, what it reported when ready and when
    it opened, its census GPU, whether it held during the census (`measured`: the census
    while holding was taken), and its error."""
    rows = []
    for m in consumers:
        row: dict[str, Any] = {"gpu": m.gpu}
        for event in ("ready", "opened"):
            row.update(
                {k: v for k, v in m.events.get(event, {}).items() if k not in ("member", "event")}
            )
        row["census_gpu"] = _census_gpu(row.get("uuid"), m.gpu, opened_census)
        row["held_during_census"] = measured and m.error is None
        row["error"] = m.error
        rows.append(row)
    return rows


def _mode_error(
    producer: _Member, consumers: list[_Member], result: Mapping[str, Any]
) -> str | None:
    """The record's "error": which members failed and why, and a failed census; None when
    nothing failed."""
    problems = [f"{m.name}: {m.error}" for m in [producer, *consumers] if m.error]
    if "census_error" in result:
        problems.append(f"census {result['census_error']}")
    return "; ".join(problems) or None


def _end(members: list[_Member], grace_s: float = 10.0) -> None:
    """Join each started child; kill one still alive after grace_s (1 s if it hung)."""
    for m in members:
        if m.proc.pid is not None:
            m.proc.join(timeout=1.0 if m.hung else grace_s)
            if m.proc.is_alive():
                m.proc.kill()
                m.proc.join()


def _take_census(census: Census, result: dict[str, Any], key: str) -> bool:
    """result[key] = census(); a census that fails (NVML) is kept as "census_error"."""
    try:
        result[key] = census()
    except Exception as exc:
        result["census_error"] = f"{key}: {type(exc).__name__}: {exc}"
        return False
    return True


def cuda_visible_count(nvml_count: int, env: Mapping[str, str] | None = None) -> int:
    """How many of NVML's GPUs CUDA will show this process, by CUDA_VISIBLE_DEVICES.

    CUDA reads the list up to its first invalid entry (an index out of range, a negative
    number, an empty item); UUIDs ("GPU-...", "MIG-...") count as one device each."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return nvml_count
    n = 0
    for item in raw.split(","):
        item = item.strip()
        if (item.isdigit() and int(item) < nvml_count) or item.startswith(("GPU-", "MIG-")):
            n += 1
        else:
            break
    return min(n, nvml_count)


def run_ipc_arm(
    gpu_count: int,
    census: Census,
    sink: Sink,
    *,
    max_gpus: int | None = None,
    payload: IpcPayload | None = None,
    timeout_s: float = 120.0,
    hold_s: float | None = None,
) -> list[dict[str, Any]]:
    """Both modes with the producer on GPU 0 and consumers on GPUs 1..N-1, where N is
    gpu_count (CUDA-visible GPUs) or max_gpus if smaller; with N = 1, the same-GPU round trip
    only. Each mode's record (`kind` "abtest.ipc") goes to sink as soon as it is measured."""
    n = gpu_count if max_gpus is None else min(gpu_count, max_gpus)
    if n < 1:
        return []
    common = {"kind": "abtest.ipc", "gpu_count": n, "visible_gpu_count": gpu_count}
    if n < 2:
        note = (
            "the IPC redirect arm needs two GPUs; checked the single-GPU round trip only"
            if gpu_count < 2
            else f"--ipc-gpus {n}: checked the single-GPU round trip only"
        )
        sink({**common, "mode": "same-gpu", "skipped_cross_gpu": True, "note": note})
        record = {
            **common,
            "mode": "same-gpu",
            **run_mode(True, 0, [0], census, timeout_s, payload=payload, hold_s=hold_s),
        }
        sink(record)
        return [record]
    out = []
    for redirect in (False, True):
        res = run_mode(
            redirect, 0, list(range(1, n)), census, timeout_s, payload=payload, hold_s=hold_s
        )
        record = {**common, "mode": "redirect" if redirect else "no-redirect", **res}
        sink(record)
        out.append(record)
    return out


def run_ipc_subprocess(
    gpu_count: int,
    sink: Sink,
    *,
    max_gpus: int | None = None,
    timeout_s: float = 300.0,
    command: Sequence[str] | None = None,
) -> int:
    """run_ipc_arm in a fresh `python -m vramdoctor.abtest.ipc_arm` process (or `command`,
    which gets the same arguments and must speak the same `@@VD {json}` lines).

    gpu_count is what NVML sees; the child narrows it to the GPUs CUDA shows it. Its spawned
    producer/consumers re-import a module with a main guard (whatever started the CLI may not
    have one), and the CLI process stays off every GPU. A child that crashes or runs past
    timeout_s leaves one "failed" record saying so."""
    from vramdoctor.abtest.wire import stream

    cmd = [*(command or [sys.executable, "-m", "vramdoctor.abtest.ipc_arm"]), str(gpu_count)]
    if max_gpus is not None:
        cmd += ["--max-gpus", str(max_gpus)]

    def on_record(record: dict[str, Any]) -> None:
        sink(record)

    rc, tail, timed_out = stream(cmd, on_record, timeout_s=timeout_s, tail_lines=20)
    if rc != 0:
        error = (
            f"IPC arm gave no result within {timeout_s:.0f} s"
            if timed_out
            else f"IPC arm exited with code {rc}"
        )
        sink(
            {
                "kind": "abtest.ipc",
                "mode": "failed",
                "error": error,
                "log_tail": tail[-10:],
                "consumers": [],
            }
        )
    return rc


def main(
    argv: list[str] | None = None,
    *,
    census: Census | None = None,
    payload: IpcPayload | None = None,
) -> int:
    """`python -m vramdoctor.abtest.ipc_arm NVML_GPU_COUNT [--max-gpus N]`: records on stdout."""
    from vramdoctor.abtest.wire import emit_record

    parser = argparse.ArgumentParser(prog="python -m vramdoctor.abtest.ipc_arm")
    parser.add_argument("gpu_count", type=int, help="GPUs NVML sees")
    parser.add_argument("--max-gpus", type=int, default=None, help="use at most this many GPUs")
    args = parser.parse_args(argv)
    if census is None:
        from vramdoctor.abtest.gpumem import census as nvml_census

        census = nvml_census
    run_ipc_arm(
        cuda_visible_count(args.gpu_count),
        census,
        emit_record,
        max_gpus=args.max_gpus,
        payload=payload,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
