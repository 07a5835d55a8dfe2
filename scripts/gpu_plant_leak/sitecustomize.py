"""Plant a VRAM leak in a third-party server from outside its code (GPU acceptance of issue 21).

    PYTHONPATH=scripts/gpu_plant_leak VD_PLANT_LEAK=module:qualname:KiB transformers serve ...

Once `module` has been imported by the server (polled every 0.2 s by a daemon thread for at most
VD_PLANT_LEAK_WAIT_S seconds, default 600), `qualname` (a function or a method of a class in it)
is replaced by a wrapper that calls it and then keeps KiB of CUDA memory alive (a uint8 tensor on
the current device, appended to a list that is never cleared): a real leak of KiB per call,
written neither by the server nor by vramdoctor. Without VD_PLANT_LEAK this file does nothing.

It is not vramdoctor's agent and needs none: it works with `soak --no-agent` too. When the agent's
own loader is first on PYTHONPATH, the agent runs this file after itself (it chains to the
sitecustomize it shadows). Lines on stderr start with `plant-leak[pid]`. Test use only.
"""

import os as _os
import sys as _sys
import threading as _threading
import time as _time

_SPEC = _os.environ.get("VD_PLANT_LEAK", "")
KEPT: list = []


def _say(msg: str) -> None:
    _sys.stderr.write(f"plant-leak[{_os.getpid()}]: {msg}\n")
    _sys.stderr.flush()


def _install(module_name: str, qualname: str, n_bytes: int) -> bool:
    module = _sys.modules.get(module_name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return False
    owner = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    raw = owner.__dict__.get(parts[-1]) if isinstance(owner, type) else getattr(owner, parts[-1])
    static = isinstance(raw, staticmethod)
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if isinstance(raw, classmethod):
        _say(f"{qualname} is a classmethod: not supported")
        return True

    def planted(*args, **kwargs):
        result = func(*args, **kwargs)
        try:
            import torch

            KEPT.append(
                torch.empty(
                    n_bytes, dtype=torch.uint8, device=f"cuda:{torch.cuda.current_device()}"
                )
            )
        except Exception as exc:  # the server must keep working
            _say(f"leak failed: {type(exc).__name__}: {exc}")
        return result

    planted.__wrapped__ = func
    setattr(owner, parts[-1], staticmethod(planted) if static else planted)
    _say(f"{n_bytes // 1024} KiB of CUDA memory kept per call of {module_name}.{qualname}")
    return True


def _watch(module_name: str, qualname: str, n_bytes: int, wait_s: float) -> None:
    deadline = _time.monotonic() + wait_s
    while _time.monotonic() < deadline:
        try:
            if _install(module_name, qualname, n_bytes):
                return
        except Exception as exc:
            _say(f"not planted: {type(exc).__name__}: {exc}")
            return
        _time.sleep(0.2)


if _SPEC:
    try:
        _mod, _qual, _kib = _SPEC.split(":")
        _bytes = int(float(_kib) * 1024)
        _wait = float(_os.environ.get("VD_PLANT_LEAK_WAIT_S", "600"))
    except ValueError:
        _say(f"VD_PLANT_LEAK: expected module:qualname:KiB, got {_SPEC!r}; ignored")
    else:
        _threading.Thread(
            target=_watch, args=(_mod, _qual, _bytes, _wait), name="plant-leak", daemon=True
        ).start()
