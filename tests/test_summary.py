"""Every figure of summary.json and sweep.csv from small tables worked out by hand,
without root: a job's summary, the run's validity warnings, the CPU-saturation rule
of runs without a fidelity verdict, and a sweep row with its steady-state means."""

from __future__ import annotations

import csv
import json

import pytest

from qaina_bench.harness.running.sampling import Sampler
from qaina_bench.harness.results.summary import job_summary, validity
from qaina_bench.harness.sweeping.sweepcsv import run_row, steady

JOB = {"job_id": 1, "index": 0, "bits": 4, "workers": 2, "lanes": 5, "payload_words": 32,
       "slots": 8}


def row(job, worker, iteration, start, end, **kw):
    out = {"job": job, "worker": worker, "iteration": iteration, "start": start, "end": end,
           "completion_s": end - start, "elements": 1000, "values": 1000, "rel_error": 0.1,
           "retransmissions": 0, "timeouts": 0, "refused": 0, "clipped": 0,
           "bytes_sent": 100, "bytes_received": 90, "packets_sent": 10}
    out.update(kw)
    return out


ROWS = [row(1, 0, 0, 10.0, 10.5, retransmissions=1, clipped=2),
        row(1, 1, 0, 10.1, 10.6),
        row(1, 0, 1, 10.6, 11.6, rel_error=0.3, retransmissions=2, timeouts=1),
        row(1, 1, 1, 10.6, 12.0, rel_error=0.3, refused=4),
        row(2, 0, 0, 0.0, 50.0, rel_error=9.0, retransmissions=100)]  # another job's
SAMPLES = [{"job": "1", "switch": "s1", "time": t, "slots_in_use": v}
           for t, v in ((9.0, 8), (10.5, 3), (11.0, 5), (11.5, 1), (12.5, 7))] + [
    {"job": "1", "switch": "s2", "time": 11.0, "slots_in_use": 9},  # not the aggregator
    {"job": "2", "switch": "s1", "time": 11.0, "slots_in_use": 9}]  # another job


def test_a_jobs_summary_worked_out_by_hand():
    s = job_summary(JOB, ROWS, SAMPLES, "s1", [{"start": 9.0, "end": 9.4, "refused": 1}])
    assert s["iterations_done"] == 2 and s["workers_reporting"] == 2
    assert s["job_completion_s"] == pytest.approx(2.0)  # 10.0 .. 12.0
    assert s["iteration_completion_mean_s"] == pytest.approx(0.85)  # (0.5+0.5+1.0+1.4)/4
    assert s["iteration_completion_p99_s"] == pytest.approx(1.388)  # 1.0 + 0.97 x 0.4
    assert s["warmup_s"] == pytest.approx(0.4)
    assert s["elements_aggregated"] == 2000 and s["elements_per_s"] == pytest.approx(1000)
    assert s["fp32_equivalent_gbps"] == pytest.approx(32e-6)
    assert (s["slots_peak"], s["slots_mean"], s["slot_samples"]) == (5.0, 3.0, 3)
    assert s["elements_per_register"] == 5
    assert s["register_bit_efficiency"] == pytest.approx(4000 / (7 * 32 * 32))  # 7 chunks
    assert s["rel_error_mean"] == pytest.approx(0.2) and s["rel_error_max"] == 0.3
    assert (s["retransmissions"], s["timeouts"], s["refused"]) == (3, 1, 5)
    assert (s["clipped_elements"], s["bytes_sent"], s["bytes_received"]) == (2, 400, 360)


def test_only_iterations_every_worker_finished_count():
    s = job_summary(JOB, ROWS + [row(1, 0, 2, 12.0, 13.0)], SAMPLES, "s1", [])
    assert s["iterations_done"] == 2 and s["elements_aggregated"] == 2000
    assert s["job_completion_s"] == pytest.approx(3.0)
    assert job_summary({**JOB, "job_id": 7}, ROWS, SAMPLES, "s1", [])["iterations_done"] == 0


def test_without_in_network_aggregation_there_are_no_slot_figures():
    s = job_summary(JOB, ROWS, SAMPLES, None, [])
    assert s["slots_peak"] is s["elements_per_register"] is s["register_bit_efficiency"] is None
    assert s["elements_per_s"] == pytest.approx(1000)


