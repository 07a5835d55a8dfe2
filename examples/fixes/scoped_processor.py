"""Run a fast image processor on the GPU without its memory staying behind.

    python examples/fixes/scoped_processor.py [--model qwen2_vl] [--requests 20]

Prints the process's PyTorch reserved memory after each request, with and without
`request_scoped_pool`, and the escaped-bytes counter. Needs `pip install 'vramdoctor[gpu]'`
and a CUDA GPU.
"""

from __future__ import annotations

import argparse

import numpy as np

from vramdoctor.abtest.models import resolve_model
from vramdoctor.abtest.processor import load_processor
from vramdoctor.abtest.workload import make_image
from vramdoctor.fixes import escaped_bytes, outputs_to_cpu, request_scoped_pool
from vramdoctor.fixes._torch import load_torch
from vramdoctor.model import MIB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2_vl", help="model id, local directory or family")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()

    torch = load_torch("this example")
    processor, name = load_processor(resolve_model(args.model))
    rng = np.random.default_rng(0)
    sizes = rng.integers(256, 2049, size=(args.requests, 2))
    print(f"{name}: PyTorch reserved MiB after each request")
    for scoped in (False, True):
        torch.cuda.empty_cache()
        levels = []
        for h, w in sizes:
            image = make_image(int(h), int(w), seed=0)  # the same images both times
            with request_scoped_pool("cuda:0", enabled=scoped):
                features = outputs_to_cpu(processor(images=[image], return_tensors="pt", device="cuda:0"))
            levels.append(round(torch.cuda.memory_reserved(0) / MIB))
        print(f"  {'scoped pool' if scoped else 'no pool    '}: {levels}")
    print(f"features on {features['pixel_values'].device}; escaped bytes: {escaped_bytes()}")


if __name__ == "__main__":
    main()
