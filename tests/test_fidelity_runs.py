"""Real Mininet runs as root: the fidelity verdict of a link-bound run and of an
unshaped one, the CPU accounting of a run adds up, and the hosts' CPU limit holds."""

from __future__ import annotations

import os
import shutil
import sys
import time
from functools import partial

import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.results.fidelity import FEW_SAMPLES
from qaina_bench.harness.running.cpulimit import LimitedHost, cgroup_dirs, limit_problem
from qaina_bench.harness.running.cpustat import CpuLedger
from qaina_bench.harness.running.run import Run

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]

needs_cpu_limit = pytest.mark.skipif(os.geteuid() == 0 and limit_problem() is not None,
                                     reason=f"{limit_problem()}")


def execute(tmp_path, **kw):
    cfg = RunConfig.flat(results_dir=str(tmp_path), **kw)
    run = Run(cfg, echo=lambda *a, **k: None)
    return run.execute(), run


def check_cost_adds_up(summary: dict, working=("agents", "switches", "harness")):
    """The components ``working`` spent CPU time (``/proc`` counts 10 ms ticks: a switch
    that only forwards a short run's TCP may spend none), each is its user and system
    time, and together no more than the cores had."""
    c = summary["cpu_cost"]
    parts = c["components"]
    for name in ("agents", "switches", "harness"):
        assert parts[name]["total_s"] > 0 or name not in working, name
        assert parts[name]["total_s"] == pytest.approx(parts[name]["user_s"]
                                                       + parts[name]["system_s"])
    assert c["unread"] == []
    # /proc counts in ticks of 10 ms per process
    slack = 0.01 * (len(c["processes"]) + 1)
    assert c["total_s"] <= c["window_s"] * c["cores"] + slack
    assert 0 <= c["kernel"]["total_s"] <= c["window_s"] * c["cores"] + slack
    elements = sum(j["elements_aggregated"] for j in summary["jobs"])
    assert c["elements_aggregated"] == elements > 0
    assert c["s_per_melem"] == pytest.approx(c["total_s"] / (elements / 1e6))


def test_a_run_on_1_mbit_links_is_network_bound(tmp_path):
    """b = 32 over 0.5 Mbit/s links: 12 iterations of about 0.6 s each, the workers'
    links full all along. The sampler reads the links every 100 ms, less often on a
    busy machine: the run is long enough for a verdict that is not coarse even then."""
    summary, _ = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[32],
                         iterations=12, bw=0.5)
    assert summary["complete"], summary["errors"]
    f = summary["jobs"][0]["fidelity"]
    assert f["verdict"] == "network-bound", f["reason"]
    assert summary["fidelity"] == {"verdict": "network-bound", "jobs": {"1": "network-bound"}}
    assert f["link_rate_mbit"] == 0.5 and f["link_load"] >= 0.9
    assert f["link_samples"] >= FEW_SAMPLES and "coarse" not in f["reason"]
    hosts = {f"s1-eth{i}" for i in range(1, 5)}
    assert {k.split()[0] for k in f["bottleneck_time"]} <= hosts
    assert f["transfer_s"] <= summary["jobs"][0]["job_completion_s"] + 1e-6
    assert not any("not network-bound" in w for w in summary["validity"]["warnings"])
    check_cost_adds_up(summary)


def test_an_unshaped_run_is_not_network_bound(tmp_path):
    """Two parameter-server jobs on unshaped links: every job is cpu-bound, each is
    judged on its own processes, and the servers' CPU time is counted."""
    summary, _ = execute(tmp_path, topo="star", jobs=2, workers=2, bits=[4], iterations=3,
                         mode="ps")
    assert summary["complete"], summary["errors"]
    for job in summary["jobs"]:
        f = job["fidelity"]
        assert f["verdict"] == "cpu-bound" and "unshaped" in f["reason"]
        assert f["link_load"] is None
        mine = {f"agent j{job['job_id']}w0", f"agent j{job['job_id']}w1",
                f"parameter server ps{job['job_id']}", "switch s1"}
        assert set(f["processes"]) <= mine
    assert summary["fidelity"]["verdict"] == "cpu-bound"
    assert any("was cpu-bound, not network-bound" in w
               for w in summary["validity"]["warnings"])
    check_cost_adds_up(summary, working=("agents", "harness"))  # the switch only routes
    ps = summary["cpu_cost"]["components"]["ps"]
    assert ps["processes"] == 2 and ps["total_s"] > 0


BUSY = """
import time
end = time.monotonic() + 2.0
while time.monotonic() < end:
    pass
"""


@needs_cpu_limit
def test_a_busy_loop_on_a_limited_host_gets_no_more_than_its_limit():
    """A host limited to 0.2 cores runs a busy loop for 2 s: its CPU time, read from
    /proc at its exit, is at most 0.2 s per second (+ 0.05 for the quota's period and
    /proc's ticks), whatever else the machine does; the cgroup goes with the host."""
    from mininet.net import Mininet
    net = Mininet(topo=None, host=partial(LimitedHost, cores=0.2), controller=None,
                  build=False)
    host = net.addHost("qbcpu1")
    try:
        net.build()
        assert (cgroup_dirs("qbcpu1")[0] / "cpu.cfs_quota_us").read_text().strip() == "20000"
        ledger = CpuLedger()
        busy = host.popen([sys.executable, "-c", BUSY])
        ledger.watch("busy", "agents", busy.pid)
        ledger.begin()
        while ledger.poll(busy) is None:
            time.sleep(0.05)
        ledger.end()
        got = ledger.readings()
        used = got["processes"]["busy"]["user_s"] + got["processes"]["busy"]["system_s"]
        assert 0 < used / got["window_s"] <= 0.2 + 0.05
    finally:
        net.stop()
    assert not any(d.exists() for d in cgroup_dirs("qbcpu1"))


@needs_cpu_limit
def test_host_cpu_holds_every_agent_to_its_limit(tmp_path):
    summary, run = execute(tmp_path, topo="star", jobs=1, workers=2, bits=[4], iterations=4,
                           host_cpu=0.1)
    assert summary["complete"], summary["errors"]
    assert summary["host_cpu"] == 0.1 and "cpu0.1" in summary["run_id"]
    cost = summary["cpu_cost"]
    for name, p in cost["processes"].items():
        if p["component"] == "agents":
            assert p["user_s"] + p["system_s"] <= 0.1 * cost["window_s"] + 0.05, name
    assert summary["jobs"][0]["fidelity"]["verdict"] == "cpu-bound"
    assert not any(d.exists() for h in ("h1", "h2") for d in cgroup_dirs(h))
    assert summary["errors"] == []
