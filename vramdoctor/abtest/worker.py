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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vramdoctor.abtest.models import ModelChoice
from vramdoctor.abtest.variants import Variant
from vramdoctor.abtest.wire import emit_record
from vramdoctor.abtest.workload import WorkloadSpec, round_images
from vramdoctor.errors import VramdoctorError
from vramdoctor.samples import MIB

if TYPE_CHECKING:
    from vramdoctor.abtest.gpumem import ProcessMemory


def emit(kind: str, **data: Any) -> None:
    emit_record({"kind": kind, **data})


def run_variant(config: dict[str, Any]) -> None:
    """Run the variant `config` (the runner's JSON) names, printing its protocol lines: one
    context line after the warm-up, a line per request and per round, then the idle line."""
    from vramdoctor.abtest.gpumem import ProcessMemory
    from vramdoctor.abtest.processor import load_processor
    from vramdoctor.fixes._torch import load_torch

    variant = Variant.from_dict(config["variant"])
    spec = WorkloadSpec.from_dict(config["workload"])
    choice = ModelChoice(**config["model"])
    gpu = int(config.get("gpu", 0))
    idle_s = float(config.get("idle_s", 3.0))

    torch = load_torch("vramdoctor ab-test")
    _check_torch(torch, variant)
    processor, class_name = load_processor(choice)
    run = _VariantRun(
        variant=variant, torch=torch, processor=processor, mem=ProcessMemory(gpu), gpu=gpu
    )
    bare_context_mib = run.open_context()
    run.warm_up()
    context_mib = run.own_mib()
    _, device_used = run.mem.read()
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
        reserved_after_warmup_mib=run.reserved_mib(),
        device_used_mib=device_used,
    )
    for r in range(spec.rounds):
        run.run_round(r, round_images(spec, r))
    run.idle(idle_s)
    run.mem.close()


def _check_torch(torch: Any, variant: Variant) -> None:
    """VramdoctorError unless torch sees a CUDA GPU and has what the variant's scope needs."""
    from vramdoctor.fixes._torch import cuda_usable, has_mem_pool

    if not cuda_usable(torch):
        raise VramdoctorError(
            f"vramdoctor ab-test needs a CUDA GPU and a CUDA build of torch: torch {torch.__version__} "
            "sees none (pip install 'vramdoctor[gpu]')"
        )
    if variant.scope != "none" and not has_mem_pool(torch):
        raise VramdoctorError(
            f"torch {torch.__version__} has no torch.cuda.MemPool: cannot run {variant.name}"
        )