def test_arrivals_give_waiting_and_turnaround():
    job = {**JOB, "arrival_s": 1.0, "admitted_s": 3.5, "arrived_at": 9.0}
    s = job_summary(job, ROWS, SAMPLES, "s1", [])
    assert s["wait_s"] == pytest.approx(2.5) and s["turnaround_s"] == pytest.approx(3.0)


def test_a_clean_run_has_no_warnings():
    rows = [row(1, w, i, 0, 1) for w in range(2) for i in range(2)]
    v = validity(rows, [{"job_id": 1, "refused": 0, "slot_samples": 40, "iterations_done": 2}],
                 {"saturated": None}, {"s1": {"spoofed_source": 0}},
                 {"s1": {"1": {"shed": 0, "rx_dropped": 0}}})
    assert v["warnings"] == [] and v["retransmission_share"] == 0 == v["clipped_share"]
    assert v["forged_packets"] == {"spoofed_source": 0, "forged_result": 0}


def test_each_threat_to_the_figures_is_one_warning():
    rows = [row(1, 0, 0, 0, 1, packets_sent=150, retransmissions=3, values=800, clipped=1),
            row(1, 1, 0, 0, 1, packets_sent=50, retransmissions=1, values=200, clipped=1)]
    jobs = [{"job_id": 1, "refused": 3, "slot_samples": 3, "iterations_done": 1},
            {"job_id": 2, "refused": 0, "slot_samples": None, "iterations_done": 1}]
    v = validity(rows, jobs, {"saturated": "all cores 97% busy on average"},
                 {"s1": {"spoofed_source": 2, "retx_unknown": 5}, "s2": {"forged_result": 1}},
                 {"s1": {"1": {"shed": 5, "rx_dropped": 1}, "2": {"shed": 2, "rx_dropped": 0}}})
    assert v["retransmission_share"] == pytest.approx(0.02)  # 4 of 200
    assert v["clipped_share"] == pytest.approx(0.002)  # 2 of 1000
    assert v["refused_packets"] == 3
    assert v["forged_packets"] == {"spoofed_source": 2, "forged_result": 1}
    assert v["switch_overload"] == {"s1": {"shed": 7, "rx_dropped": 1}}
    said = "\n".join(v["warnings"])
    assert len(v["warnings"]) == 8, said
    for fragment in ("switch s1 could not keep up at times: it shed 7 frames and the kernel "
                     "dropped 1", "agents refused 3 datagrams",
                     "dropped 2 packets as spoofed_source (s1)",
                     "dropped 1 packets as forged_result (s2)",
                     "2.0% of the packets were retransmissions",
                     "0.20% of the values were clipped", "job(s) 1 ran for fewer than 20",
                     "CPU saturated during the run (all cores 97% busy on average)"):
        assert fragment in said


def test_a_fidelity_verdict_replaces_the_saturation_warning():
    jobs = [{"job_id": 1, "fidelity": {"verdict": "cpu-bound", "reason": "links idle"}}]
    v = validity([row(1, 0, 0, 0, 1)], jobs, {"saturated": "agent j1w0 used a whole core"})
    assert v["warnings"] == ["job 1 was cpu-bound, not network-bound (links idle): its "
                             "timings measure the machine as much as the network"]


# -- the saturation rule: all cores over 90% on average, or a process over 90% busy in
#    more than half of the samples; the first sample (before the agents ran) left out
def sampler(cores, busy) -> Sampler:
    s = Sampler(None, {}, None, [], [], {})
    s._cores, s._proc_busy = cores, busy
    return s


def test_all_cores_busy_on_average_is_saturation():
    cpu = sampler([[10, 10], [95, 97], [93, 99]], {}).cpu()
    assert cpu["cores"] == 2 and cpu["cores_busy_mean"] == pytest.approx(0.96)
    assert cpu["cores_busy_max"] == pytest.approx(0.99)
    assert cpu["saturated"] == "all cores 96% busy on average"


