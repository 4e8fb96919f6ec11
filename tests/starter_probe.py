"""A host program for ``test_starter.py``: ``main(argv)`` as an agent has one.

``main([OUT, MODE])`` writes what the fork sees (its network namespace, working
directory, parent, environment, cgroups) to OUT as JSON, prints a line to its output, then by
MODE: ``burn`` spends 0.3 s of CPU and returns 3; ``sleep`` sleeps until signalled.
"""

import json
import os
import sys
import time


def main(argv):
    out, mode = argv
    seen = {"net": os.stat("/proc/self/ns/net").st_ino, "cwd": os.getcwd(),
            "ppid": os.getppid(), "threads": os.environ.get("OMP_NUM_THREADS"),
            "sid": os.getsid(0), "pid": os.getpid(),
            "cgroups": open("/proc/self/cgroup").read().splitlines()}
    with open(out + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(out + ".tmp", out)
    print(f"probe {os.getpid()} here", flush=True)
    if mode == "raise":  # as an agent whose socket meets a link that is down
        raise OSError(101, "Network is unreachable")
    if mode == "burn":
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        return 3
    while True:
        time.sleep(1)
