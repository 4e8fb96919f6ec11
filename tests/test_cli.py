"""Bad input to the CLI gets one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from qaina_bench.harness import config as config_mod
from qaina_bench.harness.cli import main
from qaina_bench.harness.config import ConfigError, RunConfig


def run_cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.smoke
@pytest.mark.parametrize("args, fragment", [
    (["up", "--topo", "torus"], "unknown topology 'torus': use one of star"),
    (["up", "--bits", "9"], "--bits 9 is not supported: use 1..8 or 32"),
    (["up", "--bits", "four"], "is not a bit width"),
    (["up", "--workers", "33"], "a job has 1..32 workers"),
    (["up", "--jobs", "2", "--bits", "4,8,32"], "gives 3 widths for 2 jobs"),
    (["up", "--trace", "no-such-trace"], "trace 'no-such-trace'"),
    (["up", "--workers", "9"], "has 8 workers, --workers 9 needs as many"),
    (["up", "--iterations", "500"], "asks for more"),
    (["up", "--slots", "600"], "do not fit a pool of 1024 slots"),
    (["up", "--jobs", "4", "--slots", "20", "--pool-slots", "64"], "do not fit a pool of 64"),
    (["up", "--pool-slots", "2000"], "the switch's pool has 1..1024 slots"),
    (["up", "--payload-words", "48"], "'48' is not one of '32', '64', '128', '256'"),
    (["up", "--mode", "ina", "--quantizer", "none"], "--quantizer none sums float32"),
    (["up", "--mode", "ring", "--quantizer", "none", "--bits", "4"], "and --bits 32"),
    (["up", "--loss", "120"], "--loss 120.0: a percentage"),
    (["up", "--train-args", "--epochs 2"], "arguments of a --train-script, and none is given"),
    (["up", "--train-script", "/tmp"], "--train-script /tmp: a directory, not a Python file"),
    (["up", "--loss", "99.999"], "--loss 99.999: a percentage, 0 or from 0.01 to 99.99"),
    (["up", "--loss", "0.004"], "--loss 0.004: a percentage, 0 or from 0.01 to 99.99"),
    (["up", "--pcap", "h1", "--pcap-size", "99999999999"],
     "--pcap-size 99999999999: megabytes per interface, from 1 to 4,000,000"),
    (["up", "--jobs", "17"], "the switch holds 1..16 jobs"),
    (["up", "--host-cpu", "0"], "--host-cpu 0.0: cores of CPU time per second"),
    (["up", "--host-cpu", "64"], "from 0.01 to the machine's"),
    (["up", "--tcp-cc", "no;such"], "--tcp-cc no;such: this kernel offers"),
    (["up", "--bw", "2000"], "--bw 2000.0: link bandwidth in Mbit/s, from 0.001 to 1000"),
    (["up", "--bw", "1e-7"], "--bw 1e-07: link bandwidth in Mbit/s, from 0.001 to 1000"),
    (["up", "--bw", "nan"], "bw is nan, which is not a finite number"),
    (["up", "--delay", "abc"], "--delay abc: a time as tc takes it"),
    (["up", "--delay", "1ms; touch /tmp/x"], "a time as tc takes it"),
    (["up", "--seed", "-1"], "--seed -1: a whole number from 0 to 4294967295"),
    (["up", "--seed", str(2 ** 32)], "--seed 4294967296: a whole number from 0"),
    (["up", "--topo", "dumbbell,bottleneck=nan"], "bottleneck='nan' is not a finite number"),
    (["up", "--topo", "dumbbell,bottleneck=1e4"], "is above its largest value 1000"),
    (["bench", "codec", "--bits", "9"], "--bits 9 with --workers 4: bit width 9 is not"),
    (["traces", "record", "x", "--lr", "nan"], "'nan' is not a finite number"),
    (["bench", "switch", "--rate", "inf"], "'inf' is not a finite number"),
    (["results", "list", "--results-dir", "/nonexistent"], "/nonexistent: no such directory"),
    (["up", "--sample-interval", "1e-9"], "--sample-interval 1e-09: at least 0.001 s"),
    (["up", "--results-dir", ""], "--results-dir is empty"),
    (["up", "--topo", "leafspine,leaves=99999"], "leaves=99999 is above its largest value 64"),
    (["bench", "codec", "--workers", "64"], "--bits 4 with --workers 64: 64 workers"),
    (["run", "/nonexistent/config.yaml"], "does not exist"),
    (["traces", "show", "nope"], "nope"),
    (["results", "show", "/nonexistent"], "has no summary.json"),
    (["eval", "compression", "--workers", "0"], "'--workers': 0 is not in the range"),
    (["eval", "compression", "--seeds", "0"], "'--seeds': 0 is not in the range x>=1"),
    (["eval", "compression", "--gvq-k", "65"], "'--gvq-k': 65 is not in the range 1<=x<=64"),
    (["eval", "compression", "--lr", "-1"], "'--lr': -1.0 is not in the range x>0"),
    (["traces", "record", "x", "--workers", "0"], "'--workers': 0 is not in the range"),
    (["traces", "record", "x", "--batch-size", "0"], "'--batch-size': 0 is not in the"),
    (["traces", "record", "x", "--hidden", "100000,100000"], "more than this testbed's"),
    (["traces", "record", "x", "--hidden", "64,0"], "--hidden 64,0: give positive layer"),
    (["traces", "record", "x", "--model", "resnet", "--width", "500"], "a resnet of about"),
    (["up", "--train", "--hidden", "100000,100000"], "a mlp of 10,007,600,010 parameters"),
    (["up", "--jobs", "2", "--arrivals", "0,1e9"], "0 to 86400, one per job"),
    (["up", "--jobs", "2", "--arrivals", "poisson:1e7"], "at most 86400"),
    (["eval", "compression", "--train-iterations", "2", "--hidden", "99999,99999"],
     "more than this testbed's 50,000,000"),
    (["eval", "compression", "--bits", "0"], "--bits 0 with --workers 8: bit width 0 is not"),
    (["eval", "compression", "--quantizers", "maxpow2,nosuch"], "--quantizers nosuch: use"),
    (["up", "--trace-dir", "/nonexistent"], "--trace-dir /nonexistent: no such directory"),
    (["traces", "list", "--trace-dir", "/nonexistent"], "Directory '/nonexistent' does not"),
    (["eval", "compression", "--trace-dir", "/etc/passwd"], "'/etc/passwd' is a file"),
    (["up", "--headroom", "256"], "--headroom 256: code steps added to the predicted scales"),
    (["up", "--headroom", "-1"], "--headroom -1: code steps added to the predicted scales"),
])
def test_bad_input_is_one_clear_line(args, fragment):
    code, out = run_cli(*args)
    assert code != 0
    assert fragment in out
    assert "| scheme" not in out  # refused before any table starts
    assert "Traceback" not in out
    assert len([line for line in out.strip().splitlines() if line.startswith("Error")]) == 1


@pytest.mark.parametrize("make, fragment", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.write_text("topo: " + "{a: " * 5000 + "}" * 5000 + "\n"), "nest"),
    (lambda p: p.write_text("jobs: " + "9" * 5000 + "\n"), "more digits than Python reads"),
    (lambda p: p.write_text("topo: star\n" + "# padding\n" * 120_000), "larger than 1 MB"),
    (lambda p: p.write_text("topo: star\nnetwork: {bw: 5}\nnetwork: {bw: 9}\n"),
     "(line 3, column 1): 'network' is given twice: keep one"),
])
def test_a_config_file_that_is_a_pipe_or_past_pythons_limits_is_one_line(tmp_path, make,
                                                                        fragment):
    """A pipe would be read forever, /dev/zero until memory runs out; deep nesting and
    huge integers raise past PyYAML's errors (libyaml refuses the nesting itself); a
    large file would take minutes to parse; PyYAML would keep the last of a key given
    twice."""
    path = tmp_path / "c.yaml"
    make(path)
    for args in (["run", str(path), "--dry-run"], ["sweep", "--dry-run", str(path)]):
        code, out = run_cli(*args)
        assert code != 0 and "Traceback" not in out and fragment in out, out[-300:]
        assert len([line for line in out.splitlines() if line.startswith("Error")]) == 1


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("topo: star\nwokers: 4\n")
    code, out = run_cli("run", str(bad))
    assert code != 0 and "unknown option(s) wokers" in out
    bad.write_text("topo: [unclosed\n")
    code, out = run_cli("run", str(bad))
    assert code != 0 and "not valid YAML (line 2, column 1): " in out and "expected ','" in out, out
    bad.write_text("topo: star\nnetwork: 5\n")
    code, out = run_cli("run", str(bad))
    assert code != 0 and "network is a section: a mapping of its options" in out, out
    good = tmp_path / "good.yaml"
    good.write_text(RunConfig.flat(topo="star", jobs=1, bits=[8]).to_yaml())
    cfg = RunConfig.from_yaml(good)
    assert cfg.network.topo == "star" and cfg.workload.bits == [8] and cfg.workload.jobs == 1


def test_bmv2_target_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(config_mod, "bmv2_missing", lambda: "simple_switch_grpc not on PATH")
    with pytest.raises(ConfigError, match="--target bmv2: simple_switch_grpc not on PATH"):
        RunConfig.flat(target="bmv2").check()


def test_without_root_says_to_use_sudo(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for args in (("up", "--topo", "star", "--jobs", "1"), ("clean",)):
        code, out = run_cli(*args)
        assert code != 0, args
        assert "needs root" in out and "sudo" in out and "Traceback" not in out, out


@pytest.mark.smoke
def test_help_lists_the_commands():
    code, out = run_cli("--help")
    assert code == 0
    for cmd in ("up", "run", "clean", "doctor", "traces", "results", "bench"):
        assert cmd in out


def test_doctor_names_what_is_missing_and_how_to_install_it(tmp_path, monkeypatch):
    """With nothing on PATH: required tools NO (exit 1), optional ones -- , each with
    its fix on the same line."""
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out = run_cli("doctor")
    assert code == 1 and "Traceback" not in out
    lines = out.splitlines()
    assert "NO  mnexec (Mininet): apt-get install mininet" in lines
    assert "--  dumpcap or tcpdump (optional: --pcap): apt-get install tshark (or tcpdump)" \
        in lines
    assert any(line.startswith("--  tshark (optional") for line in lines)
    # a shell venv that cannot be looked into (another user's; here a name too long)
    monkeypatch.setenv("QAINA_SHELL_VENV", "/tmp/" + "v" * 300)
    code, out = run_cli("doctor")
    assert "Traceback" not in out and "--  p4runtime-shell (optional" in out, out[-500:]


def test_doctor_target_bmv2_needs_bmv2_and_p4c_here(tmp_path, monkeypatch):
    """``--target bmv2`` makes this machine's BMv2 and p4c required (NO, exit 1), also
    on a cluster that lists this machine; without it they are optional."""
    monkeypatch.setenv("PATH", str(tmp_path))
    _, plain = run_cli("doctor")
    assert any(line.startswith("--  p4c (optional, --target bmv2)") for line in plain.splitlines())
    for args in (["--target", "bmv2"], ["--target", "bmv2", "--cluster", "localhost"]):
        code, out = run_cli("doctor", *args)
        lines = out.splitlines()
        assert code == 1 and "Traceback" not in out
        for tool in ("simple_switch_grpc", "p4c"):
            assert any(line.startswith(f"NO  {tool} (--target bmv2") for line in lines), out


def test_traces_list_and_show_the_bundled_set():
    code, out = run_cli("traces", "list")
    assert code == 0 and "digits-mlp" in out
    code, out = run_cli("traces", "show", "digits-mlp")
    assert code == 0
    path, manifest = out.split("\n", 1)
    assert path.endswith("digits-mlp")
    manifest = json.loads(manifest)
    assert manifest["workers"] == 8 and manifest["model"]


def test_traces_record_writes_a_set_that_runs(tmp_path):
    code, out = run_cli("traces", "record", "tiny", "--out", str(tmp_path), "--workers", "2",
                        "--iterations", "2")
    assert code == 0, out
    code, out = run_cli("traces", "list", "--trace-dir", str(tmp_path))
    assert code == 0 and "tiny" in out
    cfg = RunConfig.flat(trace="tiny", trace_dirs=[str(tmp_path)], workers=2, iterations=2, jobs=1)
    assert cfg.check().workers == 2


@pytest.mark.parametrize("name", ["..", "", ".", "a/b", "_x", "x" * 101])
def test_traces_record_refuses_a_name_that_is_not_one_directory(tmp_path, name):
    """A name like ``..`` would replace ``--out``'s parent with the set: refused before
    any training, and nothing beside the set is touched."""
    out = tmp_path / "victim" / "out"
    out.mkdir(parents=True)
    (tmp_path / "victim" / "precious.txt").write_text("keep")
    code, said = run_cli("traces", "record", name, "--out", str(out), "--overwrite",
                         "--workers", "1", "--iterations", "1")
    assert code != 0 and "Traceback" not in said and len(said.strip().splitlines()) == 1
    assert f"trace set name {name!r}: use letters" in said, said
    assert (tmp_path / "victim" / "precious.txt").read_text() == "keep" and out.is_dir()


def test_traces_record_says_what_is_wrong_with_out_before_training(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, fragment in ((afile, f"cannot make {afile}: File exists"),
                          (afile / "sub", f"cannot make {afile / 'sub'}: Not a directory")):
        code, said = run_cli("traces", "record", "x", "--out", str(out), "--workers", "1")
        assert code != 0 and said.strip() == f"Error: {fragment}; choose another --out", said
        assert "iteration 0" not in said
    (tmp_path / "x").mkdir()
    code, said = run_cli("traces", "record", "x", "--out", str(tmp_path), "--workers", "1")
    assert code != 0 and "exists (replace it with --overwrite" in said and "iteration" not in said


@pytest.mark.parametrize("line, fragment", [
    ("jobs: two", "jobs is 'two', which is not a whole number"),
    ('workers: "4"', "workers is '4', which is not a whole number"),
    ("bw: fast", "bw is 'fast', which is not a finite number"),
    ('loss: "5"', "loss is '5', which is not a finite number"),
    ("slots: 8.5", "slots is 8.5, which is not a whole number"),
    ("iterations: 2.5", "iterations is 2.5, which is not a whole number"),
    ("timeout: .inf", "timeout is inf, which is not a finite number"),
    ("record_levels: 1", "record_levels is 1, which is not true or false"),
    ("bits: [4, x]", "bits is [4, 'x']"),
    ("run_id: a/b/c", "--run-id 'a/b/c'"),
])
def test_each_bad_field_of_a_saved_config_is_one_line(tmp_path, line, fragment):
    """One edited field of a saved config.yaml: refused before anything starts."""
    import yaml
    from qaina_bench.settings import SECTION_OF
    saved = yaml.safe_load(RunConfig.flat(topo="star", jobs=1, results_dir=str(tmp_path)).to_yaml())
    key = line.split(":")[0]
    saved[SECTION_OF[key]].pop(key)
    nested = tmp_path / "config.yaml"  # as a run saves it, the field edited in its section
    nested.write_text(yaml.safe_dump(saved).replace(
        f"{SECTION_OF[key]}:\n", f"{SECTION_OF[key]}:\n  {line}\n"))
    flat = tmp_path / "flat.yaml"  # as runs before the tree saved it
    flat.write_text(yaml.safe_dump({k: v for section in saved.values() for k, v in
                                    section.items()}) + line + "\n")
    for path in (nested, flat):
        code, out = run_cli("run", str(path))
        assert code != 0 and fragment in out, out
        assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_config_files_that_are_not_configs(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    code, out = run_cli("run", str(binary))
    assert code != 0 and "is not text" in out and "Traceback" not in out
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    code, out = run_cli("run", str(empty))
    assert code != 0 and "is empty" in out
    listing = tmp_path / "list.yaml"
    listing.write_text("- star\n")
    code, out = run_cli("run", str(listing))
    assert code != 0 and "must hold a mapping" in out


def test_bits_as_a_comma_list_in_a_config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("topo: star\njobs: 2\nbits: 4,32\n")
    cfg = RunConfig.from_yaml(path)
    assert cfg.workload.bits == [4, 32] and cfg.job_bits() == [4, 32]


@pytest.mark.root  # the results directory is checked after root
def test_results_dir_that_cannot_be_written_is_one_line():
    code, out = run_cli("up", "--topo", "star", "--jobs", "1", "--results-dir", "/proc/nope")
    assert code != 0 and "cannot write results to /proc/nope" in out
    assert "Traceback" not in out


def test_one_broken_result_set_does_not_break_the_listing(tmp_path):
    good, broken = tmp_path / "good-run", tmp_path / "broken-run"
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path))
    assert code == 0 and out.startswith(f"no result sets in {tmp_path} "), out
    for d in (good, broken):
        d.mkdir()
        (d / "config.yaml").write_text("topo: star\n")
    (good / "summary.json").write_text(json.dumps({
        "status": "complete", "topology": "star", "target": "embedded", "mode": "ring",
        "bits": [4], "jobs_count": 1, "workers": 4, "trace": "digits-mlp",
        "compress": "none", "links": {"bw_mbit": 1.0}, "jobs": []}))
    (broken / "summary.json").write_text("{not json")
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path))
    assert code == 0, out
    lines = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert lines["good-run"].split()[:4] == ["complete", "star", "embedded", "ring"]
    assert "bw 1.0" in lines["good-run"]
    assert lines["broken-run"].startswith("? (")
    code, out = run_cli("results", "show", str(broken))
    assert code != 0 and "unreadable" in out and "Traceback" not in out


def test_qsgd_with_error_feedback_at_two_bits_is_refused():
    with pytest.raises(ConfigError, match="would send nothing"):
        RunConfig.flat(bits=[2], quantizer="qsgd", error_feedback=True).check()


def test_eval_compression_prints_a_row_per_scheme_and_writes_them_as_csv(tmp_path):
    path = tmp_path / "c.csv"
    code, out = run_cli("eval", "compression", "--workers", "4", "--bits", "4",
                        "--quantizers", "maxpow2,qsgd", "--seeds", "2",
                        "--train-iterations", "5", "--no-extras", "--csv", str(path))
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| b=")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "b=4 maxpow2", "b=4 maxpow2 EF", "b=4 qsgd", "b=4 qsgd EF"]
    assert "fp32, exact sum" in out
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["scheme"] for r in got] == ["fp32, exact sum"] + [
        r.split("|")[1].strip() for r in rows]
    assert got[0]["rel_error"] == "0" and got[0]["rel_error_min"] == ""
    for printed, r in zip(rows, got[1:]):  # the CSV's figures are the printed ones
        cells = [c.strip() for c in printed.split("|")[1:-1]]
        assert cells[1] == f"{r['rel_error']} ({r['rel_error_min']}-{r['rel_error_max']})"
        assert cells[3] == f"{r['sum_error']} ({r['sum_error_min']}-{r['sum_error_max']})"
        assert cells[4] == f"{r['clipped_percent']}%" and cells[5] == r["values_sent"]
        assert float(r["accuracy_min"]) <= float(r["accuracy"]) <= float(r["accuracy_max"])


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a device node (root)")
def test_a_csv_output_never_replaces_a_device_and_writes_through_a_link(tmp_path):
    """--csv naming a device is one line and leaves the device (as root, a rename over
    /dev/full would have destroyed it); a link to a file keeps the link."""
    from qaina_bench.harness.results.resultset import write_whole
    dev = tmp_path / "full"
    os.mknod(dev, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 7))
    for args in (["eval", "compression", "--bits", "4", "--csv", str(dev)],
                 ["bench", "switch", "--seconds", "0.1", "--csv", str(dev)],
                 ["bench", "scale", "--csv", str(dev)]):
        r = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "not a regular file" in r.stderr, args
        assert "Traceback" not in r.stderr, r.stderr
        assert dev.is_char_device()
    target, link = tmp_path / "t.csv", tmp_path / "l.csv"
    target.write_text("old\n")
    link.symlink_to(target)
    write_whole(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts an 8 KiB tmpfs (root)")
def test_an_output_file_on_a_full_disk_is_one_line_and_no_empty_file(tmp_path):
    """--csv and --out onto a full file system, found full only when the output is
    written: one line naming the file (`bench switch` after its table: it was a
    traceback), and no empty or temporary file left."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(tiny)], check=True)
    try:
        (tiny / "fill").write_bytes(os.urandom(7000))
        for args, out in (
                (["eval", "compression", "--bits", "4", "--quantizers", "maxpow2", "--seeds",
                  "1", "--no-extras", "--csv"], "c.csv"),
                (["bench", "switch", "--bits", "4", "--rate", "1000", "--seconds", "0.2",
                  "--csv"], "s.csv"),
                (["dissector", "--out"], "d.lua")):
            r = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", *args,
                                str(tiny / out)], capture_output=True, text=True, timeout=300)
            assert r.returncode == 1, (args, r.stderr)
            assert f"cannot write {tiny / out}: No space left on device" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
            assert sorted(p.name for p in tiny.iterdir()) == ["fill"]
    finally:
        subprocess.run(["umount", str(tiny)], check=True)


