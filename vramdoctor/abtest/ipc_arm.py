"""The IPC arm: does the consumer-device redirect keep consumers off the producer's GPU?

A producer on one GPU shares a pooled feature slice and a plain tensor over CUDA IPC; one
consumer per other GPU opens them, once without the redirect (torch's way: the handle is
opened on the producer's device, creating a CUDA context there) and once with it
(`vramdoctor.fixes.open_cuda_tensor(..., redirect=True)`). While the consumers hold the
tensors, the parent (which never touches CUDA) takes an NVML census of every process on every
GPU. Each consumer checks the data it read back against the producer's checksums.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from ..model import MIB

FEATURE_ELEMS = 4 * MIB  # int32: 16 MiB feature placed in the pooled buffer
TENSOR_ELEMS = 2 * MIB  # int32: 8 MiB plain tensor shared on its own
POOL_TOTAL_BYTES = 128 * MIB
POOL_WORKERS = 4  # -> max(32 MiB, 128 MiB) = 128 MiB: shows the floor of the split
OVERSIZE_BYTES = 130 * MIB  # does not fit the buffer: must go by CPU


def _producer(gpu: int, n_consumers: int, to_consumers: list[Any], status: Any, stop: Any) -> None:
    try:
        from ..fixes import FeatureBufferPool, share_cuda_tensor, to_transport
        from ..fixes._torch import load_torch

        torch = load_torch("ab-test IPC arm")
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        pool = FeatureBufferPool(POOL_TOTAL_BYTES, POOL_WORKERS, dev)
        feature = (torch.arange(FEATURE_ELEMS, dtype=torch.int32, device=dev) * 7) % 1000003
        plain = (torch.arange(TENSOR_ELEMS, dtype=torch.int32, device=dev) * 13) % 65521
        piece = pool.put(feature)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            oversize = to_transport(pool, torch.zeros(OVERSIZE_BYTES, dtype=torch.uint8, device=dev))
        message = {
            "slice": piece,
            "tensor": share_cuda_tensor(plain),
            "expected_slice": int(feature.to(torch.int64).sum().item()),
            "expected_tensor": int(plain.to(torch.int64).sum().item()),
        }
        torch.cuda.synchronize(dev)
        status.put({
            "who": "producer", "event": "ready", "pid": os.getpid(), "gpu": gpu,
            "pool_bytes": pool.capacity, "oversize_went_cpu": getattr(oversize, "device", None) is not None
            and oversize.device.type == "cpu", "pool_warning": [str(w.message) for w in caught][:1],
        })
        for q in to_consumers[:n_consumers]:
            q.put(message)
        stop.wait(120)
    except Exception as exc:
        status.put({"who": "producer", "event": "error", "message": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=3)})


def _consumer(gpu: int, producer_gpu: int, redirect: bool, inbox: Any, status: Any, stop: Any) -> None:
    try:
        from ..fixes import open_cuda_tensor, open_slice, peer_access
        from ..fixes._torch import load_torch
        from ..fixes.feature_pool import forget_opened

        torch = load_torch("ab-test IPC arm")
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize(gpu)
        peer = peer_access(gpu, producer_gpu)
        status.put({"who": "consumer", "event": "ready", "pid": os.getpid(), "gpu": gpu, "peer_access": peer})
        message = inbox.get(timeout=120)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sliced = open_slice(message["slice"], gpu, redirect=redirect)
            plain = open_cuda_tensor(message["tensor"], gpu, redirect=redirect)
        got_slice = int(sliced.to(torch.int64).sum().item())
        got_tensor = int(plain.to(torch.int64).sum().item())
        torch.cuda.synchronize()
        status.put({
            "who": "consumer", "event": "opened", "pid": os.getpid(), "gpu": gpu,
            "tensor_device": plain.device.index,
            "redirect_applied": plain.device.index == gpu and gpu != producer_gpu,
            "slice_correct": got_slice == message["expected_slice"],
            "tensor_correct": got_tensor == message["expected_tensor"],
            "warnings": [str(w.message) for w in caught][:2],
        })
        stop.wait(120)
        del sliced, plain
        forget_opened()
        torch.cuda.synchronize()
    except Exception as exc:
        status.put({"who": "consumer", "event": "error", "gpu": gpu,
                    "message": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)})


def _collect(status: Any, who: str, event: str, n: int, timeout_s: float) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"IPC arm: {who} did not report '{event}' within {timeout_s:.0f} s")
        try:
            msg = status.get(timeout=left)
        except queue.Empty:
            continue
        if msg.get("event") == "error":
            raise RuntimeError(f"IPC arm {msg.get('who')} failed: {msg.get('message')}")
        if msg.get("who") == who and msg.get("event") == event:
            got.append(msg)
    return got


def run_mode(
    redirect: bool,
    producer_gpu: int,
    consumer_gpus: list[int],
    census: Callable[[], dict[str, Any]],
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """One producer and its consumers; census before and while the consumers hold the data."""
    ctx = mp.get_context("spawn")
    status = ctx.Queue()
    stop = ctx.Event()
    inboxes = [ctx.Queue() for _ in consumer_gpus]
    producer_stop = ctx.Event()  # the producer outlives its consumers (they hold its memory)
    producer = ctx.Process(target=_producer, args=(producer_gpu, len(consumer_gpus), inboxes, status, producer_stop))
    consumers = [
        ctx.Process(target=_consumer, args=(g, producer_gpu, redirect, inboxes[i], status, stop))
        for i, g in enumerate(consumer_gpus)
    ]
    procs = [producer, *consumers]
    result: dict[str, Any] = {"redirect": redirect, "producer_gpu": producer_gpu, "consumer_gpus": consumer_gpus}
    try:
        for p in consumers:
            p.start()
        ready = _collect(status, "consumer", "ready", len(consumers), timeout_s)
        result["census_before"] = census()  # consumers have their own contexts, nothing opened
        producer.start()
        result["producer"] = _collect(status, "producer", "ready", 1, timeout_s)[0]
        opened = _collect(status, "consumer", "opened", len(consumers), timeout_s)
        time.sleep(0.3)
        result["census_opened"] = census()
        result["consumers"] = sorted(
            ({**r, **next(o for o in opened if o["pid"] == r["pid"])} for r in ready), key=lambda c: c["gpu"]
        )
    except (TimeoutError, RuntimeError) as exc:
        result["error"] = str(exc)
    finally:
        stop.set()
        for p in consumers:
            if p.pid is not None:
                p.join(timeout=30)
        producer_stop.set()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()
    return result


def run_ipc_arm(
    gpu_count: int,
    census: Callable[[], dict[str, Any]],
    sink: Callable[[dict[str, Any]], None],
    *,
    max_consumers: int = 3,
) -> list[dict[str, Any]]:
    """Both modes on GPU 0 -> GPUs 1..n; with one GPU, only the same-GPU round trip."""
    if gpu_count < 1:
        return []
    if gpu_count < 2:
        sink({"kind": "abtest.ipc", "mode": "same-gpu", "skipped_cross_gpu": True,
              "note": "the IPC redirect arm needs two GPUs; checked the single-GPU round trip only"})
        res = run_mode(True, 0, [0], census)
        record = {"kind": "abtest.ipc", "mode": "same-gpu", **res}
        sink(record)
        return [record]
    consumers = list(range(1, min(gpu_count, max_consumers + 1)))
    out = []
    for redirect in (False, True):
        res = run_mode(redirect, 0, consumers, census)
        record = {"kind": "abtest.ipc", "mode": "redirect" if redirect else "no-redirect", **res}
        sink(record)
        out.append(record)
    return out


def run_ipc_subprocess(
    gpu_count: int, sink: Callable[[dict[str, Any]], None], *, timeout_s: float = 300.0
) -> int:
    """run_ipc_arm in a fresh `python -m vramdoctor.abtest.ipc_arm` process.

    Its spawned producer/consumers then re-import a module with a main guard (whatever
    started the CLI may not have one), and the CLI process stays off every GPU.
    """
    import sys

    from .protocol import stream

    rc, tail, timed_out = stream([sys.executable, "-m", "vramdoctor.abtest.ipc_arm", str(gpu_count)],
                                 sink, timeout_s=timeout_s, tail_lines=20)
    if rc != 0:
        error = f"IPC arm gave no result within {timeout_s:.0f} s" if timed_out else f"IPC arm exited with code {rc}"
        sink({"kind": "abtest.ipc", "mode": "failed", "error": error, "log_tail": tail[-10:], "consumers": []})
    return rc


def main(argv: list[str] | None = None) -> int:
    import sys

    from .gpumem import census
    from .protocol import emit_record

    args = sys.argv[1:] if argv is None else argv
    run_ipc_arm(int(args[0]), census, emit_record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
