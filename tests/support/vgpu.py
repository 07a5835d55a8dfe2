"""GPU exporter pages for the reference server's virtual GPU (CPU-only machines).

On the CPU the reference server's device memory is virtual: each process writes
`DIR/<pid>.json` (examples/reference_server/refserver/device.py gives the fields) with its
pid, uid, user, GPU index, MIG GPU instance and bytes used. `VirtualGpu(DIR)` serves those
records on loopback as a real exporter would publish a GPU's memory, rendered with
support.sources' exposition writers (prometheus_client for nvitop-exporter, the text template
for dcgm-exporter):

- flavour "nvitop": per process `process_gpu_memory_MiB{pid,username,...}` and per GPU
  used/free/total (nvitop-exporter 1.7);
- flavour "dcgm": per GPU, or per MIG GPU instance when records carry one (labels
  `GPU_I_PROFILE`, `GPU_I_ID`), `DCGM_FI_DEV_FB_USED` / `DCGM_FI_DEV_FB_FREE` in MiB: device
  level only, as dcgm-exporter is.

Records of processes that are gone are dropped (as the driver forgets a dead process), so a
SIGKILLed server disappears from the page. Values are read when the page is scraped.

    with VirtualGpu(tmp / "vgpu", flavour="dcgm", mig=True) as gpu:
        run_soak(url, tmp, "--gpu-metrics", gpu.metrics_url, ...)
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from support.sources import dcgm_text, metrics_only, nvitop_text, serve

MIB = 1024 * 1024
H200_MIB = 143771  # an H200's framebuffer as NVML reports it (MiB)
H200_SLICE_MIB = 16384  # a 1g.18gb MIG slice's framebuffer (MiB), approximately


def _alive(pid: int) -> bool:
    """Running, not a zombie: a process that exited holds no GPU memory, even before its parent
    reaps it (NVML lists no context of it; CI read an exited tenant's 524.8 MiB otherwise)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


class VirtualGpu:
    """An exporter page for the processes publishing into `vgpu_dir` (see the module doc)."""

    def __init__(
        self,
        vgpu_dir: Path,
        *,
        flavour: str = "nvitop",
        gpus: int = 1,
        host: str = "ref-host",
        total_mib: float = H200_MIB,
        slice_mib: float = H200_SLICE_MIB,
    ) -> None:
        if flavour not in ("nvitop", "dcgm"):
            raise ValueError(f"flavour {flavour!r}: nvitop or dcgm")
        self.dir = Path(vgpu_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o1777)  # a tenant of another uid writes here too
        self.flavour = flavour
        self.gpus = gpus
        self.host = host
        self.total_mib = total_mib
        self.slice_mib = slice_mib
        self.metrics_url = ""
        self._ctx: Any = None

    def records(self) -> list[dict[str, Any]]:
        """The live processes' records (dead pids and half-written files skipped)."""
        out = []
        for path in sorted(self.dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(path.read_text())
                if _alive(int(rec["pid"])):
                    out.append(rec)
        return out

    def page(self) -> str:
        recs = self.records()
        if self.flavour == "nvitop":
            gpus = []
            for i in range(self.gpus):
                used = sum(r["used_bytes"] for r in recs if int(r["gpu"]) == i) / MIB
                gpus.append(
                    {
                        "index": i,
                        "name": "NVIDIA H200",
                        "uuid": f"GPU-{i:08d}-vgpu",
                        "total": self.total_mib,
                        "used": round(used, 1),
                        "free": round(self.total_mib - used, 1),
                    }
                )
            procs = [
                {
                    "index": int(r["gpu"]),
                    "pid": int(r["pid"]),
                    "username": r.get("username", "root"),
                    "mib": round(r["used_bytes"] / MIB, 3),
                    "command": str(r.get("command", "python"))[:60],
                }
                for r in recs
            ]
            return nvitop_text(self.host, gpus, procs)
        rows = []
        for i in range(self.gpus):
            mine = [r for r in recs if int(r["gpu"]) == i]
            instances = sorted(
                {r["gpu_instance"] for r in mine if r.get("gpu_instance") is not None}
            )
            if not instances:
                used = sum(r["used_bytes"] for r in mine) / MIB
                rows.append(
                    {
                        "gpu": i,
                        "uuid": f"GPU-{i:08d}-vgpu",
                        "model": "NVIDIA H200",
                        "host": self.host,
                        "used": round(used),
                        "free": round(self.total_mib - used),
                    }
                )
                continue
            for inst in instances:
                on = [r for r in mine if r.get("gpu_instance") == inst]
                used = sum(r["used_bytes"] for r in on) / MIB
                rows.append(
                    {
                        "gpu": i,
                        "uuid": f"GPU-{i:08d}-vgpu",
                        "model": "NVIDIA H200",
                        "host": self.host,
                        "used": round(used),
                        "free": round(self.slice_mib - used),
                        "mig_profile": on[0].get("gpu_profile") or "1g.18gb",
                        "mig_id": inst,
                    }
                )
        return dcgm_text(rows)

    def __enter__(self) -> VirtualGpu:
        self._ctx = serve(lambda path: metrics_only(self.page())(path))
        base = self._ctx.__enter__()
        self.metrics_url = base + "/metrics"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None
