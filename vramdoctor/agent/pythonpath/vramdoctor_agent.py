"""vramdoctor's in-process agent: PyTorch allocator snapshots on request, in every server process.

Loaded at interpreter start by the `sitecustomize.py` beside this file (put this directory first
on PYTHONPATH: `PYTHONPATH=$(vramdoctor agent-path)`) or by a `.pth` line
(`vramdoctor agent-path --pth`). It does nothing unless VRAMDOCTOR_AGENT_DIR is set. Standard
library only, and never imports torch: it waits for the process's own code to import torch and
initialise CUDA, so a CPU-only process never gets a CUDA context from it.

In each process (forked children re-start it through `os.register_at_fork`; spawned children run
sitecustomize again, since they inherit the environment):

1. a daemon thread polls every VRAMDOCTOR_AGENT_POLL_S seconds (default 0.5): until `torch` is
   fully imported (a module still being imported is left alone) and
   `torch.cuda.is_initialized()` is true; then it arms the allocator history in its cheapest
   useful setting, `torch.cuda.memory._record_memory_history(enabled="state", context="state",
   stacks="python")`, and writes `agents/<host>-<pid>.json` (state "armed");
2. it then watches `trigger.json` (written by `vramdoctor soak --attribute`): a trigger carries
   the run's token, a sequence number and an expiry time; a trigger not yet handled and not
   expired makes it write `torch.cuda.memory._snapshot()` to
   `snapshots/<token>/<seq>-<host>-<pid>.pickle` and then its `.json` (pid, time, how long the
   snapshot took). A stale trigger from an earlier run has expired and does nothing.

Never harms the server: any failure (an unwritable directory, a snapshot that raises, a torch
without the API) logs ONE line on stderr, turns the history off again if it was on, and the
thread ends; the server's own threads are never touched. What it records: allocation sizes,
addresses, states, and for each live block the Python stack (file paths, line numbers, function
names). No tensor contents, no arguments, no environment, no command line beyond the program's
file name.

VRAMDOCTOR_AGENT_TEST_LEAK=module:qualname:KiB is for tests ONLY: once armed, every return from
that function keeps KiB of GPU memory alive (on Python >= 3.12 allocated from a sys.monitoring
callback, so the stack shows the function itself; before 3.12 through a wrapper, so the stack
shows its caller). Never set it on a production server.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import socket
import sys
import tempfile
import threading
import time
from typing import Any

ENV_DIR = "VRAMDOCTOR_AGENT_DIR"
ENV_POLL = "VRAMDOCTOR_AGENT_POLL_S"
ENV_TEST_LEAK = "VRAMDOCTOR_AGENT_TEST_LEAK"
PROTOCOL = 1
TRIGGER_FILE = "trigger.json"
AGENTS_DIR = "agents"
SNAPSHOTS_DIR = "snapshots"
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
HISTORY_SETTINGS = {"enabled": "state", "context": "state", "stacks": "python"}

_lock = threading.Lock()
_started_pid: int | None = None
_fork_hook = False
_current: Agent | None = None


def _log(message: str) -> None:
    try:
        sys.stderr.write(f"vramdoctor-agent[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing to do, and never raise into the server
        pass


def safe_host() -> str:
    """This host's name as used in file names ([A-Za-z0-9._-] only)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def boot() -> None:
    """Start the agent in this process when VRAMDOCTOR_AGENT_DIR is set (idempotent per pid)."""
    global _started_pid, _fork_hook, _current
    directory = os.environ.get(ENV_DIR, "").strip()
    if not directory:
        return
    try:
        if not os.path.isabs(
            directory
        ):  # children that chdir elsewhere must find the same directory
            directory = os.environ[ENV_DIR] = os.path.abspath(directory)
        with _lock:
            if _started_pid == os.getpid():
                return
            _started_pid = os.getpid()
        if not _fork_hook and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
            _fork_hook = True
        _current = Agent(directory)
        _current.start()
    except Exception as exc:
        _log(f"not started: {type(exc).__name__}: {exc}")


def _after_fork() -> None:
    global _lock, _started_pid
    _lock = threading.Lock()  # the parent's lock may have been held by another thread at fork
    _started_pid = None
    boot()


class _StandDown(Exception):
    pass


