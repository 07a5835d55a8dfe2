"""One variant in its own process: `python -m vramdoctor.abtest.worker CONFIG_JSON`.

A fresh process per variant means a fresh CUDA context and caching allocator, so no variant
inherits another's cached segments or allocator settings (expandable_segments is read once
at CUDA init). It prints protocol lines `@@VD {json}` on stdout: context, request, round,
idle, done (or error); everything else on stdout/stderr is free text the runner keeps as
the variant's log.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from contextlib import nullcontext
from typing import Any

from vramdoctor.abtest.models import ModelChoice
from vramdoctor.abtest.variants import Variant
from vramdoctor.abtest.wire import emit_record
from vramdoctor.abtest.workload import WorkloadSpec, round_images
from vramdoctor.errors import VramdoctorError
from vramdoctor.samples import MIB


def emit(kind: str, **data: Any) -> None:
    emit_record({"kind": kind, **data})


def run_variant(config: dict[str, Any]) -> None:
    from vramdoctor.abtest.gpumem import ProcessMemory
    from vramdoctor.abtest.processor import load_processor
    from vramdoctor.fixes import escaped_bytes, outputs_to_cpu, parked_pools, request_scoped_pool
    from vramdoctor.fixes._torch import cuda_usable, has_mem_pool, load_torch
    from vramdoctor.fixes.scoped_pool import unguarded_scoped_pool

    variant = Variant.from_dict(config["variant"])
    spec = WorkloadSpec.from_dict(config["workload"])
    choice = ModelChoice(**config["model"])
    gpu = int(config.get("gpu", 0))
    idle_s = float(config.get("idle_s", 3.0))

    torch = load_torch("vramdoctor ab-test")
    if not cuda_usable(torch):
        raise VramdoctorError(
            f"vramdoctor ab-test needs a CUDA GPU and a CUDA build of torch: torch {torch.__version__} "
            "sees none (pip install 'vramdoctor[gpu]')"
        )
    if variant.scope != "none" and not has_mem_pool(torch):
        raise VramdoctorError(
            f"torch {torch.__version__} has no torch.cuda.MemPool: cannot run {variant.name}"
        )
    processor, class_name = load_processor(choice)
    mem = ProcessMemory(gpu)
    on_gpu = variant.device == "cuda"

    def own_mib() -> float | None:
        """NVML MiB of this process; None on a GPU variant when NVML does not list our PID
        (another PID namespace: the analysis then falls back to PyTorch's figures)."""
        mib, _ = mem.read()
        if mib is None and not on_gpu:
            return 0.0  # no CUDA context at all
        return mib

    device = f"cuda:{gpu}"
    if on_gpu:
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize(gpu)  # creates the CUDA context, allocates nothing
    time.sleep(0.2)
    bare_context_mib = own_mib()

    def scope() -> Any:
        if variant.scope == "guarded":
            return request_scoped_pool(device)
        if variant.scope == "unguarded":
            return unguarded_scoped_pool(device)
        return nullcontext()

    # Warm-up: one small request in the variant's own mode loads the kernels it needs (lazy
    # module loading adds them to the context), then the caches are emptied. Memory is judged
    # against this level: the context as the workload will have it, holding nothing cached.
    import numpy as np

    warm = np.random.default_rng(0).integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
    with scope():
        outputs_to_cpu(
            processor(images=[warm], return_tensors="pt", device=device if on_gpu else "cpu")
        )
    if on_gpu:
        torch.cuda.synchronize(gpu)
        torch.cuda.empty_cache()
    time.sleep(0.2)
    context_mib = own_mib()
    _, device_used = mem.read()
    emit(
        "context",
        variant=variant.name,
        pid=os.getpid(),
        gpu=gpu,
        processor=class_name,
        torch=torch.__version__,
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        bare_context_mib=bare_context_mib,
        context_mib=context_mib,
        reserved_after_warmup_mib=torch.cuda.memory_reserved(gpu) / MIB if on_gpu else 0.0,
        device_used_mib=device_used,
    )

    held: Any = None
    for r in range(spec.rounds):
        images = round_images(spec, r)
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(gpu)
        for i, image in enumerate(images):
            t0 = time.perf_counter()
            with scope():
                out = processor(
                    images=[image], return_tensors="pt", device=device if on_gpu else "cpu"
                )
                if not variant.escape:
                    out = outputs_to_cpu(out)
            if variant.escape:
                gpu_out = out  # the bug: a GPU tensor of the scope still referenced after it
                out = outputs_to_cpu(gpu_out)
                held = gpu_out
            if variant.empty_cache_each_request:
                torch.cuda.empty_cache()
            latency_ms = (time.perf_counter() - t0) * 1000.0
            nvml_mib = own_mib()
            emit(
                "request",
                round=r,
                i=i,
                h=int(image.shape[0]),
                w=int(image.shape[1]),
                latency_ms=latency_ms,
                torch_reserved_mib=torch.cuda.memory_reserved(gpu) / MIB if on_gpu else 0.0,
                torch_allocated_mib=torch.cuda.memory_allocated(gpu) / MIB if on_gpu else 0.0,
                nvml_mib=nvml_mib,
                escaped_bytes=escaped_bytes(),
                parked_pools=parked_pools(),
            )
            del out
        nvml_mib = own_mib()
        emit(
            "round",
            round=r,
            torch_reserved_mib=torch.cuda.memory_reserved(gpu) / MIB if on_gpu else 0.0,
            torch_peak_reserved_mib=torch.cuda.max_memory_reserved(gpu) / MIB if on_gpu else 0.0,
            nvml_mib=nvml_mib,
            escaped_bytes=escaped_bytes(),
        )
    gc.collect()
    time.sleep(idle_s)
    nvml_mib = own_mib()
    emit(
        "idle",
        idle_s=idle_s,
        torch_reserved_mib=torch.cuda.memory_reserved(gpu) / MIB if on_gpu else 0.0,
        nvml_mib=nvml_mib,
        escaped_bytes=escaped_bytes(),
        held_output=held is not None,
    )
    mem.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        config = json.loads(args[0])
        run_variant(config)
    except VramdoctorError as exc:
        emit("error", message=str(exc), error=type(exc).__name__)
        return 2
    except Exception as exc:  # report, then let the runner mark the variant failed
        emit("error", message=f"{type(exc).__name__}: {exc}", error=type(exc).__name__)
        import traceback

        traceback.print_exc()
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
