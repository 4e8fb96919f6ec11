"""`qaina-bench plot` of a sweep.csv whose values are no finite numbers: the runs left
out are named in a warning, a figure left without a mark is one error line and no
file, and a sweep.csv that is no regular file is one line, not a read that never ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from qaina_bench.harness.cli import main
from qaina_bench.harness.sweeping.figures import plot_sweep
from qaina_bench.harness.sweeping.sweep import SweepError

HEADER = "point,repeat,run_id,status,bits,workers,iteration_s,jobs\n"


def sweep_dir(tmp_path: Path, rows: list[str], **plot) -> Path:
    """A sweep directory: a spec whose figure draws ``iteration_s`` over ``bits``, and a
    sweep.csv of ``rows`` (``run_id,status,bits,workers,iteration_s,jobs`` each)."""
    d = tmp_path / "s"
    d.mkdir(parents=True)
    spec = {"name": "t", "base": {"topo": "star", "jobs": 1, "workers": 2, "iterations": 1},
            "grid": {"bits": [4, 32]}, "repeats": 1,
            "plot": {"x": "bits", "series": "workers", "panels": [{"y": "iteration_s"}],
                     **plot}}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    (d / "sweep.csv").write_text(HEADER + "".join(f"{k},1,{row}\n"
                                                  for k, row in enumerate(rows)))
    return d


@pytest.mark.parametrize("value", ["nan", "abc", "inf"])
def test_a_figure_of_values_that_are_no_numbers_is_one_error_and_no_file(tmp_path, value):
    d = sweep_dir(tmp_path, [f"a,complete,4,2,{value},1", f"b,complete,32,2,{value},1"])
    result = CliRunner().invoke(main, ["plot", str(d)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        "Error: plot: nothing to draw, no figure written: iteration_s: 2 run(s) left out, "
        f"their value is not a finite number: a ({value!r}), b ({value!r}) (running the "
        "same `qaina-bench sweep` again rewrites sweep.csv from the runs' summaries)"]
    assert not (d / "figures").exists()


def test_runs_whose_value_is_no_finite_number_are_left_out_with_one_warning(tmp_path):
    d = sweep_dir(tmp_path, ["a,complete,4,2,0.5,1", "b,complete,4,2,inf,1",
                             "c,complete,32,2,nan,1", "d,complete,32,2,0.7,1",
                             "e,failed,32,2,oops,1", "f,complete,32,2,,1"])
    result = CliRunner().invoke(main, ["plot", str(d)])
    assert result.exit_code == 0, result.output
    # a failed run is not drawn anyway, and an empty cell is a metric that does not apply
    assert result.stderr.strip().splitlines() == [
        "warning: iteration_s: 2 run(s) left out, their value is not a finite number: "
        "b ('inf'), c ('nan')"]
    assert sum("n=1" in line for line in result.stdout.splitlines()) == 2
    assert (d / "figures" / "t.png").is_file()


def test_a_served_panel_leaves_out_a_number_of_jobs_that_is_no_number(tmp_path):
    """A run whose ``jobs`` is text is no series that served 0 jobs: it is left out and
    named; with nothing else to draw the figure is refused."""
    d = sweep_dir(tmp_path, ["a,complete,4,2,0.5,2", "b,complete,4,4,0.5,abc"],
                  panels=[{"served": True}])
    warned, printed = [], []
    plot_sweep(d, printed.append, warned.append)
    assert [line.split() for line in printed] == [["jobs", "served", "2:", "2"]]
    assert warned == ["warning: jobs: 1 run(s) left out, their value is not a finite "
                      "number: b ('abc')"]
    d = sweep_dir(tmp_path / "all", ["a,complete,4,2,0.5,nan"], panels=[{"served": True}])
    with pytest.raises(SweepError, match="nothing to draw, no figure written: jobs: 1 run"):
        plot_sweep(d, printed.append, warned.append)


def test_a_panel_left_empty_is_named_while_the_others_are_drawn(tmp_path):
    d = sweep_dir(tmp_path, ["a,complete,4,2,nan,1", "b,complete,32,2,nan,2"],
                  panels=[{"y": "iteration_s"}, {"y": "jobs"}])
    warned = []
    plot_sweep(d, lambda _: None, warned.append)
    assert warned == [
        "warning: iteration_s: 2 run(s) left out, their value is not a finite number: "
        "a ('nan'), b ('nan')",
        "warning: panel 1 (iteration_s) is empty: no finished run has a finite value of it"]


def test_a_sweep_table_that_is_a_pipe_is_one_line_not_a_read_without_end(tmp_path):
    d = sweep_dir(tmp_path, ["a,complete,4,2,0.5,1"])
    (d / "sweep.csv").unlink()
    os.mkfifo(d / "sweep.csv")
    run = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "plot", str(d)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"Error: {d / 'sweep.csv'} is unreadable: not a regular file (a device, a pipe or "
        "a directory)"]
