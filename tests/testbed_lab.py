"""What the end-to-end run suites share: the ``target`` fixture (every run on both
switch targets), ``execute`` (a real run as root, checked for forged packets), and
checks of the aggregates every worker received."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.run import Run
from qaina_bench.harness.switches.targets import bmv2_missing
from qaina_bench.hosts.lanes import LaneFormat

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