def test_the_first_sample_and_half_the_time_do_not_saturate():
    cpu = sampler([[100, 100], [10, 20], [30, 40]],
                  {"switch s1": [0.95, 0.95, 0.2], "agent j1w1": [0.0, 0.95, 0.95, 0.2, 0.2]}
                  ).cpu()
    assert cpu["cores_busy_mean"] == pytest.approx(0.25) and cpu["saturated"] is None
    assert cpu["process_busy_mean"]["switch s1"] == pytest.approx(0.575)


def test_a_process_busy_most_of_the_time_is_saturation():
    cpu = sampler([[0, 0], [50, 50]], {"agent j1w0": [0.2, 0.95, 0.95, 0.5],
                                       "switch s1": [0.95, 0.95, 0.2, 0.3]}).cpu()
    assert cpu["saturated"] == "agent j1w0 used a whole core"
    assert cpu["process_busy_mean"]["agent j1w0"] == pytest.approx(0.8)


# -- sweep.csv ------------------------------------------------------------------------
SUMMARY = {
    "status": "complete", "compress": "none", "span_s": 3.5,
    "jobs": [{"iteration_completion_mean_s": 0.2, "iteration_completion_p99_s": 0.5,
              "job_completion_s": 2.0, "elements_per_s": 100.0, "fp32_equivalent_gbps": 1e-6,
              "slots_peak": 4.0, "register_bit_efficiency": 0.5, "rel_error_mean": 0.1,
              "retransmissions": 2, "bytes_sent": 800, "workers": 2, "iterations_done": 4,
              "turnaround_s": 2.5, "wait_s": 0.5},
             {"iteration_completion_mean_s": 0.4, "iteration_completion_p99_s": 0.9,
              "job_completion_s": 3.0, "elements_per_s": 50.0, "fp32_equivalent_gbps": 2e-6,
              "slots_peak": 6.0, "register_bit_efficiency": 0.7, "rel_error_mean": 0.3,
              "retransmissions": 1, "bytes_sent": 600, "workers": 2, "iterations_done": 2,
              "turnaround_s": 4.5, "wait_s": 1.5}],
    "validity": {"cpu": {"saturated": "all cores 95% busy", "cores_busy_mean": 0.95},
                 "warnings": ["a", "b"]},
    "fidelity": {"verdict": "cpu-bound"}, "cpu_cost": {"s_per_melem": 12.5},
    "tier_bytes": {"switch_links": 4096, "host_links": 1},
}


def result_set(tmp_path, summary=SUMMARY, iterations=None):
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    if iterations is not None:
        with open(tmp_path / "iterations.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["job", "iteration", "compressed", "completion_s",
                                   "bytes_sent"])
            w.writeheader()
            w.writerows(iterations)
    return tmp_path


def test_a_sweep_row_averages_times_and_adds_rates_over_jobs(tmp_path):
    r = run_row(result_set(tmp_path))
    assert r["status"] == "complete"
    assert r["iteration_s"] == pytest.approx(0.3) and r["iteration_p99_s"] == 0.9
    assert r["job_completion_s"] == pytest.approx(2.5) and r["job_completion_max_s"] == 3.0
    assert r["elements_per_s"] == 150 and r["fp32_gbps"] == pytest.approx(3e-6)
    assert r["slots_peak"] == 10 and r["register_bit_efficiency"] == pytest.approx(0.6)
    assert r["rel_error"] == pytest.approx(0.2)
    assert (r["retransmissions"], r["bytes_sent"]) == (3, 1400)
    assert r["bytes_per_iteration"] == pytest.approx(125)  # 800 / (2 x 4) and 600 / (2 x 2)
    assert (r["cpu_saturated"], r["cpu_busy"], r["fidelity"]) == (1, 0.95, "cpu-bound")
    assert (r["warnings"], r["cpu_s_per_melem"], r["switch_link_bytes"]) == (2, 12.5, 4096)
    assert r["turnaround_s"] == pytest.approx(3.5) and r["turnaround_max_s"] == 4.5
    assert r["wait_s"] == pytest.approx(1.0) and r["span_s"] == 3.5
    assert r["steady_iteration_s"] is None  # no iterations.csv


def test_a_result_set_without_a_readable_summary_is_said_so(tmp_path):
    assert run_row(tmp_path) == {"status": "no summary"}
    (tmp_path / "summary.json").write_text("{half")
    assert run_row(tmp_path) == {"status": "no summary"}


