"""What a user who is not root meets: the command line loads and says what is wrong
in one line, wherever that user may write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


#: the command line, as its entry point starts it
AS_COMMAND = "from qaina_bench.harness.entry import main; main()"

#: a worker's kernels compiled and called once for every format a run uses
AS_KERNELS = """
from qaina_bench.hosts import kernels
kernels.warm()
print("warm")
"""


def as_nobody(*argv, home="/nonexistent"):
    """``python argv`` as a user who may write nowhere (nobody with no home, when root
    runs the tests), in the repository's environment."""
    drop = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            if os.geteuid() == 0 else [])
    if drop and not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is missing: cannot run as another user")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["HOME"] = home
    return subprocess.run(drop + [sys.executable, *argv], capture_output=True, text=True,
                          timeout=300, cwd="/", env=env)


def test_a_user_who_may_write_nowhere_gets_the_one_line_not_a_traceback():
    """A user whose home is not writable (nobody, a service account) cannot keep the
    kernels' compiled cache: the command line still loads, says what is wrong in one
    line, and the kernels compile in the process instead."""
    run = as_nobody("-c", AS_COMMAND, "up", "--topo", "star", "--jobs", "1")
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode != 0 and lines == [
        "Error: qaina-bench up needs root (Mininet, veth, raw sockets): run it with "
        "sudo"], run.stderr
    run = as_nobody("-c", AS_KERNELS)
    assert run.returncode == 0 and run.stdout.split() == ["warm"], run.stderr
