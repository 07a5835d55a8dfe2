"""background: a background thread that allocates whatever the traffic does.

A thread started at start-up allocates `--background-kib-per-s` KiB every second (in 10 steps
a second) and never frees it, from the first second on, in idle windows as in rounds, as a
metrics buffer or an in-memory log that nobody trims does. `--background-on host` (default):
libc malloc'd buffers, every page written; `vram`: on the device (real CUDA, or the virtual GPU).
Requests themselves are as in stable.

TRUTH: LEAK in time on that layer at `bytes_per_hour` = KiB/s x 1024 x 3600 (GET
/reference/info `background_bytes` so far); it grows inside idle windows too; it is NOT a leak
per request (a per-request rate would change with the traffic's pace).
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time
from typing import TYPE_CHECKING, Any

from refserver import malloc
from refserver.modes.base import Mode, layer

if TYPE_CHECKING:
    from refserver.state import State


class BackgroundMode(Mode):
    name = "background"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--background-kib-per-s",
            type=float,
            default=1024.0,
            help="background: KiB allocated per second, never freed",
        )
        parser.add_argument(
            "--background-on", choices=["host", "vram"], default="host", help="background: where"
        )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.held: list[Any] = []
        self.background_bytes = 0
        self.started: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, state: State) -> None:
        if self.args.background_on == "host" and malloc.LIBC is None:
            raise SystemExit("--mode background needs glibc for --background-on host")

    def warm_up(self, state: State) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(state,), name="reference-background", daemon=True
        )
        self.started = time.monotonic()
        self._thread.start()

    def _run(self, state: State) -> None:
        step = int(self.args.background_kib_per_s * 1024 / 10)
        libc = malloc.LIBC
        if libc is not None:
            libc.malloc.restype = ctypes.c_void_p
            libc.malloc.argtypes = [ctypes.c_size_t]
        due = time.monotonic()
        while not self._stop.is_set() and step > 0:
            due += 0.1
            if self.args.background_on == "vram":
                handle: Any = state.gpu_mem.alloc(step)
            else:
                handle = libc.malloc(step)
                if handle:
                    ctypes.memset(handle, 1, step)
            with state.lock:
                self.held.append(handle)
                self.background_bytes += step
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stop(self, state: State) -> None:
        self._stop.set()

    def bytes_per_hour(self) -> float:
        return float(self.args.background_kib_per_s * 1024 * 3600)

    def info(self, state: State) -> dict[str, Any]:
        return {
            "background_bytes": self.background_bytes,
            "background_seconds": None
            if self.started is None
            else round(time.monotonic() - self.started, 3),
            "background_bytes_per_hour": self.bytes_per_hour(),
        }

    def truth(self, state: State) -> dict[str, Any]:
        where = "vram" if self.args.background_on == "vram" else "host"
        layers = {
            "vram": layer("STABLE", "no GPU memory held"),
            "kv": layer("STABLE", "every request's KV tokens return to the pool"),
            "host": layer("STABLE", "requests keep nothing"),
        }
        layers[where] = layer(
            "LEAK",
            "a background thread allocates at a fixed pace, whatever the traffic: growth in "
            "time (idle windows too), not per request",
            bytes_per_hour=self.bytes_per_hour(),
            growth="time",
        )
        return {"summary": f"growth in time on {where}, not per request", "layers": layers}


MODES = [BackgroundMode]