def test_eval_compression_keeps_an_existing_csv_when_it_is_interrupted(tmp_path):
    """The CSV is written once the table is complete: a Ctrl-C while it computes leaves
    the file that was there, and a path that cannot be written fails before any
    computing."""
    path = tmp_path / "c.csv"
    path.write_text("earlier,table\n")
    proc = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "eval",
                             "compression", "--workers", "8", "--seeds", "20", "--csv", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("| b="):  # computing: the first rows are out
                break
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert path.read_text() == "earlier,table\n" and not list(tmp_path.glob(".c.csv.*"))
    code, out = run_cli("eval", "compression", "--workers", "4", "--bits", "4",
                        "--quantizers", "maxpow2", "--seeds", "1", "--no-extras",
                        "--csv", str(tmp_path / "missing" / "c.csv"))
    assert code != 0 and "no such directory" in out and "| b=" not in out
    assert len(out.strip().splitlines()) == 1, out  # before anything is computed or printed
    assert "Traceback" not in out
    code, out = run_cli("eval", "compression", "--workers", "4", "--bits", "4",
                        "--quantizers", "maxpow2", "--seeds", "1", "--no-extras",
                        "--csv", str(path))
    assert code == 0, out
    assert path.read_text().startswith("scheme,") and not list(tmp_path.glob(".c.csv.*"))


