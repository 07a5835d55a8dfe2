"""Process details for the PIDs NVML reports, read from this host's /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from vramdoctor.sources.procinfo import ProcInfoCache, lookup, uses_nvidia_device


def test_a_local_process_without_the_gpu_open_is_not_taken_for_an_nvml_pid() -> None:
    # In a container NVML reports host PIDs; the same number here can be an unrelated
    # process. A CUDA process always holds /dev/nvidia* open; this sleeper does not.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert uses_nvidia_device(child.pid) is False
        deadline = time.monotonic() + 10
        plain = lookup(child.pid)
        while not plain.cmdline and time.monotonic() < deadline:  # just started: argv not there yet
            time.sleep(0.02)
            plain = lookup(child.pid)
        assert plain.visible and plain.name and plain.cmdline
        as_gpu = lookup(child.pid, expect_gpu=True)
        assert not as_gpu.visible and as_gpu.name is None and as_gpu.cmdline is None
        assert not ProcInfoCache(expect_gpu=True).get(child.pid).visible
        assert ProcInfoCache().get(child.pid).visible
    finally:
        child.kill()
        child.wait()
    assert uses_nvidia_device(child.pid) is None  # gone: cannot tell
