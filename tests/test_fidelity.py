"""The fidelity verdict and the CPU cost, without root: the rule on synthetic
counters whose answers are worked out by hand below, the CPU ledger on real child
processes, the CPU limit's checks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from qaina_bench.harness.running import cpulimit
from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.cpustat import CpuLedger, SchedClock
from qaina_bench.harness.results.fidelity import (cpu_cost, job_fidelity, link_load, overall,
                                          transfer_intervals, verdict)
from qaina_bench.harness.results.summary import fidelity as summary_fidelity
from qaina_bench.harness.results.summary import validity

# Job 1 runs on h1 and h2 (switch s1). Its two iterations:
#   iteration 0: worker 0 10.0-11.0, worker 1 10.1-11.2  -> 10.0-11.2
#   iteration 1: worker 0 11.5-12.5, worker 1 11.4-12.3  -> 11.4-12.5
# so it transfers for 1.2 s + 1.1 s = 2.3 s, with a gap 11.2-11.4.
ROWS = [
    {"job": 1, "worker": 0, "iteration": 0, "start": 10.0, "end": 11.0},
    {"job": 1, "worker": 1, "iteration": 0, "start": 10.1, "end": 11.2},
    {"job": 1, "worker": 0, "iteration": 1, "start": 11.5, "end": 12.5},
    {"job": 1, "worker": 1, "iteration": 1, "start": 11.4, "end": 12.3},
    {"job": 2, "worker": 0, "iteration": 0, "start": 0.0, "end": 50.0},
]
INTERFACES = {"s1-eth1": "h1", "s1-eth2": "h2", "s1-eth3": "h3", "s1-eth4": "s2",
              "s2-eth1": "s1"}
TIMES = [9.5 + 0.5 * k for k in range(8)]  # 9.5 .. 13.0


def link_rows():
    """h1 -> s1 at a steady 120,000 B/s (0.96 Mbit/s); h2's link moves 1,000,000 bytes
    in the gap between the iterations only; h3 (job 2) and the s1-s2 link carry a
    steady 200,000 B/s and 10,000 B/s. Everything else is idle."""
    rows = []
    for t in TIMES:
        rows.append({"time": t, "interface": "s1-eth1", "bytes_sent": 0,
                     "bytes_recv": 120_000 * (t - 9.5)})
        rows.append({"time": t, "interface": "s1-eth3", "bytes_sent": 200_000 * (t - 9.5),
                     "bytes_recv": 0})
        rows.append({"time": t, "interface": "s1-eth4", "bytes_sent": 10_000 * (t - 9.5),
                     "bytes_recv": 0})
    # h2's counter is sampled at the transfer's edges: 1,000 B in each iteration,
    # 1,000,000 B in the gap.
    for t, v in ((10.0, 0), (11.2, 1_000), (11.4, 1_001_000), (12.5, 1_002_000)):
        rows.append({"time": t, "interface": "s1-eth2", "bytes_sent": v, "bytes_recv": 0})
    return rows


def cpu_rows(switch_wait_per_s: float):
    """Two cores: per second 0.5 s user, 0.2 s system, 0.9 s niced, 0.4 s idle (the
    cores are 35% busy without the niced work). The switch runs 0.7 s per second and
    waits ``switch_wait_per_s``; job 1's agent runs 0.3 s and waits 0.1 s; job 2's
    agent runs all the time."""
    machine, procs = [], []
    for t in TIMES:
        d = t - 9.5
        machine.append({"time": t, "user_s": 0.5 * d, "system_s": 0.2 * d, "nice_s": 0.9 * d,
                        "idle_s": 0.4 * d, "iowait_s": 0, "irq_s": 0, "softirq_s": 0,
                        "steal_s": 0})
        procs.append({"time": t, "process": "switch s1", "user_s": 0.6 * d,
                      "system_s": 0.1 * d, "wait_s": switch_wait_per_s * d})
        procs.append({"time": t, "process": "agent j1w0", "user_s": 0.3 * d, "system_s": 0,
                      "wait_s": 0.1 * d})
        procs.append({"time": t, "process": "agent j2w0", "user_s": 1.0 * d, "system_s": 0,
                      "wait_s": 0})
    return machine, procs


def series(switch_wait_per_s: float = 0.25):
    machine, procs = cpu_rows(switch_wait_per_s)
    return {"link": link_rows(), "cpu": machine, "proc": procs}


def judge(bw, switch_wait_per_s=0.25, rows=ROWS, data=None):
    meta = {"interfaces": INTERFACES,
            "processes": [{"name": "switch s1", "job": None},
                          {"name": "agent j1w0", "job": 1}, {"name": "agent j2w0", "job": 2}]}
    job = {"job_id": 1, "hosts": ["h1", "h2"]}
    return summary_fidelity(job, rows, data or series(switch_wait_per_s), RunConfig.flat(bw=bw),
                            meta)


def test_transfer_time_is_the_union_of_the_iterations():
    assert transfer_intervals(ROWS, 1) == [(10.0, 11.2), (11.4, 12.5)]
    assert transfer_intervals(ROWS, 3) == []


def test_a_link_at_96_percent_of_its_rate_binds_the_job():
    f = judge(bw=1.0)
    assert f["verdict"] == "network-bound"
    assert f["transfer_s"] == pytest.approx(2.3)
    b = f["busiest_direction"]
    # 120,000 B/s x 8 = 0.96 Mbit/s of 1 Mbit/s, whatever the intervals
    assert (b["interface"], b["direction"]) == ("s1-eth1", "from h1")
    assert b["bytes"] == pytest.approx(120_000 * 2.3, abs=1)
    assert b["utilisation"] == pytest.approx(0.96)
    assert f["link_load"] == pytest.approx(0.96)  # the bottleneck all the time
    assert f["bottleneck_time"] == {"s1-eth1 from h1": pytest.approx(1.0)}
    assert "96% of 1 Mbit/s" in f["reason"]


def test_cpu_figures_cover_only_the_jobs_processes_and_leave_niced_work_out():
    f = judge(bw=1.0)
    assert f["cores_busy"] == pytest.approx(0.35)  # (0.5 + 0.2) / 2.0
    assert set(f["processes"]) == {"switch s1", "agent j1w0"}  # not job 2's agent
    assert f["processes"]["switch s1"]["busy"] == pytest.approx(0.7)
    assert f["processes"]["switch s1"]["demand"] == pytest.approx(0.95)  # 0.7 + 0.25
    assert f["processes"]["agent j1w0"]["demand"] == pytest.approx(0.4)
    assert f["cpu_saturated"]


def test_a_link_well_below_its_rate_with_a_saturated_cpu_is_cpu_bound():
    f = judge(bw=2.0)  # 0.96 of 2 Mbit/s: 48%
    assert f["link_load"] == pytest.approx(0.48)
    assert f["verdict"] == "cpu-bound"


def test_between_the_thresholds_or_without_saturation_it_is_mixed():
    assert judge(bw=1.2)["verdict"] == "mixed"  # 80%, CPU saturated
    f = judge(bw=2.0, switch_wait_per_s=0.1)  # 48%, the switch demands 0.8: not saturated
    assert not f["cpu_saturated"] and f["verdict"] == "mixed"


def test_traffic_between_iterations_and_other_jobs_links_do_not_count():
    assert judge(bw=0.1)["busiest_direction"]["interface"] == "s1-eth1"  # not job 2's
    h2 = 2_000 * 8 / 2.3 / 1e6  # 1,000 B in each iteration, the gap's million left out
    every = link_load(link_rows(), INTERFACES, {"h1", "h2"}, [(10.0, 11.2), (11.4, 12.5)],
                      0.1)["directions"]
    named = {(d["interface"], d["direction"]): d["mbit_s"] for d in every}
    assert named[("s1-eth2", "to h2")] == pytest.approx(h2)
    assert named[("s1-eth4", "to s2")] == pytest.approx(0.08)  # switch links count
    assert not any(i == "s1-eth3" for i, _ in named)


def test_unshaped_links_are_cpu_bound_and_no_iteration_is_na():
    f = judge(bw=None)
    assert f["verdict"] == "cpu-bound" and f["link_rate_mbit"] is None
    assert f["link_load"] is None and "unshaped" in f["reason"]
    assert f["link_load_mbit_s"] == pytest.approx(0.96)
    assert "(the busiest carried 1.0 Mbit/s: " in f["reason"]  # no rate to be bound by
    assert "bottleneck" not in f["reason"]
    assert judge(bw=1.0, rows=[])["verdict"] == "n/a"
    empty = {"link": [], "cpu": [], "proc": []}
    assert judge(bw=1.0, data=empty)["verdict"] == "n/a"


def test_a_bottleneck_that_changes_direction_still_binds_the_job():
    """A parameter server's link: full towards the server in iteration 0 (gather),
    full from it in iteration 1 (scatter), idle otherwise. Each direction carries
    half of what the link could over the transfer time; the link bound the job all
    along: 125,000 B/s = 1 Mbit/s in each piece."""
    rows = []
    for t in TIMES:
        down = 125_000 * (min(max(t, 10.0), 11.2) - 10.0)
        up = 125_000 * (min(max(t, 11.4), 12.5) - 11.4)
        rows.append({"time": t, "interface": "s1-eth1", "bytes_sent": down,
                     "bytes_recv": up})
    for t in (11.2, 11.4):  # samples at the edges of the gap, as a tick could fall
        rows.append({"time": t, "interface": "s1-eth1",
                     "bytes_sent": 125_000 * 1.2, "bytes_recv": 0})
    machine, procs = cpu_rows(0.0)
    f = judge(bw=1.0, data={"link": sorted(rows, key=lambda r: r["time"]), "cpu": machine,
                            "proc": procs})
    assert f["busiest_direction"]["utilisation"] == pytest.approx(1.2 / 2.3)
    assert f["link_load"] == pytest.approx(1.0)
    assert f["bottleneck_time"] == {"s1-eth1 to h1": pytest.approx(1.2 / 2.3),
                                    "s1-eth1 from h1": pytest.approx(1.1 / 2.3)}
    assert f["verdict"] == "network-bound"


def test_a_burst_past_the_rate_counts_as_busy_not_more():
    """h1's link idles and bursts in turn, half a second each: it carries 1.3 times
    its rate while it bursts (a shaper lets a link that idled through faster for a
    moment). It was busy 0.5 + 0.3 + 0.5 s of the 2.3 s transfer, and a link is at
    most busy all the time: the load is 1.3 / 2.3, not 1.3 times that."""
    def carried(t):  # bytes by time t: 1.3 x 125,000 B/s in [10, 10.5), [11, 11.5), ...
        whole, part = divmod(t - 10.0, 1.0)
        return 1.3 * 125_000 * (0.5 * whole + min(part, 0.5)) if t > 10.0 else 0.0
    rows = [{"time": t, "interface": "s1-eth1", "bytes_sent": 0, "bytes_recv": carried(t)}
            for t in TIMES]
    machine, procs = cpu_rows(0.0)
    f = judge(bw=1.0, data={"link": rows, "cpu": machine, "proc": procs})
    assert f["busiest_direction"]["utilisation"] == pytest.approx(1.3 * 1.3 / 2.3)
    assert f["link_load"] == pytest.approx(1.3 / 2.3)
    assert f["link_load_mbit_s"] == pytest.approx(1.3 / 2.3)
    steady = [{"time": t, "interface": "s1-eth1", "bytes_sent": 0,
               "bytes_recv": 150_000 * (t - 9.5)} for t in TIMES]  # 1.2 Mbit/s on 1
    f = judge(bw=1.0, data={"link": steady, "cpu": machine, "proc": procs})
    assert f["link_load"] == pytest.approx(1.0)
    assert f["verdict"] == "network-bound"
    assert "100% of 1 Mbit/s" in f["reason"]


@pytest.mark.parametrize("share, saturated, expected", [
    (0.9, False, "network-bound"), (0.95, True, "network-bound"),
    (0.8999, True, "mixed"), (0.75, True, "mixed"), (0.7499, True, "cpu-bound"),
    (0.1, False, "mixed"), (None, False, "cpu-bound"), (None, True, "cpu-bound")])
def test_the_thresholds(share, saturated, expected):
    assert verdict(share, saturated) == expected


def test_the_run_verdict():
    assert overall(["network-bound", "network-bound"]) == "network-bound"
    assert overall(["network-bound", "cpu-bound"]) == "mixed"
    assert overall(["n/a", "cpu-bound"]) == "cpu-bound"
    assert overall(["n/a"]) == overall([]) == "n/a"


def test_job_fidelity_takes_only_the_processes_it_is_given():
    f = job_fidelity(1, {"h1", "h2"}, ROWS, series(), INTERFACES, 1.0, ["agent j2w0"])
    assert set(f["processes"]) == {"agent j2w0"} and f["cpu_saturated"]


READINGS = {
    "window_s": 4.0, "cores": 2,
    "processes": {"agent j1w0": {"component": "agents", "user_s": 1.0, "system_s": 0.2},
                  "agent j1w1": {"component": "agents", "user_s": 0.8, "system_s": 0.2},
                  "switch s1": {"component": "switches", "user_s": 0.5, "system_s": 0.5},
                  "agent j1w2": {"component": "agents", "user_s": None, "system_s": None}},
    "harness": {"user_s": 0.3, "system_s": 0.1},
    "machine": {"user": 3, "nice": 0, "system": 1, "idle": 4, "iowait": 0, "irq": 0.0,
                "softirq": 0.4, "steal": 0},
    "irq_time_apart": False,
}


def test_cpu_cost_per_component_and_per_million_elements():
    c = cpu_cost(READINGS, 2_000_000)
    agents, switches, harness = (c["components"][k] for k in ("agents", "switches", "harness"))
    assert (agents["total_s"], agents["processes"]) == (pytest.approx(2.2), 2)
    assert agents["s_per_melem"] == pytest.approx(1.1)  # 2.2 s / 2 Melem
    assert switches["s_per_melem"] == pytest.approx(0.5)
    assert harness["s_per_melem"] == pytest.approx(0.2)
    assert "ps" not in c["components"]
    assert c["kernel"]["s_per_melem"] == pytest.approx(0.2)
    # softirq time is inside the processes' system time on this kernel: not added again
    assert c["kernel"]["inside_process_system_time"] is True
    assert c["total_s"] == pytest.approx(3.6) and c["s_per_melem"] == pytest.approx(1.8)
    assert c["share_of_machine"] == pytest.approx(3.6 / 8)
    assert c["unread"] == ["agent j1w2"]
    apart = cpu_cost({**READINGS, "irq_time_apart": True}, 2_000_000)
    assert apart["total_s"] == pytest.approx(4.0)
    assert cpu_cost(None, 1) is None
    assert cpu_cost(READINGS, 0)["s_per_melem"] is None
    assert "cores_by_server" not in c  # a run on one machine: its cores


def test_cpu_cost_on_a_cluster_shares_over_every_servers_cores():
    """The capacity is the sum of the servers' cores; a server that did not say is
    listed, left out of the sum."""
    by_server = {"localhost": 2, "qb-b": 4, "qb-c": 8, "qb-d": None}
    c = cpu_cost({**READINGS, "cores_by_server": by_server}, 2_000_000)
    assert c["cores"] == 14 and c["cores_by_server"] == by_server
    assert c["share_of_machine"] == pytest.approx(3.6 / (4.0 * 14))
    assert c["total_s"] == pytest.approx(3.6)  # what was spent does not change
    assert "shared_kernel" not in c and "softirq_by_server" not in c["kernel"]


def test_cpu_cost_counts_a_kernel_once_and_every_kernels_softirq():
    """Servers that are containers of one machine share its kernel: its cores once;
    another machine's softirq time adds to this one's."""
    by_server = {"localhost": 2, "qb-b": 2, "qb-c": 4}
    other = {**READINGS["machine"], "softirq": 0.6}
    c = cpu_cost({**READINGS, "cores_by_server": by_server, "shared_kernel": {"qb-b": "localhost"},
                  "machine_by_server": {"qb-c": other}}, 2_000_000)
    assert c["cores"] == 6 and c["shared_kernel"] == {"qb-b": "localhost"}
    assert c["kernel"]["softirq_s"] == pytest.approx(1.0)
    assert c["kernel"]["softirq_by_server"] == {"localhost": 0.4, "qb-c": 0.6}
    assert "2 machines" in c["kernel"]["scope"]
    assert c["total_s"] == pytest.approx(3.6)  # inside the processes' system time here


BURN = """
import sys, time
sys.stdin.readline()  # burns once the ledger has begun
start = time.process_time()
while time.process_time() - start < 0.2:
    pass