@dataclass
class _VariantRun:
    """One variant's process: its processor, torch, the GPU and this process's memory on it."""

    variant: Variant
    torch: Any
    processor: Any
    mem: ProcessMemory
    gpu: int
    # With variant.escape: the last request's GPU output, still referenced (the bug it shows).
    held: Any = None

    @property
    def on_gpu(self) -> bool:
        return self.variant.device == "cuda"

    @property
    def device(self) -> str:
        return f"cuda:{self.gpu}"

    def own_mib(self) -> float | None:
        """NVML MiB of this process; None on a GPU variant when NVML does not list our PID
        (another PID namespace: the analysis then falls back to PyTorch's figures)."""
        mib, _ = self.mem.read()
        if mib is None and not self.on_gpu:
            return 0.0  # no CUDA context at all
        return mib

    def reserved_mib(self) -> float:
        """What PyTorch's caching allocator reserves on the GPU (0 for a CPU variant)."""
        return self.torch.cuda.memory_reserved(self.gpu) / MIB if self.on_gpu else 0.0

    def scope(self) -> Any:
        """The variant's request scope: a guarded or unguarded scoped pool, or none."""
        from vramdoctor.fixes import request_scoped_pool
        from vramdoctor.fixes.scoped_pool import unguarded_scoped_pool

        if self.variant.scope == "guarded":
            return request_scoped_pool(self.device)
        if self.variant.scope == "unguarded":
            return unguarded_scoped_pool(self.device)
        return nullcontext()

    def process(self, image: Any) -> Any:
        """The processor's output for one image, on the variant's device."""
        return self.processor(
            images=[image], return_tensors="pt", device=self.device if self.on_gpu else "cpu"
        )

    def open_context(self) -> float | None:
        """Create the CUDA context (a GPU variant; it allocates nothing); this process's MiB
        then."""
        if self.on_gpu:
            self.torch.cuda.set_device(self.gpu)
            self.torch.cuda.synchronize(self.gpu)  # creates the CUDA context, allocates nothing
        time.sleep(0.2)
        return self.own_mib()

    def warm_up(self) -> None:
        """One small request in the variant's own mode loads the kernels it needs (lazy module
        loading adds them to the context), then the caches are emptied. Memory is judged
        against this level: the context as the workload will have it, holding nothing cached."""
        import numpy as np

        from vramdoctor.fixes import outputs_to_cpu

        warm = np.random.default_rng(0).integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
        with self.scope():
            outputs_to_cpu(self.process(warm))
        if self.on_gpu:
            self.torch.cuda.synchronize(self.gpu)
            self.torch.cuda.empty_cache()
        time.sleep(0.2)

    def run_round(self, r: int, images: list[Any]) -> None:
        """Round `r`: its requests, a request line each, then the round line."""
        from vramdoctor.fixes import escaped_bytes

        torch, gpu, on_gpu = self.torch, self.gpu, self.on_gpu
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(gpu)
        for i, image in enumerate(images):
            self.request(r, i, image)
        nvml_mib = self.own_mib()
        emit(
            "round",
            round=r,
            torch_reserved_mib=self.reserved_mib(),
            torch_peak_reserved_mib=torch.cuda.max_memory_reserved(gpu) / MIB if on_gpu else 0.0,
            nvml_mib=nvml_mib,
            escaped_bytes=escaped_bytes(),
        )

    def request(self, r: int, i: int, image: Any) -> None:
        """Request `i` of round `r` in the variant's scope, its output brought to the CPU (with
        variant.escape, after the scope, the GPU output kept); its request line."""
        from vramdoctor.fixes import escaped_bytes, outputs_to_cpu, parked_pools

        torch, gpu, on_gpu = self.torch, self.gpu, self.on_gpu
        t0 = time.perf_counter()
        with self.scope():
            out = self.process(image)
            if not self.variant.escape:
                out = outputs_to_cpu(out)
        if self.variant.escape:
            gpu_out = out  # the bug: a GPU tensor of the scope still referenced after it
            out = outputs_to_cpu(gpu_out)
            self.held = gpu_out
        if self.variant.empty_cache_each_request:
            torch.cuda.empty_cache()
        latency_ms = (time.perf_counter() - t0) * 1000.0
        nvml_mib = self.own_mib()
        emit(
            "request",
            round=r,
            i=i,
            h=int(image.shape[0]),
            w=int(image.shape[1]),
            latency_ms=latency_ms,
            torch_reserved_mib=self.reserved_mib(),
            torch_allocated_mib=torch.cuda.memory_allocated(gpu) / MIB if on_gpu else 0.0,
            nvml_mib=nvml_mib,
            escaped_bytes=escaped_bytes(),
            parked_pools=parked_pools(),
        )
        del out

    def idle(self, idle_s: float) -> None:
        """Collect garbage, wait `idle_s` seconds, then the idle line: what stays held."""
        from vramdoctor.fixes import escaped_bytes

        gc.collect()
        time.sleep(idle_s)
        nvml_mib = self.own_mib()
        emit(
            "idle",
            idle_s=idle_s,
            torch_reserved_mib=self.reserved_mib(),
            nvml_mib=nvml_mib,
            escaped_bytes=escaped_bytes(),
            held_output=self.held is not None,
        )


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
