"""Real Mininet runs as root: the aggregates every worker receives are exactly the sum
of all workers' quantized traces, also over lossy links; results are consistent;
Ctrl-C and crashes leave nothing behind."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess

import numpy as np
import psutil
import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.results.tables import loss_line
from qaina_bench.harness.running.run import Run
from qaina_bench.hosts.gradiveq import LayeredGradiVeQ
from qaina_bench.hosts.traces import open_trace
# target is the suites' fixture
from testbed_lab import check_exact_aggregates, execute, final_counters, target

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]


@pytest.mark.smoke
def test_star_four_workers_get_exact_aggregates(tmp_path, target):
    summary, directory = execute(tmp_path, target=target, topo="star", jobs=1, workers=4,
                                 bits=[4], iterations=3)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    assert job["iterations_done"] == 3
    for name in ("config.yaml", "iterations.csv", "timeseries.csv", "summary.json",
                 "slots.png", "iterations.png", "logs/s1.log", "logs/agent-j1w0.log",
                 "logs/mininet.log"):
        assert (directory / name).exists(), name
    if target == "embedded":  # the switch's port counters, written when it stopped
        ports = summary["switch_ports"]["s1"]
        assert sum(p["rx"] for p in ports.values()) >= job["workers"] * 3
        for p in ports.values():  # frames per read and per transmit call, at least 1
            assert 0 < p["rx_reads"] <= p["rx"] and 0 < p["tx_calls"] <= p["tx"], p
        # (a busy machine may stall the switch into shedding: counted, never a wrong sum)
        assert set(summary["validity"]["switch_overload"]["s1"]) == {"shed", "rx_dropped"}
    else:
        assert summary["switch_ports"] is None
    requests = (directory / "logs" / "p4runtime-s1.log").read_text()
    assert "> SetForwardingPipelineConfig" in requests and "ERROR" not in requests
    if target == "bmv2":  # the compiled program is logged as its size
        assert re.search(r'p4_device_config: "<\d+ bytes>"', requests)
    assert requests.count("table_id: 33554436") == 4  # member_table: the 4 workers


def test_a_job_arriving_at_a_full_pool_waits_and_reuses_a_left_jobs_slots_exactly(
        tmp_path, target):
    """Three jobs arrive together on a pool that holds two: the third is admitted when
    one leaves, on that job's slots (whose copies it must not take for its own), exact."""
    summary, directory = execute(tmp_path, target=target, topo="star", jobs=3, workers=2,
                                 bits=[4, 8, 4], iterations=2, slots=16, pool_slots=32,
                                 arrivals="0,0,0")
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    first, second, third = summary["jobs"]
    assert {first["slot_base"], second["slot_base"]} == {0, 16}
    gone = min((first, second), key=lambda j: j["left_s"])
    assert third["slot_base"] == gone["slot_base"]
    assert third["admitted_s"] >= gone["left_s"] and third["wait_s"] > 0
    assert third["turnaround_s"] > third["job_completion_s"]
    for job in summary["jobs"]:
        assert job["iterations_done"] == 2 and job["arrival_s"] == 0