"""


def test_the_ledger_reads_an_exited_process_before_it_is_reaped():
    """A child that burns 0.2 s of CPU and exits: the ledger's reading, taken at its
    exit through waitid(WNOWAIT), has all of it; then the child is reaped."""
    ledger = CpuLedger()
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE)
    ledger.watch("burner", "agents", child.pid)
    ledger.begin()
    child.stdin.write(b"go\n")
    child.stdin.close()
    while ledger.poll(child) is None:
        threading.Event().wait(0.02)
    assert child.returncode == 0
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped
    ledger.end()
    got = ledger.readings()["processes"]["burner"]
    assert got["user_s"] + got["system_s"] >= 0.19  # tick granularity of /proc


def test_the_wait_clock_keeps_what_exited_threads_waited():
    clock = SchedClock(os.getpid())
    before = clock.wait_s()
    t = threading.Thread(target=lambda: sum(range(200_000)))
    t.start()
    t.join()
    assert clock.wait_s() >= before


def test_the_cpu_limit_says_why_it_cannot_work(tmp_path, monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    assert "cgroup v2 only" in cpulimit.limit_problem(tmp_path)
    (tmp_path / "cgroup.controllers").unlink()
    assert "cpu.cfs_quota_us is missing" in cpulimit.limit_problem(tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no cgroup-tools on it
    assert "apt-get install cgroup-tools" in cpulimit.limit_problem(tmp_path)


def test_a_switch_that_shed_lost_or_dropped_long_frames_is_reported():
    ports = {"s1": {"s1-eth1": {"rx": 90, "shed": 5, "rx_dropped": 2},
                    "s1-eth2": {"rx": 80, "shed": 1, "rx_dropped": 0}},
             "s2": {"s2-eth1": {"rx": 70, "shed": 0, "rx_dropped": 0}}}
    ports["s2"]["s2-eth2"] = {"rx": 5, "rx_oversize": 3}
    v = validity([], [], None, None, ports)
    assert v["switch_overload"] == {"s1": {"shed": 6, "rx_dropped": 2},
                                    "s2": {"shed": 0, "rx_dropped": 0}}
    assert [w for w in v["warnings"] if "could not keep up" in w] == [
        "switch s1 could not keep up at times: it shed 6 frames and the kernel dropped 2 "
        "from its full receive rings (the switch, not the links, limited the run then)"]
    assert [w for w in v["warnings"] if "longer" in w] == [
        "switch s2 dropped 3 frames longer than its ports take: a link's MTU is above what "
        "the embedded switch forwards (its log says how long)"]
    assert validity([], [], None, None, None)["switch_overload"] == {}


def test_a_sampler_held_up_across_the_transfers_end_gives_no_verdict():
    """Link samples 11.0 s, then 14.0 s: the transfer's later edges (11.2, 11.4, 12.5)
    fall in the gap, what the links carried either side of them is unknown, so the
    job is not judged; a gap as long inside an iteration is interpolated and judged."""
    def without(lo, hi):
        data = series()
        data["link"] = [r for r in data["link"] if not lo < r["time"] < hi]
        return data
    held_data = without(11.0, 14.0)  # and the last samples' counts taken at 14.0 s
    held_data["link"] += [{**r, "time": 14.0} for r in link_rows() if r["time"] == 13.0]
    held = judge(bw=1.0, data=held_data)
    assert held["verdict"] == "n/a"
    assert "no link sample for 3.0 s around a start or end of the transfer" in held["reason"]
    inside = judge(bw=1.0, data=without(10.0, 11.1))  # 10.0 .. 11.2: 10.5 and 11.0 gone
    assert inside["verdict"] == "network-bound"
    ended = judge(bw=1.0, data=without(11.0, 99.0))  # the sampler's last sample at 11.0
    assert ended["verdict"] == "n/a" and "no link sample for 1.5 s" in ended["reason"]
    # unshaped links bind nothing whatever the samples: cpu-bound, and warned of
    assert judge(bw=None, data=held_data)["verdict"] == "cpu-bound"


def test_slot_sampling_with_a_long_gap_is_warned_of():
    from qaina_bench.harness.results.summary import sampling_warnings
    slots = {"interval_target_s": 0.01, "interval_max_s": 0.02}
    assert sampling_warnings(slots) == []
    assert sampling_warnings({"source": "not applicable: no in-network aggregation"}) == []
    said = sampling_warnings(slots | {"interval_max_s": 15.2})
    assert said and "unsampled for 15.2 s at a time" in said[0]


def test_the_samplers_busy_cores_leave_niced_work_out_as_the_verdict_does():
    from collections import namedtuple
    from qaina_bench.harness.running.sampling import busy_percent
    times = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest")
    cores = [times(10, 80, 5, 5, 0, 0, 0, 0, 0),  # a niced build on core 0
             times(50, 0, 20, 10, 10, 4, 5, 1, 0)]
    assert busy_percent(cores) == [15, 80]
