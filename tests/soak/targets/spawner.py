"""A daemon outside vramdoctor's tree: it starts what `via_spawner.py` asks for (as docker does)."""

import json
import os
import subprocess
import sys
import time

folder = sys.argv[1]
started = []
while True:
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        with open(path) as f:
            argv = json.load(f)
        os.unlink(path)
        p = subprocess.Popen([sys.executable, *argv], start_new_session=True)
        with open(path[:-5] + ".pid", "w") as f:
            f.write(str(p.pid))
        started.append(p)
    time.sleep(0.05)
