"""`vramdoctor try watch`: the reference server, bursts of traffic, and a short watch of it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vramdoctor.trial.traffic import Bursts
from vramdoctor.trial.tree import free_port, source_file

__all__ = ["SERVER", "WATCH_SETTINGS", "WatchTrial", "watch_trial"]

SERVER = "examples/reference_server/server.py"
"""The reference server, relative to the source tree."""

# watch's settings for a trial: samples every half second, a verdict every 2 s, 2 s of warm-up,
# 2 s without a request in flight is an idle window (the trial's traffic pauses 4 s).
# Its defaults (5 s samples, 30 minutes of warm-up, a 6-hour window) are for weeks of running.
WATCH_SETTINGS = (
    "--interval", "0.5s", "--bucket", "1s", "--window", "10m", "--warmup", "2s",
    "--analyse-every", "2s", "--min-idle", "2s", "--inside-every", "0s", "--no-exporter",
)  # fmt: skip

LEAK_KIB = 1024  # what the leaking server keeps per request: 1 MiB
IDLE_S = 4.0  # seconds of no traffic between two bursts (watch's idle windows)


@dataclass(frozen=True)
class WatchTrial:
    """One trial: `healthy` runs the caching twin (keeps nothing per request) instead of the
    leaking server; `duration_s` how long watch runs (seconds); `json_out` gives watch --json."""

    healthy: bool = False
    duration_s: float = 45.0
    json_out: bool = False

    def server_argv(self, port: int) -> list[str]:
        mode = ["--mode", "plain"] if self.healthy else ["--mode", "leaking"]
        return [
            sys.executable,
            str(source_file(SERVER)),
            "--port",
            str(port),
            *mode,
            "--device",
            "cpu",
            "--leak-kib",
            str(LEAK_KIB),
            "--metrics-flavour",
            "vllm",
        ]

    def watch_args(self, url: str) -> list[str]:
        duration = f"{self.duration_s:g}s"
        json_flag = ["--json"] if self.json_out else []
        return ["watch", "--server", url, *WATCH_SETTINGS, "--duration", duration, *json_flag]

    def expectation(self) -> str:
        if self.healthy:
            return (
                "Expect: no LEAK (the server caches up to a bound and keeps nothing per "
                "request); exit 0."
            )
        return (
            "Expect: LEAK in the server's host memory (rss, rss_anon) at about 1.0 MiB per served "
            "request, decided by glibc's bytes in use read inside the server by vramdoctor's "
            "agent (from outside alone, retention and a leak look the same); exit 1. "
            "(vramdoctor try watch --healthy: its caching twin.)"
        )


def watch_trial(
    trial: WatchTrial = WatchTrial(),
    *,
    say: Callable[[str], None] = print,
    run_dir: Path | None = None,
) -> int:
    """Run the trial; returns watch's exit code (1 LEAK, 0 no leak, 2 an error, 130 Ctrl-C).

    `say` gets the lines that explain what runs (the exact watch command among them);
    watch's own output goes to this process's stdout and stderr. The server's log is kept in
    `run_dir` (default: a temporary folder removed at the end). Raises TrialUnavailable
    outside a source tree, LaunchFailed when the server does not start.
    """
    from vramdoctor.soak.launch import LaunchSpec, launch

    argv = trial.server_argv(free_port())
    port = argv[argv.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="vramdoctor-try-") as tmp:
        folder = run_dir or Path(tmp)
        # The agent in the server, as --launch does: from outside alone its steady heap growth
        # is retention or a leak; glibc's bytes in use, read inside, decide.
        spec = LaunchSpec(argv=tuple(argv), agent=True, startup_timeout_s=60.0, stop_grace_s=5.0)
        kind = (
            "its caching twin" if trial.healthy else f"keeping {LEAK_KIB // 1024} MiB per request"
        )
        say(f"try watch: the reference server ({kind}, on the CPU, the agent inside) at {url},")
        say(f"traffic in bursts of 20 requests with {IDLE_S:g} s idle between, and this watch:")
        say("  vramdoctor " + " ".join(trial.watch_args(url)))
        say(trial.expectation())
        with launch(spec, run_dir=folder, stem="try-watch") as server:
            server.wait_ready(url)
            traffic = Bursts(url, idle_s=IDLE_S).start()
            try:
                code = run_child([sys.executable, "-m", "vramdoctor", *trial.watch_args(url)])
            finally:
                traffic.stop()
            say(
                f"try watch: {traffic.sent} requests sent ({traffic.failed} failed); the server "
                f"is stopped. Its log: {server.log_path}"
                if run_dir
                else f"try watch: {traffic.sent} requests sent ({traffic.failed} failed); "
                "the server is stopped."
            )
    return code


def run_child(argv: list[str], *, grace_s: float = 30.0) -> int:
    """Run `argv` in the foreground and return its exit code (130 for a signal). On Ctrl-C the
    child (same process group: it got the signal too) has `grace_s` seconds to give its
    partial report; a second Ctrl-C, or the grace running out, kills it."""
    child = subprocess.Popen(argv)
    try:
        code = child.wait()
    except KeyboardInterrupt:
        try:
            code = child.wait(grace_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            child.kill()
            child.wait()
            code = 130
    return 130 if code < 0 else code
