"""What the docs' generated tables are made with: the CSVs of ``docs/data``
(``DocData``), a column's values, the mean with its range, number formats, and a
Markdown table."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Callable

from .metrics import over_repeats
from .resultset import read_text


class DataError(ValueError):
    """A CSV of ``docs/data`` that cannot be read as a table; the message names it."""


class DocData:
    """The CSVs of ``docs/data``, read once each; ``read`` names those read (the
    report clears it before each table, to say which files a failure comes from)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self._tables: dict[str, list[dict]] = {}
        self.read: list[str] = []

    def rows(self, name: str) -> list[dict]:
        if name not in self.read:
            self.read.append(name)
        if name not in self._tables:
            self._tables[name] = read_table(self.dir / f"{name}.csv")
        return self._tables[name]

    def points(self, name: str, key: tuple[str, ...]) -> dict[tuple, list[dict]]:
        """A sweep's rows grouped by the config columns ``key``, in the CSV's order."""
        out: dict[tuple, list[dict]] = defaultdict(list)
        for r in self.rows(name):
            if r.get("status") == "complete":
                out[tuple(r[k] for k in key)].append(r)
        return out


def read_table(path: Path) -> list[dict]:
    """The rows of a CSV with a header and at least one row, every row as long as the
    header; DataError (one line, naming the file) for anything else."""
    hint = "docs/data/README.md says which command makes it"
    try:
        reader = csv.reader(io.StringIO(read_text(path), newline=""))
        head = next(reader, None)
        lines = [(reader.line_num, r) for r in reader if r]
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, csv.Error) as exc:  # not UTF-8, not a regular file, too large
        raise DataError(f"{path} is not a CSV table ({exc}): {hint}") from None
    if not head:
        raise DataError(f"{path} is empty: {hint}")
    if not lines:
        raise DataError(f"{path} has a header but no rows: {hint}")
    for line, r in lines:
        if len(r) != len(head):
            raise DataError(f"{path}: line {line} has {len(r)} fields, the header "
                            f"{len(head)} (cut short or damaged): {hint}")
    return [dict(zip(head, r)) for _, r in lines]


def values(rows: list[dict], column: str) -> list[float]:
    return [float(r[column]) for r in rows if r.get(column) not in (None, "")]


def span(lo: str, hi: str) -> str:
    """``lo-hi``, or ``lo`` alone where the two read the same."""
    return lo if lo == hi else f"{lo}-{hi}"


def spread(xs: list[float], fmt: Callable[[float], str], unit: str = "") -> str:
    """``mean unit (min-max)``; the range left out where it does not show at ``fmt``."""
    stats = over_repeats(xs)
    mean, lo, hi = fmt(stats["mean"]), fmt(stats["min"]), fmt(stats["max"])
    return f"{mean}{unit}" + (f" ({lo}-{hi})" if lo != hi else "")


def fixed(digits: int) -> Callable[[float], str]:
    """A format with ``digits`` decimals."""
    return lambda x: f"{x:.{digits}f}"


f1, f2, f3 = fixed(1), fixed(2), fixed(3)


def seconds(x: float) -> str:
    """Three decimals below a second, three significant digits above."""
    return f"{x:.3f}" if x < 1 else f"{x:.3g}"


def mbytes(x: float) -> str:
    return f"{x / 1e6:.3g}"


def verdicts(rows: list[dict], column: str = "fidelity") -> str:
    found = sorted({r[column] for r in rows})
    return found[0] if len(found) == 1 else "/".join(found)


def table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


# -- docs/results.md -----------------------------------------------------------------


def sig2(x: float) -> str:
    return f"{x:#.2g}"


def wait(x: float) -> str:
    """One significant digit below 0.1 s, two decimals above."""
    return f"{x:.1g}" if x < 0.1 else f"{x:.2f}"


def sig3(x: float) -> str:
    return f"{x:#.3g}"