def test_results_show_reads_a_result_set_made_before_the_fidelity_verdict(tmp_path):
    """Without ``fidelity`` in its summary, a result set shows its CPU saturation."""
    old = {"run_id": "old", "status": "complete", "complete": True, "topology": "star",
           "target": "embedded", "mode": "ina",
           "jobs": [{"job_id": 1, "bits": 4, "iterations_done": 0}],
           "validity": {"cpu": {"saturated": "all cores 97% busy on average"},
                        "warnings": []}, "errors": []}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    code, out = run_cli("results", "show", str(tmp_path))
    assert code == 0, out
    assert "fidelity: not judged" in out and "97% busy" in out


def test_traces_list_shows_the_recipes_it_would_record(tmp_path, monkeypatch):
    from qaina_bench.hosts.recorder import RECIPES
    monkeypatch.setenv("QAINA_TRACE_DIR", str(tmp_path))
    code, out = run_cli("traces", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("digits-mlp ")
    for name in RECIPES:
        assert sum(line.startswith(f"{name}  not recorded yet: recorded on first use (")
                   for line in lines) == 1, out
    assert "hidden 512,256" in out  # the recipe's options, as `traces record` takes them


def test_a_known_recipe_is_recorded_on_first_use_with_progress(tmp_path, monkeypatch, capsys):
    from qaina_bench.harness.cli import record_on_first_use
    from qaina_bench.hosts import recorder
    from qaina_bench.hosts.traces import find_trace, open_trace
    monkeypatch.setenv("QAINA_TRACE_DIR", str(tmp_path))
    monkeypatch.setitem(recorder.RECIPES, "tiny-recipe",
                        dict(model="mlp", hidden=(8,), workers=2, iterations=3))
    cfg = RunConfig.flat(trace="tiny-recipe", workers=2, iterations=3)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    record_on_first_use(cfg)  # without root: `up` stops before anything is recorded
    assert not (tmp_path / "tiny-recipe").exists()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    record_on_first_use(cfg)
    out = capsys.readouterr().out
    assert "recording trace set tiny-recipe" in out
    assert [line.split(":")[0] for line in out.splitlines()[1:]] == [
        f"  iteration {i}" for i in range(3)]
    assert find_trace("tiny-recipe") == tmp_path / "tiny-recipe"
    trace = open_trace("tiny-recipe")
    assert (trace.workers, trace.iterations) == (2, 3)
    cfg.check()  # the run's own check now finds it
    record_on_first_use(cfg)  # recorded once
    assert capsys.readouterr().out == ""


@pytest.mark.root  # Mininet
@pytest.mark.slow
def test_up_records_a_known_recipe_on_first_use_and_runs_it(tmp_path):
    from qaina_bench.hosts.traces import TraceSet
    env = dict(os.environ, QAINA_TRACE_DIR=str(tmp_path / "traces"))
    res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo", "star",
                          "--jobs", "1", "--workers", "2", "--iterations", "1",
                          "--trace", "digits-mlp-wide", "--results-dir", str(tmp_path),
                          "--run-id", "wide"], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "recording trace set digits-mlp-wide" in res.stdout
    assert "  iteration 5: minibatch loss" in res.stdout  # progress, one line per iteration
    summary = json.loads((tmp_path / "wide" / "summary.json").read_text())
    trace = TraceSet.open(tmp_path / "traces" / "digits-mlp-wide")
    assert summary["complete"] and summary["jobs"][0]["elements_per_iteration"] == trace.elements


