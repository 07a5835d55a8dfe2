"""Start a helper daemon out of the server's process tree that keeps KIB KiB per request, then
exec the server (the shape of a tokenizer-like helper that double-forks and calls setsid).

    helper_daemon.py KIB PIDFILE -- ARGV...

The daemon (double fork + setsid: its parent is no longer the server) polls the server's
request counter (GET /reference/info "requests", the reference server's own count, on the
port of ARGV's `--port`) every 50 ms and keeps KIB KiB of fresh bytes (`bytes(n)`: one malloc
each) for every request the server finished since the last poll. It writes its pid to PIDFILE
and ends once the server's pid is gone. Standard library only.
"""

import json
import os
import sys
import time
import urllib.request

kib, pidfile = int(sys.argv[1]), sys.argv[2]
argv = sys.argv[sys.argv.index("--") + 1 :]
port = argv[argv.index("--port") + 1]
server = os.getpid()  # the exec keeps this pid

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        kept: list[bytes] = []
        seen = 0
        url = f"http://127.0.0.1:{port}/reference/info"
        while True:
            try:
                os.kill(server, 0)
            except ProcessLookupError:
                os._exit(0)
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    done = int(json.loads(r.read())["requests"])
            except (OSError, ValueError, KeyError):
                done = seen
            while seen < done:
                kept.append(bytes(kib * 1024))
                seen += 1
            time.sleep(0.05)
    os._exit(0)
os.wait()
while not os.path.exists(pidfile):
    time.sleep(0.01)
os.execv(sys.executable, [sys.executable, *argv])
