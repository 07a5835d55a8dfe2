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


# --- host memory by kind (sources/host.py) ------------------------------------------------------

ARENA_CHILD = r"""
import ctypes, sys, threading
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = int(sys.argv[1])
go, done = threading.Event(), threading.Barrier(n + 1)
def work():
    ptrs = [libc.malloc(100_000) for _ in range(40)]   # below the mmap threshold: arena chunks
    for p in ptrs:
        ctypes.memset(p, 1, 100_000)
    for p in ptrs:
        libc.free(p)                                   # freed, but kept by the thread's arena
    done.wait()
    go.wait()
ts = [threading.Thread(target=work) for _ in range(n)]
for t in ts:
    t.start()
done.wait()
print("ready", flush=True)
sys.stdin.readline()
go.set()
"""


def _arena_child(threads: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    import os

    child = subprocess.Popen(
        [sys.executable, "-c", ARENA_CHILD, str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_threads_that_malloc_show_as_new_arena_heaps_and_the_cap_bounds_them() -> None:
    """A real process whose threads malloc: each concurrent thread gets a glibc arena whose heap
    is a 64 MiB-aligned region in /proc/PID/maps; MALLOC_ARENA_MAX=2 leaves one besides main."""
    import psutil

    from vramdoctor.sources.host import HostSource, process_memory

    for threads, env, expect in ((0, None, 0), (4, None, 4), (4, {"MALLOC_ARENA_MAX": "2"}, 1)):
        child = _arena_child(threads, env)
        try:
            row = process_memory(child.pid, psutil.Process(child.pid).memory_info().rss)
            assert row.malloc_arenas == expect, (threads, env, row)
            assert row.malloc_arena_reserved_mib == 64 * expect
            if expect:
                assert 0 < row.malloc_arena_writable_mib <= 64 * expect
            assert row.threads == threads + 1
            assert row.rss_anon_mib > 0 and row.rss_file_mib > 0 and row.rss_shmem_mib is not None
            assert row.unreadable is None
            sample = HostSource({child.pid: "server"}).sample()
            assert sample.processes[0].malloc_arenas == expect
            assert sample.dev_shm_used_mib is None or sample.dev_shm_used_mib >= 0
        finally:
            child.communicate("\n", timeout=10)


def test_arena_heaps_are_found_through_merged_mappings() -> None:
    """The kernel merges adjacent anonymous mappings with equal flags: a heap's read-write part
    joined to the mapping before it, its PROT_NONE tail to a stack guard after it."""
    from vramdoctor.sources.host import malloc_heaps

    m = 64 * 2**20
    base = 0x7F0000000000  # 64 MiB aligned

    def line(lo: int, hi: int, perms: str, path: str = "") -> str:
        return f"{lo:x}-{hi:x} {perms} 00000000 00:00 0 {path}".rstrip()

    text = "\n".join(
        [
            line(
                base - 3 * 4096, base + 5 * 2**20, "rw-p"
            ),  # merged: other anon + heap 1 rw (5 MiB)
            line(base + 5 * 2**20, base + m + 4096, "---p"),  # heap 1 tail + a stack guard page
            line(base + m + 4096, base + m + 8 * 2**20, "rw-p"),  # that thread's stack (not a heap)
            line(base + 2 * m, base + 3 * m, "rw-p"),  # heap 2, grown to the full 64 MiB
            line(base + 3 * m, base + 3 * m + 2**20, "rw-p", "/usr/lib/libfoo.so"),
            line(
                base + 4 * m + 4096, base + 4 * m + 3 * 2**20, "rw-p"
            ),  # not aligned: a big malloc block
            line(
                base + 4 * m + 3 * 2**20, base + 5 * m - 4096, "---p"
            ),  # ends short of the boundary
            line(base + 6 * m - 4096, base + 6 * m, "---p"),  # a lone guard page at a boundary
            line(base + 6 * m, base + 6 * m + 8 * 2**20, "rw-p"),  # its stack
        ]
    )
    heaps = malloc_heaps(text)
    assert heaps.heaps == 2
    assert heaps.writable_bytes == 5 * 2**20 + m


def test_unreadable_proc_files_are_named_not_guessed(tmp_path) -> None:
    from vramdoctor.sources.host import process_memory

    fake = tmp_path / "proc"
    (fake / "123").mkdir(parents=True)
    (fake / "123" / "status").write_text(
        "Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t3\n"
    )  # kernel < 4.5
    row = process_memory(123, 2 * 2**20, proc=str(fake))
    assert row.rss_mib == 2 and row.rss_anon_mib is None and row.threads == 3
    assert "no RssAnon" in row.unreadable and "maps: not found" in row.unreadable
