"""The embedded switch's own limits, beyond what both targets share: a port whose link
goes down and comes back (said once, counted, no busy loop on the error its ring
socket reports), and a Read that asks for more than it answers."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from conftest import SwitchLab, ip, open_lab
from qaina_bench.harness.switches.control import ControlError
from qaina_bench.p4.proto import p4runtime_pb2

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


def test_a_read_of_wildcards_past_the_limit_is_refused_whole(tmp_path_factory):
    """Every cell of ``agg_sum`` many times over in one small request: the embedded
    switch refuses it before it builds the answer (a limit of its own: BMv2 builds it)."""
    from qaina_bench.p4.embedded.runtime import READ_MAX
    lab = open_lab("embedded", tmp_path_factory, ports=1)
    try:
        lab.reset()  # the pipeline installed
        conn = lab.conn
        reg = conn.p4info.register("MyIngress.agg_sum")
        req = p4runtime_pb2.ReadRequest(device_id=1)
        for _ in range(READ_MAX // reg.size + 1):
            req.entities.add().register_entry.register_id = reg.id
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn._call("read", lambda r, timeout: list(conn.stub.Read(r, timeout=timeout)), req)
        assert len(conn.read_register("MyIngress.agg_count")) > 0  # still serving
    finally:
        lab.close()
