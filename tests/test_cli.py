"""Bad input to the CLI gets one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from qaina_bench.harness import config as config_mod
from qaina_bench.harness.cli import main
from qaina_bench.harness.config import ConfigError, RunConfig


def run_cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("args, fragment", [
    (["up", "--topo", "torus"], "Invalid value for '--topo'"),
    (["up", "--bits", "9"], "--bits 9 is not supported: use 1..8 or 32"),
    (["up", "--bits", "four"], "is not a bit width"),
    (["up", "--workers", "33"], "a job has 1..32 workers"),
    (["up", "--jobs", "2", "--bits", "4,8,32"], "gives 3 widths for 2 jobs"),
    (["up", "--trace", "no-such-trace"], "trace 'no-such-trace'"),
    (["up", "--workers", "9"], "has 8 workers, --workers 9 needs as many"),
    (["up", "--iterations", "500"], "asks for more"),
    (["up", "--slots", "600"], "must fit the switch's pool of 1024 slots"),
    (["up", "--loss", "120"], "--loss 120.0: a percentage"),
    (["up", "--jobs", "17"], "the switch holds 1..16 jobs"),
    (["run", "/nonexistent/config.yaml"], "does not exist"),
    (["traces", "show", "nope"], "nope"),
    (["results", "show", "/nonexistent"], "has no summary.json"),
])
def test_bad_input_is_one_clear_line(args, fragment):
    code, out = run_cli(*args)
    assert code != 0
    assert fragment in out
    assert "Traceback" not in out
    assert len([line for line in out.strip().splitlines() if line.startswith("Error")]) == 1


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("topo: star\nwokers: 4\n")
    code, out = run_cli("run", str(bad))
    assert code != 0 and "unknown option(s) wokers" in out
    bad.write_text("topo: [unclosed\n")
    code, out = run_cli("run", str(bad))
    assert code != 0 and "not valid YAML" in out
    good = tmp_path / "good.yaml"
    good.write_text(RunConfig(topo="star", jobs=1, bits=[8]).to_yaml())
    cfg = RunConfig.from_yaml(good)
    assert cfg.topo == "star" and cfg.bits == [8] and cfg.jobs == 1


def test_bmv2_target_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(config_mod, "bmv2_missing", lambda: "simple_switch_grpc not on PATH")
    with pytest.raises(ConfigError, match="--target bmv2: simple_switch_grpc not on PATH"):
        RunConfig(target="bmv2").check()


def test_without_root_says_to_use_sudo(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out = run_cli("up", "--topo", "star", "--jobs", "1")
    assert code != 0
    assert "needs root" in out and "sudo" in out and "Traceback" not in out


def test_help_lists_the_commands():
    code, out = run_cli("--help")
    assert code == 0
    for cmd in ("up", "run", "clean", "doctor", "traces", "results", "bench"):
        assert cmd in out


def test_traces_list_and_show_the_bundled_set():
    code, out = run_cli("traces", "list")
    assert code == 0 and "digits-mlp" in out
    code, out = run_cli("traces", "show", "digits-mlp")
    assert code == 0
    manifest = json.loads(out)
    assert manifest["workers"] == 8 and manifest["model"]


def test_traces_record_writes_a_set_that_runs(tmp_path):
    code, out = run_cli("traces", "record", "tiny", "--out", str(tmp_path), "--workers", "2",
                        "--iterations", "2")
    assert code == 0, out
    code, out = run_cli("traces", "list", "--trace-dir", str(tmp_path))
    assert code == 0 and "tiny" in out
    cfg = RunConfig(trace="tiny", trace_dirs=[str(tmp_path)], workers=2, iterations=2, jobs=1)
    assert cfg.check().workers == 2
