"""A real small disk for tests of what happens when writing fails.

`on_small_disk(argv, directory, size_kib=...)` runs a command whose `directory` lies on a
real filesystem of `size_kib` KiB, so the kernel itself refuses writes past it:

1. as root, a tmpfs mounted at `directory` (unmounted afterwards): ENOSPC, a full disk;
2. else, when user namespaces allow it, the same tmpfs inside `unshare -rm` (the command
   runs in its own mount namespace, where it is root);
3. else a file-size limit (RLIMIT_FSIZE) on the command: the kernel refuses to grow any file
   past `size_kib` (EFBIG), a file the OS refuses.

`SmallDisk.kind` says which one ran ("tmpfs", "unshare", "rlimit"): a full disk fills for
every file (space comes back only when a file is deleted); a size limit stops each file on
its own.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SmallDisk", "on_small_disk"]


@dataclass
class SmallDisk:
    kind: str  # "tmpfs", "unshare", "rlimit"
    done: subprocess.CompletedProcess[str]


def _mount(directory: Path, size_kib: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


def on_small_disk(
    argv: Sequence[str],
    directory: Path,
    *,
    size_kib: int = 256,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> SmallDisk:
    """Run `argv` with `directory` (created, empty) on a filesystem of `size_kib` KiB."""
    directory.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    if _mount(directory, size_kib):
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, env=full_env
            )
        finally:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)
        return SmallDisk("tmpfs", done)
    if _unshare_works():
        script = 'mount -t tmpfs -o size="$1"k tmpfs "$2" && shift 2 && exec "$@"'
        done = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script, "sh", str(size_kib), str(directory), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
        return SmallDisk("unshare", done)
    limit = size_kib * 1024

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        preexec_fn=cap,
    )
    return SmallDisk("rlimit", done)
