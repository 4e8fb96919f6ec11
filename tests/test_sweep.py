"""Sweeps: specs checked before anything runs, points and their run options, the
pool's refusals, and (as root) real sweeps that resume after Ctrl-C and plot."""

from __future__ import annotations

import csv
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from qaina_bench.harness.sweeping.sweep import Spec, SweepError, plan, slots_for
from qaina_bench.harness.config import RunConfig
from qaina_bench.hosts.traces import open_trace

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
CLI = [sys.executable, "-m", "qaina_bench.harness.cli"]


def spec(**over) -> dict:
    data = {"name": "t", "base": {"topo": "star", "jobs": 1, "workers": 2, "iterations": 1},
            "grid": {"bits": [4, 32]}, "repeats": 1}
    data.update(over)
    return data


@pytest.mark.parametrize("change, fragment", [
    ({"colour": 1}, "unknown key(s) colour"),
    ({"name": "a/b"}, "name must be a short name"),
    ({"grid": {}}, "grid must map at least one axis"),
    ({"grid": {"bits": []}}, "needs a non-empty list"),
    ({"grid": {"speed": [1, 2]}}, "unknown run option(s) speed"),
    ({"grid": {"s": [{"bits": 4}]}}, "needs a label"),
    ({"grid": {"s": [{"label": "a", "bits": 4}, 8]}}, "mixes plain values and variants"),
    ({"grid": {"s": [{"label": "a", "bits": 4}, {"label": "a", "bits": 8}]}}, "repeats a label"),
    ({"base": {"results_dir": "/tmp"}}, "the sweep sets results_dir and run_id"),
    ({"repeats": 0}, "repeats must be a whole number"),
    ({"quick": {"plot": {}}}, "quick may replace"),
    ({"traces": [{"name": "x", "colour": 1}]}, "unknown key(s) colour"),
    ({"traces": ["nope"]}, "has no recipe"),
    ({"traces": [{"name": "x", "hidden": 5}]}, "trace 'x': hidden must be a list of whole layer"),
    ({"traces": [{"name": "x", "workers": "8"}]}, "trace 'x': workers must be a whole number"),
    ({"traces": [{"name": "x", "dtype": "int8"}]}, "trace 'x': dtype 'int8': use one of"),
    ({"traces": [{"name": "x", "lr": "fast"}]}, "trace 'x': the learning rate must be"),
    ({"traces": [{"name": "x", "model": "gpt"}]}, "trace 'x': unknown model 'gpt'"),
    ({"traces": [{"name": "../x"}]}, "trace '../x': trace set name '../x'"),
    ({"plot": {"x": "bitz", "panels": [{"y": "iteration_s"}]}},
     "plot: 'bitz' is not a column of sweep.csv"),
    ({"plot": {"x": "bits", "series": ["mode", "colour"], "panels": [{"y": "iteration_s"}]}},
     "plot: 'colour' is not a column of sweep.csv"),
    ({"plot": {"x": "bits", "panels": [{"served": True}, {"y": "iteration_time"}]}},
     "plot: panel y 'iteration_time' is not a column of sweep.csv"),
    ({"grid": {"seed": list(range(200)), "bits": [2, 4, 8], "workers": list(range(1, 21))}},
     "more than 10000"),
    ({"window_elements": 640, "grid": {"bits": [9]}}, "point 0 (bits=9): bit width 9 is not"),
    ({"window_elements": 640, "grid": {"workers": [0]}}, "point 0 (workers=0): 0 workers"),
    ({"plot": {"x": "bits", "panels": [{"y": "iteration_s", "scale": "abc"}]}},
     "plot: panel 1: scale must be a number above 0"),
    ({"plot": {"x": "bits", "title": [1], "panels": [{"y": "iteration_s"}]}},
     "plot: title must be text"),
    ({"plot": {"x": "bits", "kind": "pie", "panels": [{"y": "iteration_s"}]}},
     "plot: kind is line or bar"),
    ({"plot": {"x": "bits", "logx": "yes", "panels": [{"y": "iteration_s"}]}},
     "plot: logx must be true or false"),
    ({"plot": {"x": "bits", "panels": [{"y": "iteration_s", "colour": 1}]}},
     "plot: panel 1: unknown key(s) colour"),
    ({"plot": {"x": "bits", "panels": []}}, "plot: panels must be a list"),
    ({"plot": {"panels": [{"y": "iteration_s"}]}}, "plot: give x"),
    ({"grid": {"s": [{"label": "a\x1b]0;x\x07b", "bits": 4}]}}, "holds a control character"),
    ({"grid": {"s": [{"label": "two\nlines", "bits": 4}]}}, "holds a tab or a line break"),
    ({"plot": {"x": "bits", "title": "t\x9bx", "panels": [{"y": "iteration_s"}]}},
     "holds a control character"),
])
def test_bad_specs_are_one_clear_error(change, fragment):
    with pytest.raises(SweepError) as err:
        s = Spec.from_dict(spec(**change), "s.yaml", quick=True)
        plan(s, Path("/tmp/nowhere"))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_recipe_and_a_plot_a_sweep_can_use_are_taken():
    """A grid axis and a metric are columns to plot; 1e-3 (text to YAML) is a rate."""
    s = Spec.from_dict(spec(traces=[{"name": "x", "lr": "1e-3", "hidden": [8]}], plot={
        "x": "bits", "series": "mode", "facet": "workers",
        "panels": [{"y": "iteration_s"}, {"served": True}]}), "s.yaml")
    assert len(plan(s, Path("/tmp/nowhere"))) == 2


