"""A secret whose value has spaces is blanked whole, everywhere.

Cases 05, 05b, 05c, 05d (tests/fixtures/logs/review12/) printed
`api_key='*** horse battery staple'`: the free-text rule masked the first word, and the registered
value no longer matched what was left. The forms below are the servers' own: vLLM's
`args: Namespace(api_key=...)` (up to 0.8) and `non-default args: {'api_key': [...]}` (0.9+, where
`api_key` is `list[str]`: FrontendArgs), SGLang's `server_args=ServerArgs(...)` and
`server_args={...}` (0.5.19+), and pasted shell commands (`--api-key '...'`, `--api-key="..."`,
`HF_TOKEN="..." vllm serve`, `'it'\\''s'`). Each log goes through `vramdoctor diagnose` as a user
runs it (text and `--json`), and every output is searched for every piece of the secret.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import vd as _vd

from vramdoctor.diagnose import diagnose
from vramdoctor.diagnose.cmdline import parse_command
from vramdoctor.redact import (
    REDACTED,
    forget_secrets,
    redact_argv,
    redact_obj,
    redact_tail,
    redact_text,
)
from vramdoctor.render import console

CASES = Path(__file__).parents[1] / "fixtures" / "logs" / "review12"
REVIEWER = "correct horse battery staple"
# A secret no output of the tool could contain by chance, in any 4-character window.
S = "zebra7 quokka9 narwhal3 ibex5"
S2 = "yak4 okapi8 wombat6 gnu2x"

VLLM_BANNER = "INFO 05-02 10:11:12 [api_server.py:1024] vLLM API server version 0.10.1\n"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process "
    "has 77.98 GiB memory in use.\n"
)


@pytest.fixture(autouse=True)
def _fresh_registry():
    """Each CLI run starts with no registered secret; so does each test here."""
    forget_secrets()
    yield
    forget_secrets()


def pieces(secret: str) -> set[str]:
    """Every 4-character window of each word of `secret` (a leak of any part of it shows)."""
    out = set()
    for word in secret.split():
        out.update(word[i : i + 4] for i in range(len(word) - 3))
    return out


def leaks(text: str, *secrets: str) -> list[str]:
    return sorted(p for s in secrets for p in pieces(s) if p in text)


def cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _vd("diagnose", str(path), *args)


def outputs(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    """(text report, --json document) of `vramdoctor diagnose path`, in process: the same library
    call, JSON printer and renderer the CLI uses, each with a fresh secret registry as in a run."""
    from vramdoctor.diagnose.report import render

    capsys.readouterr()
    forget_secrets()
    console.print_json(diagnose([path]).to_json())
    doc = json.loads(capsys.readouterr().out)
    forget_secrets()
    render(diagnose([path]), console.stdout())
    text = capsys.readouterr().out
    return text, doc


def strings(obj: object) -> list[str]:
    """Every string (keys included) of a JSON document."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (*strings(k), *strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


# -- the four cases, through the real CLI -----------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "05-secret-with-spaces-namespace.log",
        "05b-secret-with-spaces-pasted-command.log",
        "05c-secret-with-spaces-sglang-dict.log",
        "05d-secret-with-spaces-text-output.log",
    ],
)
def test_reviewer_cases_blank_the_whole_value_in_text_and_json(case: str) -> None:
    path = CASES / case
    text = cli(path)
    js = cli(path, "--json")
    assert text.returncode in (0, 1) and js.returncode in (0, 1), text.stderr + js.stderr
    for out in (text.stdout, js.stdout):
        for word in REVIEWER.split():
            assert word not in out, (case, word, out)
    doc = json.loads(js.stdout)
    evidence = [e["text"] for e in doc["facts"]["evidence"].values()]
    evidence += [e["text"] for f in doc["findings"] for e in f["evidence"]]
    lines = [t for t in evidence if "api_key" in t or "api-key" in t]
    assert lines, "the line with the key is the evidence of a fact"
    for t in lines:
        assert f"'{REDACTED}'" in t, t  # the value as a whole, its quotes kept
    args = doc["facts"]["server_args"]
    if args is not None:
        assert args["api_key"] == REDACTED
    if case.startswith("05d"):
        assert f"--api-key '{REDACTED}'" in text.stdout


# -- every server format, every output (in process: the CLI's own printers) ----------------------


