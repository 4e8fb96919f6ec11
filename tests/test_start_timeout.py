"""--timeout bounds the agents' start too: a --train-script that never reaches its first
iteration ends the run after --timeout seconds, not after the fixed start wait."""

from __future__ import annotations

import json
import time

import pytest
from conftest import root

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.processes import RunError
from qaina_bench.harness.running.run import Run

pytestmark = [root]


def test_a_script_that_never_starts_ends_the_run_at_its_timeout(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(10000)\n")
    cfg = RunConfig.flat(results_dir=str(tmp_path / "results"), topo="star", jobs=1,
                         workers=2, iterations=2, train_script=str(script), timeout=8)
    run = Run(cfg, echo=lambda *a, **k: None)
    began = time.monotonic()
    with pytest.raises(RunError, match="did not start within 8 s"):
        run.execute()
    took = time.monotonic() - began
    assert took < 100, took  # the start wait for scripts alone is 120 s
    summary = json.loads((run.dir / "summary.json").read_text())
    assert summary["status"] == "failed", summary["status"]
