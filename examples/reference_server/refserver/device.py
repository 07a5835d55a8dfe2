"""Where "GPU" memory lives for the modes that hold some: real CUDA, or a virtual GPU.

`Device.alloc(nbytes)` -> handle, `Device.free(handle)`; `allocated_bytes` counts what the
modes hold now. On CUDA (`--device cuda[:N]`) a handle is a real `torch.uint8` tensor filled
on the device, so NVML and the caching allocator see it. On the CPU the device is VIRTUAL: a
handle is a number of bytes counted, no host memory stands in for it (so the host layer does not
see it); the process publishes its device bytes in GET /reference/info ("device") and, with
`--vgpu-dir DIR` (or $REFERENCE_VGPU_DIR), as `DIR/<pid>.json`:

    {"pid": int, "ppid": int, "uid": int, "username": str, "command": str,
     "gpu": int, "gpu_instance": int | null, "gpu_profile": str | null,
     "compute_instance": int | null, "used_bytes": int, "context_bytes": int, "t": float}

`used_bytes` = `context_bytes` (what a CUDA context costs: `--vgpu-context-mib`, 500 MiB by
default, as measured on an H200) + the bytes allocated. The file is replaced atomically at most
every 0.1 s after a change, and removed at exit; a process killed with SIGKILL leaves it, so
readers drop files whose pid is gone (as a driver forgets a dead process).
tests/support/vgpu.py serves these files as nvitop-exporter / dcgm-exporter pages (MIG labels
for records with a gpu_instance).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

MIB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The virtual GPU's flags (used only on the CPU)."""
    parser.add_argument(
        "--vgpu-dir",
        default=os.environ.get("REFERENCE_VGPU_DIR"),
        help="CPU only: publish this process's virtual-GPU bytes as DIR/<pid>.json "
        "(default: $REFERENCE_VGPU_DIR; none)",
    )
    parser.add_argument("--vgpu-index", type=int, default=0, help="virtual GPU index")
    parser.add_argument(
        "--vgpu-instance",
        type=int,
        default=None,
        help="virtual MIG GPU instance id (GPU_I_ID) the process runs on; none: the whole GPU",
    )
    parser.add_argument(
        "--vgpu-profile", default="1g.18gb", help="virtual MIG profile name (GPU_I_PROFILE)"
    )
    parser.add_argument(
        "--vgpu-context-mib",
        type=float,
        default=500.0,
        help="virtual GPU: MiB a CUDA context costs the process (published with its bytes)",
    )


def username(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


class Device:
    """The device memory a mode holds. Thread-safe."""

    def __init__(
        self, args: argparse.Namespace, *, role: str = "server", publish_now: bool = True
    ) -> None:
        """`publish_now=False`: open the record directory now, publish only after `publish()`
        (a process that changes its uid in between: the tenant; its records must be its own)."""
        self.args = args
        self.cuda = str(args.device).startswith("cuda")
        self.role = role
        self.allocated_bytes = 0
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._written = 0.0
        self.dir = None if self.cuda else args.vgpu_dir
        self.context_bytes = 0 if self.cuda else int(args.vgpu_context_mib * MIB)
        self._flusher: threading.Thread | None = None
        self._dirfd: int | None = None
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)
            # Written relative to this fd: the directory was reachable when it was opened, even if
            # its parents are not for the uid this process takes later.
            self._dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            self._name = f"{os.getpid()}.json"
            atexit.register(self.close)
            if publish_now:
                self.publish()

    def publish(self) -> None:
        """Write the record and keep it current (a thread rewrites it after changes)."""
        if self._dirfd is None or self._flusher is not None:
            return
        self._write()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self._flusher.start()

    # --- allocation -------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Any:
        """Hold `nbytes` on the device; returns the handle to `free`."""
        nbytes = int(nbytes)
        if self.cuda:
            import torch

            handle: Any = torch.ones(nbytes, dtype=torch.uint8, device=self.args.device)
        else:
            handle = nbytes
        with self._lock:
            self.allocated_bytes += nbytes
        self._dirty.set()
        return handle

    def free(self, handle: Any) -> None:
        nbytes = int(handle.numel()) if self.cuda else int(handle)
        with self._lock:
            self.allocated_bytes -= nbytes
        self._dirty.set()
        del handle

    def return_to_driver(self) -> None:
        """Give the freed device memory back to the driver, as vLLM's sleep mode (CuMemAllocator
        unmaps the pages) and SGLang's memory saver do: on CUDA the caching allocator would
        otherwise keep the freed blocks reserved and NVML would see no change."""
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    @property
    def used_bytes(self) -> int:
        """What the exporter reports for this process: context + allocated."""
        return self.context_bytes + self.allocated_bytes

    def describe(self) -> dict[str, Any]:
        """GET /reference/info's "device" block."""
        return {
            "kind": "cuda" if self.cuda else "virtual",
            "gpu": self.args.vgpu_index if not self.cuda else self.args.device,
            "gpu_instance": None if self.cuda else self.args.vgpu_instance,
            "allocated_bytes": self.allocated_bytes,
            "used_bytes": self.used_bytes,
            "vgpu_dir": self.dir,
        }

    # --- publication (virtual only) ---------------------------------------------------------
    def record(self) -> dict[str, Any]:
        uid = os.getuid()
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "uid": uid,
            "username": username(uid),
            "command": " ".join(sys.argv)[:200] or sys.executable,
            "role": self.role,
            "gpu": self.args.vgpu_index,
            "gpu_instance": self.args.vgpu_instance,
            "gpu_profile": self.args.vgpu_profile if self.args.vgpu_instance is not None else None,
            "compute_instance": 0 if self.args.vgpu_instance is not None else None,
            "used_bytes": self.used_bytes,
            "context_bytes": self.context_bytes,
            "t": time.time(),
        }

    def _write(self) -> None:
        assert self._dirfd is not None
        tmp = f".{self._name}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self._dirfd)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.record(), fh)
        os.replace(tmp, self._name, src_dir_fd=self._dirfd, dst_dir_fd=self._dirfd)
        self._written = time.monotonic()

    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(0.5):
                wait = 0.1 - (time.monotonic() - self._written)
                if wait > 0:
                    self._stop.wait(wait)
                self._dirty.clear()
                with contextlib.suppress(OSError):
                    self._write()

    def flush(self) -> None:
        """Write the record now (a test reads the file right after a request)."""
        if self._dirfd is not None:
            self._dirty.clear()
            with contextlib.suppress(OSError):
                self._write()

    def close(self) -> None:
        self._stop.set()
        if self._dirfd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._name, dir_fd=self._dirfd)
            with contextlib.suppress(OSError):
                os.close(self._dirfd)
            self._dirfd = None