def test_plan_opens_each_trace_set_once(monkeypatch):
    """A plan checks every run, but reads a trace set's files once (a 10,000-run grid
    opened it 10,000 times: minutes for a --dry-run)."""
    from qaina_bench.hosts.traces import TraceSet
    opened, real = [], TraceSet.open.__func__
    monkeypatch.setattr(TraceSet, "open", classmethod(
        lambda cls, path: opened.append(path) or real(cls, path)))
    s = Spec.from_dict(spec(grid={"bits": [2, 4, 8], "seed": [1, 2, 3]}), "s.yaml")
    assert len(plan(s, Path("/tmp/nowhere"))) == 9 and len(opened) == 1


def test_points_are_the_cross_product_in_order_with_variants(tmp_path):
    s = Spec.from_dict(spec(grid={"jobs": [1, 2], "scheme": [
        {"label": "b=4", "bits": 4}, {"label": "b=8 unpacked", "bits": 8, "pack": False}]},
        repeats=2), "s.yaml")
    points = s.points()
    assert [p.values for p in points] == [
        {"jobs": 1, "scheme": "b=4"}, {"jobs": 1, "scheme": "b=8 unpacked"},
        {"jobs": 2, "scheme": "b=4"}, {"jobs": 2, "scheme": "b=8 unpacked"}]
    cfg = s.config(points[3], tmp_path, 2)
    assert (cfg.workload.jobs, cfg.workload.bits, cfg.compression.pack, cfg.workload.workers) == (2, [8], False, 2)
    assert cfg.output.run_id == "t-p003-r2" and cfg.output.results_dir == str(tmp_path / "runs")
    assert cfg.workload.seed == 1  # the second repeat


def test_quick_replaces_axes_and_keeps_the_rest():
    data = spec(grid={"bits": [2, 4, 8], "jobs": [1, 2]}, repeats=3,
                quick={"grid": {"bits": [4]}, "repeats": 1, "base": {"iterations": 2}})
    s = Spec.from_dict(data, "s.yaml", quick=True)
    assert s.grid == {"bits": [4], "jobs": [1, 2]} and s.repeats == 1
    assert s.base["iterations"] == 2 and s.base["topo"] == "star"
    assert len(Spec.from_dict(data, "s.yaml").points()) == 6


def test_window_elements_size_the_slots_and_the_pool_refuses_what_does_not_fit(tmp_path):
    # 2 workers: b=4 lanes are 5 bits, 6 per word, 192 values per 32-word slot;
    # unpacked and 32-bit carry 32 values per slot.
    assert slots_for(640, RunConfig.flat(bits=[4], workers=2)) == 4
    assert slots_for(640, RunConfig.flat(bits=[8], workers=2, pack=False)) == 20
    assert slots_for(640, RunConfig.flat(bits=[4], workers=2, payload_words=256)) == 1
    s = Spec.from_dict(spec(base={"topo": "star", "workers": 2, "pool_slots": 64,
                                  "iterations": 1},
                            window_elements=640,
                            grid={"jobs": [1, 4], "bits": [4, 32]}), "s.yaml")
    tasks = plan(s, tmp_path)
    fits = {(t.point.values["jobs"], t.point.values["bits"]): t.refused for t in tasks}
    assert fits[1, 4] is None and fits[4, 4] is None and fits[1, 32] is None
    assert "do not fit a pool of 64 slots" in fits[4, 32]