def test_shared_pool_collisions_fall_back_to_a_host_and_every_sum_stays_exact(
        tmp_path, target):
    """Three jobs hash their chunks onto one pool of 16 slots (32 copies) with 16 chunks
    each in flight: many chunks collide and are summed on their job's fallback host, the
    rest in the switch; every worker gets every sum exactly, on lossy links too."""
    summary, directory = execute(tmp_path, target=target, topo="leafspine", jobs=3,
                                 workers=3, bits=[4, 8, 32], iterations=2, slots=16,
                                 pool_slots=16, allocation="shared", loss=1, seed=5)
    assert summary["complete"], summary["errors"]
    assert summary["allocation"] == "shared"
    check_exact_aggregates(directory, summary)
    spine = summary["aggregator"]
    for job in summary["jobs"]:
        fb = job["fallback"]
        assert fb["refused"] == 0
        # chunks summed in the switch and on the host: both, and all of them
        assert 0 < job["switch_share"] < 1, fb
        chunks = -(-job["values_per_iteration_mean"] // (32 * job["lanes"]))
        assert fb["chunks_switch"] + fb["chunks_hosts"] + fb["chunks_split"] >= 2 * chunks
        assert final_counters(directory, spine, job["job_id"])["slots_closed"] \
            >= fb["chunks_switch"]
    assert "fallback" in {p["component"] for p in summary["processes"]}


def test_shared_jobs_arriving_over_time_are_admitted_at_once_and_stay_exact(
        tmp_path, target):
    """Under the shared policy jobs hold no slots of their own: each is admitted when it
    arrives; a job that leaves has its copies freed (over P4Runtime on the embedded
    switch, Thrift on BMv2) while the others go on."""
    summary, directory = execute(tmp_path, target=target, topo="star", jobs=3, workers=2,
                                 bits=[4, 8, 4], iterations=2, slots=16, pool_slots=8,
                                 allocation="shared", arrivals="0,0.2,0.4")
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    for job in summary["jobs"]:  # no wait for slots (a busy machine's loop is late)
        assert job["wait_s"] < 5 and job["left_s"] is not None
        assert job["fallback"]["chunks_hosts"] > 0  # 8 slots, 16 chunks in flight each


def test_shared_pool_without_collisions_aggregates_every_chunk_in_the_switch(tmp_path):
    """One job alone on a large shared pool: the switch sums every chunk and the
    fallback host only releases the copies."""
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[4],
                                 iterations=2, slots=8, allocation="shared")
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    assert job["switch_share"] > 0.97, job["fallback"]


def test_two_levels_on_lossy_links_stay_exact(tmp_path, target):
    """Leaves sum their workers, the spine sums the leaves: every chunk exact although
    contributions, partial sums and results are lost on the way."""
    summary, directory = execute(tmp_path, target=target, topo="leafspine", jobs=2,
                                 workers=4, bits=[4, 8], iterations=2, levels=2, loss=3,
                                 slots=16, seed=3)
    assert summary["complete"], summary["errors"]
    assert summary["levels"] == 2
    check_exact_aggregates(directory, summary)
    assert sum(j["retransmissions"] for j in summary["jobs"]) > 0  # losses were recovered
    logs = (directory / "logs" / "p4runtime-lf1.log").read_text()
    assert "upstream_table" in logs or "33554440" in logs  # lf1 aggregates below sp1


def test_two_levels_halve_the_bytes_between_leaves_and_spine(tmp_path):
    """Two workers of each job under each leaf: one sum per leaf and chunk crosses a
    leaf-spine link instead of two contributions (and one result instead of two)."""
    crossed = {}
    for levels in (1, 2):
        summary, directory = execute(tmp_path / str(levels), topo="leafspine", jobs=1,
                                     workers=4, bits=[4], iterations=2, levels=levels, bw=8)
        assert summary["complete"], summary["errors"]
        check_exact_aggregates(directory, summary)
        tiers = summary["tier_bytes"]
        crossed[levels] = tiers["switch_links"] / tiers["host_links"]
    # One level: every contribution and result crosses a host link and a leaf-spine link.
    assert 0.85 < crossed[1] < 1.15 and 0.4 < crossed[2] < 0.6, crossed


def test_dumbbell_aggregates_across_the_bottleneck_and_reruns_from_its_config(tmp_path, target):
    summary, directory = execute(tmp_path, target=target, topo="dumbbell", jobs=1, workers=4,
                                 bits=[1], iterations=2)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)  # b = 1: sign lanes
    links = summary["link_bytes"]
    assert links["s1-eth3"]["bytes_sent"] > 0 and links["s2-eth3"]["bytes_sent"] > 0
    again = RunConfig.from_yaml(directory / "config.yaml")
    again.output.run_id = "again"
    rerun = Run(again, echo=lambda *a, **k: None).execute()
    want = {**summary["config"], "output": {**summary["config"]["output"], "run_id": "again"}}
    assert rerun["complete"] and rerun["config"] == want


