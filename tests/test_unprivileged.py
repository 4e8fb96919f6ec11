"""What a user who is not root meets: the command line loads and says what is wrong
in one line, wherever that user may write."""

from __future__ import annotations

import os

from conftest import as_nobody


#: the command line, as its entry point starts it
AS_COMMAND = "from qaina_bench.harness.entry import main; main()"

#: a worker's kernels compiled and called once for every format a run uses
AS_KERNELS = """
from qaina_bench.hosts import kernels
kernels.warm()
print("warm")
"""


def in_no_home(*argv):
    """``python argv`` as an unprivileged user whose home does not exist, with no numba
    settings of the environment's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    return as_nobody(*argv, env={**env, "HOME": "/nonexistent"})


def test_a_user_who_may_write_nowhere_gets_the_one_line_not_a_traceback():
    """A user whose home is not writable (nobody, a service account) cannot keep the
    kernels' compiled cache: the command line still loads, says what is wrong in one
    line, and the kernels compile in the process instead."""
    run = in_no_home("-c", AS_COMMAND, "up", "--topo", "star", "--jobs", "1")
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode != 0 and lines == [
        "Error: qaina-bench up needs root (Mininet, veth, raw sockets): run it with "
        "sudo"], run.stderr
    run = in_no_home("-c", AS_KERNELS)
    assert run.returncode == 0 and run.stdout.split() == ["warm"], run.stderr
