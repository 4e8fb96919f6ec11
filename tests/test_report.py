"""The metric registry and the docs written from data: README's glossary and the docs'
tables and quoted values match docs/data and the registry, a drift is named, and a
metric added to the registry reaches summary.json, sweep.csv and the CLI's table."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import warnings
import sys
from pathlib import Path

import pytest

from qaina_bench.harness.sweeping import sweepcsv
from qaina_bench.harness.results.metrics import METRICS, Column, Metric, glossary, sweep_columns
from qaina_bench.harness.results.report import FILES, ReportError, check, write
from qaina_bench.harness.results.summary import job_summary
from qaina_bench.harness.results.tables import columns_help, job_head, job_line, startup_line

ROOT = Path(__file__).resolve().parents[1]

#: sweep.csv's metric columns before the registry; plots and readers depend on them
OLD_COLUMNS = ["iteration_s", "steady_iteration_s", "iteration_p99_s", "job_completion_s",
               "job_completion_max_s", "elements_per_s", "fp32_gbps", "slots_peak",
               "register_bit_efficiency", "rel_error", "retransmissions", "bytes_sent",
               "bytes_per_iteration", "steady_bytes_per_iteration", "span_s",
               "cpu_saturated", "fidelity", "cpu_s_per_melem", "cpu_busy", "warnings",
               "jobs_fit", "switch_link_bytes", "turnaround_s", "turnaround_max_s",
               "wait_s", "switch_share"]


def copy_repo(tmp_path: Path) -> Path:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs" / "data", tmp_path / "docs" / "data")
    return tmp_path


def test_the_docs_match_their_data_and_the_registry():
    assert check(ROOT) is None


def test_sweep_csv_keeps_its_columns_in_their_order():
    assert sweep_columns() == OLD_COLUMNS


def test_the_glossary_names_every_metric_column_and_where_it_is_computed():
    text = glossary()
    for column in sweep_columns():
        assert f"`{column}`" in text
    assert "`harness/results/metrics.py:slots_peak`" in text
    assert "harness/running/sampling.py:Sampler._sample_slots" in text  # slots in use
    assert "hosts/agent.py" in text  # the per-iteration error


def _drift(text: str, pattern: str) -> tuple[str, str]:
    """The first match of ``pattern`` (its group 1 a number) in ``text``, and the same
    with the number's last digit changed."""
    m = re.search(pattern, text)
    assert m, pattern
    number = m.group(1)
    last = str((int(number[-1]) + 1) % 10)
    return m.group(0), m.group(0).replace(number, number[:-1] + last, 1)


@pytest.mark.parametrize("pattern, named", [
    (r"ring <!-- value:ring_mean -->([\d.]+)<", "value ring_mean"),
    (r"\| 4 \| 4 \| ([\d.]+) s, network-bound", "table:links"),
])
def test_a_number_that_drifts_from_its_data_is_named(tmp_path, pattern, named):
    root = copy_repo(tmp_path)
    path = root / "docs" / "results.md"
    text = path.read_text()
    old, new = _drift(text, pattern)
    path.write_text(text.replace(old, new))
    assert check(root) == f"docs/results.md: {named} differs from its data"
    assert write(root) == [f"docs/results.md: {named}"]
    assert path.read_text() == text and check(root) is None


