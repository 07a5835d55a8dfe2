"""The line protocol between ab-test child processes and the parent: `@@VD {json}` per record.

One place for the prefix, for writing a record (the variant worker, the IPC arm) and for
reading a child's records as they arrive (the runner, the IPC arm's launcher). Every other
line a child prints is free text the parent keeps as a tail for error messages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from vramdoctor.record import dumps

PREFIX = "@@VD "


def emit_record(record: dict[str, Any]) -> None:
    """Write one record on stdout, flushed (the parent streams it into the run file)."""
    sys.stdout.write(PREFIX + dumps(record) + "\n")
    sys.stdout.flush()


def stream(
    cmd: Sequence[str],
    on_record: Callable[[dict[str, Any]], None],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    on_start: Callable[[int], None] | None = None,
    tail_lines: int = 40,
) -> tuple[int, list[str], bool]:
    """Run cmd, handing each record to on_record as it arrives; kill it after timeout_s.

    Returns (return code, the last free-text lines, whether the timeout killed it)."""
    tail: deque[str] = deque(maxlen=tail_lines)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1
    )
    if on_start is not None:
        on_start(proc.pid)
    fired = threading.Event()

    def _kill() -> None:
        fired.set()
        proc.kill()

    timer = threading.Timer(timeout_s, _kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PREFIX):
                try:
                    record = json.loads(line[len(PREFIX) :])
                except json.JSONDecodeError:
                    tail.append(line.rstrip("\n"))
                    continue
                on_record(record)
            else:
                tail.append(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    return rc, list(tail), fired.is_set()
