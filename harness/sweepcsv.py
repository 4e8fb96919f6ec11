"""``sweep.csv``: one row per run of a sweep, joining its summary.

Every figure of a row comes from the run's own ``summary.json`` (``harness/summary.py``)
and ``iterations.csv``; over the jobs of a run, times are averaged and rates added:

``iteration_s``        mean iteration completion time over jobs (``iteration_completion_mean_s``)
``steady_iteration_s`` the same over the iterations that ran the run's scheme: with
                       GradiVeQ only the compressed ones (not the exact fitting ones)
``iteration_p99_s``    the largest 99th percentile of the jobs
``job_completion_s``   mean over jobs of first send to last iteration done
``job_completion_max_s`` the slowest job's
``elements_per_s``     sum over jobs: the aggregate throughput
``fp32_gbps``          the same as 32-bit values, Gbit/s
``slots_peak``         sum over jobs of each job's peak slots held (in-network only)
``register_bit_efficiency`` mean over jobs (in-network only)
``rel_error``          mean over jobs of the relative aggregation error
``retransmissions``, ``bytes_sent`` sums over jobs
``bytes_per_iteration`` mean over jobs of the bytes a worker sent per iteration
``steady_bytes_per_iteration`` the same over the iterations of ``steady_iteration_s``
``cpu_saturated``      1 if the run's summary flags a saturated CPU (the sampler's rule:
                       all cores or a process over 90% busy)
``fidelity``           the run's fidelity verdict (``network-bound``, ``cpu-bound``,
                       ``mixed``, ``n/a``; ``harness/fidelity.py``); empty for result
                       sets made before the verdict, whose plots fall back to
                       ``cpu_saturated``
``cpu_s_per_melem``    CPU seconds of the run's processes per million aggregated elements
``jobs_fit``           jobs of this point that the pool holds (1 for a point that ran;
                       0 for a point the pool refused)
``switch_link_bytes``  bytes that crossed switch-to-switch links (``tier_bytes``)
``turnaround_s``       with ``--arrivals``: mean over jobs of arrival to last iteration
                       done (``turnaround_max_s`` the slowest job's); ``wait_s`` the mean
                       time from arrival to admission
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .resultset import read_csv
from .summary import _mean

CONFIG_COLUMNS = ["topo", "target", "mode", "jobs", "workers", "bits", "quantizer", "compress",
                  "payload_words", "pack", "bw", "delay", "loss", "slots", "pool_slots",
                  "trace", "iterations", "levels", "leaves", "arrivals", "allocation"]
METRIC_COLUMNS = ["iteration_s", "steady_iteration_s", "iteration_p99_s", "job_completion_s",
                  "job_completion_max_s", "elements_per_s", "fp32_gbps", "slots_peak",
                  "register_bit_efficiency", "rel_error", "retransmissions", "bytes_sent",
                  "bytes_per_iteration", "steady_bytes_per_iteration",
                  "span_s", "cpu_saturated", "fidelity", "cpu_s_per_melem", "cpu_busy",
                  "warnings", "jobs_fit", "switch_link_bytes", "turnaround_s",
                  "turnaround_max_s", "wait_s", "switch_share"]
BASE_COLUMNS = ["point", "repeat", "run_id", "status", "note"]


def columns(axes: list[str]) -> list[str]:
    return BASE_COLUMNS + [a for a in axes if a not in CONFIG_COLUMNS] + CONFIG_COLUMNS \
        + METRIC_COLUMNS


def _sum(values):
    values = [v for v in values if v is not None]
    return float(np.sum(values)) if values else None


def steady(directory: Path, compressed: bool) -> tuple[float | None, float | None]:
    """Mean completion time and bytes a worker sent, over the iterations that ran the
    scheme (per job, then over jobs): the compressed ones with GradiVeQ, all otherwise."""
    try:
        rows = read_csv(directory / "iterations.csv")
    except OSError:
        return None, None
    times: dict[str, list[float]] = {}
    sent: dict[str, list[float]] = {}
    for r in rows:
        if compressed and str(r.get("compressed")) not in ("True", "1", "true"):
            continue
        if r.get("completion_s") not in (None, ""):
            times.setdefault(r["job"], []).append(float(r["completion_s"]))
            sent.setdefault(r["job"], []).append(float(r.get("bytes_sent") or 0))
    return (_mean([float(np.mean(v)) for v in times.values()]),
            _mean([float(np.mean(v)) for v in sent.values()]))


def run_row(directory: Path) -> dict:
    """The metrics of one result set (empty if it has no readable summary)."""
    try:
        s = json.loads((directory / "summary.json").read_text())
    except (OSError, ValueError):
        return {"status": "no summary"}
    jobs = s.get("jobs") or []
    v = s.get("validity") or {}
    cpu = v.get("cpu") or {}
    get = lambda key: [j.get(key) for j in jobs]  # noqa: E731
    steady_s, steady_bytes = steady(directory, s.get("compress") == "gradiveq")
    return {
        "status": s.get("status"),
        "iteration_s": _mean(get("iteration_completion_mean_s")),
        "steady_iteration_s": steady_s,
        "iteration_p99_s": max((x for x in get("iteration_completion_p99_s") if x is not None),
                               default=None),
        "job_completion_s": _mean(get("job_completion_s")),
        "job_completion_max_s": max((x for x in get("job_completion_s") if x is not None),
                                    default=None),
        "elements_per_s": _sum(get("elements_per_s")),
        "fp32_gbps": _sum(get("fp32_equivalent_gbps")),
        "slots_peak": _sum(get("slots_peak")),
        "register_bit_efficiency": _mean(get("register_bit_efficiency")),
        "rel_error": _mean(get("rel_error_mean")),
        "retransmissions": _sum(get("retransmissions")),
        "bytes_sent": _sum(get("bytes_sent")),
        "bytes_per_iteration": _mean([j["bytes_sent"] / (j["workers"] * j["iterations_done"])
                                      for j in jobs if j.get("iterations_done")]),
        "steady_bytes_per_iteration": steady_bytes,
        "span_s": s.get("span_s"),
        "cpu_saturated": 1 if cpu.get("saturated") else 0,
        "fidelity": (s.get("fidelity") or {}).get("verdict"),
        "cpu_s_per_melem": (s.get("cpu_cost") or {}).get("s_per_melem"),
        "cpu_busy": cpu.get("cores_busy_mean"),
        "warnings": len(v.get("warnings") or []),
        "jobs_fit": 1,
        "switch_link_bytes": (s.get("tier_bytes") or {}).get("switch_links"),
        "turnaround_s": _mean(get("turnaround_s")),
        "turnaround_max_s": max((x for x in get("turnaround_s") if x is not None),
                                default=None),
        "wait_s": _mean(get("wait_s")),
        "switch_share": _mean(get("switch_share")),
    }


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
