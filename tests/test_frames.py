"""Result sets and sweeps as DataFrames (``qaina_bench.results``): column sets, row
counts and values against the files a real small sweep wrote (as root, Mininet), the
example script on them, and one clear error for what is not a result set."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pd = pytest.importorskip("pandas", reason="pandas missing: pip install 'qaina-bench[data]'")

from qaina_bench.harness.results.metrics import job_metrics, sweep_columns  # noqa: E402
from qaina_bench.harness.results.resultset import ITERATION_COLUMNS, TIMESERIES_COLUMNS  # noqa: E402
from qaina_bench.harness.sweeping.sweepcsv import BASE_COLUMNS, CONFIG_COLUMNS  # noqa: E402
from qaina_bench.results import (FIDELITY_FIELDS, JOB_FIELDS, VALIDITY_COLUMNS,  # noqa: E402
                                 ResultsError, load, load_sweep)

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "qaina_bench.harness.cli"]
JOBS, WORKERS, ITERATIONS = 2, 2, 2
needs_mininet = pytest.mark.skipif(shutil.which("mnexec") is None,
                                   reason="mnexec missing: apt-get install mininet")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real sweep of two tiny runs (b = 4 and b = 32, 2 jobs x 2 workers)."""
    base = tmp_path_factory.mktemp("frames")
    spec = {"name": "frames", "base": {"topo": "star", "jobs": JOBS, "workers": WORKERS,
                                       "iterations": ITERATIONS},
            "grid": {"bits": [4, 32]}, "repeats": 1}
    (base / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = base / "sweep"
    r = subprocess.run(CLI + ["sweep", str(base / "spec.yaml"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def runs(sweep: Path) -> list[Path]:
    return [sweep / "runs" / row["run_id"]
            for row in csv.DictReader(open(sweep / "sweep.csv"))]


@pytest.mark.root
@needs_mininet
def test_a_run_loads_with_the_documented_columns_and_rows(sweep):
    directory = runs(sweep)[0]
    run = load(directory)
    summary = json.loads((directory / "summary.json").read_text())
    assert run.summary == summary and run.config == summary["config"]
    assert run.config["workload"]["workers"] == WORKERS
    assert list(run.jobs.columns[:len(JOB_FIELDS)]) == JOB_FIELDS
    assert {m.name for m in job_metrics()} <= set(run.jobs.columns)
    assert list(run.iterations.columns) == ITERATION_COLUMNS
    assert set(TIMESERIES_COLUMNS) <= set(run.series.columns) and "t" in run.series
    assert list(run.validity.columns) == VALIDITY_COLUMNS
    assert list(run.fidelity.columns[:1 + len(FIDELITY_FIELDS)]) == ["job_id", *FIDELITY_FIELDS]
    assert len(run.jobs) == len(run.validity) == len(run.fidelity) == JOBS
    assert len(run.iterations) == JOBS * WORKERS * ITERATIONS
    keys = run.iterations[["job", "worker", "iteration"]].drop_duplicates()
    assert len(keys) == JOBS * WORKERS * ITERATIONS
    assert set(run.series["kind"]) >= {"slots", "link", "proc", "cpu"}


@pytest.mark.root
@needs_mininet
def test_values_equal_the_files_the_run_wrote(sweep):
    directory = runs(sweep)[0]
    run = load(directory)
    summary = json.loads((directory / "summary.json").read_text())
    for job, row in zip(summary["jobs"], run.jobs.to_dict("records")):
        for m in job_metrics():
            if job.get(m.name) is None:
                assert pd.isna(row[m.name]), m.name
            else:
                assert row[m.name] == pytest.approx(job[m.name]), m.name
        assert row["hosts"] == job["hosts"] and row["bits"] == job["bits"]
        f = run.fidelity.set_index("job_id").loc[job["job_id"]]
        assert f["verdict"] == job["fidelity"]["verdict"]
        assert f["busiest_bytes"] == job["fidelity"]["busiest_direction"]["bytes"]
        v = run.validity.set_index("job_id").loc[job["job_id"]]
        assert v["refused"] == job["refused"] and v["slot_samples"] == job["slot_samples"]
    table = list(csv.DictReader(open(directory / "iterations.csv")))
    for raw, row in zip(table, run.iterations.to_dict("records")):
        assert row["job"] == int(raw["job"]) and row["bytes_sent"] == int(raw["bytes_sent"])
        assert row["completion_s"] == pytest.approx(float(raw["completion_s"]))
    assert run.iterations["completion_s"].mean() == pytest.approx(
        sum(j["iteration_completion_mean_s"] for j in summary["jobs"]) / JOBS)
    series = list(csv.DictReader(open(directory / "timeseries.csv")))
    assert len(run.series) == len(series)
    slots = run.series[run.series["kind"] == "slots"]
    for job in summary["jobs"]:  # a job's peak is over the samples of its iterations
        mine = [r for r in table if int(r["job"]) == job["job_id"]]
        began = min(float(r["start"]) for r in mine)
        ended = max(float(r["end"]) for r in mine)
        during = slots[(slots["job"].astype(int) == job["job_id"])
                       & slots["time"].astype(float).between(began, ended)]
        if during.empty:  # a busy machine took no slot sample within them: no peak
            assert job["slots_peak"] is None
        else:
            assert during["slots_in_use"].max() == job["slots_peak"]


@pytest.mark.root
@needs_mininet
def test_a_sweep_loads_with_typed_columns(sweep):
    frame = load_sweep(sweep)
    raw = list(csv.DictReader(open(sweep / "sweep.csv")))
    assert len(frame) == len(raw) == 2
    assert set(BASE_COLUMNS + CONFIG_COLUMNS + sweep_columns()) <= set(frame.columns)
    assert str(frame["workers"].dtype) == "Int64" and frame["pack"].dtype == "boolean"
    assert frame["elements_per_s"].dtype == float and frame["fidelity"].dtype == object
    assert list(frame["bits"]) == ["4", "32"]
    for row, got in zip(raw, frame.to_dict("records")):
        assert got["elements_per_s"] == pytest.approx(float(row["elements_per_s"]))
        assert got["run_id"] == row["run_id"] and got["jobs"] == JOBS
    assert load_sweep(sweep / "sweep.csv").equals(frame)


@pytest.mark.root
@needs_mininet
def test_the_example_compares_two_runs_and_draws_the_sweep(sweep, tmp_path):
    a, b = runs(sweep)
    out = tmp_path / "sweep.png"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_runs.py"), str(a),
                        str(b), str(sweep), "--x", "bits", "--y", "iteration_s",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"A = {a.name}" in r.stdout and "iteration_completion_mean_s" in r.stdout
    assert "1 line(s) from 2 run(s)" in r.stdout
    assert out.stat().st_size > 5_000


def test_what_is_not_a_result_set_is_one_clear_error(tmp_path):
    for call, target, fragment in [
            (load, tmp_path / "nowhere", "is not a directory"),
            (load, tmp_path, "has no summary.json"),
            (load_sweep, tmp_path, "sweep.csv not found")]:
        with pytest.raises(ResultsError) as err:
            call(target)
        assert fragment in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ResultsError, match="unreadable"):
        load(tmp_path)
    (tmp_path / "sweep.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ResultsError, match="not a qaina-bench sweep.csv"):
        load_sweep(tmp_path)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "compare_runs.py"),
                        str(tmp_path), str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "summary.json" in r.stderr


def _edit_summary(directory: Path, change):
    s = json.loads((directory / "summary.json").read_text())
    change(s)
    (directory / "summary.json").write_text(json.dumps(s))


def _edit_csv(path: Path, column: str, value: str):
    rows = list(csv.DictReader(open(path)))
    rows[0][column] = value
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _drop_column(path: Path, column: str):
    rows = list(csv.DictReader(open(path)))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, [c for c in rows[0] if c != column], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


@pytest.mark.root
@needs_mininet
@pytest.mark.parametrize("edit", [
    lambda d: _edit_summary(d, lambda s: s.update(jobs="x")),
    lambda d: _edit_summary(d, lambda s: s["jobs"][0].pop("job_id")),
    lambda d: _edit_summary(d, lambda s: s["jobs"][0].update(fidelity="x")),
    lambda d: _edit_csv(d / "timeseries.csv", "time", "noon"),
    lambda d: _edit_csv(d / "iterations.csv", "job", "1.5"),
    lambda d: _drop_column(d / "iterations.csv", "job"),
    lambda d: _drop_column(d / "timeseries.csv", "kind"),
])
def test_a_hand_edited_result_set_is_one_clear_error(sweep, tmp_path, edit):
    """A result set edited by hand (or by another tool) loads or says, in one
    ResultsError naming it, that it cannot: no TypeError or KeyError from pandas."""
    directory = tmp_path / "run"
    shutil.copytree(runs(sweep)[0], directory)
    edit(directory)
    with pytest.raises(ResultsError, match="a file of the result set cannot be read") as err:
        load(directory)
    assert str(directory) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.root
@needs_mininet
def test_a_sweep_csv_with_nan_loads_and_one_with_a_bad_value_is_one_error(sweep, tmp_path):
    path = tmp_path / "sweep.csv"
    shutil.copy(sweep / "sweep.csv", path)
    _edit_csv(path, "job_completion_s", "nan")  # as a NaN mean is written
    assert load_sweep(path)["job_completion_s"].isna().iloc[0]
    _edit_csv(path, "jobs", "1.5")
    with pytest.raises(ResultsError, match="column jobs is not what sweep.csv holds"):
        load_sweep(path)


def test_without_pandas_the_import_is_one_clear_line():
    code = ("import sys; sys.modules['pandas'] = None\n"
            "try:\n    import qaina_bench.results\n"
            "except ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == ("qaina_bench.results needs pandas: pip install "
                                "'qaina-bench[data]' (or `make venv`)")