def test_leafspine_two_jobs_exact_and_slot_usage(tmp_path, target):
    # Links of 1 Mbit/s keep each job busy long enough for the 50 ms switch samples.
    summary, directory = execute(tmp_path, target=target, topo="leafspine", jobs=2, workers=4,
                                 bits=[4, 32], iterations=3, slots=16, bw=1)
    assert summary["complete"], summary["errors"]
    assert summary["aggregator"] == "sp1"
    check_exact_aggregates(directory, summary)
    b4, b32 = summary["jobs"]
    assert b32["rel_error_max"] < 1e-5  # fixed point: exact up to rounding
    for job in summary["jobs"]:
        assert 0 < job["slots_peak"] <= 16
        # A time series, not a couple of points (fewer on a busy machine, where the
        # sampler's reads are late: the intervals achieved are in slot_sampling).
        assert job["slot_samples"] >= 5
    sampling = summary["slot_sampling"]
    assert "P4Runtime counter reads of sp1" in sampling["source"]
    # The reads keep a fixed schedule: a late read shortens the next gap, so the median
    # may sit a little under the target, never far under it.
    assert 0.9 * sampling["interval_target_s"] <= sampling["interval_median_s"] < 1.0
    assert summary["validity"]["cpu"]["cores"] == psutil.cpu_count()
    # b = 4 packs five elements per register where b = 32 packs one.
    assert (b4["elements_per_register"], b32["elements_per_register"]) == (5, 1)
    elements = b4["elements_per_iteration"]
    chunks4, chunks32 = -(-elements // 160), -(-elements // 32)
    for job, chunks in ((b4, chunks4), (b32, chunks32)):
        c = final_counters(directory, "sp1", job["job_id"])
        warmup = min(16, chunks)
        assert c["slots_closed"] == c["slots_opened"] == warmup + 3 * chunks


def test_lossy_links_still_aggregate_every_chunk_exactly_once(tmp_path, target):
    summary, directory = execute(tmp_path, target=target, topo="star", jobs=1, workers=4,
                                 bits=[8], iterations=3, loss=1.0, slots=16)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    assert job["retransmissions"] > 0  # 1% loss on every link did hit the run
    check_link_loss(summary, 1.0)
    chunks = -(-job["elements_per_iteration"] // (32 * job["lanes"]))
    c = final_counters(directory, "s1", job["job_id"])
    assert c["slots_closed"] == c["slots_opened"] == min(16, chunks) + 3 * chunks
    assert c["agg_packets"] == 4 * c["slots_closed"]  # no contribution applied twice
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "qaina_loss" not in tables  # loss rules (where netem is missing) are removed


def test_slow_lossless_links_need_no_retransmission(tmp_path):
    """0.3 Mbit/s links queue a whole window: the RTO follows the queueing delay,
    nothing is resent, and the run takes what the links need for its bytes."""
    from qaina_bench.harness.benchmarks.testbedbench import link_bound_time
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[32],
                                 iterations=2, bw=0.3)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    assert job["retransmissions"] == 0 and job["timeouts"] == 0
    assert summary["validity"]["retransmission_share"] == 0
    assert 0.85 < summary["span_s"] / link_bound_time(summary) < 1.15


def test_gradiveq_aggregates_coefficients_exactly(tmp_path, target):
    """Exact 32-bit iterations fit (0) and refresh (3) the per-layer bases; the others
    send coefficients and small layers at 8 bits, which the switch sums exactly."""
    summary, directory = execute(tmp_path, target=target, topo="star", jobs=1, workers=4,
                                 bits=[8], iterations=5, compress="gradiveq", gvq_d=64,
                                 gvq_k=16, gvq_refresh=2)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)  # the switch summed coefficients exactly
    trace = open_trace("digits-mlp")
    compressed_size = LayeredGradiVeQ([(x.name, x.size) for x in trace.layers], 64,
                                      16).compressed_size()
    # The error of each iteration, recomputed: bases fitted to the exact aggregates
    # every worker received (0, 3), compressed sums expanded with them, against the
    # trace's exact sum.
    z = np.load(directory / "agents" / "j1w0.npz")
    bases = LayeredGradiVeQ([(x.name, x.size) for x in trace.layers], 64, 16)
    errors = {}
    for i in range(5):
        got = z[f"aggregate_{i}"]
        if i in (0, 3):
            bases.fit([got])
        else:
            got = bases.decompress(got)
        exact = trace.exact_sum(i, workers=range(4))
        errors[i] = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    for r in rows:
        i = int(r["iteration"])
        exact = i in (0, 3)
        assert (r["compressed"] == "True") == (not exact)
        assert int(r["bits"]) == (32 if exact else 8)
        assert int(r["values"]) == (trace.elements if exact else compressed_size)
        assert float(r["rel_error"]) == pytest.approx(errors[i], rel=1e-3, abs=1e-7)
        if exact:
            assert float(r["rel_error"]) < 1e-5
        else:  # no sum of coefficients beats the projection onto the bases
            assert 0 < float(r["gvq_projection_error"]) <= float(r["rel_error"]) + 1e-6
            assert float(r["gvq_energy"]) > 0.5


