"""An excerpt that ends inside a traceback: the frames say where the server was, the error is missing.

People paste the part of a log they think matters, and a search index cuts posts: many excerpts end
on a traceback's last frame, before the exception line that says what went wrong. The reader keeps
the last `reader.TAIL` bytes of each input (`ReadStats.tail`); this module looks there for a
traceback with no exception line after its last frame and records what the frames show:

- a `traceback_cut` event: the phase the frames show (events.EventsMixin's markers), the innermost
  frames, and whether they are torch.compile's (inductor/dynamo): the error-line-missing rule then
  says where it failed and what the error line would decide;
- vLLM's sampler warm-up wrapper (`_dummy_sampler_run` re-raising `RuntimeError("CUDA out of memory
  occurred when warming up sampler ...") from e`, vllm/v1/worker/gpu_model_runner.py): that raise
  runs only for an out-of-memory error, so the frames prove one. A `cuda_oom` event is recorded with
  `derived: true` and the frames as its evidence.
"""

from __future__ import annotations

import re

from vramdoctor.diagnose import patterns as P
from vramdoctor.diagnose.events import EventsMixin
from vramdoctor.diagnose.findings import LogEvent
from vramdoctor.diagnose.normalize import clean

_FRAME = re.compile(r'File \\?"([^"\\]+)\\?", line \d+, in (\w+)')
_ELISION = re.compile(r"^\.\.\.<\d+ lines>\.\.\.$|^\.\.\.+$|^\(\s*\.\.\.")
# vLLM's sampler warm-up wrapper: the raise and the last line of its message ("... initializing the engine.")
_SAMPLER_RAISE = re.compile(r'initializing the engine\.?"?\)? from e\b')


def read(ex: EventsMixin, tail: bytes, total_lines: int) -> None:
    """Record what a traceback the input ends in shows (see the module docstring)."""
    if b'File "' not in tail and b'File \\"' not in tail:
        return
    raw = tail.decode("utf-8", "replace").split("\n")
    if raw and raw[-1] == "":
        raw.pop()
    # (line number, cleaned text) of the non-blank lines, from the end
    numbered = [(total_lines - (len(raw) - 1 - i), clean(x).text) for i, x in enumerate(raw)]
    lines = [(n, s) for n, s in numbered if s.strip()]
    if not lines:
        return
    last_frame = max((i for i, (_, s) in enumerate(lines) if _FRAME.search(s)), default=-1)
    if last_frame < 0 or len(lines) - 1 - last_frame > 6:
        return  # no frame near the end: the excerpt does not end in a traceback
    after = [s for _, s in lines[last_frame + 1 :]]
    if any(P.EXCEPTION_LINE.match(s) for s in after):
        return  # the error line is there
    start = max(0, last_frame - 200)
    for i in range(last_frame, start - 1, -1):
        s = lines[i][1]
        if s.startswith("Traceback (most recent call last)") or P.EXCEPTION_LINE.match(s):
            start = i + (0 if s.startswith("Traceback") else 1)
            break
    region = "\n".join(s for _, s in lines[start:])
    frames = [f"{m.group(1).rsplit('/', 1)[-1]} in {m.group(2)}" for m in _FRAME.finditer(region)]
    lineno = lines[last_frame][0]
    text = lines[last_frame][1]
    if "_dummy_sampler_run" in region and any(
        _SAMPLER_RAISE.search(s) for s in [*after, region[-200:]]
    ):
        # vLLM raises this RuntimeError only when the sampler warm-up ran out of memory
        ex.add_event(
            LogEvent(
                "cuda_oom",
                ex.name,
                lineno,
                ex.cut(text),
                "warmup",
                {"sampler": True, "derived": True, "frames": frames[-4:]},
            )
        )
        return
    marks = EventsMixin._markers(region)
    ex.add_event(
        LogEvent(
            "traceback_cut",
            ex.name,
            lineno,
            ex.cut(text),
            EventsMixin._phase(marks),
            {"frames": frames[-4:], "inductor": bool(P.INDUCTOR_FRAME.search(region))},
        )
    )
