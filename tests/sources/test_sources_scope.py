"""Whose process each host-memory row is, on real processes: the server's tree, a tenant of
its GPUs, or unknown; with owner, parent and the server's own name for it (its title)."""

from __future__ import annotations

import os
import subprocess
import sys

from vramdoctor.samples import HostSample
from vramdoctor.sources.discover import ServerProcesses, roles
from vramdoctor.sources.host import HostSource


def test_host_rows_say_scope_owner_parent_and_title() -> None:
    # A child whose argv[0] is a vLLM process title, as setproctitle leaves /proc/PID/cmdline.
    worker = subprocess.Popen(["VLLM::Worker_TP1", "60"], executable="/bin/sleep")
    tenant = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    unknown = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        src = HostSource(
            {
                os.getpid(): "server",
                worker.pid: "child",
                tenant.pid: "gpu-peer",
                unknown.pid: "gpu-process",
            }
        )
        s = src.sample()
    finally:
        for p in (worker, tenant, unknown):
            p.kill()
            p.wait()
    rows = {p.pid: p for p in s.processes}
    assert rows[os.getpid()].scope == "server" and rows[worker.pid].scope == "server"
    assert rows[tenant.pid].scope == "tenant"
    assert rows[unknown.pid].scope is None
    assert rows[worker.pid].title_role == "vllm worker TP1"
    assert rows[tenant.pid].title_role is None
    for pid in (worker.pid, tenant.pid):
        assert rows[pid].ppid == os.getpid() and rows[pid].uid == os.getuid()
    # The fields travel through a run file and back.
    again = HostSample.from_dict(s.to_dict())
    assert again == s


def test_gpu_processes_are_tenants_only_when_the_server_was_found() -> None:
    found = ServerProcesses(root_pids=[10], tree={10: "python", 11: "python"})
    assert roles(found, {12: "python"}) == {10: "server", 11: "child", 12: "gpu-peer"}
    hidden = ServerProcesses(reason="port forwarded by docker-proxy")
    assert roles(hidden, {12: "python"}) == {12: "gpu-process"}
