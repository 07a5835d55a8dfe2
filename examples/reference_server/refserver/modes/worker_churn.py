"""worker-churn: plain, plus a helper process that comes and goes.

After `--churn-after` requests a helper process starts (48 MiB touched), fails to bind the
server's port and exits after `--churn-lifetime` s, as compile workers and failed restarts do
on real servers. It is reaped by the server.

TRUTH: as plain (CACHING/STABLE); the helper is a process that appeared and exited and decides
no verdict.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

from refserver.modes.plain import PlainMode

if TYPE_CHECKING:
    from refserver.request import Request
    from refserver.state import State

CHURN_WORKER = """
import socket, sys, time
buf = bytearray(48 * 1024 * 1024)  # a worker's start-up memory, touched
for i in range(0, len(buf), 4096):
    buf[i] = 1
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError as exc:
    print(f"worker: cannot bind {sys.argv[1]}:{sys.argv[2]}: {exc}", flush=True)
time.sleep(float(sys.argv[3]))
sys.exit(1)
"""


def spawn_churn_worker(args: argparse.Namespace) -> None:
    """A helper process that appears, fails to bind the server's port and exits (reaped)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHURN_WORKER,
            args.host,
            str(args.bound_port),
            str(args.churn_lifetime),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    threading.Thread(target=proc.wait, daemon=True).start()


class WorkerChurnMode(PlainMode):
    name = "worker-churn"

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.churned = False
        self._pending = False  # the helper is due: started once, outside the lock

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--churn-after",
            type=int,
            default=5,
            help="worker-churn: requests before the helper starts",
        )
        parser.add_argument(
            "--churn-lifetime",
            type=float,
            default=1.5,
            help="worker-churn: seconds the helper lives",
        )

    def after_request_locked(self, state: State, req: Request | None) -> None:
        if not self.churned and state.requests >= self.args.churn_after:
            self.churned = self._pending = True

    def after_request(self, state: State, req: Request | None) -> None:
        with state.lock:
            due, self._pending = self._pending, False
        if due:
            spawn_churn_worker(self.args)

    def info(self, state: State) -> dict[str, Any]:
        return {"churned": self.churned}


MODES = [WorkerChurnMode]
