"""``up --train-script``: the shipped DDP example on real Mininet runs, its buckets
summed exactly by the switch (both targets) or the ring, and its records in the
result set like the agents'."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import root
from testbed_lab import check_exact_aggregates, execute, target  # noqa: F401  (fixture)

pytest.importorskip("torch", reason="PyTorch is not installed (make venv installs its CPU "
                    "build: TORCH=torch==2.13.0)")
pytest.importorskip("sklearn", reason="the example trains on scikit-learn's digits")

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "ddp_digits.py")
STEPS = 6

pytestmark = [root, pytest.mark.slow]


def run_example(tmp_path, **kw):
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=2, iterations=STEPS,
                                 train_script=EXAMPLE, **kw)
    assert summary["status"] == "complete", summary.get("errors")
    rows = list(csv.DictReader(open(directory / "iterations.csv")))
    assert sorted((int(r["worker"]), int(r["iteration"])) for r in rows) == \
        [(w, i) for w in range(2) for i in range(STEPS)]
    assert summary["train_script"] == {"script": EXAMPLE, "args": kw.get("train_args", "")}
    assert (directory / "script" / "ddp_digits.py").is_file()
    for w in range(2):  # the script's own output is in the result set
        log = (directory / "logs" / f"script-j1w{w}.log").read_text()
        assert f"rank {w} (" in log and "test accuracy" in log, log[-2000:]
    return summary, directory, rows


def test_the_example_through_the_switch_is_exact(tmp_path, target):  # noqa: F811
    summary, directory, rows = run_example(tmp_path, target=target, bits=[4])
    check_exact_aggregates(directory, summary)
    job = summary["jobs"][0]
    # (slots_peak is not checked: a step's buckets can fall between two 10 ms samples)
    assert job["iterations_done"] == STEPS
    assert all(int(r["packets_sent"]) > 0 for r in rows)


def test_the_example_through_the_ring_is_exact(tmp_path):
    summary, directory, _ = run_example(tmp_path, mode="ring", bits=[8])
    check_exact_aggregates(directory, summary)


def test_the_plain_allreduce_baseline_records_the_links_bytes(tmp_path):
    summary, directory, rows = run_example(tmp_path, train_args="--comm allreduce")
    # gloo all-reduce of the 6,570 float32 gradients of each step, as the links saw it
    assert all(int(r["bytes_sent"]) >= 4 * 6570 // 2 for r in rows)
    done = [json.loads(line) for line in open(directory / "agents" / "j1w0.jsonl")][-1]
    assert done["type"] == "done" and 0 <= done["test_accuracy"] <= 1
