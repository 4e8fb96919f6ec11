"""The configuration tree: one tree from YAML (nested or flat), the command line and sweep
specs; one default per option; the agents get it whole. No root needed."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest
import yaml
from click.testing import CliRunner

from qaina_bench.harness.cli import main
from qaina_bench.harness.config import ConfigError, RunConfig
from qaina_bench.harness.sweeping.sweep import Spec
from qaina_bench.hosts.agent import AgentConfig
from qaina_bench.settings import SECTION_OF, SECTIONS, Settings, default_of, flag_of

pytestmark = pytest.mark.smoke

FLAT = {"topo": "star", "jobs": 1, "workers": 2, "bits": "4,32", "quantizer": "qsgd",
        "error_feedback": True, "hidden": [16], "sample_interval": 0.05, "headroom": 2,
        "pack": False, "gvq_fit": 3, "run_id": "x1"}


def nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        out.setdefault(SECTION_OF[key], {})[key] = value
    return out


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def dry_run(*args) -> dict:
    code, out = cli(*args, "--dry-run")
    assert code == 0, out
    return yaml.safe_load(out)


def test_nested_and_flat_yaml_give_the_same_tree(tmp_path):
    flat, tree = tmp_path / "flat.yaml", tmp_path / "nested.yaml"
    flat.write_text(yaml.safe_dump(FLAT))
    tree.write_text(yaml.safe_dump(nested(FLAT)))
    a, b = RunConfig.from_yaml(flat), RunConfig.from_yaml(tree)
    assert a == b
    assert a.workload.bits == [4, 32] and a.compression.pack is False
    assert a.output.sample_interval == 0.05 and a.network.topo == "star"
    assert a != RunConfig()  # the options were taken, not the defaults
    mixed = {"topo": "star", "workload": {"jobs": 1}}  # a mix reads too
    assert RunConfig.from_dict(mixed, "m") == RunConfig.flat(topo="star", jobs=1)


def test_round_trip_to_yaml_and_back():
    cfg = RunConfig.flat(**FLAT)
    text = cfg.to_yaml()
    data = yaml.safe_load(text)
    assert list(data) == list(SECTIONS)  # written nested, in the tree's order
    assert data["compression"]["gvq_fit"] == 3 and "gvq_fit" not in data
    assert RunConfig.from_dict(data, "round trip") == cfg
    assert RunConfig.from_dict(cfg.flat_dict(), "flat") == cfg


@pytest.mark.parametrize("data, fragment", [
    ({"topo": "star", "colour": "red"}, "unknown option(s) colour; known: allocation"),
    ({"network": {"topo": "star", "jobs": 2}}, "w: network: unknown option(s) jobs; known: "),
    ({"jobs": 2, "workload": {"jobs": 3}}, "jobs is given twice"),
    ({"workload": {"slots": 8.5}}, "slots is 8.5, which is not a whole number"),
    ({"training": {"hidden": "64,x"}}, "hidden is '64,x', which is not a whole number"),
    ({"network": {"bw": float("inf")}}, "bw is inf, which is not a finite number"),
    ({"output": {"switch_log": "yes"}}, "switch_log is 'yes', which is not true or false"),
    ({f"k{i:02}": 1 for i in range(30)}, "unknown option(s) k00, k01, k02, k03, k04, k05 and "
                                         "24 more; known: allocation"),
    ({"x" * 100: 1}, f"unknown option(s) {'x' * 37}...; known"),
])
def test_bad_input_is_one_line(data, fragment):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data, "w")
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_bad_config_file_and_options_are_one_line_on_the_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("network:\n  topo: star\n  slots: 4\n")
    for args in (["run", str(bad)], ["up", "--config", str(bad)]):
        code, out = cli(*args)
        assert code != 0 and "network: unknown option(s) slots" in out, out
        assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_options_override_the_config_file(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(nested({"topo": "star", "jobs": 1, "bits": 8,
                                           "error_feedback": True, "timeout": 50.0})))
    got = dry_run("up", "--config", str(base), "--bits", "2", "--no-error-feedback",
                  "--sample-interval", "0.02", "--headroom", "3")
    assert got["network"]["topo"] == "star" and got["workload"]["jobs"] == 1  # from the file
    assert got["output"]["timeout"] == 50.0  # the file's, not the default 300
    assert got["workload"]["bits"] == [2]  # given: overrides the file
    assert got["compression"]["error_feedback"] is False
    assert got["output"]["sample_interval"] == 0.02 and got["compression"]["headroom"] == 3
    # An option given with its default value still overrides the file.
    assert dry_run("up", "--config", str(base), "--timeout", "300")["output"]["timeout"] == 300


def test_run_accepts_the_same_overrides_as_up(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(RunConfig.flat(topo="star", jobs=1, bits=[4], run_id="old").to_yaml())
    got = dry_run("run", str(saved), "--bits", "8", "--quantizer", "maxfine")
    assert got["workload"]["bits"] == [8] and got["compression"]["quantizer"] == "maxfine"
    assert got["network"]["topo"] == "star" and got["workload"]["jobs"] == 1
    assert got["output"]["run_id"] is None  # a new result set, unless --run-id
    assert dry_run("run", str(saved), "--run-id", "new")["output"]["run_id"] == "new"
    code, out = cli("run", str(saved), "--bits", "9", "--dry-run")
    assert code != 0 and "--bits 9 is not supported" in out


def test_up_defaults_are_the_trees():
    tree = RunConfig()
    tree.resolve_topology()  # the checked configuration records the full topology spec
    assert dry_run("up") == tree.to_dict()
    params = {p.name: p for p in main.commands["up"].params}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            assert f.name in params, f"up has no option for {section}.{f.name}"
            assert flag_of(f) in params[f.name].opts or f"--{f.name.replace('_', '-')}" \
                in params[f.name].opts


def test_up_help_shows_one_heading_per_section():
    code, out = cli("up", "--help")
    assert code == 0
    heads = [line for line in out.splitlines() if line.endswith("options:")]
    assert heads == [f"{s.capitalize()} options:" for s in SECTIONS] + ["Other options:"]
    for flag in ("--headroom", "--sample-interval", "--no-pack", "--trace-dir", "--config"):
        assert flag in out


@pytest.mark.parametrize("command", [("traces", "record"), ("eval", "compression")])
def test_one_default_per_option(command):
    """An option that ``up`` and another command share has the tree's default in both,
    except ``traces record --workers``: the workers a trace holds, not a run's."""
    group = main.commands[command[0]]
    params = {p.name: p for p in group.commands[command[1]].params}
    checked = 0
    for section, f in ((s, f) for s, cls in SECTIONS.items() for f in fields(cls)):
        p = params.get(f.name)
        if p is None or (command[1], f.name) in {("record", "workers"),
                                                  ("compression", "workers"),
                                                  ("compression", "bits"),
                                                  ("compression", "gvq_refresh")}:
            continue
        value = p.type_cast_value(None, p.default)
        assert value == default_of(f), f"{' '.join(command)} --{f.name}: {value!r}"
        checked += 1
    assert checked >= 5