def test_ring_all_reduce_baseline_is_exact_over_the_same_fabric(tmp_path):
    summary, directory = execute(tmp_path, topo="leafspine", jobs=1, workers=4, bits=[4],
                                 iterations=2, mode="ring")
    assert summary["complete"], summary["errors"]
    assert summary["mode"] == "ring"
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    # The switches only routed: slot figures do not apply (and are not printed as 0).
    assert job["slots_peak"] is None and job["register_bit_efficiency"] is None
    assert summary["slot_sampling"]["source"].startswith("not applicable")
    assert job["bytes_sent"] > 0 and job["clipped_elements"] == 0
    # Every worker moves 2 (n - 1) / n of the packed words, plus the exponents.
    words = 4 * 32 * -(-job["elements_per_iteration"] // 160)
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    assert all(int(r["bytes_sent"]) >= 2 * 3 / 4 * words for r in rows)


@pytest.mark.parametrize("mode", ["ring", "ps"])
def test_tcp_baselines_use_the_congestion_control_asked_whatever_the_machines(tmp_path, mode):
    """The TCP baselines' congestion control is the run's (--tcp-cc, cubic by default),
    set on their sockets, so it holds even where a network namespace may not default to
    it (outside net.ipv4.tcp_allowed_congestion_control); ``system`` keeps the
    machine's."""
    machine = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    asked = "cubic" if machine != "cubic" else "reno"
    for tcp_cc, expected in ((asked, asked), ("system", machine)):
        summary, directory = execute(tmp_path / tcp_cc, topo="star", jobs=1, workers=2,
                                     bits=[4], iterations=1, mode=mode, tcp_cc=tcp_cc)
        assert summary["complete"], summary["errors"]
        assert summary["jobs"][0]["tcp_congestion_control"] == expected, tcp_cc
        if mode == "ps":  # the server's side of the connections too
            log = (directory / "logs" / "ps1.log").read_text()
            assert f"(TCP congestion control {expected})" in log, log
    assert open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip() == machine
    assert RunConfig.flat().network.tcp_cc == "cubic"


def test_hosts_default_to_the_congestion_control_asked_or_the_run_says_why_not(tmp_path):
    """For a training script's TCP the hosts' default is set too (``host_tcp_cc``): reno
    always may be; an algorithm outside net.ipv4.tcp_allowed_congestion_control may not
    be a namespace's default, and the testbed says so instead of failing."""
    from qaina_bench.harness.running.network import Testbed
    from qaina_bench.harness.running.record import RunRecord
    from qaina_bench.topologies.star import StarTopo
    allowed = open("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read().split()
    offered = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    cases = [("reno", "reno")] + [(cc, None) for cc in offered if cc not in allowed][:1]
    for asked, becomes in cases:
        (tmp_path / asked).mkdir()
        bed = Testbed(StarTopo(hosts=2), "embedded", tmp_path / asked,
                      RunRecord(f"tcpcc-{asked}", tmp_path), host_tcp_cc=asked)
        try:
            bed.start()
            now = bed.host("h1").cmd("sysctl -n net.ipv4.tcp_congestion_control").strip()
            if becomes:
                assert now == becomes and bed.stack_refusals == []
            else:
                assert now != asked and len(bed.stack_refusals) == 1
                assert bed.stack_refusals[0].startswith(f"--tcp-cc {asked}: h1's default")
        finally:
            bed.stop()


@pytest.mark.parametrize("words", [64, 256])
def test_larger_payload_builds_aggregate_exactly(tmp_path, target, words, capfd):
    """A run on the 64- or 256-word build of qaina.p4: every chunk exact, and the
    packets are as long as the build's."""
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[4],
                                 iterations=2, payload_words=words, target=target, bw=200)
    assert summary["complete"], summary["errors"]
    assert summary["switch_program"]["payload_words"] == words
    # tc's warning at 200 Mbit/s went to the run's Mininet log, not to the terminal
    assert "sch_htb" not in capfd.readouterr().err
    assert "sch_htb" in (directory / "logs" / "mininet.log").read_text()
    check_exact_aggregates(directory, summary)
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    frame = 14 + 20 + 8 + 12 + 4 * words
    assert all(int(r["bytes_sent"]) == int(r["packets_sent"]) * frame for r in rows)
    elements = summary["jobs"][0]["elements_per_iteration"]
    assert all(int(r["packets_sent"]) >= -(-elements // (words * 5)) for r in rows)


def test_unpacked_baseline_spends_a_register_per_value(tmp_path):
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[8],
                                 iterations=2, pack=False)
    assert summary["complete"], summary["errors"]
    job = summary["jobs"][0]
    assert job["elements_per_register"] == 1 and summary["packed"] is False
    check_exact_aggregates(directory, summary)
    # 8 value bits in every 32-bit register (tail padding aside)
    assert 0.2 < job["register_bit_efficiency"] <= 0.25


def test_parameter_server_baseline_is_exact(tmp_path):
    summary, directory = execute(tmp_path, topo="leafspine", jobs=2, workers=2, bits=[4],
                                 iterations=2, mode="ps")
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    for job in summary["jobs"]:
        assert job["slots_peak"] is None
    logs = sorted(p.name for p in (directory / "logs").glob("ps*.log"))
    assert logs == ["ps1.log", "ps2.log"]
    for name in logs:  # each server reduced every iteration's scales and words, then ended
        text = (directory / "logs" / name).read_text()
        assert re.search(r"parameter server: ([4-9]|\d\d+) reductions for 2 workers", text), text


@pytest.mark.parametrize("mode", ["ring", "ps"])
def test_fp32_baselines_sum_the_float_gradients(tmp_path, mode):
    """--quantizer none: the hosts sum float32 gradients; the error is float rounding."""
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[32],
                                 iterations=2, mode=mode, quantizer="none")
    assert summary["complete"], summary["errors"]
    job = summary["jobs"][0]
    assert job["rel_error_max"] < 1e-6
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    fp32 = 4 * job["elements_per_iteration"]
    share = 2 * 3 / 4 if mode == "ring" else 1.0
    assert all(int(r["bytes_sent"]) >= share * fp32 for r in rows)


def test_tcp_baselines_see_the_link_loss(tmp_path):
    """Over lossy links the ring reports the kernel's TCP retransmissions and its sums
    stay exact (that the nftables rules' losses are wire losses for TCP is
    tests/test_linkloss.py)."""
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[4],
                                 iterations=3, mode="ring", loss=5.0)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    assert summary["jobs"][0]["retransmissions"] > 0
    check_link_loss(summary, 5.0)


