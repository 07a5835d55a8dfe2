"""Leave a grandchild behind (own session, SIGTERM ignored), then exec the server.

The grandchild writes its pid to PIDFILE and a line to PIDFILE.beat every 0.2 s, so a test can
tell a grandchild that had to be SIGKILLed from one that ended by itself."""

import os
import signal
import sys
import time
import traceback

pidfile, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
if os.fork() == 0:
    os.setsid()  # out of the server's process group: a killpg does not reach it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    try:
        while True:
            with open(pidfile + ".beat", "a") as f:
                f.write(f"{time.time():.3f}\n")
            time.sleep(0.2)
    except BaseException:
        with open(pidfile + ".beat", "a") as f:
            f.write("ended: " + traceback.format_exc().replace("\n", " | ") + "\n")
        raise
while not os.path.exists(pidfile):
    time.sleep(0.01)
os.execv(sys.executable, [sys.executable, *argv])