def test_sweep_spec_base_may_be_nested(tmp_path):
    flat = {"name": "t", "base": {"topo": "star", "jobs": 1, "workers": 2},
            "grid": {"bits": [4, 8]}}
    tree = {**flat, "base": {"network": {"topo": "star"}, "workload": {"jobs": 1, "workers": 2}},
            "quick": {"base": {"workload": {"iterations": 2}}}}
    a, b = Spec.from_dict(flat, "flat"), Spec.from_dict(tree, "nested", quick=True)
    point = a.points()[1]
    ca, cb = a.config(point, tmp_path, 1), b.config(b.points()[1], tmp_path, 1)
    assert ca.workload.bits == cb.workload.bits == [8]
    assert cb.workload.iterations == 2 and cb.network.topo == "star"  # quick merged per option
    cb.workload.iterations = ca.workload.iterations
    assert ca == cb


def test_agent_json_holds_the_tree_and_loads_back(tmp_path):
    cfg = RunConfig.flat(**FLAT)
    agent = AgentConfig(run=cfg, job_id=1, worker=0, bits=4, trace="", aggregator="10.0.0.1",
                        slot_base=0, slots=8, output=str(tmp_path / "a.jsonl"))
    path = tmp_path / "a.json"
    agent.save(path)
    data = json.loads(path.read_text())
    assert data["run"] == cfg.to_dict()
    assert not {"packed", "gvq_fit_iterations", "quantizer", "workers"} & set(data)
    loaded = AgentConfig.load(path)
    assert isinstance(loaded.run, Settings) and loaded.run.to_dict() == cfg.to_dict()
    assert loaded.run.compression.gvq_fit == 3 and loaded.run.compression.pack is False
    data["run"]["compression"]["packed"] = False
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown option"):
        AgentConfig.load(path)


def test_hosts_do_not_import_the_harness():
    code = ("import sys, qaina_bench.hosts.agent; "
            "print(sorted(m for m in sys.modules if m.startswith('qaina_bench.harness')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_recorder_defaults_are_the_trees():
    import inspect
    from qaina_bench.hosts.recorder import RECIPES, record
    defaults = {k: p.default for k, p in inspect.signature(record).parameters.items()}
    t = RunConfig().training
    assert (defaults["learning_rate"], list(defaults["hidden"]), defaults["batch_size"],
            defaults["width"]) == (t.lr, t.hidden, t.batch_size, t.width)
    # The recipes keep the learning rate their sets were recorded with.
    assert {n: r["learning_rate"] for n, r in RECIPES.items()} == {
        "digits-mlp-wide": 0.1, "digits-mlp-1m": 0.1, "digits-mlp-1m-8w": 0.1,
        "digits-resnet": 0.05}


def test_trace_paths_are_recorded_absolute(tmp_path, monkeypatch):
    """config.yaml is repeated with `run` from any directory: a relative --trace-dir or
    --trace path is recorded as the absolute path it named."""
    from pathlib import Path
    bundled = Path(__file__).resolve().parents[1] / "hosts" / "traces" / "digits-mlp"
    (tmp_path / "td").mkdir()
    (tmp_path / "td" / "mine").symlink_to(bundled)
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig.flat(topo="star", workers=2, iterations=2, trace="mine",
                         trace_dirs=["td"])
    cfg.check()
    assert cfg.training.trace_dirs == [str(tmp_path / "td")]
    cfg = RunConfig.flat(topo="star", workers=2, iterations=2, trace="td/mine")
    cfg.check()
    assert cfg.training.trace == str(tmp_path / "td" / "mine")
    monkeypatch.chdir("/")
    cfg.check()  # what config.yaml holds checks again, from elsewhere
