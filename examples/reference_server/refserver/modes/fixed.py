"""fixed: the leaking code path done right.

GPU: the same preprocessing inside `vramdoctor.fixes.request_scoped_pool`, its outputs moved to
the CPU with `outputs_to_cpu`. CPU: the leaking mode's `--leak-kib` buffer is allocated per
request and released at the request's end.

TRUTH: STABLE (the request-scoped pool's segments are released at request end; on the CPU the
buffer is freed before the answer goes out).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from refserver.modes.base import Mode

if TYPE_CHECKING:
    from PIL import Image

    from refserver.request import Request
    from refserver.state import State


def _import_fixes() -> Any:
    try:
        import vramdoctor  # noqa: F401
    except ImportError:  # run from a checkout without installing: use the checkout's copy
        root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        )
        sys.path.insert(0, os.path.abspath(root))
    from vramdoctor import fixes

    return fixes


class FixedMode(Mode):
    name = "fixed"

    def setup(self, state: State) -> None:
        if state.gpu is not None:
            fixes = _import_fixes()
            self.request_scoped_pool = fixes.request_scoped_pool
            self.outputs_to_cpu = fixes.outputs_to_cpu

    def gpu_image(self, state: State, img: Image.Image, data: bytes, req: Request | None) -> None:
        assert state.gpu is not None
        with self.request_scoped_pool(state.device):
            out = self.outputs_to_cpu(state.gpu(img))
        del out

    def after_request(self, state: State, req: Request | None) -> None:
        if state.gpu is None:
            # The leaking code path, but its buffer is released at the end of the request.
            buf = np.ones(int(self.args.leak_kib * 1024), dtype=np.uint8)
            del buf


MODES = [FixedMode]
