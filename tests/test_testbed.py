"""Real Mininet runs as root: the aggregates every worker receives are exactly the sum
of all workers' quantized traces, also over lossy links; results are consistent;
Ctrl-C and crashes leave nothing behind."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.jobs import aggregator_ip, aggregator_mac
from qaina_bench.harness.run import Run
from qaina_bench.harness.targets import bmv2_missing
from qaina_bench.hosts.gradiveq import LayeredGradiVeQ
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.hosts.traces import open_trace

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]


@pytest.fixture(params=["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def target(request):
    """The switch target of a run: every run below that takes it runs on both."""
    if request.param == "bmv2" and bmv2_missing():
        pytest.skip(f"BMv2 target: {bmv2_missing()}")
    return request.param


def execute(tmp_path, **kw):
    cfg = RunConfig.flat(results_dir=str(tmp_path), record_levels=True, **kw)
    run = Run(cfg, echo=lambda *a, **k: None)
    summary = run.execute()
    # Source validation never drops what the testbed's own hosts and switches send.
    assert summary["validity"]["forged_packets"] == {"spoofed_source": 0, "forged_result": 0}, \
        summary["drops"]
    return summary, run.dir


def final_counters(directory: Path, switch: str, job: int) -> dict:
    rows = [r for r in csv.DictReader(open(directory / "timeseries.csv"))
            if r["kind"] == "slots" and r["switch"] == switch and int(r["job"]) == job]
    return {k: int(v) for k, v in rows[-1].items()
            if k in ("slots_opened", "slots_closed", "agg_packets", "results_sent")}


def check_exact_aggregates(directory: Path, summary: dict):
    """Every worker got, for every chunk, the exact integer sum of all workers' levels."""
    for job in summary["jobs"]:
        npz = [np.load(directory / "agents" / f"j{job['job_id']}w{w}.npz")
               for w in range(job["workers"])]
        for i in range(summary["iterations"]):
            # the format of the iteration: GradiVeQ's exact ones are 32-bit
            bits = int(npz[0][f"bits_{i}"])
            fmt = LaneFormat(bits, job["workers"], summary.get("packed", True) or bits == 32)
            levels = np.stack([z[f"levels_{i}"].astype(np.int64) for z in npz])
            total = (2 * levels - 1).sum(axis=0) if fmt.bits == 1 else levels.sum(axis=0)
            scale = npz[0][f"scale_{i}"]
            words = summary.get("payload_words", 32)
            expected = scaled_sum(total, scale, fmt, words * fmt.lanes,
                                  summary["config"]["compression"]["quantizer"])
            for w, z in enumerate(npz):
                assert np.array_equal(z[f"sums_{i}"], total), \
                    f"job {job['job_id']} worker {w} iteration {i}: level sums differ"
                assert np.array_equal(z[f"scale_{i}"], scale), "scales not agreed"
                np.testing.assert_allclose(z[f"aggregate_{i}"], expected, rtol=3e-7, atol=0)