def test_results_show_of_a_summary_it_cannot_read_is_one_line(tmp_path):
    (tmp_path / "summary.json").write_text('{"jobs": "x"}')
    code, out = run_cli("results", "show", str(tmp_path))
    assert code == 1 and "Traceback" not in out
    assert out.strip().splitlines() == [
        f"Error: {tmp_path / 'summary.json'} is not a summary this qaina-bench can read "
        "(KeyError: 'run_id')"]


def test_results_show_and_list_never_print_a_summarys_control_characters(tmp_path):
    """A run id with a terminal escape (one that retitles the terminal) is shown with
    ``?`` for each control character, by `results show` and `results list`."""
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.yaml").write_text("topo: star\n")
    (run / "summary.json").write_text(json.dumps(
        {"jobs": [], "status": "complete", "topology": "star", "target": "embedded",
         "run_id": "a\x1b]0;pwned\x07b", "trace": "t\x1b[2J"}))
    for args in (["results", "show", str(run)], ["results", "list", "--results-dir",
                                                  str(tmp_path)]):
        code, out = run_cli(*args)
        assert code == 0, out
        assert "\x1b" not in out and "\x07" not in out
    assert "a?]0;pwned?b: complete" in run_cli("results", "show", str(run))[1]


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.symlink_to("/dev/zero"), "is unreadable: not a regular file"),
    (lambda p: os.mkfifo(p), "is unreadable: not a regular file"),
    (lambda p: p.write_text('{"jobs": ' + "[" * 100000 + "]" * 100000 + "}"),
     "is unreadable: nested too deeply"),
])
def test_a_summary_that_is_no_file_or_too_deep_is_one_line(tmp_path, make, fragment):
    """`results show` and `results list` of a summary.json that is a device, a pipe
    (reads that never end) or JSON nested past Python's recursion: one line each, and
    `list` goes on to the other result sets."""
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    make(bad / "summary.json")
    (good / "summary.json").write_text('{"jobs": [], "status": "complete"}')
    for d in (bad, good):  # a result set is a directory with its config.yaml
        (d / "config.yaml").write_text("topo: star\n")
    code, out = run_cli("results", "show", str(bad))
    assert code == 1 and "Traceback" not in out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {bad / 'summary.json'} {fragment}")
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path))
    assert code == 0 and "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 2 and fragment in lines[0] and lines[1].startswith("good"), lines


