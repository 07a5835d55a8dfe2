"""Real CUDA contexts for the `gpu` tests, made through the driver API (libcuda via ctypes), so
they need an NVIDIA driver but not torch; and the NVML skip marker."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

from vramdoctor.sources.nvml import nvml_status

NVML_OK, NVML_WHY = nvml_status()
needs_nvml = pytest.mark.skipif(
    not NVML_OK, reason="no NVML here: " + NVML_WHY.split(";")[0].split(":")[0]
)

CONTEXT_HOLDER = textwrap.dedent("""
    # Holds CUDA contexts until killed: argv = "GPU:MiB" ...  (MiB allocated in that context)
    import ctypes, sys, time
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    keep = []
    for spec in sys.argv[1:]:
        dev_index, mib = (int(x) for x in spec.split(":"))
        dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        assert cuda.cuDeviceGet(ctypes.byref(dev), dev_index) == 0
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert cuda.cuCtxSetCurrent(ctx) == 0
        if mib:
            assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)) == 0
        keep.append((ctx, ptr))
    print("ready", flush=True)
    time.sleep(300)
""")


def hold_contexts(*specs: str) -> subprocess.Popen[str]:
    if ctypes.util.find_library("cuda") is None and not os.path.exists(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    ):
        pytest.skip("no libcuda")
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTEXT_HOLDER, *specs], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if line.strip() != "ready":
        proc.kill()
        pytest.fail(f"could not create CUDA contexts {specs}: exit {proc.wait()}")
    return proc


def hold_titled(title: str, *specs: str) -> subprocess.Popen[str]:
    """A CUDA context holder whose /proc/PID/cmdline starts with a server's process title."""
    if ctypes.util.find_library("cuda") is None and not os.path.exists(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    ):
        pytest.skip("no libcuda")
    proc = subprocess.Popen(
        [title, "-c", CONTEXT_HOLDER, *specs],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
        proc.kill()
        pytest.fail(f"could not create CUDA contexts {specs}: exit {proc.wait()}")
    return proc
