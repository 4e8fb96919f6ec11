"""The benchmarks' CSV output (what ``docs/data`` is made from), through the CLI."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "qaina_bench.harness.cli", "bench"]


def run(args, cwd, timeout=600):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table_rows(tmp_path, table: str, *args) -> tuple[list[dict], str]:
    """One run of each point of ``bench testbed --table TABLE``: its CSV rows and what
    it printed."""
    path = tmp_path / f"{table}.csv"
    out = run(["testbed", "--table", table, "--iterations", "1", "--repeat", "1", *args,
               "--csv", str(path)], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return rows(path), out.stdout


def test_testbed_csv_needs_exactly_one_table(tmp_path):
    out = run(["testbed", "--csv", str(tmp_path / "x.csv")], tmp_path)
    assert out.returncode == 2
    assert "--csv writes one table" in out.stderr
    out = run(["testbed", "--table", "transport", "--csv", str(tmp_path / "x.csv")], tmp_path)
    assert out.returncode == 2 and "ratio, cost, headline" in out.stderr
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.root
def test_switch_csv_has_a_row_per_point_with_the_range_of_its_runs(tmp_path):
    path = tmp_path / "switch.csv"
    out = run(["switch", "--bits", "4", "--rate", "2000", "--rate", "4000", "--seconds",
               "1", "--repeat", "2", "--csv", str(path)], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    got = rows(path)
    assert [(r["target"], r["bits"], r["runs"]) for r in got] == [("embedded", "4", "2")] * 2
    for r, rate in zip(got, (2000, 4000)):
        offered, agg = int(r["offered_pps"]), int(r["aggregated_pps"])
        assert 0.5 * rate < offered < 1.2 * rate  # (a busy machine's sender falls behind)
        # (a run aggregates at most what it was offered; the row's offered is the mean)
        assert int(r["aggregated_min"]) <= agg <= int(r["aggregated_max"]) <= 1.02 * offered
        assert agg > 0.5 * offered  # far below the switch's peak: nearly all of it
        assert r["peak_pps"] == ""  # rates given: no overload point
        assert (r["switch_cpu"], r["throttled"]) == ("", "0")  # a whole core, never stopped
        # the printed table has the same mean
        assert f"{agg:,}" in out.stdout


@pytest.mark.root
def test_switch_cpu_limits_the_switch_and_leaves_no_cgroup(tmp_path):
    """--switch-cpu puts the switch in a cgroup of its own whose CFS bandwidth stops
    it once its share is used up (counted in cpu.stat), and removes it afterwards."""
    from pathlib import Path
    path = tmp_path / "switch.csv"
    before = set(Path("/sys/fs/cgroup/cpu").glob("qaina-bench-*"))
    out = run(["switch", "--bits", "4", "--rate", "100000", "--seconds", "1",
               "--switch-cpu", "0.1", "--csv", str(path)], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the switch gets 0.1 of its core (CFS bandwidth: 1 ms of CPU time per 10 ms)" \
        in out.stdout
    (row,) = rows(path)
    assert row["switch_cpu"] == "0.1"
    # 100 kpps take the switch far more than 1 ms of every 10: the limit stopped it
    assert int(row["throttled"]) > 0
    assert set(Path("/sys/fs/cgroup/cpu").glob("qaina-bench-*")) == before


@pytest.mark.root
@pytest.mark.slow
def test_ratio_csv_has_a_row_per_run_with_both_modes_and_their_verdicts(tmp_path):
    (row,), printed = table_rows(tmp_path, "ratio", "--ratio-trace", "digits-mlp")
    assert row["run"] == "1"
    for name, mode in (("in_network", "ina"), ("ring", "ring")):
        ms = float(row[f"{name}_ms"])
        assert f"run 1 {mode:>4}: iteration {ms:.1f} ms" in printed
        assert row[f"{name}_verdict"] in ("network-bound", "cpu-bound", "mixed", "n/a")


@pytest.mark.root
@pytest.mark.slow
def test_headline_csv_has_a_row_per_run_and_window_with_the_switch_cost(tmp_path):
    got, printed = table_rows(tmp_path, "headline", "--headline-trace", "digits-mlp",
                                 "--slots", "8", "--slots", "64")
    assert [(r["mode"], r["slots"]) for r in got] == [("ina", "8"), ("ina", "64"),
                                                      ("ring", "")]
    for r in got:
        assert float(r["melem_s_per_job"]) > 0 and float(r["agents_s_per_melem"]) > 0
        assert r["verdict"] == "cpu-bound"  # unshaped links
    assert float(got[0]["switches_s_per_melem"]) > 0  # the switch aggregates
    assert "ina, 8 slots:" in printed and "ina, 64 slots:" in printed


@pytest.mark.root
@pytest.mark.slow
def test_sampling_csv_compares_the_sampler_intervals_on_the_same_runs(tmp_path):
    got, printed = table_rows(tmp_path, "sampling", "--variants-trace", "digits-mlp")
    assert [(r["bw_mbit"], r["sampling"]) for r in got] == [
        ("16.0", "10 ms"), ("16.0", "100 ms"), ("unshaped", "10 ms"), ("unshaped", "100 ms")]
    assert [float(r["slot_interval_target_s"]) for r in got] == [0.01, 0.1] * 2
    for r in got:  # (how far apart they came depends on the machine's load)
        assert float(r["melem_s"]) > 0 and float(r["harness_s_per_melem"]) > 0
        assert float(r["slot_interval_s"]) > 0
    assert "100 ms: " in printed and "slot reads" in printed


def test_codec_prints_the_reference_and_the_kernels_per_format():
    from click.testing import CliRunner
    from qaina_bench.harness.cli import main
    res = CliRunner().invoke(main, ["bench", "codec", "--bits", "4", "--bits", "32",
                                    "--workers", "8", "--payload-words", "256",
                                    "--repeats", "1"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "chunks of 256 words" in lines[0]
    assert lines[1].split()[1:] == ["encode", "decode", "kernel", "encode", "kernel", "decode",
                                    "exponents", "random"]
    for line, fmt in zip(lines[2:], ("b=4 n=8: w=7 m=4", "b=32 n=8: w=32 m=1")):
        assert line.startswith(fmt)
        cells = line[len(fmt):].split()
        assert len(cells) == 12  # six "MB/s (ns)" pairs
        for mbs, ns in zip(cells[::2], cells[1::2]):  # the two agree: 4 bytes an element
            # to their printed precision: MB/s whole (+-0.5), ns to a tenth (+-0.05)
            low, high = 4e3 / (float(mbs) + 0.5), 4e3 / max(float(mbs) - 0.5, 0.5)
            assert low - 0.051 <= float(ns.strip("()")) <= high + 0.051, (mbs, ns)


@pytest.mark.root
def test_floor_measures_a_datagram_and_the_kernels_and_leaves_nothing(tmp_path):
    """The datagrams crossed between two namespaces and were answered, through UDP
    sockets and through PACKET_MMAP rings; each format's floor is its packets' share
    plus its kernels', from the printed cost per chunk; the veth pairs, the endpoints
    and the records are gone afterwards."""
    from qaina_bench.harness.running.record import record_dir
    before = set(record_dir().glob("*.json")) if record_dir().exists() else set()
    out = run(["floor", "--bits", "4", "--workers", "4", "--workers", "8", "--count", "3000",
               "--repeat", "2"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    chunk_us = {}
    for line, method in zip(lines[:2], ("sockets", "rings")):
        assert line.startswith(f"{method}: a 1036-byte datagram (256 words)"), line
        assert "3000 with 32 in flight, 2 run(s)" in line and "lost 0" in line, line
        chunk_us[method] = float(line.split("the worker ")[1].split()[0])
        assert 0.5 < chunk_us[method] < 10_000
    for line, (fmt, elements, n) in zip(lines[3:5], (("b=4 n=4: w=6 m=5", 1280, 4),
                                                     ("b=4 n=8: w=7 m=4", 1024, 8))):
        assert line.startswith(fmt), line
        cells = line[len(fmt):].split()
        assert int(cells[0]) == elements
        encode, decode, kernels, *by_method = map(float, cells[1:])
        assert encode > 0 and decode > 0
        assert kernels == pytest.approx(n * (encode + decode) / 1e3, rel=0.05, abs=0.002)
        for method, (packets, floor) in zip(chunk_us, zip(by_method[::2], by_method[1::2])):
            assert packets == pytest.approx(n * chunk_us[method] / elements, rel=0.02,
                                            abs=0.002)
            assert floor == pytest.approx(packets + kernels, abs=0.0015)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in links.splitlines()]
    assert not [n for n in names if re.fullmatch(r"qb\d+f[wp]", n)], names
    after = set(record_dir().glob("*.json")) if record_dir().exists() else set()
    assert after <= before


@pytest.mark.root
@pytest.mark.slow
def test_ctrl_c_stops_a_testbed_benchmark_after_tearing_its_run_down(tmp_path):
    """Ctrl-C ends the run under way (torn down as `up` does) and the whole benchmark,
    not just that run: exit 130, one line, no later run, nothing left."""
    import os
    import signal
    import time
    records = tmp_path / "records"
    env = dict(os.environ, QAINA_RECORD_DIR=str(records))
    proc = subprocess.Popen(CLI + ["testbed", "--table", "headline", "--iterations", "1",
                                   "--repeat", "3", "--headline-trace", "digits-mlp"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(records.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the first run's record: its network is coming up
    assert list(records.glob("*.json")), "no run started"
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "interrupted: the benchmark stopped" in err and "Traceback" not in err
    assert "run 1" not in out and "run 2" not in out  # no run finished, none after
    assert not list(records.glob("*.json"))  # the run's record removed with what it listed


@pytest.mark.root
@pytest.mark.slow
def test_scale_csv_has_a_row_per_run_and_the_printed_spread(tmp_path):
    path = tmp_path / "scale.csv"
    out = run(["scale", "--workers", "4", "--iterations", "1", "--repeat", "2", "--bw", "20",
               "--results-dir", str(tmp_path / "runs"), "--csv", str(path)], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    got = rows(path)
    assert [(r["run"], r["where"], r["workers"], r["bw_mbit"]) for r in got] == \
        [("1", "this machine", "4", "20.0"), ("2", "this machine", "4", "20.0")]
    for r in got:
        assert float(r["bring_up_s"]) > 0 and float(r["job_s"]) > 0
        assert float(r["agents_ready_s"]) > 0
        assert float(r["cpu_s_per_melem"]) > 0 and r["verdict"]
    times = [float(r["job_s"]) for r in got]
    assert f"job s {sum(times) / 2:.2f} ({min(times):.2f}-{max(times):.2f})" in out.stdout


@pytest.mark.parametrize("args, fragment", [
    (["switch", "--rate", "-5"], "'--rate': -5.0 is not in the range 100<=x<=10000000"),
    (["switch", "--seconds", "0"], "'--seconds': 0.0 is not in the range 0.1<=x<=3600"),
    (["switch", "--repeat", "0"], "'--repeat': 0 is not in the range 1<=x<=100"),
    (["switch", "--bits", "9"], "'--bits': '9' is not one of"),
    (["switch", "--switch-cpu", "2"], "'--switch-cpu': 2.0 is not in the range 0.05<=x<=1.0"),
    (["testbed", "--bw", "0"], "'--bw': 0.0 is not in the range 0.001<=x<=1000"),
    (["testbed", "--iterations", "0"], "'--iterations': 0 is not in the range x>=1"),
    (["testbed", "--slots", "0"], "'--slots': 0 is not in the range 1<=x<=512"),
    (["scale", "--workers", "0"], "'--workers': 0 is not in the range 1<=x<=32"),
    (["scale", "--bw", "-1"], "'--bw': -1.0 is not in the range 0.001<=x<=1000"),
    (["codec", "--repeats", "0"], "'--repeats': 0 is not in the range 1<=x<=1000"),
])
def test_bad_benchmark_options_are_one_line(args, fragment):
    from click.testing import CliRunner
    from qaina_bench.harness.cli import main
    res = CliRunner().invoke(main, ["bench"] + args)
    assert res.exit_code == 2 and fragment in res.output and "Traceback" not in res.output


def test_a_failed_run_counts_in_no_mean_and_shows_in_the_verdicts():
    from qaina_bench.harness.benchmarks.testbedbench import _cost_row, cost_figures
    done = {"complete": True, "status": "complete", "fidelity": {"verdict": "cpu-bound"},
            "jobs": [{"elements_per_s": 2e6}, {"elements_per_s": 4e6}],
            "cpu_cost": {"s_per_melem": 0.5, "components": {"agents": {"s_per_melem": 0.3}}}}
    failed = {"complete": False, "status": "error", "jobs": [{"elements_per_s": None}]}
    runs = [cost_figures(done), cost_figures(failed)]
    assert runs[0]["melem_s"] == 6.0 and runs[0]["melem_s_per_job"] == 3.0
    row = _cost_row((None, 4, "ina"), runs)
    assert (row["melem_s_mean"], row["melem_s_min"], row["total_mean"]) == (6.0, 6.0, 0.5)
    assert row["verdicts"] == "cpu-bound 1; error 1"


def invoke(args, monkeypatch, euid=None):
    """``qaina-bench bench ARGS`` in this process (as user ``euid`` if given): exit code
    and what it printed."""
    from click.testing import CliRunner
    from qaina_bench.harness.cli import main
    if euid is not None:
        monkeypatch.setattr("os.geteuid", lambda: euid)
    res = CliRunner().invoke(main, ["bench"] + args)
    return res.exit_code, res.output


def one_error_line(out: str) -> str:
    """The one ``Error:`` line of ``out`` (no traceback, no argparse usage)."""
    assert "Traceback" not in out and "usage:" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, out
    return errors[0]


@pytest.mark.parametrize("args, fragment", [
    (["switch", "--seconds", "1e-9", "--bits", "4"], "'--seconds': 1e-09 is not in the range"),
    (["switch", "--seconds", "1e9"], "'--seconds': 1000000000.0 is not in the range"),
    (["switch", "--rate", "1e-300"], "'--rate': 1e-300 is not in the range"),
    (["switch", "--rate", "1e300"], "'--rate': 1e+300 is not in the range"),
    (["switch", "--rate", "nan"], "'nan' is not a finite number"),
    (["switch", "--rate", "500", "--seconds", "0.2"], "fewer than one burst of 128"),
    (["switch", "--repeat", "100000"], "'--repeat': 100000 is not in the range"),
    (["testbed", "--repeat", "100000"], "'--repeat': 100000 is not in the range"),
    (["testbed", "--bw", "1e-300"], "'--bw': 1e-300 is not in the range 0.001<=x<=1000"),
    (["testbed", "--ratio-bw", "1e9"], "'--ratio-bw': 1000000000.0 is not in the range"),
    (["testbed", "--table", "headline", "--slots", "5000"], "'--slots': 5000 is not in the"),
    (["testbed", "--iterations", "500"], "--iterations 500: trace digits-mlp has"),
    (["control", "--repeat", "10000000"], "'--repeat': 10000000 is not in the range"),
    (["scale", "--workers", "100000"], "'--workers': 100000 is not in the range 1<=x<=32"),
    (["scale", "--iterations", "3"], "'--iterations': 3 is not in the range 1<=x<=2"),
    (["scale", "--repeat", "100000"], "'--repeat': 100000 is not in the range"),
    (["scale", "--bw", "1e-300"], "'--bw': 1e-300 is not in the range 0.001<=x<=1000"),
    (["codec", "--repeats", "10000000"], "'--repeats': 10000000 is not in the range"),
])
def test_numeric_options_out_of_range_are_refused_before_anything_starts(args, fragment,
                                                                        monkeypatch, tmp_path):
    """Refused before the root check (as a user: nothing could start), in one line
    naming the option given (`scale --workers` once blamed a --topo no one gave)."""
    monkeypatch.chdir(tmp_path)
    code, out = invoke(args, monkeypatch, euid=1000)
    assert code != 0 and fragment in one_error_line(out), out
    assert "needs root" not in out and "--topo" not in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("table, option", [("ratio", "--ratio-trace"),
                                           ("headline", "--headline-trace"),
                                           ("coalescing", "--variants-trace"),
                                           ("sampling", "--variants-trace")])
def test_an_unknown_trace_set_is_one_line(table, option, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out = invoke(["testbed", "--table", table, option, "nosuch"], monkeypatch, euid=1000)
    line = one_error_line(out)
    assert code == 1 and line.startswith(f"Error: {option} nosuch: no trace set 'nosuch'")
    assert "qaina-bench traces record" in line


def test_a_trace_set_of_too_few_workers_is_refused_by_its_option(monkeypatch):
    code, out = invoke(["testbed", "--table", "ratio", "--ratio-trace", "digits-mlp-1m"],
                       monkeypatch, euid=1000)
    assert code == 1 and "--ratio-trace digits-mlp-1m: the ratio table runs 8 workers" \
        in one_error_line(out)


@pytest.mark.parametrize("args, fragment", [
    (["--table", "transport", "--bw", "16"], "--bw is used by the repeat and comparison"),
    (["--table", "transport", "--bw", "5"], "--bw is used by the repeat and comparison"),
    (["--table", "transport", "--repeat", "2"], "--repeat is used by the repeat, ratio"),
    (["--table", "cost", "--slots", "8"], "--slots is used by the headline table only"),
    (["--table", "headline", "--ratio-bw", "2"], "--ratio-bw is used by the ratio table"),
    (["--table", "ratio", "--mode", "ring"], "--mode is used by the cost table only"),
    (["--table", "ratio", "--workers", "4"], "--workers is used by the cost table only"),
    (["--table", "cost", "--variants-trace", "x"], "by the coalescing and sampling tables"),
])
def test_an_option_no_chosen_table_takes_is_refused(args, fragment, monkeypatch):
    code, out = invoke(["testbed", *args], monkeypatch, euid=1000)
    line = one_error_line(out)
    assert code == 2 and fragment in line and "add --table" in line, line


@pytest.mark.parametrize("command", ["switch", "testbed", "control", "scale", "floor"])
def test_a_user_is_told_root_is_needed_in_one_line_before_any_work(command, monkeypatch,
                                                                   tmp_path):
    """Not argparse's usage (which listed 3 of the 5 commands), nothing recorded
    (`scale` recorded a 1.2 MB trace) and no table header first."""
    monkeypatch.chdir(tmp_path)
    code, out = invoke([command], monkeypatch, euid=1000)
    assert code == 1
    assert one_error_line(out) == (f"Error: qaina-bench bench {command} needs root (veth "
                                   "pairs, raw sockets, Mininet): run it with sudo")
    assert out.startswith("Error") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["switch"], ["testbed", "--table", "ratio"], ["scale"]])
def test_an_unwritable_csv_is_one_line_before_any_work(command, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out = invoke([*command, "--csv", str(tmp_path / "no" / "x.csv")], monkeypatch,
                       euid=0)
    assert code == 1 and one_error_line(out) == \
        f"Error: --csv {tmp_path / 'no' / 'x.csv'}: no such directory"
    assert list(tmp_path.iterdir()) == []


def test_a_results_dir_that_is_a_file_is_one_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("hi\n")
    code, out = invoke(["scale", "--results-dir", str(tmp_path / "afile"), "--workers", "2"],
                       monkeypatch, euid=0)
    assert code == 1 and one_error_line(out) == (
        f"Error: --results-dir {tmp_path / 'afile'}: {tmp_path / 'afile'} is not a "
        "directory: name a directory (made if missing)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.root
def test_floor_whose_interface_name_is_taken_is_one_line_and_leaves_it(monkeypatch):
    """A pair left by a benchmark killed before (here another of the same name): one
    line saying so and what removes it; the interface that was there stays."""
    import os
    taken = f"qb{os.getpid() % 10000}fw"
    subprocess.run(["ip", "link", "add", taken, "type", "veth", "peer", "name",
                    f"qbt{os.getpid() % 10000}"], check=True)
    try:
        code, out = invoke(["floor", "--count", "1000", "--repeat", "1"], monkeypatch)
        assert code == 1
        line = one_error_line(out)
        assert line.startswith(f"Error: bench floor: ip link add {taken} type veth"), line
        assert "exists" in line and "qaina-bench clean" in line, line
        assert subprocess.run(["ip", "link", "show", taken], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", taken], capture_output=True)


def test_the_benchmarks_help_lists_all_six(monkeypatch):
    code, out = invoke(["--help"], monkeypatch)
    assert code == 0 and all(c in out for c in ("switch", "codec", "testbed", "control",
                                                "scale", "floor"))
    mod = subprocess.run([sys.executable, "-m", "qaina_bench.harness.benchmarks.bench",
                          "--help"], capture_output=True, text=True, timeout=120)
    assert mod.returncode == 0, mod.stderr
    assert all(c in mod.stdout for c in ("switch", "codec", "testbed", "control", "scale"))


def test_a_run_the_options_cannot_make_and_a_failed_csv_are_the_clis_error_line():
    """What a run refuses (ConfigError) is exit 1, a --csv that could not be written
    after the runs keeps the printed table: one line each, as the rest of the CLI."""
    import click
    from qaina_bench.harness.benchmarks.benchchecks import benchmark_errors
    from qaina_bench.harness.config import ConfigError
    from qaina_bench.harness.results.resultset import OutputError
    with pytest.raises(click.ClickException, match="^--slots 5000: a job needs"):
        with benchmark_errors("nothing written"):
            raise ConfigError("--slots 5000: a job needs more slots")
    with pytest.raises(click.ClickException, match="full; the table above is what was"):
        with benchmark_errors("nothing written"):
            raise OutputError("cannot write x.csv: disk full")
