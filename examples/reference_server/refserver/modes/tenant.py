"""tenant: plain caching, and a real process of another owner on the same GPU that grows.

At start (before torch is imported or any thread exists) the server forks a tenant: it leaves
the server's process tree (setsid and a second fork: its parent becomes pid 1 or the nearest
subreaper), takes the uid of `--tenant-user` (default nobody) when the server runs as root,
and then holds device memory on the server's GPU that grows by `--tenant-mib-per-s` MiB/s
whatever the server's traffic (another user's notebook): real CUDA tensors with --device cuda,
else the virtual GPU (`--vgpu-dir`: its record names its own pid, uid and user). It exits by
itself within 0.5 s once the server is gone (it polls the server's pid) and on SIGTERM; the
server also signals it at shutdown. The server itself is plain (bounded caching).

TRUTH: the server's layers as plain (CACHING/STABLE, exit 0); the tenant (GET /reference/info
`tenant`: pid, uid, user) grows on the same GPU and is not the server's: it must be listed as
another tenant and never decide the server's verdict or be its culprit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from refserver.modes.base import layer
from refserver.modes.plain import PlainMode

if TYPE_CHECKING:
    from refserver.state import State

MIB = 1024 * 1024


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def run_tenant(args: argparse.Namespace, server_pid: int, report: int) -> None:
    """The tenant's body (in the grandchild; never returns)."""
    import json  # noqa: F401  (imported before the uid changes: stdlib may be unreadable after)
    import pwd
    import threading  # noqa: F401

    from refserver.device import Device

    cuda = str(args.device).startswith("cuda")
    if str(args.device) == "auto":
        try:
            import torch

            cuda = bool(torch.cuda.is_available())
        except ImportError:
            cuda = False
    elif cuda:
        import torch
    if cuda and str(args.device) == "auto":
        args.device = "cuda"
    if not cuda:
        args.device = "cpu"
    device = Device(args, role="tenant", publish_now=False)  # its directory opened as we are
    if os.getuid() == 0 and args.tenant_user:
        try:
            pw = pwd.getpwnam(args.tenant_user)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
        except (KeyError, OSError) as exc:
            print(f"tenant: cannot become {args.tenant_user}: {exc}", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):  # its own name in ps (comm), as another program has
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(15, b"ref-tenant", 0, 0, 0)  # PR_SET_NAME
    device.publish()  # as the uid it now has
    os.write(report, f"{os.getpid()} {os.getuid()}\n".encode())
    os.close(report)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    held = []
    step = int(args.tenant_mib_per_s * MIB / 10)
    due = time.monotonic()
    try:
        while not stop[0] and _alive(server_pid):
            due += 0.1
            if step > 0:
                try:
                    held.append(device.alloc(step))
                except Exception as exc:  # a CUDA OOM or no device: say so once and stay
                    print(f"tenant: allocation failed: {exc}", file=sys.stderr, flush=True)
                    step = 0
            time.sleep(max(0.0, due - time.monotonic()))
    finally:
        device.close()
    os._exit(0)


class TenantMode(PlainMode):
    name = "tenant"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tenant-mib-per-s",
            type=float,
            default=4.0,
            help="tenant: MiB the other owner's process adds on the GPU per second",
        )
        parser.add_argument(
            "--tenant-user",
            default="nobody",
            help="tenant: the user it runs as when the server is root ('' keeps the uid)",
        )

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.tenant_pid: int | None = None
        self.tenant_uid: int | None = None

    def prefork(self, args: argparse.Namespace) -> None:
        if args.vgpu_dir:
            os.makedirs(args.vgpu_dir, exist_ok=True)
            with contextlib.suppress(OSError):
                os.chmod(args.vgpu_dir, 0o1777)  # the other user writes its record there too
        server_pid = os.getpid()
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the intermediate: leave the session, fork the tenant, exit
            os.close(read)
            try:
                os.setsid()
                if os.fork() == 0:
                    try:
                        run_tenant(args, server_pid, write)
                    except BaseException as exc:
                        print(f"tenant: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                        os._exit(1)
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(child, 0)
        with os.fdopen(read) as fh:
            line = fh.readline().split()
        if len(line) == 2:
            self.tenant_pid, self.tenant_uid = int(line[0]), int(line[1])

    def stop(self, state: State) -> None:
        if self.tenant_pid:
            with contextlib.suppress(OSError):
                os.kill(self.tenant_pid, signal.SIGTERM)

    def info(self, state: State) -> dict[str, Any]:
        user = None
        if self.tenant_uid is not None:
            from refserver.device import username

            user = username(self.tenant_uid)
        return {
            "tenant": {
                "pid": self.tenant_pid,
                "uid": self.tenant_uid,
                "user": user,
                "alive": bool(self.tenant_pid and _alive(self.tenant_pid)),
                "mib_per_s": self.args.tenant_mib_per_s,
            }
        }

    def truth(self, state: State) -> dict[str, Any]:
        out = super().truth(state)
        out["summary"] = (
            "the server only caches; another owner's process on its GPU grows "
            f"{self.args.tenant_mib_per_s:g} MiB/s (pid {self.tenant_pid}): a tenant, not the server"
        )
        out["tenant"] = layer(
            "LEAK",
            "another owner's process (not in the server's tree) grows on the server's GPU",
            pid=self.tenant_pid,
            bytes_per_hour=self.args.tenant_mib_per_s * MIB * 3600,
            decides=False,
        )
        return out


MODES = [TenantMode]
