"""``qaina-bench report``: the numbers of README and ``docs/*.md`` written from data.

A generated part of a Markdown file sits between marker comments: a block on lines
of its own (README's glossary ``<!-- metrics -->`` ... ``<!-- /metrics -->``, a table
``<!-- table:NAME -->`` ... ``<!-- /table:NAME -->``) or a
value inside a sentence (``<!-- value:NAME -->889.8<!-- /value -->``). ``render``
rewrites every marked part from its generator (``harness/results/doctables.py``: ``BLOCKS``
and ``VALUES``, which read the CSVs of ``docs/data/``); ``check`` says which marked
part, if any, differs from what its data gives.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from .docformat import DataError
from .resultset import read_text
from .doctables import BLOCKS, VALUES, DocData

#: the files ``report`` rewrites, relative to the repository
FILES = ("README.md", "docs/results.md", "docs/compression.md", "docs/performance.md")

BLOCK = re.compile(r"(<!-- (metrics|table:[\w-]+) -->\n)(.*?)(<!-- /\2 -->)", re.S)
VALUE = re.compile(r"(<!-- value:([\w-]+) -->)(.*?)(<!-- /value -->)", re.S)
#: every marker, opening or closing, of a block or a value
MARKER = re.compile(r"<!-- (/?)(metrics|table:[\w-]+|value:[\w-]+|value) -->")


class ReportError(ValueError):
    """A marker names nothing the report can make, or its data is missing."""


def rewrite(text: str, data: DocData, where: str) -> tuple[str, list[str]]:
    """``text`` with every marked part made afresh, and the names of the parts that
    changed, in order."""
    check_markers(text, where)
    changed: list[str] = []

    def block(m: re.Match) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            raise ReportError(f"{where}: nothing makes {name!r} (known: "
                              f"{', '.join(sorted(BLOCKS))})")
        new = _make(BLOCKS[name], data, f"{where}: {name}")
        if new != m.group(3):
            changed.append(name)
        return m.group(1) + new + m.group(4)

    def value(m: re.Match) -> str:
        name = m.group(2)
        if name not in VALUES:
            raise ReportError(f"{where}: no value called {name!r}")
        new = _make(VALUES[name], data, f"{where}: value {name}")
        if new != m.group(3):
            changed.append(f"value {name}")
        return m.group(1) + new + m.group(4)

    return VALUE.sub(value, BLOCK.sub(block, text)), changed


def check_markers(text: str, where: str):
    """ReportError (one line) for a marker without its partner: every opening is
    followed by its own closing before any other marker (a block's opening ends its
    line), and every closing follows its opening."""
    opened = None  # (the opening marker, the closing it needs)
    for m in MARKER.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if opened is None and closing:
            wanted = "value:NAME" if name == "value" else name
            raise ReportError(f"{where}: {m.group(0)} has no opening <!-- {wanted} -->")
        if opened is None:
            if name == "value":
                raise ReportError(f"{where}: {m.group(0)} names no value: write "
                                  "<!-- value:NAME -->")
            if not name.startswith("value:") and not text.startswith("\n", m.end()):
                raise ReportError(f"{where}: {m.group(0)} must end its line")
            opened = (m.group(0), "value" if name.startswith("value:") else name)
        elif closing and name == opened[1]:
            opened = None
        else:
            break
    if opened is not None:
        raise ReportError(f"{where}: {opened[0]} has no closing <!-- /{opened[1]} -->")


def _make(generator, data: DocData, what: str) -> str:
    """``generator(data)``; data that lacks what it reads, or that it cannot read, is
    one ``ReportError`` naming the CSVs behind it (numpy's warnings of an empty or
    bad column are errors here)."""
    data.read.clear()
    try:
        with warnings.catch_warnings(), np.errstate(all="raise"):
            warnings.simplefilter("error", RuntimeWarning)
            return generator(data)
    except DataError:
        raise
    except KeyError as exc:
        raise ReportError(f"{what}: no {exc.args[0]!r} in {_files(data)} (from an older "
                          "command? rerun it)") from None
    except (StopIteration, IndexError, ZeroDivisionError, RuntimeWarning,
            FloatingPointError):
        raise ReportError(f"{what}: no rows for it in {_files(data)} (docs/data/README.md "
                          "says which command makes them)") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ReportError(f"{what}: cannot make it from {_files(data)} ({exc}): "
                          "docs/data/README.md says which command makes them") from None


def _files(data: DocData) -> str:
    """The CSVs the last generator read, as the docs name them."""
    return " and ".join(f"docs/data/{name}.csv" for name in data.read) or "its data"


def render(root: Path) -> dict[Path, tuple[str, list[str]]]:
    """Every file of ``FILES`` made afresh: path -> (new text, what changed)."""
    data = DocData(Path(root) / "docs" / "data")
    out = {}
    for name in FILES:
        path = Path(root) / name
        try:
            text = read_text(path)
        except OSError as exc:
            raise ReportError(f"cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ReportError(f"{path} is not text (UTF-8)") from None
        except ValueError as exc:
            raise ReportError(f"cannot read {path}: {exc}") from None
        out[path] = rewrite(text, data, name)
    return out


def check(root: Path) -> str | None:
    """None if every marked part matches its data, else the first that differs."""
    for path, (_, changed) in render(root).items():
        if changed:
            return f"{path.relative_to(root)}: {changed[0]} differs from its data"
    return None


def write(root: Path) -> list[str]:
    """Rewrite the files; returns what changed, one line per file."""
    lines = []
    for path, (text, changed) in render(root).items():
        if changed:
            path.write_text(text)
            lines.append(f"{path.relative_to(root)}: {', '.join(changed)}")
    return lines