def _write_atomic(path: str, payload: bytes) -> None:
    """Write via a new temporary file in the same directory, then rename: readers never see half a
    file, and a name planted in a shared directory (a symlink) is never written through."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".vd-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _imported_torch() -> Any:
    """The torch module once fully imported (None while absent or still being imported)."""
    for name in ("torch", "torch.cuda"):
        mod = sys.modules.get(name)
        if mod is None:
            return None
        spec = getattr(mod, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return None  # half-imported: another thread is executing its module body
    return sys.modules["torch"]


class Agent:
    """One process's agent: see the module docstring."""

    def __init__(self, directory: str) -> None:
        self.dir = os.path.abspath(directory)
        try:
            poll = float(os.environ.get(ENV_POLL, "0.5"))
        except ValueError:
            poll = 0.5
        self.poll_s = min(60.0, max(0.02, poll))
        self.pid = os.getpid()
        self.host = safe_host()
        self.torch: Any = None
        self.armed = False
        self.trigger_key: tuple[int, int, int] | None = None
        self.handled: tuple[str, int] | None = None
        self.leak_spec = os.environ.get(ENV_TEST_LEAK, "").strip()
        self.leaked: list[Any] = []
        self.leak_installed = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="vramdoctor-agent", daemon=True).start()

    # --- life cycle ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                time.sleep(self.poll_s)
                if not self.armed:
                    torch = _imported_torch()
                    if torch is None:
                        continue
                    if not self._cuda_initialised(torch):
                        continue
                    self._arm(torch)
                    continue
                if self.leak_spec and not self.leak_installed:
                    self._install_test_leak()
                self._check_trigger()
        except _StandDown as exc:
            self._stand_down(str(exc))
        except Exception as exc:  # a bug of ours must not reach the server
            self._stand_down(f"{type(exc).__name__}: {exc}")

    def _stand_down(self, reason: str) -> None:
        if self.armed:
            with contextlib.suppress(Exception):
                self.torch.cuda.memory._record_memory_history(enabled=None)
        self.armed = False
        _log(f"standing down, the server is not affected: {reason}")
        with contextlib.suppress(Exception):
            self._write_status("stood-down", reason=reason)

    @staticmethod
    def _cuda_initialised(torch: Any) -> bool:
        cuda = getattr(torch, "cuda", None)
        probe = getattr(cuda, "is_initialized", None)
        if not callable(probe):
            raise _StandDown(
                f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.is_initialized"
            )
        try:
            return bool(probe())
        except Exception as exc:
            raise _StandDown(
                f"torch.cuda.is_initialized() raised {type(exc).__name__}: {exc}"
            ) from None

    def _status_path(self) -> str:
        return os.path.join(self.dir, AGENTS_DIR, f"{self.host}-{self.pid}.json")

    def _write_json(self, path: str, data: dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_atomic(path, json.dumps(data).encode("utf-8"))

    def _identity(self) -> dict[str, Any]:
        argv0 = sys.argv[0] if getattr(sys, "argv", None) else ""
        return {
            "protocol": PROTOCOL,
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": self.host,
            "program": os.path.basename(argv0) or "python",
            "python": sys.version.split()[0],
            "torch": str(getattr(self.torch, "__version__", "?"))
            if self.torch is not None
            else None,
        }

    def _write_status(self, state: str, **extra: Any) -> None:
        self._write_json(
            self._status_path(),
            {**self._identity(), "state": state, "updated_wall": time.time(), **extra},
        )

    def _arm(self, torch: Any) -> None:
        self.torch = torch
        memory = getattr(getattr(torch, "cuda", None), "memory", None)
        record = getattr(memory, "_record_memory_history", None)
        snapshot = getattr(memory, "_snapshot", None)
        if not callable(record) or not callable(snapshot):
            raise _StandDown(
                f"torch {getattr(torch, '__version__', '?')} has no allocator history "
                "(torch.cuda.memory._record_memory_history/_snapshot need torch >= 2.1)"
            )
        try:
            self._write_status("arming")
        except OSError as exc:
            raise _StandDown(
                f"cannot write to the agent directory {self.dir}: {exc.strerror or exc}"
            ) from None
        t0 = time.perf_counter()
        try:
            record(**HISTORY_SETTINGS)
        except Exception as exc:
            raise _StandDown(
                f"arming the allocator history failed: {type(exc).__name__}: {exc}"
            ) from None
        self.armed = True
        took = time.perf_counter() - t0
        try:
            self._write_status(
                "armed", armed_wall=time.time(), arm_s=took, history=HISTORY_SETTINGS
            )
        except OSError as exc:
            raise _StandDown(
                f"cannot write to the agent directory {self.dir}: {exc.strerror or exc}"
            ) from None
        _log(f"armed (allocator history: state, Python stacks); snapshots on request in {self.dir}")

    # --- triggers ----------------------------------------------------------------------------
    def _check_trigger(self) -> None:
        path = os.path.join(self.dir, TRIGGER_FILE)
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self.trigger_key:
            return
        self.trigger_key = key
        try:
            with open(path, encoding="utf-8") as fh:
                trig = json.load(fh)
            token = str(trig["token"])
            seq = int(trig["seq"])
            expires = float(trig["expires_wall"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # not a trigger of ours: ignore it
        if not TOKEN_RE.fullmatch(token) or seq < 0 or time.time() > expires:
            return  # stale (an earlier run's) or malformed: does nothing
        if (token, seq) == self.handled:
            return
        self.handled = (token, seq)
        self._snapshot(token, seq)

    def _snapshot(self, token: str, seq: int) -> None:
        wall = time.time()
        t0 = time.perf_counter()
        try:
            snap = self.torch.cuda.memory._snapshot()
        except Exception as exc:
            raise _StandDown(
                f"taking the allocator snapshot raised {type(exc).__name__}: {exc}"
            ) from None
        took = time.perf_counter() - t0
        out = os.path.join(self.dir, SNAPSHOTS_DIR, token)
        base = os.path.join(out, f"{seq:04d}-{self.host}-{self.pid}")
        try:
            os.makedirs(out, exist_ok=True)
            _write_atomic(f"{base}.pickle", pickle.dumps(snap, protocol=4))
            self._write_json(
                f"{base}.json",
                {
                    **self._identity(),
                    "token": token,
                    "seq": seq,
                    "wall": wall,
                    "snapshot_s": took,
                    "write_s": time.perf_counter() - t0 - took,
                },
            )
        except OSError as exc:
            raise _StandDown(f"cannot write the snapshot to {out}: {exc.strerror or exc}") from None

    # --- test-only leak ------------------------------------------------------------------------
    def _install_test_leak(self) -> None:
        """VRAMDOCTOR_AGENT_TEST_LEAK=module:qualname:KiB (tests only; see the module docstring)."""
        try:
            module_name, qualname, kib = self.leak_spec.split(":")
            n_bytes = int(float(kib) * 1024)
        except ValueError:
            self.leak_installed = True
            _log(f"{ENV_TEST_LEAK}: expected module:qualname:KiB, got {self.leak_spec!r}; ignored")
            return
        module = sys.modules.get(module_name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return  # not imported (yet) by the server: try again at the next poll
        owner: Any = module
        parts = qualname.split(".")
        try:
            for part in parts[:-1]:
                owner = getattr(owner, part)
            func = getattr(owner, parts[-1])
        except AttributeError:
            self.leak_installed = True
            _log(f"{ENV_TEST_LEAK}: {module_name} has no {qualname}; ignored")
            return
        func = getattr(func, "__func__", func)
        self.leak_installed = True
        torch = self.torch
        leaked = self.leaked

        def leak() -> None:
            try:
                device = torch.cuda.current_device()
                leaked.append(torch.empty(n_bytes, dtype=torch.uint8, device=f"cuda:{device}"))
            except Exception as exc:
                _log(f"test leak failed: {type(exc).__name__}: {exc}")

        monitoring = getattr(sys, "monitoring", None)
        code = getattr(func, "__code__", None)
        if monitoring is not None and code is not None:
            tool = next((i for i in range(5, 0, -1) if monitoring.get_tool(i) is None), None)
            if tool is not None:
                monitoring.use_tool_id(tool, "vramdoctor-agent-test-leak")

                def on_return(_code: Any, _offset: int, _retval: Any) -> None:
                    leak()

                monitoring.register_callback(tool, monitoring.events.PY_RETURN, on_return)
                monitoring.set_local_events(tool, code, monitoring.events.PY_RETURN)
                _log(
                    f"TEST-ONLY leak of {kib} KiB per return from {module_name}.{qualname} installed"
                )
                return
        import functools

        original = func

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                leak()

        setattr(owner, parts[-1], wrapper)
        _log(
            f"TEST-ONLY leak of {kib} KiB per call of {module_name}.{qualname} installed (wrapper)"
        )