FORMATS = {
    "vllm-namespace-escaped-quotes": (
        VLLM_BANNER
        + "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, port=8000, "
        + "api_key='zebra7 \"quokka9\" narwhal3\\'s ibex5', model='meta-llama/Llama-3.1-8B-Instruct', "
        + "gpu_memory_utilization=0.95)\n"
        + OOM,
        ["zebra7", "quokka9", "narwhal3", "ibex5"],
    ),
    "vllm-namespace-double-quoted": (
        VLLM_BANNER
        + "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, port=8000, "
        + "api_key=\"zebra7 'quokka9' narwhal3 ibex5\", model='m/Llama-3.1-8B', "
        + "gpu_memory_utilization=0.95)\n"
        + OOM,
        [S],
    ),
    "vllm-namespace-list": (
        VLLM_BANNER
        + "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, port=8000, "
        + f"api_key=['{S}', '{S2}'], model='m/Llama-3.1-8B', gpu_memory_utilization=0.95)\n"
        + OOM,
        [S, S2],
    ),
    "vllm-non-default-args-list": (
        VLLM_BANNER
        + "INFO 05-02 10:11:12 [utils.py:326] non-default args: {'model': 'm/Llama-3.1-8B', "
        + f"'api_key': ['{S}', '{S2}'], 'gpu_memory_utilization': 0.95}}\n"
        + OOM,
        [S, S2],
    ),
    "sglang-dataclass": (
        "[2025-09-14 03:22:00] server_args=ServerArgs(model_path='m/Llama-3.1-8B', tp_size=1, "
        + f"mem_fraction_static=0.88, api_key='{S}', admin_api_key='{S2}', port=30000)\n"
        + OOM,
        [S, S2],
    ),
    "sglang-dict": (
        "[2025-09-14 03:22:00] server_args={'model_path': 'm/Llama-3.1-8B', 'tp_size': 1, "
        + f"'mem_fraction_static': 0.88, 'api_key': '{S}', 'admin_api_key': '{S2}'}}\n"
        + OOM,
        [S, S2],
    ),
    "pasted-flag-equals-double-quotes": (
        f'vllm serve m/Llama-3.1-8B --api-key="{S}" --gpu-memory-utilization 0.95\n'
        + VLLM_BANNER
        + OOM,
        [S],
    ),
    "pasted-env-assignment": (
        f'HF_TOKEN="{S}" vllm serve m/Llama-3.1-8B --gpu-memory-utilization 0.95\n'
        + VLLM_BANNER
        + OOM,
        [S],
    ),
    "pasted-shell-quote-concatenation": (
        "vllm serve m/Llama-3.1-8B --api-key 'zebra7'\\''s quokka9 narwhal3 ibex5' "
        + "--gpu-memory-utilization 0.95\n"
        + VLLM_BANNER
        + OOM,
        [S],
    ),
    "pasted-vllm-two-keys": (
        f"vllm serve m/Llama-3.1-8B --api-key '{S}' '{S2}' --gpu-memory-utilization 0.95\n"
        + VLLM_BANNER
        + OOM,
        [S, S2],
    ),
    "pasted-sglang-both-keys": (
        f'python -m sglang.launch_server --model-path m/Llama-3.1-8B --api-key "{S}" '
        + f"--admin-api-key '{S2}' --mem-fraction-static 0.88\n"
        + OOM,
        [S, S2],
    ),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_is_blanked_whole_in_every_output(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, secrets = FORMATS[name]
    path = tmp_path / "server.log"
    path.write_text(log)
    text, doc = outputs(path, capsys)
    assert not leaks(text, *secrets), (name, leaks(text, *secrets), text)
    found = [s for s in strings(doc) if leaks(s, *secrets)]
    assert not found, (name, found)
    # the key's line is evidence (the dump or the command names the model and the budget)
    ev = [e["text"] for e in doc["facts"]["evidence"].values()]
    assert any(REDACTED in t for t in ev), ev
    args = doc["facts"]["server_args"]
    if args is not None:
        assert args.get("api_key") == REDACTED


def test_a_bool_or_none_under_a_secret_name_is_a_setting_not_a_secret(tmp_path: Path) -> None:
    """vLLM's --hf-token takes no value (True: use the cached login): neither "True" nor "None"
    may become a registered secret that blanks those words everywhere."""
    path = tmp_path / "server.log"
    path.write_text(
        VLLM_BANNER
        + "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, hf_token=True, "
        + "api_key=None, model='m/Llama-3.1-8B', enforce_eager=True, gpu_memory_utilization=0.95)\n"
        + OOM
    )
    d = diagnose([path])
    assert d.facts.server_args is not None
    assert d.facts.server_args["hf_token"] is True and d.facts.server_args["api_key"] is None
    assert redact_text("enforce_eager: True") == "enforce_eager: True"


# -- a value cut off by the evidence length limit ------------------------------------------------


def test_a_secret_across_the_evidence_cut_leaves_no_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evidence and event texts keep 600 characters of a line. A key whose value starts before
    the cut and ends after it is blanked before the cut, whole."""
    prefix = "args: Namespace(host=None, port=8000, model='meta-llama/Llama-3.1-8B-Instruct', "
    body = ""
    i = 0
    while len(prefix + body) < 570:
        body += f"opt_{i}='v{i}', "
        i += 1
    body += "o='" + "x" * (585 - len(prefix + body) - 6) + "', "
    assert len(prefix + body) == 585  # the value runs from 594 to 623: across the cut at 600
    dump = "INFO 05-02 10:11:12 api_server.py:713] " + prefix + body
    dump += f"api_key='{S}', gpu_memory_utilization=0.95)\n"
    pad = "x" * (600 - len(OOM.strip()) - 25)
    oom = OOM.strip() + f' {pad} request --api-key "{S2}" was set\n'
    path = tmp_path / "server.log"
    path.write_text(VLLM_BANNER + dump + oom)
    text, doc = outputs(path, capsys)
    for out in (text, *strings(doc)):
        assert not leaks(out, S, S2), (leaks(out, S, S2), out)
    cut = [e["text"] for e in doc["facts"]["evidence"].values() if e["text"].startswith("args:")]
    # the dump's value was registered: blanked before the cut, the line goes on after it
    assert cut and all(len(t) <= 600 and "api_key='***', " in t for t in cut), cut
    events = [e["text"] for e in doc["events"] if e["kind"] == "cuda_oom"]
    # an event's text is redacted before it is cut too (FileExtractor.cut): the key is blanked whole
    assert events and all(f'--api-key "{REDACTED}"' in t for t in events), events


def test_a_registered_secret_cut_by_an_event_text_leaves_no_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An event's text (the OOM line) is cut at 600 characters before it is blanked; the key,
    known from the dump, appears bare across the cut: its start is blanked too."""
    dump = (
        "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, port=8000, "
        f"api_key='{S}', model='m/Llama-3.1-8B', gpu_memory_utilization=0.95)\n"
    )
    pad = "x" * (600 - len(OOM.strip()) - 12)
    path = tmp_path / "server.log"
    path.write_text(VLLM_BANNER + dump + OOM.strip() + f" {pad} caller {S} end\n")
    text, doc = outputs(path, capsys)
    for out in (text, *strings(doc)):
        assert "caller zeb" not in out and not leaks(out, S), out
    events = [e["text"] for e in doc["events"] if e["kind"] == "cuda_oom"]
    assert events and all(t.endswith(f"caller {REDACTED}") for t in events), events


def test_a_terminal_wrapped_dump_blanks_the_start_of_the_key_on_its_first_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dump wrapped by a terminal mid-value: the first row, the evidence, ends inside the key
    (`api_key='zebra7 quokk`); the quote left open blanks the rest of the row."""
    head = (
        "INFO 05-02 10:11:12 api_server.py:713] args: Namespace(host=None, port=8000, "
        "model='meta-llama/Llama-3.1-8B-Instruct', api_key='"
    )
    full = head + S + "', gpu_memory_utilization=0.95, max_model_len=4096, enforce_eager=False)"
    width = len(head) + 12
    rows = [full[i : i + width] for i in range(0, len(full), width)]
    assert rows[0].endswith("'zebra7 quokk")
    path = tmp_path / "server.log"
    path.write_text(VLLM_BANNER + "\n".join(rows) + "\n" + OOM)
    text, doc = outputs(path, capsys)
    for out in (text, *strings(doc)):
        assert not leaks(out, S), (leaks(out, S), out)
    assert doc["facts"]["gpu_memory_utilization"] == 0.95  # the rows were joined for the facts
    ev = doc["facts"]["evidence"]["gpu_memory_utilization"]["text"]
    assert ev.endswith(f"api_key='{REDACTED}"), ev


def test_redact_tail_masks_only_the_start_of_a_known_secret() -> None:
    assert redact_tail("x caller zeb", [S]) == "x caller ***"
    assert redact_tail("x caller zebra7 quo", [S2, S]) == "x caller ***"
    assert redact_tail("x caller z", [S]) == "x caller z"  # one character says nothing
    assert redact_tail("x caller yes", [S]) == "x caller yes"


# -- the free-text rules (vramdoctor.redact, used by every output path) ---------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # quoted values after a secret name: whole, quotes kept
        (f"api_key='{S}', model='m'", "api_key='***', model='m'"),
        (f"'api_key': '{S}'", "'api_key': '***'"),
        (f'{{"api_key": "{S}", "n": 1}}', '{"api_key": "***", "n": 1}'),
        ('{"token": "zebra7 \\"quokka9\\" narwhal3"}', '{"token": "***"}'),
        ("api_key='zebra7 \\'quokka9\\' narwhal3', x=1", "api_key='***', x=1"),
        (f'set --api-key "{S}" to enable auth', 'set --api-key "***" to enable auth'),
        (f"--api-key '{S}' --port 8000", "--api-key '***' --port 8000"),
        (f'--admin-api-key="{S}" --port 8000', '--admin-api-key="***" --port 8000'),
        (f'HF_TOKEN="{S}" vllm serve m', 'HF_TOKEN="***" vllm serve m'),
        ("--api-key 'zebra7'\\''s quokka9' --port 1", "--api-key '***' --port 1"),
        (f"password: '{S}'", "password: '***'"),
        # lists and tuples of keys
        (f"api_key=['{S}', '{S2}'], model='m'", "api_key=***, model='m'"),
        (f"'api_key': ('{S}',), 'model': 'm'", "'api_key': ***, 'model': 'm'"),
        # a quote the line does not close (a cut): the rest of the line
        (f"api_key='{S[:12]}", "api_key='***"),
        (f'x --api-key "{S[:9]}\nnext line', 'x --api-key "***\nnext line'),
        (f"api_key=['{S}', 'yak4 oka", "api_key=***"),
        # a prose word in front does not hide the pair
        (f"then api_key='{S}' failed", "then api_key='***' failed"),
        # a command line printed as a list (a subprocess call in a traceback)
        (
            f"Popen(['python', '-m', 'sglang.launch_server', '--api-key', '{S}', '--port', '1'])",
            "Popen(['python', '-m', 'sglang.launch_server', '--api-key', '***', '--port', '1'])",
        ),
        (f'["vllm", "serve", "--hf-token", "{S}"]', '["vllm", "serve", "--hf-token", "***"]'),
    ],
)
def test_free_text_quoted_values_are_masked_whole(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "pass your key with --api-key or OPENAI_API_KEY",
        "--api-key KEY",
        "--api-key <key>",
        "the key 'model_path' is missing",
        "a token 'abc def' appeared in prose",
        "KeyError: 'rid'",
        "raise InvalidTokenError: 'expired'",
        "Error: missing key: (see docs)",
        "#token: 1234, token usage: 0.01",
        "--max-tokens 16 --tokenizer-path /p",
        "ssl_keyfile='/etc/k.pem'",
        "api_key='', model='m'",
        'he said "keys matter" and left',
        "Authorization: Bearer ***",
        "args: Namespace(api_key=None, hf_token=True, x='y')",
        "required fields: ['api_key', 'model']",
        "['vllm', 'serve', '--api-key', '--port', '8000']",
    ],
)
def test_ordinary_prose_and_settings_stay(text: str) -> None:
    assert redact_text(text) == text


def test_a_registered_secret_with_spaces_is_masked_whole_after_its_name() -> None:
    """The original fault: the registered value is masked before any rule could split it."""
    out = redact_text(f"api_key='{S}' and later {S} again", [S])
    assert out == "api_key='***' and later *** again"


def test_a_masked_quoted_value_is_remembered_for_the_rest_of_the_output() -> None:
    redact_text(f"--api-key '{S}'")
    assert redact_text(f"401 for key {S}") == "401 for key ***"


def test_argv_and_json_documents_blank_values_with_spaces_and_lists() -> None:
    assert redact_argv(["env", f"HF_TOKEN={S}", "vllm", "serve", "--api-key", S2]) == [
        "env",
        "HF_TOKEN=***",
        "vllm",
        "serve",
        "--api-key",
        "***",
    ]
    doc = redact_obj({"api_key": [S, S2], "model": "m", "n": 3})
    assert doc == {"api_key": ["***", "***"], "model": "m", "n": 3}


def test_pasted_command_secrets() -> None:
    _, env, secrets = parse_command(
        f'HF_TOKEN="{S}" SGLANG_X_TOKEN_LIMIT=4096 OPENAI_API_KEY=true vllm serve m '
        f"--api-key '{S2}' 'k2-second' --max-new-token 1234 --port 8000"
    )
    assert set(secrets) == {S, S2, "k2-second"}  # vLLM's --api-key takes several keys
    assert env["HF_TOKEN"] == S
    _, _, secrets = parse_command(
        f"python -m sglang.launch_server --model-path m --api-key '{S2}' extra-word "
        f'--ssl-keyfile-password="{S}"'
    )
    assert set(secrets) == {S2, S}  # SGLang's --api-key takes one
