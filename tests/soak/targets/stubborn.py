"""Leave a grandchild behind (own session, SIGTERM ignored), then exec the server."""

import os
import signal
import sys
import time

pidfile, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
if os.fork() == 0:
    os.setsid()  # out of the server's process group: a killpg does not reach it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    while True:
        time.sleep(1)
while not os.path.exists(pidfile):
    time.sleep(0.01)
os.execv(sys.executable, [sys.executable, *argv])