def test_a_dry_run_checks_pcap_names_and_the_cluster_as_up_does(tmp_path):
    spec = tmp_path / "cluster.yaml"
    spec.write_text("servers: [localhost, n2]\npin: 5\n")
    for args, fragment in ((["--pcap", "nosuch"], "--pcap nosuch: not a node or interface"),
                           (["--cluster", str(spec)], "pin is a mapping of node names"),
                           (["--cluster", "root@n2:22"], "'root@n2:22' is not a host name")):
        code, out = run_cli("up", *args, "--dry-run")
        assert code != 0 and fragment in out and "Traceback" not in out, out
    code, out = run_cli("up", "--cluster", "localhost,n2", "--dry-run")  # not asked: ssh
    assert code == 0 and "cluster: localhost,n2" in out, out


def test_traces_show_of_a_damaged_set_says_only_what_is_wrong(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    code, out = run_cli("traces", "show", str(tmp_path / "bad"))
    assert code != 0 and len(out.strip().splitlines()) == 1 and out.startswith("Error:"), out


def test_ctrl_c_of_a_command_that_does_not_handle_it_exits_130_in_one_line():
    """`bench codec` has no Ctrl-C handling of its own: the group's says "interrupted"
    and exits 130, as a shell expects of SIGINT (click said "Aborted!" and exit 1)."""
    proc = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "bench", "codec",
                             "--repeats", "1000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()  # timing: the first line is out
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and err.strip() == "interrupted", err
