"""Take SECONDS to 'load' (printing as it goes), then exec the server (same pid)."""

import os
import sys
import time

seconds, argv = float(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
end = time.monotonic() + seconds
while time.monotonic() < end:
    print("loading weights ...", flush=True)
    time.sleep(0.2)
os.execv(sys.executable, [sys.executable, *argv])