def test_a_changed_data_file_changes_the_docs(tmp_path):
    root = copy_repo(tmp_path)
    ratio = root / "docs" / "data" / "ratio.csv"
    with open(ratio, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[1]["ring_ms"] = "900.0"
    with open(ratio, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert check(root) == "docs/results.md: table:ratio differs from its data"
    assert write(root)[0].startswith("docs/results.md: table:ratio, value ring_mean")
    text = (root / "docs" / "results.md").read_text()
    mean = sum(float(r["ring_ms"]) for r in rows) / len(rows)
    assert f"<!-- value:ring_mean -->{mean:.1f}<!-- /value -->" in text
    assert f"| 2 | {float(rows[1]['in_network_ms']):.1f} ms, " in text
    assert f"| 900.0 ms, {rows[1]['ring_verdict']} |" in text


def test_a_marker_nothing_makes_is_one_error(tmp_path):
    root = copy_repo(tmp_path)
    (root / "docs" / "performance.md").write_text("<!-- value:nothing -->1<!-- /value -->\n")
    with pytest.raises(ReportError, match="no value called 'nothing'"):
        check(root)


def test_report_check_exits_non_zero_with_one_line(tmp_path):
    root = copy_repo(tmp_path)
    cli = [sys.executable, "-m", "qaina_bench.harness.cli"]
    ok = subprocess.run(cli + ["report", "--check", "--root", str(root)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    path = root / "docs" / "compression.md"
    path.write_text(path.read_text().replace("| b=4 maxpow2 | 0.194", "| b=4 maxpow2 | 0.195"))
    bad = subprocess.run(cli + ["report", "--check", "--root", str(root)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "Error: docs/compression.md: table:compression-resnet differs from its data: run "
        "`qaina-bench report`"]


@pytest.fixture
def extra_metric():
    """A metric registered in-process, as an entry point of qaina_bench.metrics would."""
    metric = Metric("chunks_per_worker", "chunks", "chunks a worker sent per iteration",
                    lambda d: sum(r["chunks"] for r in d.rows) / len(d.rows),
                    sweep=(("chunks_total", "sum"),), table=Column("chunks", 6, ".1f"))
    METRICS.add(metric.name, metric, "test")
    yield metric
    del METRICS._items[metric.name], METRICS._origin[metric.name]


JOB = {"job_id": 1, "index": 0, "bits": 4, "workers": 2, "lanes": 5, "lane_width": 6,
       "payload_words": 32, "slots": 8}
ROWS = [{"job": 1, "worker": w, "iteration": 0, "start": 1.0, "end": 2.0 + w,
         "completion_s": 1.0 + w, "elements": 100, "values": 100, "rel_error": 0.1,
         "retransmissions": 0, "timeouts": 0, "refused": 0, "clipped": 0,
         "bytes_sent": 10, "bytes_received": 10, "chunks": 3 + w} for w in (0, 1)]


def test_a_plugin_metric_reaches_summary_sweep_csv_and_the_table(extra_metric, tmp_path):
    s = job_summary(JOB, ROWS, [], "s1", [])
    assert s["chunks_per_worker"] == 3.5
    assert sweepcsv.columns([])[-1] == "chunks_total"
    (tmp_path / "summary.json").write_text(json.dumps(
        {"status": "complete", "jobs": [s, dict(s, chunks_per_worker=1.5)]}))
    row = sweepcsv.run_row(tmp_path)
    assert row["chunks_total"] == 5.0 and row["elements_per_s"] == pytest.approx(100 / 2.0 * 2)
    assert job_head().endswith("chunks") and job_line(s).endswith("   3.5")
    assert "chunks chunks a worker sent" in " ".join(columns_help().split())
    assert "`chunks_per_worker`" in glossary()


def test_the_job_table_says_n_a_for_what_does_not_apply():
    s = job_summary(JOB, ROWS, [], None, [])  # ring: the switches only route
    assert s["slots_peak"] is None and s["register_bit_efficiency"] is None
    line = job_line(s)
    assert len(line) == len(job_head()) and line.count("n/a") == 3


def test_the_startup_line_says_where_the_time_before_the_first_packet_went():
    summary = {"startup_to_first_send_s": 11.0,
               "events": {"invoked": 100.0, "network_up": 101.5, "programmed": 101.5,
                          "agents_go": 110.9}}
    assert startup_line(summary) == (
        "first packet 11.0 s after start: network up 1.5 s, switches programmed 0.0 s, "
        "agents ready 9.4 s, first send 0.1 s")
    del summary["events"]["programmed"]  # a step a run did not record is left out
    assert startup_line(summary).endswith("network up 1.5 s, agents ready 9.4 s, "
                                          "first send 0.1 s")
    assert startup_line({"startup_to_first_send_s": 2.0}) == "first packet 2.0 s after start"


@pytest.mark.parametrize("name, old, new, message", [
    ("README.md", "<!-- /metrics -->", "",
     "README.md: <!-- metrics --> has no closing <!-- /metrics -->"),
    ("docs/results.md", "<!-- /table:links -->", "",
     "docs/results.md: <!-- table:links --> has no closing <!-- /table:links -->"),
    ("docs/results.md", "<!-- table:links -->", "",
     "docs/results.md: <!-- /table:links --> has no opening <!-- table:links -->"),
    ("docs/results.md", "<!-- /value -->", "",
     "docs/results.md: <!-- value:qaina_1job_b8 --> has no closing <!-- /value -->"),
])
def test_a_marker_without_its_partner_is_named(tmp_path, name, old, new, message):
    """A block or value whose closing marker was lost is not skipped as if it matched."""
    root = copy_repo(tmp_path)
    path = root / name
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(ReportError) as err:
        check(root)
    assert str(err.value) == message


def test_report_check_names_a_lost_closing_marker_in_one_line(tmp_path):
    root = copy_repo(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("<!-- /metrics -->", ""))
    r = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "report", "--check",
                        "--root", str(root)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "Error: README.md: <!-- metrics --> has no closing <!-- /metrics -->"]


def _damage(path: Path, how: str):
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "header only":
        path.write_bytes(data.split(b"\n")[0] + b"\n")
    elif how == "cut short":  # in the last row's last field but one
        path.write_bytes(data[:data.rstrip(b"\n").rfind(b",")])
    elif how == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256)))
    elif how == "a pipe":  # a read that never ends
        path.unlink()
        os.mkfifo(path)
    elif how == "a link to a device":  # a read that never ends, filling memory
        path.unlink()
        path.symlink_to("/dev/zero")


def _first_problem(root: Path) -> str:
    """What ``report --check`` says first, with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return check(root)
        except ValueError as exc:
            return str(exc)


@pytest.mark.parametrize("csv_name", ["ratio", "qaina-jobs", "compression-resnet", "headline"])
@pytest.mark.parametrize("how, fragment", [
    ("empty", "is empty"), ("header only", "has a header but no rows"),
    ("cut short", "(cut short or damaged)"), ("binary", "is not a CSV table"),
    ("a pipe", "not a regular file"), ("a link to a device", "not a regular file"),
])
def test_a_damaged_data_file_is_named_in_one_line(tmp_path, csv_name, how, fragment):
    """Truncated, empty or binary CSVs name the file, in one line, without a numpy
    warning."""
    root = copy_repo(tmp_path)
    _damage(root / "docs" / "data" / f"{csv_name}.csv", how)
    first = _first_problem(root)
    assert f"{csv_name}.csv" in first and fragment in first and "\n" not in first


def test_a_data_file_without_the_rows_a_table_needs_is_named(tmp_path):
    """Not a bare ``max() arg is an empty sequence``: the table and its CSV."""
    root = copy_repo(tmp_path)
    path = root / "docs" / "data" / "qaina-jobs.csv"
    path.write_text(path.read_text().replace(",complete,", ",failed,"))
    first = _first_problem(root)
    assert first.startswith("docs/results.md: table:qaina-jobs: ") and "\n" not in first
    assert "docs/data/qaina-jobs.csv" in first and "docs/data/README.md" in first
