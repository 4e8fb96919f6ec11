"""`results list` and `results show` of result sets written by another tool or by hand:
listed by when they started, values of the wrong type shown as n/a with one warning,
bidirectional controls made harmless; and a summary.json is always valid JSON."""

from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner

from qaina_bench.harness.cli import main
from qaina_bench.harness.results.summary import job_summary

JOB = {"job_id": 1, "index": 0, "bits": 4, "workers": 2, "lanes": 5, "lane_width": 6,
       "payload_words": 32, "slots": 8}
ROWS = [{"job": 1, "worker": w, "iteration": 0, "start": 1.0, "end": 2.0 + w,
         "completion_s": 1.0 + w, "elements": 100, "values": 100, "rel_error": 0.1,
         "retransmissions": 0, "timeouts": 0, "refused": 0, "clipped": 0,
         "bytes_sent": 10, "bytes_received": 10} for w in (0, 1)]


def run_cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def result_set(directory, **summary):
    """A result set in ``directory``: its config.yaml and a summary.json of ``summary``
    (NaN written as JSON's NaN, as another tool might)."""
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text("topo: star\n")
    body = {"run_id": directory.name, "status": "complete", "topology": "star",
            "target": "embedded", "jobs": [], **summary}
    (directory / "summary.json").write_text(json.dumps(body))
    return directory


def test_results_list_puts_the_newest_run_last(tmp_path):
    """By when each run started: its summary's start, else (no summary yet, or one
    without it) its folder's last change; not by name."""
    result_set(tmp_path / "a-newest", events={"invoked": 3000.0})
    result_set(tmp_path / "b-oldest", events={"invoked": 1000.0})
    result_set(tmp_path / "c-between", events={"invoked": "soon"})  # not a time: mtime
    going = tmp_path / "d-going"  # a run still going: no summary yet
    going.mkdir()
    (going / "config.yaml").write_text("topo: star\n")
    os.utime(tmp_path / "c-between", (1500, 1500))
    os.utime(going, (2000, 2000))
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path))
    assert code == 0, out
    assert [line.split()[0] for line in out.splitlines()] == [
        "b-oldest", "c-between", "d-going", "a-newest"]


@pytest.mark.parametrize("field, value, cell, why", [
    ("iterations_done", math.nan, "n/a", "nan (not a finite number)"),
    ("retransmissions", "abc", "n/a", "'abc' (not a number)"),
    ("retransmissions", 1.5, "n/a", "1.5 (not a whole number)"),
    ("iteration_completion_mean_s", [1], "n/a", "[1] (not a number)"),
    ("job_completion_s", -1.0, "-1.00", "-1.0 (below 0)"),
    ("bits", None, "n/a", None),
])
def test_results_show_prints_values_of_the_wrong_type_as_n_a_with_a_warning(
        tmp_path, field, value, cell, why):
    job = dict(job_summary(JOB, ROWS, [], "s1", []), **{field: value})
    run = result_set(tmp_path / "r", jobs=[job])
    code, out = run_cli("results", "show", str(run))
    assert code == 0 and "Traceback" not in out, out
    lines = out.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith("job "))
    row = lines[head + 1]
    assert len(row) == len(lines[head]), (lines[head], row)
    assert row.split()[0] == "1" and cell in row.split()
    warnings = [line for line in lines if "holds values of the wrong type" in line]
    if why is None:  # None is n/a: not a value of the wrong type
        assert not warnings
        return
    assert warnings == [f"warning: {run / 'summary.json'} holds values of the wrong type or "
                        f"range (shown as n/a, one below 0 as it is): jobs[0].{field} = {why}"]
    assert "columns: job;" in out  # the whole table, then what its columns mean


def test_a_job_without_iterations_and_odd_values_is_still_one_row(tmp_path):
    run = result_set(tmp_path / "r", jobs=[{"job_id": "1\u202e", "bits": math.inf}])
    code, out = run_cli("results", "show", str(run))
    assert code == 0 and "n/a n/a  no iteration completed" in out, out
    assert "jobs[0].job_id = '1\\u202e' (not a number); jobs[0].bits = inf" in out


@pytest.mark.parametrize("control", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e",
                                     "\u200f", "\u061c"])
def test_results_show_and_list_never_print_a_bidi_control(tmp_path, control):
    """A bidirectional control (U+202E writes the rest of the line right to left) would
    make a run id read as another: shown as ``?``, as a control character is."""
    job = dict(job_summary(JOB, ROWS, [], "s1", []),
               fidelity={"verdict": "network-bound", "reason": f"links{control}x"})
    run = result_set(tmp_path / "r", run_id=f"a{control}b", trace=f"t{control}",
                     jobs=[job], fidelity={"verdict": "network-bound"})
    for args in (["results", "show", str(run)],
                 ["results", "list", "--results-dir", str(tmp_path)]):
        code, out = run_cli(*args)
        assert code == 0 and control not in out, out
    assert "a?b: complete" in run_cli("results", "show", str(run))[1]
    assert "links?x" in run_cli("results", "show", str(run))[1]


def test_a_summary_with_numbers_that_are_not_finite_is_written_as_valid_json(tmp_path):
    """NaN and infinity are no JSON: written as null (n/a), as a strict reader needs."""
    from qaina_bench.harness.results.summary import write_summary
    path = tmp_path / "summary.json"
    write_summary(path, {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}],
                         "d": (2, "x"), "e": None})

    def refuse(name):
        raise ValueError(f"{name} in {path}")
    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "a": None, "b": [1.5, None, {"c": None}], "d": [2, "x"], "e": None}