def test_a_point_that_cannot_run_names_the_point():
    s = Spec.from_dict(spec(grid={"bits": [4, 5, 33]}), "s.yaml")
    with pytest.raises(SweepError, match=r"point 2 \(bits=33\): --bits 33 is not supported"):
        plan(s, Path("/tmp/nowhere"))
    s = Spec.from_dict(spec(grid={"jobs": [None]}), "s.yaml")
    with pytest.raises(SweepError) as err:
        plan(s, Path("/tmp/nowhere"))
    assert str(err.value).count("point 0 (jobs=None)") == 1, err.value


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_specs_plan_in_full_and_quick(path, tmp_path):
    for quick in (False, True):
        s = Spec.load(path, quick=quick)
        tasks = plan(s, tmp_path)
        assert tasks and s.plot and s.plot.get("panels")
        assert any(t.cfg is not None for t in tasks)


def cli(*args, **kw):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, **kw)


def test_cli_errors_are_one_line(tmp_path):
    r = cli("sweep", str(tmp_path / "missing.yaml"))
    assert r.returncode != 0 and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("plot", str(tmp_path))
    assert r.returncode != 0 and "is not a sweep directory" in r.stderr
    assert "Traceback" not in r.stderr
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    r = cli("sweep", str(tmp_path / "bin.yaml"))
    assert "is not text" in r.stderr and "Traceback" not in r.stderr


def test_a_plot_of_more_panels_than_a_figure_takes_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(grid={"bits": [4]}, plot={
        "x": "bits", "panels": [{"y": "iteration_s"}] * 13})))
    r = cli("sweep", "--dry-run", str(path))
    assert r.returncode != 0 and "13 panels; a figure takes at most 12" in r.stderr
    assert "Traceback" not in r.stderr


