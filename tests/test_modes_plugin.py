"""A collective mode from a package of its own, registered through the entry-point group
``qaina_bench.modes``: the two code blocks of docs/extending.md ("A new mode"), taken
from the page, become an installed distribution; the CLI offers the mode, its data
drives the configuration checks, and (as root) ``up`` runs it end to end in Mininet
with exact sums."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def doc_blocks() -> dict[str, str]:
    """The page's example files: ``<!-- mode-example: PATH -->`` and the fenced block after."""
    text = DOC.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- mode-example: (\S+) -->\n```\w+\n(.*?)```", text, re.S)}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict:
    """The environment of a process that has the example package installed: its
    module on the path and a distribution with its entry points (what pip writes)."""
    root = tmp_path_factory.mktemp("plugin")
    blocks = doc_blocks()
    assert set(blocks) == {"my_modes/backring.py", "pyproject.toml"}
    (root / "my_modes").mkdir()
    (root / "my_modes" / "__init__.py").write_text("")
    (root / "my_modes" / "backring.py").write_text(blocks["my_modes/backring.py"])
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads(blocks["pyproject.toml"])["project"]
    points = project["entry-points"]["qaina_bench.modes"]
    dist = root / "my_modes-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    (dist / "entry_points.txt").write_text("[qaina_bench.modes]\n" + "".join(
        f"{name} = {value}\n" for name, value in points.items()))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def python(env, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_plugin_mode_is_a_choice_with_its_origin(plugin):
    done = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "up", "--help"],
                          env=plugin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--mode [ina|ring|ps|backring]" in done.stdout
    done = python(plugin, "from qaina_bench.hosts.collective import MODES\n"
                          "print(MODES.origin('backring'))")
    assert "entry point backring = my_modes.backring:MODE (my-modes 0.1)" in done.stdout, \
        done.stderr


def test_the_plugin_modes_data_drives_the_checks(plugin):
    code = """
from qaina_bench.harness.config import ConfigError, RunConfig
for kw in (dict(levels=2), dict(allocation="shared"), dict(quantizer="none", bits=[4]),
           dict(quantizer="none", bits=[32]), dict()):
    try:
        RunConfig.flat(mode="backring", trace="digits-mlp", **kw).check()
        print("ok")
    except ConfigError as exc:
        print("refused:", exc)
"""
    done = python(plugin, code)
    lines = done.stdout.splitlines()
    assert len(lines) == 5, done.stderr
    assert lines[0].startswith("refused: --levels 2") and "not --mode backring" in lines[0]
    assert lines[1].startswith("refused: --allocation shared")
    assert lines[2].startswith("refused: --quantizer none") and "ring or ps or backring" \
        in lines[2]
    assert lines[3:] == ["ok", "ok"]


def test_an_unknown_mode_is_one_line_naming_the_choices():
    from qaina_bench.harness.config import ConfigError, RunConfig
    with pytest.raises(ConfigError, match=r"^--mode: unknown mode 'tree': use one of ina, "
                                          r"ring, ps"):
        RunConfig.flat(mode="tree", trace="digits-mlp").check()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("mnexec") is None, reason="mnexec missing: apt-get install "
                    "mininet")
def test_the_plugin_mode_runs_end_to_end_with_exact_sums(plugin, tmp_path):
    done = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo",
                           "star", "--workers", "3", "--bits", "4", "--iterations", "2",
                           "--mode", "backring", "--record-levels", "--results-dir",
                           str(tmp_path), "--run-id", "backring"], env=plugin,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ring all-reduce, backwards" in done.stdout
    directory = tmp_path / "backring"
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["complete"] and summary["mode"] == "backring"
    job = summary["jobs"][0]
    assert job["iterations_done"] == 2 and job["slots_peak"] is None
    npz = [np.load(directory / "agents" / f"j1w{w}.npz") for w in range(3)]
    for i in range(2):
        total = np.sum([z[f"levels_{i}"].astype(np.int64) for z in npz], axis=0)
        for z in npz:
            assert np.array_equal(z[f"sums_{i}"], total)
            assert np.array_equal(z[f"aggregate_{i}"], npz[0][f"aggregate_{i}"])
