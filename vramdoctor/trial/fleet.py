"""`vramdoctor try fleet`: days of generated exporter history in a local Prometheus, and fleet.

The history is the one fleet's own tests are checked against (tests/fixtures/fleet/backfill.py:
`fleet_series` and its `TRUTH`), so the trial shows what the tests prove: every leak the
history holds found at its rate, the plateaus and restarts not called leaks.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vramdoctor.trial.tree import TrialUnavailable, free_port, load_module
from vramdoctor.trial.watch import run_child

__all__ = ["HISTORY", "FleetTrial", "fleet_trial", "local_prometheus"]

HISTORY = "tests/fixtures/fleet/backfill.py"
"""The history generator, relative to the source tree."""

APT_HINT = "sudo apt-get install prometheus (Debian/Ubuntu; it brings promtool)"


@dataclass(frozen=True)
class FleetTrial:
    """`days` of history at one sample per `step_s` seconds; `keep` leaves Prometheus
    running after fleet (until Ctrl-C) so you can try fleet's options on it yourself;
    `json_out` gives fleet --json."""

    days: float = 3.0
    step_s: float = 60.0
    keep: bool = False
    json_out: bool = False

    def fleet_args(self, url: str, until: float) -> list[str]:
        return [
            "fleet",
            "--prometheus",
            url,
            "--since",
            f"{self.days:g}d",
            "--until",
            f"{until:.0f}",
            "--step",
            "5m",
            *(["--json"] if self.json_out else []),
        ]


def _tools() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        missing = " and ".join(
            name for name, path in (("prometheus", prometheus), ("promtool", promtool)) if not path
        )
        raise TrialUnavailable(f"try fleet needs {missing} on PATH: {APT_HINT}")
    return prometheus, promtool


def truth_lines(truth: dict[str, tuple[str, float]]) -> list[str]:
    """What the history holds, one line per leaking series (the rest are not leaks)."""
    lines = []
    for key, (verdict, rate) in sorted(truth.items()):
        if verdict == "LEAK":
            unit = "tokens" if key.endswith("/kv") else "MiB"
            lines.append(f"  {key}: leaks {rate:g} {unit} per hour")
    others = sum(1 for v, _ in truth.values() if v != "LEAK")
    lines.append(f"  and {others} series that cache, restart or stay flat: not leaks")
    return lines


@contextlib.contextmanager
def local_prometheus(
    folder: Path,
    *,
    days: float = 3.0,
    step_s: float = 60.0,
    say: Callable[[str], None] | None = None,
) -> Iterator[tuple[str, float, dict[str, tuple[str, float]]]]:
    """A real Prometheus on loopback serving `days` of the generated history, under the soak
    launcher (stopped when the block ends, however it ends). Yields (its URL, the history's
    end as unix seconds, the history's truth: series key -> (verdict, rate per hour)).
    Files go in `folder`. Raises TrialUnavailable without prometheus/promtool, outside a
    source tree, or when promtool or Prometheus fail."""
    from vramdoctor.soak.launch import LaunchFailed, LaunchSpec, launch

    prometheus, promtool = _tools()
    backfill = load_module(HISTORY, "vramdoctor_trial_fleet_history")
    end = (time.time() // 60) * 60 - 600
    folder.mkdir(parents=True, exist_ok=True)
    history = folder / "history.om"
    series = backfill.fleet_series(end, days, step_s)
    truth = dict(backfill.TRUTH)
    with history.open("w", encoding="utf-8") as f:
        f.writelines(backfill.openmetrics(series))
    if say is not None:
        # lines under 80 columns: stderr notes are not wrapped
        say(f"try fleet: {days:g} days of exporter history, {len(series)} series of")
        say("dcgm-exporter, nvitop-exporter, nvidia_gpu_exporter and SGLang KV, backfilled")
        say("with promtool into a local Prometheus. What it holds:")
        for line in truth_lines(truth):
            say(line)
    data = folder / "data"
    made = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=96h",
            "-q",
            str(history),
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if made.returncode != 0:
        last = (made.stderr or made.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TrialUnavailable(f"promtool could not backfill the history: {last[0]}")
    config = folder / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n", encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = LaunchSpec(
        argv=(
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=3650d",
        ),
        agent=False,
        startup_timeout_s=60.0,
        stop_grace_s=5.0,
    )
    with launch(spec, run_dir=folder, stem="try-fleet-prometheus") as server:
        try:
            server.wait_ready(url)
        except LaunchFailed as exc:
            raise TrialUnavailable(f"Prometheus did not start: {exc}") from None
        yield url, end, truth


def fleet_trial(
    trial: FleetTrial = FleetTrial(),
    *,
    say: Callable[[str], None] = print,
    run_dir: Path | None = None,
) -> int:
    """Run the trial; returns fleet's exit code (1 a leak found, 0 none, 2 an error).

    Builds the history in `run_dir` (default: a temporary folder removed at the end), backfills
    it with promtool, starts Prometheus on loopback (`local_prometheus`), runs `vramdoctor
    fleet` over it (its output on this process's stdout/stderr) and stops Prometheus (with
    `keep`: after Ctrl-C). Raises TrialUnavailable without prometheus/promtool or outside a
    source tree, or when Prometheus does not start.
    """
    with tempfile.TemporaryDirectory(prefix="vramdoctor-try-") as tmp:
        folder = run_dir or Path(tmp)
        with local_prometheus(folder, days=trial.days, step_s=trial.step_s, say=say) as (
            url,
            end,
            _truth,
        ):
            args = trial.fleet_args(url, end)
            say("then this fleet:")
            say("  vramdoctor " + " ".join(args))
            if not trial.keep:  # the printed URL dies with the trial: say so where it is printed
                say("  (this Prometheus stops when the trial ends: the command works only")
                say("  meanwhile; vramdoctor try fleet --keep keeps it running until Ctrl-C)")
            code = run_child([sys.executable, "-m", "vramdoctor", *args])
            if trial.keep and code in (0, 1):
                say(f"try fleet: Prometheus stays at {url} until Ctrl-C; try, for example:")
                say(f"  vramdoctor fleet --prometheus {url} --since 2d --until {end:.0f} --json")
                try:
                    while True:
                        time.sleep(1.0)
                except KeyboardInterrupt:
                    pass
        say("try fleet: Prometheus is stopped.")
    return code
