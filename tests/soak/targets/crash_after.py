"""Run the server as a child; SECONDS later kill it with SIGSEGV and exit 139 (a crash)."""

import os
import signal
import subprocess
import sys
import time

seconds, argv = float(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
child = subprocess.Popen([sys.executable, *argv])
time.sleep(seconds)
sys.stderr.write("Fatal Python error: Segmentation fault\n")
sys.stderr.flush()
os.kill(child.pid, signal.SIGSEGV)
child.wait()
sys.exit(139)
