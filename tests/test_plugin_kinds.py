"""Quantizers, compressors and topologies as plugins, without root: the registries'
built-ins, ``--topo`` specs and their one-line errors, the old ``--spines``/``--leaves``
aliases, and an out-of-tree package (tests/outoftree.py) seen by the CLI through
PYTHONPATH, a broken one included."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from outoftree import install, install_broken
from qaina_bench.harness.config import ConfigError, RunConfig
from qaina_bench.harness.running.run import build_topology, new_run_id
from qaina_bench.hosts.compression import COMPRESSORS, QUANTIZERS
from qaina_bench.hosts.gradiveq import GradiVeQCompressor
from qaina_bench.hosts.quantize import MaxRule, scale_rule
from qaina_bench.plugins import PluginError, Registry
from qaina_bench.topologies import (TOPOLOGIES, DumbbellTopo, LeafSpineTopo, LinkParams,
                                    TopologyError, parse_topo)


# -- topology specs ---------------------------------------------------------------------
@pytest.mark.parametrize("text, params", [
    ("leafspine", {"spines": 2, "leaves": 2}),
    ("leafspine,3,4", {"spines": 3, "leaves": 4}),
    ("leafspine,leaves=4", {"spines": 2, "leaves": 4}),
    ("leafspine,3,leaves=5", {"spines": 3, "leaves": 5}),
    (" leafspine , leaves = 4 ", {"spines": 2, "leaves": 4}),
    ("dumbbell,bottleneck=2.5", {"bottleneck": 2.5}),
    ("dumbbell", {"bottleneck": None}),
    ("star", {}),
])
def test_a_spec_names_a_topology_and_its_parameters(text, params):
    spec = parse_topo(text)
    assert spec.cls is TOPOLOGIES.get(text.split(",")[0].strip()) and spec.params == params
    assert parse_topo(spec.text()) == spec  # the recorded form reads back the same


def test_the_full_spec_and_the_short_name_of_a_run():
    assert parse_topo("leafspine,3").text() == "leafspine,spines=3,leaves=2"
    assert parse_topo("leafspine,3").short() == "leafspine-spines3"
    assert parse_topo("dumbbell").text() == "dumbbell"
    assert parse_topo("dumbbell,0.5").text() == "dumbbell,bottleneck=0.5"


@pytest.mark.parametrize("text, message", [
    ("torus", "unknown topology 'torus': use one of star, dumbbell, leafspine"),
    ("", "give a topology name"),
    ("leafspine,racks=2", "leafspine has no parameter 'racks' (it takes: spines, leaves)"),
    ("leafspine,spines=two", "spines='two' is not an int"),
    ("leafspine,2.5", "spines='2.5' is not an int"),
    ("dumbbell,bottleneck=fast", "bottleneck='fast' is not a float"),
    ("leafspine,1,2,3", "leafspine takes at most 2 value(s) (spines, leaves)"),
    ("star,4", "star takes no parameters"),
    ("leafspine,leaves=2,3", "a positional value after a name=value one"),
    ("leafspine,2,spines=3", "spines is given twice"),
    ("leafspine,,2", "an empty value between commas"),
    ("leafspine,spines=0", "spines=0 is below its smallest value 1"),
    ("dumbbell,bottleneck=0", "bottleneck=0.0 is below its smallest value 0.001"),
])
def test_a_bad_spec_is_one_line(text, message):
    with pytest.raises(TopologyError) as err:
        parse_topo(text)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="^[^\n]+$"):
        RunConfig.flat(topo=text).check()


def test_a_topology_plugin_must_be_a_qaina_topology(monkeypatch):
    monkeypatch.setitem(TOPOLOGIES._items, "fn", lambda **_: None)
    monkeypatch.setitem(TOPOLOGIES._origin, "fn", "entry point fn = m:fn (m 1)")
    with pytest.raises(TopologyError, match="topology 'fn' \\(entry point fn = m:fn \\(m 1\\)\\) "
                                            "is not a QainaTopo subclass"):
        parse_topo("fn")


def test_the_dumbbell_bottleneck_shapes_only_the_middle_link():
    topo = DumbbellTopo(hosts=4, link=LinkParams(bw=10.0), bottleneck=2.0)
    assert topo.linkInfo("s1", "s2")["bw"] == 2.0
    assert topo.linkInfo("h1", "s1")["bw"] == 10.0 and topo.linkInfo("h2", "s2")["bw"] == 10.0
    cfg = RunConfig.flat(topo="dumbbell,bottleneck=2", bw=10.0, jobs=1, workers=4)
    assert build_topology(cfg).linkInfo("s1", "s2")["bw"] == 2.0
    assert DumbbellTopo(hosts=2, link=LinkParams(bw=10.0)).linkInfo("s1", "s2")["bw"] == 10.0


def test_spines_and_leaves_are_aliases_folded_into_the_spec():
    cfg = RunConfig.flat(topo="leafspine", spines=3, leaves=4)
    topo = build_topology(cfg)  # without check(), as a test or the sweep may build it
    assert sorted(s for s in topo.switches()) == ["lf1", "lf2", "lf3", "lf4", "sp1", "sp2",
                                                   "sp3"]
    cfg.check()
    assert (cfg.network.topo, cfg.network.spines, cfg.network.leaves) == ("leafspine,spines=3,leaves=4", 3, 4)
    cfg.check()  # what config.yaml records checks again to the same
    assert cfg.network.topo == "leafspine,spines=3,leaves=4"
    # the spec wins over an alias left at its default, and both at once must agree
    cfg = RunConfig.flat(topo="leafspine,leaves=3")
    cfg.check()
    assert (cfg.network.topo, cfg.network.leaves) == ("leafspine,spines=2,leaves=3", 3)
    with pytest.raises(ConfigError, match="sets leaves=3 and --leaves 4: give it once"):
        RunConfig.flat(topo="leafspine,leaves=3", leaves=4).check()
    with pytest.raises(ConfigError, match="with --spines: spines=0 is below"):
        RunConfig.flat(topo="leafspine", spines=0).check()
    star = RunConfig.flat(topo="star", spines=5)  # a topology without the parameter ignores it
    star.check()
    assert star.network.topo == "star"


def test_a_sweep_resumes_runs_stored_with_the_topology_s_short_name():
    from qaina_bench.harness.sweeping.sweep import comparable
    stored = RunConfig.flat(topo="leafspine", leaves=4)  # a config.yaml from before specs
    planned = RunConfig.flat(topo="leafspine", leaves=4)
    planned.check()
    assert planned.network.topo == "leafspine,spines=2,leaves=4"
    assert comparable(stored) == comparable(planned)
    assert comparable(RunConfig.flat(topo="leafspine", leaves=3)) != comparable(planned)


def test_the_run_id_names_the_parameters_that_differ_from_their_defaults():
    assert new_run_id(RunConfig.flat(topo="leafspine,2,4"))[16:].startswith(
        "leafspine-leaves4-ina-j2w4b4")
    assert new_run_id(RunConfig.flat(leaves=4))[16:].startswith("leafspine-leaves4-ina-")


# -- quantizers and compressors ----------------------------------------------------------
def test_the_built_in_quantizers_and_compressors_are_registered():
    assert QUANTIZERS.names()[:3] == ("maxpow2", "maxfine", "qsgd")
    assert all(QUANTIZERS.origin(n) == "built in" for n in ("maxpow2", "maxfine", "qsgd"))
    assert COMPRESSORS.get("gradiveq") is GradiVeQCompressor
    assert scale_rule("qsgd", 160, bucket=480).bucket_chunks == 3
    with pytest.raises(ValueError, match="unknown quantizer 'nope': use one of maxpow2, "
                                         "maxfine, qsgd"):
        scale_rule("nope", 160)
    with pytest.raises(ConfigError, match="--quantizer 'nope': use one of maxpow2, maxfine, "
                                          "qsgd.* or none$"):
        RunConfig.flat(quantizer="nope").check()
    with pytest.raises(ConfigError, match="--compress 'zip': use one of gradiveq.* or none$"):
        RunConfig.flat(compress="zip").check()


def test_a_rule_with_its_own_steps_codes_the_smallest_scale_above_the_statistic():
    rng = np.random.default_rng(3)
    g = (rng.standard_normal(4000) * np.exp2(rng.integers(-20, 20, 4000))).astype(np.float32)
    rule = MaxRule("half", steps=2)
    codes = rule.codes(g, 40).astype(np.float64)
    top = np.abs(g.astype(np.float64)).reshape(100, 40).max(axis=1)
    assert np.all(top <= np.exp2(codes / 2)) and np.all(top > np.exp2((codes - 1) / 2))
    assert np.array_equal(rule.factors(codes), np.exp2(codes / 2))


def test_the_gradiveq_compressor_keeps_its_schedule_fit_window_and_linearity():
    rng = np.random.default_rng(0)
    layers = [("w", 64 * 40), ("b", 10)]
    gvq = COMPRESSORS.get("gradiveq")(layers, d=64, k=8, fit=2, refresh=1)
    assert [gvq.exact(i) for i in range(6)] == [True, True, False, True, False, True]
    a, b = (rng.standard_normal(64 * 40 + 10).astype(np.float32) for _ in range(2))
    gvq.learn(a, 0)
    assert not gvq.fitted and gvq.metrics(a) == {}
    gvq.learn(b, 1)
    assert gvq.fitted and len(gvq.window) == 2
    np.testing.assert_allclose(gvq.compress(a + b), gvq.compress(a) + gvq.compress(b),
                               rtol=1e-4, atol=1e-4)
    assert len(gvq.compress(a)) == 40 * 8 + 10
    assert set(gvq.metrics(a)) == {"gvq_projection_error", "gvq_energy"}


# -- out-of-tree plugins -----------------------------------------------------------------
def cli(site, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(s) for s in site] + [os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", *args], env=env,
                         capture_output=True, text=True, timeout=120)
    return res.returncode, res.stdout + res.stderr


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    return install(tmp_path_factory.mktemp("plugin"))


def test_an_installed_package_adds_a_quantizer_and_a_topology(plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_site))
    quantizers = Registry("quantizer", "qaina_bench.quantizers")
    topologies = Registry("topology", "qaina_bench.topologies")
    assert quantizers.names() == ("maxhalf",) and topologies.names() == ("line",)
    assert quantizers.origin("maxhalf") == ("entry point maxhalf = qb_line_plugin:MAXHALF "
                                            "(qb-line-plugin 0.1)")
    line = topologies.get("line")(hosts=5, link=LinkParams(), switches=4)
    assert sorted(line.switches()) == ["s1", "s2", "s3", "s4"] and line.aggregator == "s1"
    code, out = cli([plugin_site], "plugins")
    assert code == 0, out
    assert "maxhalf      entry point maxhalf = qb_line_plugin:MAXHALF (qb-line-plugin 0.1)" \
        in out
    assert "line         entry point line = qb_line_plugin:LineTopo (qb-line-plugin 0.1)  " \
           "[switches=3]" in out
    code, out = cli([plugin_site], "up", "--help")
    assert code == 0 and "maxhalf" in out


@pytest.mark.parametrize("args, message", [
    (["up", "--topo", "line,switches=0"], "--topo line,switches=0: switches=0 is below"),
    (["up", "--topo", "line,2,3"], "line takes at most 1 value(s) (switches)"),
    (["up", "--quantizer", "nope"], "'nope' is not one of 'none', 'maxpow2', 'maxfine', "
                                    "'qsgd', 'maxhalf'"),
])
def test_a_plugin_s_bad_input_is_one_line(plugin_site, args, message):
    code, out = cli([plugin_site], *args)
    assert code != 0 and message in out and "Traceback" not in out
    errors = [line for line in out.splitlines() if line.strip() and not
              line.startswith(("Usage:", "Try "))]  # click's usage lines, then the error
    assert len(errors) == 1, out


def test_a_broken_entry_point_is_one_line(tmp_path, monkeypatch):
    install_broken(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="topology plugin 'bad' \\(qb_no_such_module:Thing\\) "
                                          "does not load: ModuleNotFoundError"):
        Registry("topology", "qaina_bench.topologies").names()
    for args in (["plugins"], ["up", "--topo", "star"]):
        code, out = cli([tmp_path], *args)
        assert code != 0 and "topology plugin 'bad'" in out and "does not load" in out, out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
