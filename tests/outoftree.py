"""A tiny out-of-tree plugin package, as a researcher would write one: a
``pyproject.toml`` with entry points and one module holding a quantizer (``maxhalf``,
max|g| in half octaves) and a topology (``line``: switches in a chain). The tests build
its wheel and install it with pip into a directory of their own (``--target``), never
into the project's virtualenv, and make it visible through PYTHONPATH."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "qb-line-plugin"
version = "0.1"
dependencies = ["qaina-bench"]

[project.entry-points."qaina_bench.quantizers"]
maxhalf = "qb_line_plugin:MAXHALF"

[project.entry-points."qaina_bench.topologies"]
line = "qb_line_plugin:LineTopo"

[tool.setuptools]
py-modules = ["qb_line_plugin"]
'''

MODULE = '''\
"""A quantizer and a topology for qaina-bench."""

from qaina_bench.hosts.quantize import MaxRule
from qaina_bench.topologies import LinkParams, Param, QainaTopo

#: max|g| rounded up to half octaves: at most 41% above the maximum
MAXHALF = MaxRule("maxhalf", steps=2)


class LineTopo(QainaTopo):
    """Switches s1..sN in a chain, hosts spread over them in turn; s1 aggregates."""

    params = (Param("switches", int, 3, "switches in the chain", low=1),)

    def build(self, hosts=4, link=LinkParams(), switches=3, **_):
        chain = [self.addSwitch(f"s{k}") for k in range(1, switches + 1)]
        for left, right in zip(chain, chain[1:]):
            self.addLink(left, right, **link.opts())
        for i in range(1, hosts + 1):
            self.addLink(self.addWorker(i), chain[(i - 1) % switches], **link.opts())
        self.aggregator = "s1"
'''

BROKEN = """Metadata-Version: 2.1
Name: qb-broken-plugin
Version: 0.1
"""


def write_package(root: Path) -> Path:
    """The package's source tree under ``root``."""
    pkg = root / "qb-line-plugin"
    pkg.mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "qb_line_plugin.py").write_text(MODULE)
    return pkg


def build_wheel(pkg: Path, out: Path) -> Path:
    """The package's wheel, written from its pyproject.toml (name, version, entry
    points, modules) without a build backend: the project's virtualenv need not hold
    ``wheel``, and nothing is downloaded."""
    pyproject = tomllib.loads((pkg / "pyproject.toml").read_text())
    meta = pyproject["project"]
    dist = f"{meta['name'].replace('-', '_')}-{meta['version']}"
    files = {f"{m}.py": (pkg / f"{m}.py").read_bytes()
             for m in pyproject["tool"]["setuptools"]["py-modules"]}
    points = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
                     + "\n" for group, entries in meta["entry-points"].items())
    files[f"{dist}.dist-info/METADATA"] = (f"Metadata-Version: 2.1\nName: {meta['name']}\n"
                                           f"Version: {meta['version']}\n").encode()
    files[f"{dist}.dist-info/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: tests\n"
                                        b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist}.dist-info/entry_points.txt"] = points.encode()
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n"
                     for name, data in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    wheel = out / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(root: Path) -> Path:
    """Write, build and pip-install the package into ``root/site``; returns that
    directory (put it on PYTHONPATH)."""
    wheel = build_wheel(write_package(root), root)
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", "--target", str(site), str(wheel)], check=True)
    return site


def install_broken(site: Path, group: str = "qaina_bench.topologies") -> None:
    """A distribution in ``site`` whose entry point in ``group`` names a module that
    does not exist."""
    info = site / "qb_broken_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(BROKEN)
    (info / "entry_points.txt").write_text(f"[{group}]\nbad = qb_no_such_module:Thing\n")
