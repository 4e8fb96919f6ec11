"""A real run's summary (as root, Mininet) against sources of its own: the trace
(elements, the exact sums for the error), the switch's counters (chunks, so
registers), the agents' logs (times), and the order of the run's events."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from qaina_bench.hosts.traces import open_trace
from test_testbed import execute, final_counters

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]


def test_summary_agrees_with_what_the_trace_the_switch_and_the_agents_say(tmp_path):
    """Each figure of the summary against a source of its own: the trace (elements and
    the exact sums, for the error), the switch's counters (chunks, so registers), the
    agents' logs (times), and the order of the run's events."""
    summary, directory = execute(tmp_path, topo="star", jobs=2, workers=2, bits=[2],
                                 iterations=2)
    saved = json.loads((directory / "summary.json").read_text())
    assert saved["jobs"] == summary["jobs"]
    machine = saved["machine"]  # what the timings are a property of, besides the network
    cpuinfo = Path("/proc/cpuinfo").read_text()
    if "model name" in cpuinfo:  # x86 names its model there (some ARM kernels do not)
        assert machine["cpu_model"] and f": {machine['cpu_model']}\n" in cpuinfo
    assert machine["cores"] == cpuinfo.count("processor\t:") >= machine["cores_usable"] > 0
    assert machine["memory_gib"] > 0 and machine["architecture"]
    trace = open_trace("digits-mlp")
    for job in saved["jobs"]:
        jid = job["job_id"]
        logs = [[r for r in map(json.loads, open(directory / "agents" / f"j{jid}w{w}.jsonl"))
                 if r["type"] == "iteration"] for w in range(2)]
        assert job["elements_per_iteration"] == trace.elements
        assert job["iterations_done"] == 2 and job["elements_aggregated"] == 2 * trace.elements
        # a worker's iterations follow one another within the job's span
        for mine in logs:
            assert [r["iteration"] for r in mine] == [0, 1]
            assert mine[0]["end"] <= mine[1]["start"] + 1e-6
            assert sum(r["completion_s"] for r in mine) <= job["job_completion_s"] + 1e-6
        slowest = max(r["completion_s"] for mine in logs for r in mine)
        assert job["iteration_completion_mean_s"] <= job["iteration_completion_p99_s"] <= slowest
        assert job["elements_per_s"] * job["job_completion_s"] == pytest.approx(
            2 * trace.elements)
        assert job["fp32_equivalent_gbps"] == pytest.approx(job["elements_per_s"] * 32 / 1e9)
        # registers: the chunks the switch opened per iteration (after the warm-up's)
        c = final_counters(directory, "s1", jid)
        chunks = -(-trace.elements // (32 * job["lanes"]))
        assert c["slots_opened"] == min(job["slots"], chunks) + 2 * chunks
        assert job["register_bit_efficiency"] == pytest.approx(
            trace.elements * 2 / (chunks * 32 * 32))
        # the error: the aggregate every worker received against the trace's exact sum
        z = np.load(directory / "agents" / f"j{jid}w0.npz")
        errors = []
        for i in range(2):
            exact = trace.exact_sum(i, workers=range(2))  # every job replays workers 0, 1
            got = z[f"aggregate_{i}"].astype(np.float64)
            errors.append(np.linalg.norm(got - exact) / np.linalg.norm(exact))
        assert job["rel_error_max"] == pytest.approx(max(errors), rel=1e-4)
    # ... against the exact sums the run summed once for every agent, in a temporary
    # directory that is gone with the run
    named = {json.loads((directory / "agents" / f"j{j}w{w}.json").read_text())["exact_sums"]
             for j in (1, 2) for w in range(2)}
    (path,) = named
    assert "qaina-bench-sums-" in path and not Path(path).exists()
    first_send = min(r["start"] for p in (directory / "agents").glob("*.jsonl")
                     for r in map(json.loads, open(p)) if r["type"] in ("warmup", "iteration"))
    events = saved["events"]
    assert events["invoked"] < events["network_up"] < events["agents_go"] <= first_send
    assert saved["startup_to_first_send_s"] == pytest.approx(first_send - events["invoked"])
