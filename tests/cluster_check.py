"""What ``docker/cluster.sh`` checks of a run in container qb-a: its result set
complete with exact sums (``testbed_lab.check_exact_aggregates``), and where its nodes
ran (``logs/placement.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed_lab import check_exact_aggregates


def checked_run(name: str, results: Path = Path("/results")) -> tuple[Path, dict, dict]:
    """(the run's directory, its summary, node -> server) of run ``name``, after the
    checks every cluster run must pass."""
    run = results / name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"], summary["status"]
    check_exact_aggregates(run, summary)
    where = json.loads((run / "logs" / "placement.json").read_text())
    return run, summary, where
