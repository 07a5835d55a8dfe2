"""Record small PyTorch allocator snapshot series on a CUDA GPU for vramdoctor's CPU tests.

Run on the GPU machine from a copy of this file placed under a virtual-environment-like path
(scripts/gpu_attribute.sh copies it to /opt/torch/vd_app/), so the "server's own" frames live
under /opt/torch/... while PyTorch's live under /opt/torch/.venv/lib/python3.X/site-packages/torch/.

Usage: record_attribute_fixtures.py KIND OUT_DIR
  KIND: leak        weights before arming (no frames), a bounded cache filled in round 1, a
                    1 MiB tensor kept per request, transient work; 4 snapshots, 10 requests/round
        caching     the same without the kept tensor (no growing stack)
        escape      a request-scoped torch.cuda.MemPool whose output escapes (private pools, dead)
        expandable  `leak` under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by caller)
Each snapshot: OUT_DIR/KIND-<n>.pickle, plus OUT_DIR/KIND.json with the truth (bytes kept per
request, requests per round).
"""

import json
import os
import pickle
import sys

import torch

MIB = 1024 * 1024
REQUESTS = 10
ROUNDS = 3
KEPT: list = []
CACHE: dict = {}


def load_weights():
    return [torch.empty(4 * MIB, dtype=torch.uint8, device="cuda") for _ in range(2)]


def cache_features(key):
    if key not in CACHE and len(CACHE) < 3:
        CACHE[key] = torch.empty(2 * MIB, dtype=torch.uint8, device="cuda")


def transient_work():
    scratch = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    return int(scratch.numel())


def keep_per_request():
    KEPT.append(torch.ones(MIB, dtype=torch.uint8, device="cuda"))


def escape_request():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        scratch = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
        out = torch.ones(1536 * 1024, dtype=torch.uint8, device="cuda")
        del scratch
    KEPT.append(out)  # escapes the pool; the pool object dies with this frame
    del pool


def handle_request(kind, i):
    transient_work()
    if kind in ("leak", "caching", "expandable"):
        cache_features(i % 4)
    if kind in ("leak", "expandable"):
        keep_per_request()
    if kind == "escape":
        escape_request()


def main(kind, out):
    os.makedirs(out, exist_ok=True)
    torch.cuda.init()
    weights = load_weights()  # before arming: blocks without frames
    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
    snaps = []
    for rnd in range(ROUNDS + 1):
        if rnd:
            for i in range(REQUESTS):
                handle_request(kind, i)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        path = os.path.join(out, f"{kind}-{rnd}.pickle")
        with open(path, "wb") as fh:
            pickle.dump(snap, fh, protocol=4)
        snaps.append(path)
    truth = {"kind": kind, "requests_per_round": REQUESTS, "rounds": ROUNDS,
             "kept_bytes_per_request": {"leak": MIB, "expandable": MIB, "escape": 1536 * 1024}.get(kind, 0),
             "torch": torch.__version__, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
             "files": [os.path.basename(p) for p in snaps], "python": sys.version.split()[0],
             "script": os.path.abspath(__file__), "weights": len(weights)}
    with open(os.path.join(out, f"{kind}.json"), "w") as fh:
        json.dump(truth, fh, indent=1)
    print(json.dumps(truth))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
