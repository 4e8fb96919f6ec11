"""The house limits (README, "Layout"): every function at most 80 lines, every file of
Python at most 600, and the layers import downwards only (``hosts/``, ``topologies/``
and ``p4/`` never import ``harness/``)."""

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION, MAX_FILE = 80, 600
LOWER = ("hosts", "topologies", "p4")


def python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the house limits are checked on the repository")
    return [ROOT / name for name in listed.stdout.split()]


def test_functions_and_files_keep_the_house_limits():
    too_long = []
    for path in python_files():
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_FILE:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, "over the house limits:\n" + "\n".join(too_long)


def imported_modules(rel: Path, tree) -> list[tuple[int, str]]:
    """(line, module as a path from the repository's root, dotted) of every import."""
    found = []
    package = list(rel.parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.removeprefix("qaina_bench.")) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0:
                found.append((node.lineno, module.removeprefix("qaina_bench.")))
            else:
                base = package[:len(package) - (node.level - 1)]
                found.append((node.lineno, ".".join(base + ([module] if module else []))))
    return found


def test_lower_layers_never_import_the_harness():
    upward = []
    for path in python_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in LOWER:
            continue
        for line, module in imported_modules(rel, ast.parse(path.read_text())):
            if module == "harness" or module.startswith("harness."):
                upward.append(f"{rel}:{line} imports {module}")
    assert not upward, "a lower layer imports the harness:\n" + "\n".join(upward)


def test_imports_resolve_from_the_repository_root():
    """The resolver of the layering check reads relative and absolute imports."""
    tree = ast.parse("from ..harness.run import x\nfrom . import kernels\n"
                     "import qaina_bench.harness.cli\n")
    assert sorted(imported_modules(Path("hosts/agent.py"), tree)) == [
        (1, "harness.run"), (2, "hosts"), (3, "harness.cli")]
