"""`vramdoctor try`: watch and fleet working in a minute, on a laptop, with no GPU and no production.

Two trials, each one command, each a real run of the real command against real processes:

- `watch_trial` (`vramdoctor try watch`): the reference server (examples/reference_server) on
  this machine's CPU, keeping 1 MiB of host memory per request (`--healthy`: its caching twin,
  which keeps nothing), real traffic in bursts with idle gaps, and `vramdoctor watch` with
  short settings for 45 seconds. Expected: LEAK in the server's anonymous memory at about
  1.0 MiB per served request (exit 1); healthy: no LEAK (exit 0).
- `fleet_trial` (`vramdoctor try fleet`): three days of exporter history with known leaks and
  plateaus (tests/fixtures/fleet/backfill.py: dcgm-exporter, nvitop-exporter,
  nvidia_gpu_exporter, SGLang KV), backfilled with `promtool tsdb create-blocks-from
  openmetrics` into a local Prometheus on loopback, then `vramdoctor fleet` over it. Expected:
  the series the history leaks, at their rates; nothing else called a leak (exit 1).

Both print the exact command they run (copy it to run it yourself), start every process
through the soak launcher (`vramdoctor.soak.launch`: own process group, stopped on exit,
Ctrl-C or a crash: nothing outlives vramdoctor) and return the command's exit code. They run
from a clone of the source tree (they need examples/ and tests/fixtures/); `TrialUnavailable`
(exit 2, one line) says what is missing.
"""

from __future__ import annotations

from vramdoctor.trial.fleet import FleetTrial, fleet_trial, local_prometheus
from vramdoctor.trial.tree import TrialUnavailable, source_file
from vramdoctor.trial.watch import WatchTrial, watch_trial

__all__ = [
    "FleetTrial",
    "TrialUnavailable",
    "WatchTrial",
    "fleet_trial",
    "local_prometheus",
    "source_file",
    "watch_trial",
]
