"""``sweep.csv``: one row per run of a sweep, joining its summary.

Every figure of a row comes from the run's own ``summary.json`` (``harness/results/summary.py``)
and ``iterations.csv``; the metric columns, how each combines the jobs of a run (times
averaged, rates added) and their definitions are the metric registry's
(``harness/results/metrics.py``, ``METRICS``), listed at the end of this docstring and in
README's glossary. The other columns: the point and repeat, the run's id, status and
note, and its configuration (``CONFIG_COLUMNS``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..results.metrics import METRICS, steady, sweep_columns, sweep_values  # noqa: F401
from ..results.resultset import read_text

CONFIG_COLUMNS = ["topo", "target", "mode", "jobs", "workers", "bits", "quantizer", "compress",
                  "payload_words", "pack", "bw", "delay", "loss", "slots", "pool_slots",
                  "trace", "iterations", "levels", "leaves", "arrivals", "allocation"]
BASE_COLUMNS = ["point", "repeat", "run_id", "status", "note"]


def columns(axes: list[str]) -> list[str]:
    return BASE_COLUMNS + [a for a in axes if a not in CONFIG_COLUMNS] + CONFIG_COLUMNS \
        + sweep_columns()


def _column_doc() -> str:
    """The metric columns with their definitions, from the registry."""
    lines = ["", "Metric columns (``harness/results/metrics.py``):", ""]
    for name in METRICS.names():
        m = METRICS.get(name)
        for column, how in ([(m.name, "per run")] if m.scope == "run" else m.sweep):
            over = how if how == "per run" else f"{how} over jobs of ``{m.name}``"
            lines.append(f"``{column}`` ({m.unit}, {over}): {m.definition}")
    return "\n".join(lines) + "\n"


__doc__ = (__doc__ or "") + _column_doc()


#: the status of a run whose summary says complete but whose metrics cannot be read
UNREADABLE = "unreadable"


def run_row(directory: Path) -> dict:
    """The metrics of one result set (empty if it has no readable summary)."""
    try:
        s = json.loads(read_text(directory / "summary.json"))
    except (OSError, ValueError, RecursionError):
        return {"status": "no summary"}
    if not isinstance(s, dict):  # not a summary: a run that did not complete
        return {"status": "no summary"}
    try:
        return {"status": s.get("status"), **sweep_values(s, directory)}
    except (AttributeError, KeyError, TypeError, ValueError):  # edited, or not ours
        return {"status": UNREADABLE}


def config_row(cfg) -> dict:
    """The run's options of ``CONFIG_COLUMNS``, read from its configuration tree."""
    options = cfg.flat_dict()
    row = {k: options[k] for k in CONFIG_COLUMNS}
    row["bits"] = "-".join(map(str, row["bits"]))
    return row


def write(path: Path, axes: list[str], rows: list[dict]):
    """Write ``rows`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, columns(axes), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    tmp.replace(path)