def test_dry_run_lists_every_run(tmp_path):
    r = cli("sweep", "--dry-run", "--quick", str(EXPERIMENTS / "qaina-jobs.yaml"),
            "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 6 and sum("refused" in line for line in lines) == 2
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("summary, status", [
    ('{"status": "complete"}', "complete"), ("[1, 2]", "unreadable"), ('"complete"', "unreadable"),
    ('{"status": ["complete"]}', "unreadable"), ("{", "unreadable"),
    ('{"status": "complete", "jobs": [1, "x"]}', "unreadable"),
    ('{"status": "complete", "jobs": {"0": {}}}', "unreadable"),
])
def test_a_stored_summary_that_is_not_a_summary_is_a_run_to_redo(tmp_path, summary, status):
    """A resumed sweep reruns a stored run whose summary.json is no JSON object."""
    from qaina_bench.harness.sweeping.sweepcsv import run_row
    from qaina_bench.harness.sweeping.sweep import stored_status
    task = plan(Spec.from_dict(spec(grid={"bits": [4]}), "s.yaml"), tmp_path)[0]
    task.directory.mkdir(parents=True)
    (task.directory / "config.yaml").write_text(task.cfg.to_yaml())
    (task.directory / "summary.json").write_text(summary)
    assert stored_status(task) == status
    if not summary.startswith("{"):  # sweep.csv's row too
        assert run_row(task.directory) == {"status": "no summary"}
    elif '"jobs"' in summary:  # a complete run's summary edited: no metrics read from it
        assert run_row(task.directory) == {"status": "unreadable"}


# -- real sweeps (root, Mininet) ----------------------------------------------------------
needs_mininet = pytest.mark.skipif(shutil.which("mnexec") is None,
                                   reason="needs Mininet (apt-get install mininet)")


def rows(directory: Path) -> list[dict]:
    return list(csv.DictReader(open(directory / "sweep.csv")))


@pytest.mark.slow
@pytest.mark.root
@needs_mininet
def test_sweep_resumes_after_ctrl_c_and_plots(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(
        grid={"bits": [4, 32], "workers": [2]}, repeats=2,
        plot={"x": "bits", "series": "workers",
              "panels": [{"y": "iteration_s", "ylabel": "iteration time (s)"}]})))
    out = tmp_path / "sweep"
    proc = subprocess.Popen(CLI + ["sweep", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    second = out / "runs" / "t-p000-r2" / "config.yaml"
    while time.monotonic() < deadline and not second.exists():
        time.sleep(0.05)
    time.sleep(0.5)  # the second run is under way
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "run the same command again to resume" in stderr
    first = rows(out)
    assert [x["status"] for x in first] == ["complete", "interrupted"]
    r = cli("sweep", str(path), "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "3 to run, 1 already done" in r.stdout
    done = rows(out)
    assert [(x["point"], x["repeat"], x["status"]) for x in done] == [
        ("0", "1", "complete"), ("0", "2", "complete"), ("1", "1", "complete"),
        ("1", "2", "complete")]
    assert {x["bits"] for x in done} == {"4", "32"}
    for x in done:  # the figures against the run's own iteration table
        table = list(csv.DictReader(open(out / "runs" / x["run_id"] / "iterations.csv")))
        times = [float(r["completion_s"]) for r in table]
        span = max(float(r["end"]) for r in table) - min(float(r["start"]) for r in table)
        assert len(table) == 2 and float(x["iteration_s"]) == pytest.approx(sum(times) / 2)
        assert float(x["elements_per_s"]) == pytest.approx(open_trace("digits-mlp").elements / span)
    # the interrupted run was kept under another name, not lost
    kept = out / "runs" / "t-p000-r2.attempt1"
    assert (kept / "config.yaml").exists() and "interrupted" in (kept / "summary.json").read_text()
    again = cli("sweep", str(path), "--out", str(out), timeout=120)
    assert "0 to run" in again.stdout
    p = cli("plot", str(out))
    assert p.returncode == 0, p.stderr
    assert (out / "figures" / "t.png").stat().st_size > 10_000
    table = list(csv.DictReader(open(out / "figures" / "t.csv")))
    assert {(t["x"], t["repeats"]) for t in table} == {("4", "2"), ("32", "2")}
    # another spec may not write into this sweep's directory
    path.write_text(yaml.safe_dump(spec(grid={"bits": [8]})))
    r = cli("sweep", str(path), "--out", str(out))
    assert r.returncode != 0 and "holds the sweep of another spec" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
@pytest.mark.root
@needs_mininet
def test_shipped_quick_sweeps_run_and_plot(path, tmp_path):
    out = tmp_path / "q"
    r = cli("sweep", "--quick", str(path), "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(out)
    assert got and all(x["status"] in ("complete", "refused") for x in got)
    p = cli("plot", str(out))
    assert p.returncode == 0, p.stderr
    assert list((out / "figures").glob("*.png"))


def test_plot_survives_a_hostile_sweep_table(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    s = Spec.from_dict(spec(plot={"x": "bits", "series": "workers",
                                  "panels": [{"y": "iteration_s"}]}), "s.yaml")
    (d / "spec.yaml").write_text(s.to_yaml())
    (d / "sweep.csv").write_text(
        "point,repeat,run_id,status,bits,workers,iteration_s,cpu_saturated\n"
        "0,1,a,complete,4,2,0.5,1\n0,2,b,complete,4,2,oops,x\n1,1,c,complete,32,2,,\n"
        "1,2,d,failed,32,2,9,0\n")
    r = cli("plot", str(d))
    assert r.returncode == 0, r.stderr
    assert "iteration_s" in r.stdout and "n=1" in r.stdout  # only the one good value
    (d / "sweep.csv").write_bytes(b"\xff\xfe\x00garbage")
    r = cli("plot", str(d))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    (d / "sweep.csv").write_text("a,b\n1,2\n")
    r = cli("plot", str(d))
    assert "not a sweep table" in r.stderr


def test_only_timings_are_drawn_hollow():
    """A mark is hollow for each repeat that was not network-bound, but never for a
    count the CPU cannot change (bytes on the fabric, errors)."""
    from qaina_bench.harness.sweeping.figures import marks
    rows = [{"status": "complete", "mode": "ina", "leaves": "2", "fidelity": verdict,
             "iteration_s": "0.2", "switch_link_bytes": "2967000", "rel_error": "0.3"}
            for verdict in ("cpu-bound", "mixed", "network-bound")]
    p = {"x": "leaves", "series": ["mode"]}
    assert [m["hollow"] for m in marks(p, rows, "iteration_s")] == [2]
    assert [m["hollow"] for m in marks(p, rows, "switch_link_bytes")] == [0]
    assert [m["hollow"] for m in marks(p, rows, "rel_error")] == [0]


def plot_dir(tmp_path: Path, table: str, **plot) -> Path:
    """A sweep directory holding ``table`` as its sweep.csv and a spec with ``plot``."""
    d = tmp_path / "s"
    d.mkdir(exist_ok=True)
    plot = {"x": "bits", "series": "workers", "panels": [{"y": "iteration_s"}], **plot}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec(plot=plot)))
    (d / "sweep.csv").write_text("point,repeat,run_id,status,bits,workers,iteration_s,jobs\n"
                                 "0,1,a,complete,4,2,0.5,1\n" + table)
    return d


def test_plot_names_a_damaged_table_or_plot_section_in_one_line(tmp_path):
    from qaina_bench.harness.sweeping.figures import plot_sweep
    r = cli("plot", str(plot_dir(tmp_path, "0,1,complete\n")))  # a row cut short
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"Error: {tmp_path / 's' / 'sweep.csv'}: line 3 has fewer fields than the header: "
        "the table is damaged (running the same `qaina-bench sweep` again rewrites it)"]
    with pytest.raises(SweepError, match="line 3 has more fields"):
        plot_sweep(plot_dir(tmp_path, "1,1,b,complete,32,2,0.7,1,extra\n"), echo=lambda _: None)
    d = plot_dir(tmp_path, "", panels=[{"y": "iteration_s", "scale": "abc"}])
    with pytest.raises(SweepError, match="panel 1: scale must be a number above 0"):
        plot_sweep(d, echo=lambda _: None)
    with pytest.raises(SweepError, match="title must be text"):
        plot_sweep(plot_dir(tmp_path, "", title=[1]), echo=lambda _: None)


def test_plot_leaves_out_values_no_float_holds(tmp_path):
    """1e400 is no number to draw (nor a number of jobs): its repeat is left out."""
    from qaina_bench.harness.sweeping.figures import plot_sweep
    d = plot_dir(tmp_path, "0,2,b,complete,4,2,1e400,1e400\n1,1,c,complete,32,2,0.7,2\n",
                 panels=[{"y": "iteration_s", "logy": True}, {"served": True}])
    printed = []
    plot_sweep(d, echo=printed.append)
    assert sum("n=1" in line for line in printed) == 2 and "jobs served" in printed[-1]
    d = plot_dir(tmp_path, "1,1,c,complete,1e400,2,0.7,2\n", logx=True)
    with pytest.raises(SweepError, match="x column 'bits' holds '1e400', not a number"):
        plot_sweep(d, echo=lambda _: None)



def test_a_plot_section_with_empty_labels_falls_back_to_the_names(tmp_path):
    """``title:``, ``xlabel:`` and ``ylabel:`` left empty (null in YAML) draw the
    spec's name and the columns' names."""
    from qaina_bench.harness.sweeping.figures import plot_sweep
    d = plot_dir(tmp_path, "1,1,c,complete,32,2,0.7,2\n", title=None, xlabel=None,
                 panels=[{"y": "iteration_s", "ylabel": None}])
    plot_sweep(d, echo=lambda _: None)
    assert list((d / "figures").glob("*.png"))


def test_line_series_that_coincide_stay_told_apart():
    """Two series with the same values: each line has its own style and marker in the
    legend, and the later one's marks are smaller, so the one under it still shows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from qaina_bench.harness.sweeping.figures import _panel
    rows = [{"status": "complete", "bits": bits, "mode": mode, "iteration_s": "30.4",
             "fidelity": "network-bound"} for mode in ("b8", "32") for bits in ("1", "2")]
    fig, ax = plt.subplots()
    try:
        _panel(ax, {"x": "bits", "series": ["mode"]}, rows, None, {"y": "iteration_s"})
        handles, labels = ax.get_legend_handles_labels()
        assert labels == ["b8", "32"]
        styles = {(h.get_linestyle(), h.get_marker()) for h in handles}
        assert len(styles) == 2, styles
        sizes = {line.get_color(): line.get_markersize() for line in ax.get_lines()
                 if len(line.get_xdata()) == 1}  # the marks, one per point
        assert len(set(sizes.values())) == 2, sizes
    finally:
        plt.close(fig)
