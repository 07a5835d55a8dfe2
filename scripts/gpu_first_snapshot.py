"""How long PyTorch's allocator reads take in a CUDA process, first call and later ones, plain
and with the agent's allocator history armed (state, Python stacks), and how long another
Python thread is kept waiting meanwhile (the agent's first inside record read 4.1 s on an
H200, 2026-12-02; a fresh process without history reads 0.2 ms). One JSON line per setting."""

import json
import sys
import threading
import time

import torch

history = len(sys.argv) > 1 and sys.argv[1] == "history"
if history:
    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
kept = [torch.ones(1 << (10 + i % 12), device="cuda") for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300)]
torch.cuda.synchronize()
gaps = [0.0]
stop = threading.Event()


def ticker() -> None:
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps[0] = max(gaps[0], now - last)
        last = now


th = threading.Thread(target=ticker, daemon=True)
th.start()
time.sleep(0.05)
t: dict[str, float] = {"history": float(history), "tensors": float(len(kept))}
for name, fn in (
    ("memory_stats", lambda: torch.cuda.memory_stats(0)),
    ("snapshot", lambda: torch.cuda.memory._snapshot()),
):
    for i in range(3):
        gaps[0] = 0.0
        t0 = time.perf_counter()
        fn()
        t[f"{name}_{i}_ms"] = (time.perf_counter() - t0) * 1e3
        time.sleep(0.01)
        t[f"{name}_{i}_thread_blocked_ms"] = gaps[0] * 1e3
stop.set()
print(json.dumps({k: round(v, 3) for k, v in t.items()}))