ITERATIONS = [{"job": 1, "iteration": 0, "compressed": False, "completion_s": 1.0,
               "bytes_sent": 1000},
              {"job": 1, "iteration": 1, "compressed": True, "completion_s": 0.2,
               "bytes_sent": 100},
              {"job": 1, "iteration": 2, "compressed": True, "completion_s": 0.4,
               "bytes_sent": 300},
              {"job": 2, "iteration": 1, "compressed": True, "completion_s": 0.6,
               "bytes_sent": 500}]


def test_steady_means_take_the_schemes_iterations_per_job_then_over_jobs(tmp_path):
    directory = result_set(tmp_path, iterations=ITERATIONS)
    times, sent = steady(directory, compressed=True)
    assert times == pytest.approx((0.3 + 0.6) / 2) and sent == pytest.approx((200 + 500) / 2)
    times, sent = steady(directory, compressed=False)
    assert times == pytest.approx((1.6 / 3 + 0.6) / 2)
    assert sent == pytest.approx((1400 / 3 + 500) / 2)
    assert steady(tmp_path / "nothing", compressed=False) == (None, None)
    row_ = run_row(result_set(tmp_path, {**SUMMARY, "compress": "gradiveq"}, ITERATIONS))
    assert row_["steady_iteration_s"] == pytest.approx(0.45)
    assert row_["steady_bytes_per_iteration"] == pytest.approx(350)


def test_link_loss_sums_the_rules_counts_and_warns_when_they_did_not_act():
    from qaina_bench.harness.results.summary import loss_summary, loss_warnings
    ends = {"h1-eth0": {"frames": 900, "bytes": 900_000, "lost": 9, "lost_bytes": 9_000},
            "s1-eth1": {"frames": 100, "bytes": 100_000, "lost": 1, "lost_bytes": 2_000}}
    loss = loss_summary({"by": "nftables", "interfaces": ends}, 1.0)
    assert (loss["frames"], loss["lost"], loss["bytes"]) == (1000, 10, 1_000_000)
    assert loss["lost_share"] == pytest.approx(0.011)
    links = {"s1-eth1": {"bytes_sent": 100_000, "bytes_recv": 900_000}}
    assert loss_warnings(loss, links) == []
    # the hook saw nothing though the links carried frames: the links were lossless
    unseen = loss_summary({"by": "nftables", "interfaces": {
        k: dict.fromkeys(v, 0) for k, v in ends.items()}}, 1.0)
    assert "loss rules never saw (s1-eth1)" in loss_warnings(unseen, links)[0]
    assert loss_warnings(unseen, {}) == []  # nor did the links carry any
    # one switch interface's rule saw nothing of what it sent: that link only
    partly = loss_summary({"by": "nftables", "interfaces": {
        **ends, "s1-eth2": dict.fromkeys(ends["s1-eth1"], 0)}}, 1.0)
    said = loss_warnings(partly, links | {"s1-eth2": {"bytes_sent": 5, "bytes_recv": 0}})
    assert len(said) == 1 and "never saw (s1-eth2)" in said[0]
    # 5% asked of 10,000 frames, 300 lost: far below (500 +- 22)
    few = loss_summary({"by": "nftables", "interfaces": {"h1-eth0": {
        "frames": 10_000, "bytes": 10**7, "lost": 300, "lost_bytes": 3 * 10**5}}}, 5.0)
    assert "lost 300 of 10000 frames" in loss_warnings(few, links)[0]
    near = loss_summary({"by": "nftables", "interfaces": {"h1-eth0": {
        "frames": 10_000, "bytes": 10**7, "lost": 430, "lost_bytes": 43 * 10**4}}}, 5.0)
    assert loss_warnings(near, links) == []
    unread = loss_summary({"by": "nftables", "error": "the counters could not be read"}, 1.0)
    assert "not known" in loss_warnings(unread, links)[0]
    half = loss_summary({"by": "nftables", "interfaces": ends, "error": "h2: no answer"}, 1.0)
    assert half["frames"] == 1000 and len(loss_warnings(half, links)) == 1
    assert loss_summary({"by": "netem"}, 1.0) == {"percent": 1.0, "by": "netem"}
    assert loss_summary(None, None) is None and loss_warnings(None, links) == []
