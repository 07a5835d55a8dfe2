"""Options every command spells the same way.

GPU selection is `--gpu`, repeated or comma-separated (`--gpu 0 --gpu 1`, `--gpu 0,1`); the
older `--gpus 0,1` of census and watch is kept as a hidden alias. Report output is
`--report FILE` with the suffix choosing the format; colour is `vramdoctor --no-color` (or
NO_COLOR=1) for every command.
"""

from __future__ import annotations

from collections.abc import Iterable

from vramdoctor.errors import InputError

GPU_HELP = "Only these NVML GPU indices: --gpu 0 --gpu 1, or --gpu 0,1."


def parse_gpu_indices(
    values: Iterable[str | int] | str | None, option: str = "--gpu"
) -> list[int] | None:
    """GPU indices from `--gpu 0 --gpu 1`, `--gpu 0,1` or both; None when none is given.

    Returns the indices sorted, each once. Raises InputError naming `option` for anything but
    whole numbers >= 0.
    """
    items: list[str | int] = [values] if isinstance(values, str) else list(values or [])
    out: list[int] = []
    for text in items:
        for part in str(text).split(","):
            if not part.strip():
                continue
            try:
                index = int(part)
            except ValueError:
                raise InputError(
                    f"{option} wants NVML GPU indices like 0 or 0,1 (not {text!r})"
                ) from None
            if index < 0:
                raise InputError(f"{option} wants NVML GPU indices >= 0 (not {text!r})")
            out.append(index)
    return sorted(set(out)) or None
