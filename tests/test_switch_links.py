"""The embedded switch when a port's link goes down and comes back: it says so once,
counts it, goes back to waiting (no busy loop on the error its ring socket reports)
and forwards through the port again."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from conftest import SwitchLab, ip

pytestmark = pytest.mark.root


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def test_a_port_whose_link_flaps_is_counted_and_leaves_the_switch_idle(tmp_path):
    lab = SwitchLab("embedded", 2, tmp_path)
    try:
        sw, _ = lab.veths.pairs[1]
        ip("link", "set", sw, "down")
        time.sleep(0.3)
        ip("link", "set", sw, "up")
        time.sleep(0.5)
        proc = psutil.Process(lab.target.pid)
        before = cpu_seconds(proc)
        time.sleep(2.0)
        used = cpu_seconds(proc) - before
        # idle it polls 5 times a second; spinning on the error it took about a core
        assert used < 0.5, f"the idle switch took {used:.2f} CPU s in 2 s after the flap"
        log = (tmp_path / "s1.log").read_text()
        assert f"port 1 ({sw}): ENETDOWN" in log, log[-2000:]
        lab.target.stop()
        stats = json.loads(lab.target.stats_path.read_text())
        assert stats[sw]["link_errors"] >= 1 and stats[sw]["rx_mode"] == "ring", stats
    finally:
        lab.close()
