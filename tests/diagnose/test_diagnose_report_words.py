"""What the terminal report says, read as a newcomer reads it (docs/first-hour.md).

Every check runs the real command on a shipped log: a number carries separators and its unit, a
missing setting is said as a sentence (never "settings: not shown"), a derived fact does not repeat
its value in the column that says what it rests on, logs of two servers each get their own events
line, a quoted line that was cut when read ends in "…", and a command in a code block does not run
into the next line.
"""

from __future__ import annotations

import re
from pathlib import Path

from support.cli import vd

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "logs"
EXTRA = ROOT / "tests" / "fixtures" / "logs" / "extra"


def diagnose(*args: str | Path, columns: int = 80) -> tuple[int, str]:
    out = vd("diagnose", *map(str, args), env={"COLUMNS": str(columns)})
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout


def fact_row(text: str, label: str) -> str:
    rows = [ln for ln in text.splitlines() if ln.startswith(label + "  ")]
    assert rows, f"no {label!r} row in:\n{text}"
    return rows[0]


def test_kv_tokens_have_separators_and_a_unit() -> None:
    _, text = diagnose(EXAMPLES / "sglang_qwen2.5-vl-7b-tp2_fast-image-processor_gpu0-oom.log")
    row = fact_row(text, "KV tokens")
    assert re.search(r"\b1,198,210 tokens\b", row), row
    assert "1198210" not in text


def test_no_budget_setting_is_a_sentence_not_a_blank_field() -> None:
    code, text = diagnose(EXAMPLES / "sglang_llama4-scout-vlm_tp8_prefill-oom.log", columns=200)
    assert code == 1
    assert "not shown in the log." not in text and "Budget settings in the log: not" not in text
    assert "The log prints no budget setting" in text


def test_budget_settings_that_are_printed_are_listed() -> None:
    _, text = diagnose(
        EXAMPLES / "sglang_qwen2.5-vl-7b-tp2_fast-image-processor_gpu0-oom.log", columns=200
    )
    m = re.search(r"Budget settings in the log: ([^.]+(?:\.\d[^.]*)*)\.", text)
    assert m and "mem_fraction_static=" in m.group(1), text


def test_a_derived_fact_does_not_repeat_its_value_where_it_says_what_it_rests_on() -> None:
    _, text = diagnose(EXAMPLES / "sglang_llama4-scout-vlm_tp8_prefill-oom.log")
    row = fact_row(text, "tensor parallel")
    _, _, rests_on = row.partition("at least 7")
    assert "at least" not in rests_on and "TP ranks 5, 6" in rests_on and ">= 7" in rests_on, row
    # it fits 80 columns on one line, so the facts table has no blank lines between its rows
    table = text.split("Facts read from the log\n", 1)[1].split("Events:", 1)[0]
    assert "\n\n" not in table, table


def test_two_servers_get_an_events_line_each_naming_their_files() -> None:
    a, b = next(EXTRA.glob("30_*.log")), next(EXTRA.glob("16_*.log"))
    _, text = diagnose(a, b, columns=200)
    lines = [ln for ln in text.splitlines() if ln.startswith("Events")]
    assert len(lines) == 2, text
    assert f"Events in {a}:" in lines[0] or f"Events in {a.name}:" in lines[0] or str(a) in lines[0]
    assert str(b) in lines[1]
    assert not any(ln.startswith("Events: ") for ln in lines)


def test_a_quoted_line_cut_when_read_ends_with_an_ellipsis(tmp_path: Path) -> None:
    long_tail = " ".join(f"word{i}" for i in range(200))  # far past the 600 characters kept
    log = tmp_path / "server.log"
    log.write_text(
        "[2025-09-14 03:22:10 TP0] Load weight end. type=Qwen2ForCausalLM, avail mem=30.12 GB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.44 GiB of which 1.10 GiB is free. " + long_tail + "\n"
    )
    _, text = diagnose(log, columns=400)
    quoted = text.split("line 2: torch.OutOfMemoryError", 1)[1].split("Fix:", 1)[0]
    assert quoted.rstrip().endswith("…"), text
    assert "word199" not in text


def test_a_command_in_a_code_block_does_not_run_into_the_next_line() -> None:
    code, text = diagnose(ROOT / "README.md", columns=200)
    row = fact_row(text, "model")
    assert re.match(r"model\s+MODEL\s+line \d+$", row.rstrip()), row
    assert code in (0, 1)
