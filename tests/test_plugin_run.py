"""An out-of-tree package's quantizer and topology run end to end, as root: the
package (tests/outoftree.py) is built and pip-installed into a directory of the test's
own, which PYTHONPATH shows to the harness and, through it, to the agents in the
Mininet hosts; every worker gets the exact sum of all workers' levels, at the scales the
plugin's rule gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from outoftree import install
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.hosts.traces import open_trace

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]

WORKERS, ITERATIONS, BITS = 4, 3, 4


def test_a_plugin_topology_and_quantizer_run_end_to_end(tmp_path):
    site = install(tmp_path / "plugin")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    res = subprocess.run(
        [sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo", "line,3",
         "--quantizer", "maxhalf", "--jobs", "1", "--workers", str(WORKERS), "--bits",
         str(BITS), "--iterations", str(ITERATIONS), "--record-levels",
         "--results-dir", str(tmp_path / "results"), "--run-id", "line"],
        env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    directory = tmp_path / "results" / "line"
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["complete"], summary["errors"]
    assert summary["topology"] == "line,switches=3"
    assert summary["config"]["compression"]["quantizer"] == "maxhalf"
    assert "topo: line,switches=3" in (directory / "config.yaml").read_text()
    assert {f"s{k}" for k in (1, 2, 3)} <= set(summary["switch_ports"])
    assert summary["jobs"][0]["iterations_done"] == ITERATIONS
    check_sums_at_half_octaves(directory)


def check_sums_at_half_octaves(directory):
    """Every worker received the integer sum of all workers' levels, the same scales,
    and the float sum ``levels * 2**(code / 2) / L``; iteration 0's scales (exact, not
    predicted) are, chunk by chunk, the smallest half octave at or above the largest
    value any worker sent, computed here from the trace."""
    fmt = LaneFormat(BITS, WORKERS)
    chunk = 32 * fmt.lanes
    npz = [np.load(directory / "agents" / f"j1w{w}.npz") for w in range(WORKERS)]
    for i in range(ITERATIONS):
        total = np.stack([z[f"levels_{i}"].astype(np.int64) for z in npz]).sum(axis=0)
        scale = npz[0][f"scale_{i}"].astype(np.float64)
        expected = total * np.repeat(np.exp2(scale / 2), chunk)[:len(total)] / fmt.levels
        for w, z in enumerate(npz):
            assert np.array_equal(z[f"sums_{i}"], total), f"worker {w} iteration {i}"
            assert np.array_equal(z[f"scale_{i}"], npz[0][f"scale_{i}"]), "scales differ"
            np.testing.assert_allclose(z[f"aggregate_{i}"], expected, rtol=3e-7, atol=0)
    trace = open_trace("digits-mlp")
    top = np.max([np.abs(trace.gradient(w, 0).astype(np.float64)) for w in range(WORKERS)],
                 axis=0)
    chunks = -(-len(top) // chunk)
    top = np.pad(top, (0, chunks * chunk - len(top))).reshape(chunks, chunk).max(axis=1)
    code = npz[0]["scale_0"].astype(np.float64)
    assert np.all(top <= np.exp2(code / 2)) and np.all(top > np.exp2((code - 1) / 2))
