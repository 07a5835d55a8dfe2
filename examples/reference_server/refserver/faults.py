"""Faults on purpose (#24's variant matrix): a server that fails to start, one that crashes
after N requests.

`--fail-start [MESSAGE]` (or $REFERENCE_FAIL_START): at start, before the port is bound, log
MESSAGE (default: a CUDA out-of-memory error as PyTorch words it) on stderr and exit 1.
`--crash-after N`: after the N-th request's work (before its answer is sent) the process dies:
`--crash-how exit` logs a traceback-like error and exits 1 at once (os._exit: no clean-up, as
a fatal error in a server's event loop does), `kill` sends itself SIGKILL (the OOM killer's
way), `segv` SIGSEGV and `abort` abort() (a crash in native code: "Fatal Python error: ..." is
logged first, as faulthandler does). `--crash-after-requests` is the same flag.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.72 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process "
    "has 138.58 GiB memory in use. Of the allocated memory 136.02 GiB is allocated by PyTorch, and "
    "1.06 GiB is reserved by PyTorch but unallocated."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-start",
        nargs="?",
        const=CUDA_OOM,
        default=os.environ.get("REFERENCE_FAIL_START") or None,
        metavar="MESSAGE",
        help="fail at start: log MESSAGE (default: a CUDA OOM) and exit 1 "
        "(also $REFERENCE_FAIL_START)",
    )
    parser.add_argument(
        "--crash-after",
        "--crash-after-requests",
        dest="crash_after",
        type=int,
        default=0,
        metavar="N",
        help="die after the N-th request (see --crash-how); 0: never",
    )
    parser.add_argument(
        "--crash-how",
        choices=["exit", "kill", "segv", "abort"],
        default="exit",
        help="how --crash-after dies: exit 1 at once, SIGKILL itself, SIGSEGV, or abort()",
    )
    parser.add_argument(
        "--leak-scale",
        type=float,
        default=1.0,
        help="multiply every per-request leak by this (a flag that makes a leak worse)",
    )


def fail_start(message: str) -> None:
    """Log the start-up failure as a server does and exit 1."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "refserver/cli.py", in main', file=sys.stderr)
    print(message, file=sys.stderr, flush=True)
    print(f"reference server failed to start: {message.splitlines()[0][:120]}", flush=True)
    sys.exit(1)


def crash_now(args: argparse.Namespace, requests: int) -> None:
    """Die now, as --crash-how says (never returns)."""
    sys.stdout.flush()
    print(
        f"Scheduler hit an exception: RuntimeError: reference server crashes after request "
        f"{requests} (--crash-after {args.crash_after})",
        file=sys.stderr,
        flush=True,
    )
    if args.crash_how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.crash_how == "segv":
        print("Fatal Python error: Segmentation fault", file=sys.stderr, flush=True)
        # To this thread, not the process: a process-directed signal may be taken by another
        # thread after os.kill returns, and the os._exit(1) below would win the race (seen in
        # CI: exit 1 instead of -11). The default action (or faulthandler's, which re-raises
        # it) ends the process before this returns.
        signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
    elif args.crash_how == "abort":
        print("Fatal Python error: Aborted", file=sys.stderr, flush=True)
        os.abort()
    os._exit(1)
