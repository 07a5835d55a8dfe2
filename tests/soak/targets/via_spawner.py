"""Ask the spawner daemon (spawner.py FOLDER) to start the server, then wait: like `docker run -d`
followed by a log tail, the server is not this process's descendant."""

import json
import os
import sys
import time

folder, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
name = os.path.join(folder, f"{os.getpid()}.json")
with open(name + ".tmp", "w") as f:
    json.dump(argv, f)
os.rename(name + ".tmp", name)
while True:
    time.sleep(1)
