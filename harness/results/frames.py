"""A result set and a sweep as pandas DataFrames: ``load`` and ``load_sweep``.

The public names are ``qaina_bench.results.load`` and ``load_sweep``
(``results/__init__.py``); pandas is the optional extra ``data``. Every frame is read
from the files the run wrote (``summary.json``, ``iterations.csv``,
``timeseries.csv``, ``sweep.csv``) and its column names are theirs: a job metric's
column is the metric's name in ``harness/results/metrics.py`` (``METRICS``), a
sweep.csv column its name there (``harness/sweeping/sweepcsv.py``).

``Run`` (from ``load(RUN_DIR)``):

``jobs``, one row per job: the run's job fields (``JOB_FIELDS``: ``job_id``,
``index`` (0-based), ``bits``, ``workers``, ``lane_width`` (bits of a lane),
``lanes`` (values per 32-bit register), ``packed``, ``payload_words``, ``slot_base``,
``slots``, ``allocation``, ``hosts`` (list of host names), and with ``--arrivals``
``arrival_s``, ``arrived_at``, ``admitted_s``, ``left_s``), then every job metric of
the registry by its name (``iterations_done``, ``iteration_completion_mean_s``,
``elements_per_s``, ``bytes_sent``, ...: README's "Metrics" has each one's unit and
definition; a metric that does not apply to the run is NaN), then what else
``summary.json`` gives per job as a plain value (``--train``: ``final_test_accuracy``,
``target_accuracy``, ``time_to_target_s``, ``iterations_to_target``). Nested entries
(``fidelity``, ``fallback``, ``accuracy_curve``) stay in ``summary``.

``iterations``, one row per job x worker x iteration: ``iterations.csv``, the agents'
per-iteration records, with the columns of ``ITERATION_COLUMNS``
(``harness/results/resultset.py``; README's "Results" explains each). ``job``,
``worker``, ``iteration`` and the counters are integers, ``compressed`` a boolean,
``start``/``end`` epoch seconds; a field an agent did not record is NaN (a file
without ``job``, ``worker`` or ``iteration`` is a ``ResultsError``).

``series``, the sampler's time series: ``timeseries.csv`` with the columns of
``TIMESERIES_COLUMNS``; ``time`` is epoch seconds, ``t`` the seconds since the first
sample, ``kind`` says what a row is (``slots``: a job's counters on a switch, with
``slots_in_use``; ``link``: an interface's cumulative byte and packet counters;
``drops``: a switch's drops by ``reason``; ``proc``: a process's cumulative CPU
seconds; ``cpu``: the machine's). Columns a kind does not use are NaN.

``validity``, one row per job: ``job_id``; ``refused`` (the job metric);
``retransmission_share`` and ``clipped_share`` (the run's ``validity`` shares,
computed over the job's own iteration rows: retransmissions / packets sent, clipped /
values); ``slot_samples`` (the job metric) and ``coarse_slots`` (fewer than
``MIN_SLOT_SAMPLES`` slot samples: the summary warns); ``network_bound`` (the job's
verdict is ``network-bound``); ``warnings``: the run's warnings that name the job
(list). The run-wide figures (CPU, forged packets, switch overload) are in
``summary["validity"]``.

``fidelity``, one row per job: ``job_id`` and the job's verdict fields
(``FIDELITY_FIELDS``: ``verdict``, ``reason``, ``transfer_s``, ``link_rate_mbit``,
``link_load``, ``link_load_mbit_s``, ``link_samples``, ``cores_busy``,
``cpu_saturated``; README's "Fidelity"), and the busiest direction flattened:
``busiest_interface``, ``busiest_direction``, ``busiest_bytes``,
``busiest_mbit_s``. Result sets older than the verdict give NaN.

``config`` is the run's configuration tree as a dict (sections ``network``,
``workload``, ``compression``, ``training``, ``output``), ``summary`` the raw
``summary.json``, ``directory`` the result set.

``load_sweep(SWEEP_DIR)`` gives ``sweep.csv``, one row per run of the sweep, with
typed columns: the point's keys (``BASE_COLUMNS``), the configuration
(``CONFIG_COLUMNS``: integers, floats and booleans as their options are), and the
metric columns of the registry (numbers; ``fidelity`` a string). Columns of an older
sweep.csv that the file lacks are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ..config import MAX_YAML, parse_yaml
from .metrics import METRICS, job_metrics
from .resultset import ITERATION_COLUMNS, TIMESERIES_COLUMNS, read_text, regular_file
from .summary import MIN_SLOT_SAMPLES, SummaryError, load_summary

try:
    import pandas as pd
except ImportError:  # one clear line, not a traceback through the package
    raise ImportError("qaina_bench.results needs pandas: pip install 'qaina-bench[data]' "
                      "(or `make venv`)") from None

JOB_FIELDS = ["job_id", "index", "bits", "workers", "lane_width", "lanes", "packed",
              "payload_words", "slot_base", "slots", "allocation", "hosts",
              "arrival_s", "arrived_at", "admitted_s", "left_s"]
#: per-job entries of summary.json that are nested: in ``summary``, not in ``jobs``
NESTED = ("fidelity", "fallback", "accuracy_curve")
FIDELITY_FIELDS = ["verdict", "reason", "transfer_s", "link_rate_mbit", "link_load",
                   "link_load_mbit_s", "link_samples", "cores_busy", "cpu_saturated"]
BUSIEST = {"busiest_interface": "interface", "busiest_direction": "direction",
           "busiest_bytes": "bytes", "busiest_mbit_s": "mbit_s"}
VALIDITY_COLUMNS = ["job_id", "refused", "retransmission_share", "clipped_share",
                    "slot_samples", "coarse_slots", "network_bound", "warnings"]
INTEGER_ITERATION = ["job", "worker", "iteration", "elements", "values", "packets_sent",
                     "packets_received", "bytes_sent", "bytes_received", "retransmissions",
                     "timeouts", "fast_retransmits", "duplicates", "refused", "send_errors",
                     "clipped", "bits", "wakeups"]
#: sweep.csv's configuration columns by type (the others are strings)
SWEEP_INTEGERS = ["point", "repeat", "jobs", "workers", "payload_words", "slots",
                  "pool_slots", "iterations", "levels", "leaves"]
SWEEP_FLOATS = ["bw", "loss"]
SWEEP_BOOLEANS = ["pack"]
SWEEP_STRINGS_METRICS = ["fidelity"]
SWEEP_INTEGER_METRICS = ["cpu_saturated", "warnings", "jobs_fit"]


class ResultsError(ValueError):
    """A directory that is not a result set or a sweep; the message says which."""


@dataclass
class Run:
    """One result set as DataFrames (the columns: this module's docstring)."""
    directory: Path
    summary: dict
    config: dict
    jobs: "pd.DataFrame"
    iterations: "pd.DataFrame"
    series: "pd.DataFrame"
    validity: "pd.DataFrame"
    fidelity: "pd.DataFrame"

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id", self.directory.name)


def job_columns() -> list[str]:
    """``jobs``' fixed columns: the job fields, then the registry's job metrics."""
    return JOB_FIELDS + [m.name for m in job_metrics()]


def jobs_frame(summary: dict) -> "pd.DataFrame":
    fixed = job_columns()
    extra: list[str] = []
    rows = []
    for job in summary.get("jobs") or []:
        row = {k: v for k, v in job.items() if k not in NESTED}
        extra += [k for k in row if k not in fixed and k not in extra]
        rows.append(row)
    return pd.DataFrame(rows, columns=fixed + extra)


def _read(path: Path, columns: list[str], keys: tuple[str, ...]) -> "pd.DataFrame":
    """``path`` with ``columns`` first (missing ones NaN); ValueError if it lacks one of
    the ``keys`` that say what a row is."""
    if not path.exists():
        return pd.DataFrame(columns=columns)
    frame = pd.read_csv(regular_file(path), low_memory=False)
    lacking = [k for k in keys if k not in frame.columns]
    if lacking:
        raise ValueError(f"{path.name} has no {', '.join(lacking)} column")
    return frame.reindex(columns=columns + [c for c in frame.columns if c not in columns])


def iterations_frame(directory: Path) -> "pd.DataFrame":
    frame = _read(directory / "iterations.csv", ITERATION_COLUMNS,
                  ("job", "worker", "iteration"))
    for column in INTEGER_ITERATION:
        frame[column] = pd.to_numeric(frame[column]).astype("Int64")
    frame["compressed"] = frame["compressed"].map(
        lambda v: v if isinstance(v, bool) else str(v) in ("True", "true", "1")).astype(bool)
    return frame


def series_frame(directory: Path) -> "pd.DataFrame":
    frame = _read(directory / "timeseries.csv", TIMESERIES_COLUMNS, ("time", "kind"))
    frame["job"] = pd.to_numeric(frame["job"]).astype("Int64")
    frame.insert(1, "t", frame["time"] - frame["time"].min() if len(frame) else frame["time"])
    return frame


def _share(part, whole) -> float:
    return float(part) / float(whole) if whole else 0.0


def validity_frame(summary: dict, iterations: "pd.DataFrame") -> "pd.DataFrame":
    warnings = (summary.get("validity") or {}).get("warnings") or []
    rows = []
    for job in summary.get("jobs") or []:
        mine = iterations[iterations["job"] == job["job_id"]]
        named = f"job {job['job_id']} "
        listed = [w for w in warnings if named in w or (
            "job(s) " in w and str(job["job_id"]) in w.split("job(s) ")[1].split(" ran")[0]
            .split(", "))]
        samples = job.get("slot_samples")
        rows.append({"job_id": job["job_id"], "refused": job.get("refused"),
                     "retransmission_share": _share(mine["retransmissions"].sum(),
                                                    mine["packets_sent"].sum()),
                     "clipped_share": _share(mine["clipped"].sum(), mine["values"].sum()),
                     "slot_samples": samples,
                     "coarse_slots": bool(samples is not None and job.get("iterations_done")
                                          and samples < MIN_SLOT_SAMPLES),
                     "network_bound": (job.get("fidelity") or {}).get("verdict")
                     == "network-bound",
                     "warnings": listed})
    return pd.DataFrame(rows, columns=VALIDITY_COLUMNS)


def fidelity_frame(summary: dict) -> "pd.DataFrame":
    rows = []
    for job in summary.get("jobs") or []:
        f = job.get("fidelity") or {}
        top = f.get("busiest_direction") or {}
        rows.append({"job_id": job["job_id"], **{k: f.get(k) for k in FIDELITY_FIELDS},
                     **{column: top.get(key) for column, key in BUSIEST.items()}})
    return pd.DataFrame(rows, columns=["job_id", *FIDELITY_FIELDS, *BUSIEST])


def _config(summary: dict, directory: Path) -> dict:
    if isinstance(summary.get("config"), dict):
        return summary["config"]
    try:
        config = parse_yaml(read_text(directory / "config.yaml", MAX_YAML)) or {}
    except (OSError, ValueError, RecursionError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def load(run_dir) -> Run:
    """The result set ``run_dir`` (``results/<run-id>/``) as a ``Run`` of DataFrames;
    ``ResultsError`` (one line) when it is not a result set."""
    directory = Path(run_dir)
    if not directory.is_dir():
        raise ResultsError(f"{directory} is not a directory (a result set is "
                           "results/<run-id>/)")
    try:
        summary = load_summary(directory)
    except SummaryError as exc:
        raise ResultsError(str(exc)) from None
    try:
        iterations = iterations_frame(directory)
        series = series_frame(directory)
        return Run(directory, summary, _config(summary, directory), jobs_frame(summary),
                   iterations, series, validity_frame(summary, iterations),
                   fidelity_frame(summary))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError,
            pd.errors.ParserError) as exc:  # a file edited by hand, or not ours
        raise ResultsError(f"{directory}: a file of the result set cannot be read "
                           f"({type(exc).__name__}: {exc})".splitlines()[0]) from None


def sweep_metric_columns() -> list[str]:
    """sweep.csv's metric columns, from the registry."""
    return [c for n in METRICS.names() for c in METRICS.get(n).columns()]


def load_sweep(sweep_dir) -> "pd.DataFrame":
    """``SWEEP_DIR/sweep.csv`` (or a sweep.csv path) as a DataFrame with typed columns;
    ``ResultsError`` (one line) when there is none."""
    path = Path(sweep_dir)
    path = path / "sweep.csv" if path.is_dir() else path
    if not path.is_file():
        raise ResultsError(f"{path} not found: a sweep directory holds sweep.csv "
                           "(qaina-bench sweep SPEC writes it)")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as exc:
        raise ResultsError(f"{path} is unreadable: {exc}".splitlines()[0]) from None
    if "run_id" not in frame.columns:
        raise ResultsError(f"{path} is not a qaina-bench sweep.csv (no run_id column)")
    blank = frame.replace("", None)
    for column in frame.columns:
        try:
            if column in SWEEP_INTEGERS or column in SWEEP_INTEGER_METRICS:
                frame[column] = pd.to_numeric(blank[column]).astype("Int64")
            elif column in SWEEP_FLOATS or (column in sweep_metric_columns()
                                            and column not in SWEEP_STRINGS_METRICS):
                frame[column] = pd.to_numeric(blank[column].replace("nan", None)).astype(float)
            elif column in SWEEP_BOOLEANS:
                frame[column] = blank[column].map({"True": True, "False": False}).astype(
                    "boolean")
        except (ValueError, TypeError, OverflowError) as exc:
            raise ResultsError(f"{path}: column {column} is not what sweep.csv holds "
                               f"({exc})".splitlines()[0]) from None
    return frame


__all__ = ["Run", "ResultsError", "load", "load_sweep", "job_columns"]
