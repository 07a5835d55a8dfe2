"""Run a fast image processor on the GPU without its memory staying behind.

    python examples/fixes/scoped_processor.py [--model qwen2_vl] [--requests 20]

Prints the process's PyTorch reserved memory after each request, with and without
`request_scoped_pool`, and the escaped-bytes counter. Needs `pip install 'vramdoctor[gpu]'`
and a CUDA GPU; without them it says so in one line and exits 2. Uses public names only.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import NoReturn

from vramdoctor import VramdoctorError
from vramdoctor.abtest import load_processor, make_image, resolve_model
from vramdoctor.fixes import escaped_bytes, outputs_to_cpu, request_scoped_pool
from vramdoctor.units import MIB


def fail(message: str) -> NoReturn:
    print(f"scoped_processor.py: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2_vl", help="model id, local directory or family")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        fail("needs torch and transformers: pip install 'vramdoctor[gpu]' (and a CUDA GPU)")
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU (torch.cuda.is_available() is False here)")
    try:
        processor, name = load_processor(resolve_model(args.model))
    except VramdoctorError as exc:
        fail(str(exc))
    rng = random.Random(0)
    sizes = [(rng.randint(256, 2048), rng.randint(256, 2048)) for _ in range(args.requests)]
    print(f"{name}: PyTorch reserved MiB after each request")
    features = None
    for scoped in (False, True):
        torch.cuda.empty_cache()
        levels = []
        for h, w in sizes:
            image = make_image(h, w, seed=0)  # the same images both times
            with request_scoped_pool("cuda:0", enabled=scoped):
                features = outputs_to_cpu(
                    processor(images=[image], return_tensors="pt", device="cuda:0")
                )
            levels.append(round(torch.cuda.memory_reserved(0) / MIB))
        print(f"  {'scoped pool' if scoped else 'no pool    '}: {levels}")
    assert features is not None
    print(f"features on {features['pixel_values'].device}; escaped bytes: {escaped_bytes()}")


if __name__ == "__main__":
    main()
