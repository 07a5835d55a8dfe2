"""Parse the servers' argument dumps into a dict, tolerating every form they print.

SGLang prints `server_args=ServerArgs(k=v, ...)` (a dataclass repr, up to 0.5.18) or
`server_args={'k': v, ...}` (a dict, 0.5.19+); vLLM prints `args: Namespace(k=v, ...)` (up
to 0.8) or `non-default args: {'k': v, ...}` (0.9+). Values are Python reprs; most are
literals, some are objects (`<LoadFormat.AUTO: 'auto'>`, `torch.bfloat16`) that stay strings.
Dumps cut by the reporter or wrapped by a terminal are parsed as far as they go.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}


# A quoted string (a backslash escapes the next character, whatever it is), or a quote that is never
# closed (the rest of the text is inside it), then what the parsers read outside quoted strings: one
# match per token, the text between them skipped in C.
_QUOTED = r"""'(?:[^'\\]|\\.)*+'|"(?:[^"\\]|\\.)*+"|['"]"""
_BRACKETS = re.compile(_QUOTED + r"|[()\[\]{}]", re.S)
_BRACKETS_COMMAS = re.compile(_QUOTED + r"|[()\[\]{},]", re.S)


def balanced_end(text: str, start: int, opener: str) -> int:
    """Index just past the bracket closing `opener` at `start`, or -1 if it is not closed.

    Brackets inside quoted strings do not count. The regex steps over everything else in C (a dump
    is thousands of characters, and only its brackets matter here)."""
    stack = [_OPEN[opener]]
    for m in _BRACKETS.finditer(text, start + 1):
        i = m.start()
        c = text[i]
        if c in "([{":
            stack.append(_OPEN[c])
        elif c in ")]}":
            if c == stack[-1]:
                stack.pop()
                if not stack:
                    return i + 1
            # an unmatched closer is tolerated (cut or odd reprs)
        elif m.end() == i + 1:
            return -1  # a quote never closed: the rest of the text is inside it
    return -1


def _split_top(body: str) -> list[str]:
    """Split on top-level commas (outside quotes and brackets)."""
    parts: list[str] = []
    depth = 0
    cur = 0
    for m in _BRACKETS_COMMAS.finditer(body):
        i = m.start()
        c = body[i]
        if c == ",":
            if depth == 0:
                parts.append(body[cur:i])
                cur = i + 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif m.end() == i + 1:
            break  # a quote never closed: the rest of the text is inside it
    tail = body[cur:]
    if tail.strip():
        parts.append(tail)
    return parts


def _value(raw: str) -> Any:
    raw = raw.strip()
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        if raw.startswith("<") and ": " in raw and raw.endswith(">"):  # <Enum.X: 'x'>
            return _value(raw.split(": ", 1)[1][:-1])
        return raw


def parse_dump(text: str, opener_at: int) -> tuple[dict[str, Any], bool]:
    """Parse the dump whose opening bracket is at `opener_at`; (args, complete)."""
    opener = text[opener_at]
    end = balanced_end(text, opener_at, opener)
    complete = end > 0
    body = text[opener_at + 1 : (end - 1) if complete else len(text)]
    out: dict[str, Any] = {}
    parts = _split_top(body)
    if not complete and parts:
        parts = parts[:-1]  # the last item may be cut mid-value
    for part in parts:
        if opener == "{":
            key, sep, val = part.partition(":")
            key = key.strip().strip("'\"")
        else:
            key, sep, val = part.partition("=")
            key = key.strip()
        if not sep or not key.replace("_", "").replace("-", "").isalnum():
            continue
        out[key] = _value(val)
    return out, complete