def scaled_sum(total, codes, fmt: LaneFormat, chunk: int, quantizer: str) -> np.ndarray:
    """The summed gradient as hosts/quantize.py defines it, computed here in float64:
    ``sum * 2**(code / steps) / L`` per chunk (b = 1: ``(2s - n) * 2**code``)."""
    steps = 4 if quantizer == "maxfine" else 1
    scale = np.repeat(np.exp2(codes.astype(np.float64) / steps), chunk)[:len(total)]
    return total * scale / (1 if fmt.bits == 1 else fmt.levels)


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
    for job in summary["jobs"]:
        assert job["wait_s"] < 0.5 and job["left_s"] is not None
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
    assert sampling["interval_target_s"] <= sampling["interval_median_s"] < 1.0
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
    chunks = -(-job["elements_per_iteration"] // (32 * job["lanes"]))
    c = final_counters(directory, "s1", job["job_id"])
    assert c["slots_closed"] == c["slots_opened"] == min(16, chunks) + 3 * chunks
    assert c["agg_packets"] == 4 * c["slots_closed"]  # no contribution applied twice
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "qaina_loss" not in tables  # loss rules (where netem is missing) are removed


def test_slow_lossless_links_need_no_retransmission(tmp_path):
    """0.3 Mbit/s links queue a whole window: the RTO follows the queueing delay,
    nothing is resent, and the run takes what the links need for its bytes."""
    from qaina_bench.harness.bench import link_bound_time
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


FORGER = """
import socket, struct, sys, time
from qaina_bench.p4.header import QAINA_STRUCT, QAINA_UDP_PORT, QAINA_WORDS
target, job, worker, flags = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
junk = struct.pack("!%dI" % QAINA_WORDS, *([0x5A5A5A5A] * QAINA_WORDS))
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    try:
        for seq in range(400):
            s.sendto(QAINA_STRUCT.pack(job, worker, flags, 0, 0, 0, seq) + junk,
                     (target, QAINA_UDP_PORT))
    except OSError:  # the run ended first and took the host's network with it
        break
    time.sleep(0.01)
"""

#: Raw frames from a host: RESULTs for job 1's worker 0 with the aggregator's address
#: and port (and, one in 50, with the host's own address), every sequence number in
#: turn, until the host's interface is gone; after every batch it writes to a file
#: how many of each it sent, and when it sent the first and the last.
FRAME_FORGER = """
import os, socket, struct, sys, time
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from qaina_bench.p4.header import FLAG_RESULT, QAINA_AT, QAINA_UDP_PORT, scapy_layer
iface, dst_mac, dst_ip, agg_mac, agg_ip, own_ip, words, report = sys.argv[1:9]
QAINA = scapy_layer()

def frame(src):
    return bytearray(bytes(Ether(src=agg_mac, dst=dst_mac) / IP(src=src, dst=dst_ip)
                           / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT, chksum=0)
                           / QAINA(job_id=1, worker=0, flags=FLAG_RESULT, exp=3,
                                   words=[0x5A5A5A5A] * int(words))))

spoofed, own = frame(agg_ip), frame(own_ip)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
sent, seq, first, end = [0, 0], 0, time.time(), time.monotonic() + 120
while time.monotonic() < end:
    try:
        for _ in range(50):
            struct.pack_into("!I", spoofed, QAINA_AT["seq"], seq % 400)
            s.send(spoofed)
            sent[0] += 1
            seq += 1
        struct.pack_into("!I", own, QAINA_AT["seq"], seq % 400)
        s.send(own)
        sent[1] += 1
    except OSError:  # the run ended and took the host's network with it
        break
    with open(report + ".tmp", "w") as f:
        f.write(f"{sent[0]} {sent[1]} {first} {time.time()}")
    os.replace(report + ".tmp", report)
    time.sleep(0.01)
"""


def run_with(cfg: RunConfig, host: str, command, event="agents_go") -> tuple[dict, Run, object]:
    """Run ``cfg``; at ``event`` of the run, host ``host`` starts ``command(run)``
    (argv). Returns the summary, the run and the process started."""
    import threading
    run = Run(cfg, echo=lambda *a, **k: None)
    started = []

    def start():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and event not in run.events:
            time.sleep(0.05)
        started.append(run.testbed.host(host).popen(command(run), stdout=subprocess.PIPE,
                                                    text=True))

    thread = threading.Thread(target=start)
    thread.start()
    summary = run.execute()
    thread.join()
    assert started, "the agents never went"
    return summary, run, started[0]


def test_datagrams_from_another_host_are_refused_and_reported(tmp_path):
    """Job 2's host floods job 1's worker with QAINA datagrams for every sequence
    number (not results: the switch routes them); the worker takes results only from
    its aggregator, stays exact, and the run says packets were refused."""
    from qaina_bench.p4.header import FLAG_RETX
    cfg = RunConfig.flat(results_dir=str(tmp_path), record_levels=True, topo="star", jobs=2,
                    workers=2, bits=[8], iterations=6, bw=1)
    summary, run, forger = run_with(cfg, "h3", lambda run: [
        sys.executable, "-c", FORGER, run.testbed.host("h1").IP(), "1", "0", "3",
        str(FLAG_RETX)])
    assert forger.wait(30) == 0
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(run.dir, summary)
    job1 = summary["jobs"][0]
    assert job1["rel_error_max"] < 0.1
    assert job1["refused"] > 0 and summary["validity"]["refused_packets"] == job1["refused"]
    assert any("refused" in w for w in summary["validity"]["warnings"])


def test_forged_aggregates_are_dropped_by_the_switch(tmp_path, target):
    """The attack of a tenant on another: during the run, job 2's host h3 sends job 1's
    worker h1 RESULT frames with the aggregator's address and port (which h1's agent
    would take), and some with its own address. The switch drops all of them at h3's
    port (spoofed_source, forged_result); job 1's sums stay exact and nothing forged
    reaches h1."""
    cfg = RunConfig.flat(results_dir=str(tmp_path / "run"), record_levels=True, target=target,
                    topo="star", jobs=2, workers=2, bits=[4], bw=1)
    report = tmp_path / "forger.txt"

    def command(run):
        h1, h3 = run.testbed.host("h1"), run.testbed.host("h3")
        return [sys.executable, "-c", FRAME_FORGER, h3.defaultIntf().name, h1.MAC(), h1.IP(),
                aggregator_mac(1), aggregator_ip(1), h3.IP(), str(cfg.network.payload_words),
                str(report)]

    # From the moment the switch is programmed, so that it sends while the agents run.
    summary, run, forger = run_with(cfg, "h3", command, event="programmed")
    forger.wait(30)
    assert report.exists(), forger.stderr.read()
    spoofed, own, first, last = (float(x) for x in report.read_text().split())
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(run.dir, summary)
    rows = [r for r in csv.DictReader(open(run.dir / "iterations.csv")) if r["job"] == "1"]
    assert first < max(float(r["end"]) for r in rows) and last > run.events["agents_go"]
    drops = summary["drops"]["s1"]
    # The host's link (1 Mbit/s) drops what it cannot carry; every frame that reached
    # the switch was dropped there, under its reason.
    assert 0 < drops["spoofed_source"] <= spoofed and 0 < drops["forged_result"] <= own
    assert summary["jobs"][0]["refused"] == 0  # nothing forged reached h1
    assert summary["validity"]["forged_packets"] == {
        "spoofed_source": drops["spoofed_source"], "forged_result": drops["forged_result"]}
    assert any("spoofed_source" in w for w in summary["validity"]["warnings"])


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


def test_leafspine_ports_admit_the_sources_their_routes_bring(tmp_path):
    """On a leaf-spine (h1, h3 on lf1; h2, h4 on lf2; sp1 aggregates), every switch port
    is guarded: a host port admits its host, a spine's port towards a leaf the hosts
    below that leaf, a leaf's uplinks the hosts below the other leaf between them,
    and only a leaf's uplink to sp1 admits sp1's results."""
    from qaina_bench.harness.jobs import Job, ip_to_int
    from qaina_bench.harness.network import Testbed
    from qaina_bench.harness.record import RunRecord
    from qaina_bench.topologies.leafspine import LeafSpineTopo
    bed = Testbed(LeafSpineTopo(hosts=4, spines=2, leaves=2), "embedded", tmp_path,
                  RunRecord("srcval-leafspine", tmp_path))
    try:
        bed.start()
        hosts = ["h1", "h2", "h3", "h4"]
        job = Job(1, 0, LaneFormat(4, 4), 0, 8,
                  [bed.worker(k, h, "sp1") for k, h in enumerate(hosts)])
        bed.program_aggregators(["sp1"])
        bed.install_job(bed.placements(job, "sp1"))
        ip = {h: ip_to_int(bed.host(h).IP()) for h in hosts}
        agg = ip_to_int(aggregator_ip(bed.device_ids["sp1"]))

        def port(sw, peer):
            a, b = bed.net.get(sw), bed.net.get(peer)
            return a.ports[a.connectionsTo(b)[0][0]]

        def admitted(sw):
            """port -> {source: results} of the switch's source_guard."""
            out = {}
            for e in bed.conns[sw].read_table("MyIngress.source_guard"):
                key = [int.from_bytes(m.exact.value, "big") for m in e.match]
                results = int.from_bytes(e.action.action.params[0].value, "big")
                out.setdefault(key[0], {})[key[1]] = results
            return out

        below = {"lf1": ["h1", "h3"], "lf2": ["h2", "h4"]}
        for sw in ("sp1", "sp2", "lf1", "lf2"):
            guarded = {int.from_bytes(e.match[0].exact.value, "big")
                       for e in bed.conns[sw].read_table("MyIngress.port_guard")}
            node = bed.net.get(sw)
            assert guarded == {node.ports[i] for i in node.intfList() if i.name != "lo"}
        for leaf, other in (("lf1", "lf2"), ("lf2", "lf1")):
            got = admitted(leaf)
            for h in below[leaf]:
                assert got[port(leaf, h)] == {ip[h]: 0}
            up1, up2 = got.get(port(leaf, "sp1"), {}), got.get(port(leaf, "sp2"), {})
            assert up1.pop(agg) == 1 and agg not in up2
            assert set(up1) | set(up2) == {ip[h] for h in below[other]}
            assert not any(up1.values()) and not any(up2.values())
            for spine in ("sp1", "sp2"):
                assert set(admitted(spine).get(port(spine, leaf), {})) <= {
                    ip[h] for h in below[leaf]}
            assert set(admitted("sp1")[port("sp1", leaf)]) == {ip[h] for h in below[leaf]}
    finally:
        bed.stop()
