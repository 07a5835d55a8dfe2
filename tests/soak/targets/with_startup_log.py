"""Print a real server's start-up lines on stderr, then exec the server (same pid)."""

import os
import sys

log, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
with open(log, encoding="utf-8") as f:
    sys.stderr.write(f.read())
sys.stderr.flush()
os.execv(sys.executable, [sys.executable, *argv])