def check_link_loss(summary: dict, percent: float):
    """The summary says how the loss was made and, for nftables rules, that they lost
    about ``percent`` % of what the links carried."""
    loss = summary["link_loss"]
    assert loss["percent"] == percent
    if loss["by"] == "netem":
        return
    assert loss["by"] == "nftables" and set(loss["interfaces"]) >= set(summary["interfaces"])
    assert loss["frames"] > 300 and 0 < loss["lost"] < loss["frames"]
    assert 100 * loss["lost_share"] < percent * 3
    # nor far below the rate (5 standard deviations: loss_warnings)
    assert not [w for w in summary["validity"]["warnings"] if "loss rules" in w]
    assert loss_line(summary).startswith(f"link loss {percent:g}% by nftables: ")


def test_closed_loop_training_learns_from_the_aggregates(tmp_path):
    """--train: the agents train the digits MLP from what the switch sums; the
    aggregates are exact in the integer domain, and the model learns."""
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=4, bits=[8],
                                 train=True, iterations=20, eval_every=10,
                                 target_accuracy=0.5)
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    assert job["rel_error_mean"] is None  # no trace: no exact sum to compare with
    curve = job["accuracy_curve"]
    assert [p["iteration"] for p in curve] == [10, 20]
    assert job["final_test_accuracy"] > 0.5 and job["iterations_to_target"] in (10, 20)
    assert summary["train"]["model"] == "mlp" and summary["trace"] is None
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    assert all(r["train_loss"] for r in rows)
    assert {r["worker"] for r in rows if r["test_accuracy"]} == {"0"}
