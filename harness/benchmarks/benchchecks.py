"""The checks of ``qaina-bench bench``'s options, made before a benchmark starts
anything, and the one line each of its errors ends with (as the rest of the CLI)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from pathlib import Path

import click

from ..config import MAX_BW, MIN_BW


class Within(click.FloatRange):
    """A finite number from ``low`` to ``high``: nan and inf are refused as not finite
    (``click.FloatRange`` would let nan through)."""

    def __init__(self, low: float, high: float):
        super().__init__(min=low, max=high)

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


#: link Mbit/s of a benchmark's runs: what ``up --bw`` takes
BANDWIDTH = Within(MIN_BW, MAX_BW)
#: runs of each point of a benchmark (the repeats of its mean and range)
REPEATS = click.IntRange(1, 100)


def fail(message: str):
    """End the command with ``Error: message`` and exit 1, as the CLI's other commands."""
    raise click.ClickException(message)


def need_root(command: str):
    """One line and exit 1 unless this is root: before anything is recorded or run."""
    if os.geteuid() != 0:
        fail(f"qaina-bench bench {command} needs root (veth pairs, raw sockets, Mininet): "
             "run it with sudo")


def check_csv(path: str | None):
    """One line if ``--csv`` cannot be written: checked now, written after the runs."""
    from ..results.resultset import unwritable
    problem = unwritable(path) if path else None
    if problem:
        fail(f"--csv {problem}")


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a folder this process writes in (made if it is missing,
    with the folders above it), in a few words naming what is in the way; None if it
    can be."""
    probe = Path(path).absolute()
    while not probe.exists() and not probe.is_symlink():
        probe = probe.parent
    if not probe.exists():
        return f"{probe} is a link to nothing"
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable for this user"
    return None


def check_results_dir(path: Path, inside: str = ""):
    """One line if ``--results-dir`` (and ``inside`` it) cannot take the runs."""
    problem = folder_problem(Path(path) / inside)
    if problem:
        fail(f"--results-dir {path}: {problem}: name a directory (made if missing)")


def check_burst(rates, seconds: float, burst: int):
    """``bench switch``: each ``--rate`` offers at least one burst in ``--seconds`` (else
    the sender offers nothing the figures could be made of)."""
    for rate in rates:
        if rate * seconds < burst:
            fail(f"--rate {rate:g} for --seconds {seconds:g} offers {rate * seconds:g} "
                 f"contributions, fewer than one burst of {burst}: give a higher --rate or "
                 "more --seconds")


def trace_shape(name: str) -> tuple[int, int]:
    """(workers, iterations) of trace set ``name``: one that is there, or a recipe that
    is recorded on first use; TraceError (one line) if it is neither."""
    from ...hosts.recorder import RECIPES
    from ...hosts.traces import TraceError, open_trace
    try:
        trace = open_trace(name)
        return trace.workers, trace.iterations
    except TraceError:
        if name not in RECIPES:
            raise
    return RECIPES[name]["workers"], RECIPES[name]["iterations"]


def check_trace(option: str, name: str, table: str, workers: int, iterations: int):
    """One line unless trace set ``name`` (given with ``option``; None: the runs'
    default) is found or recorded on first use, and holds the ``workers`` and the
    ``iterations`` that ``table`` runs."""
    from ...hosts.traces import TraceError
    given = f"{option} {name}" if option else f"trace {name} (the {table} table's)"
    try:
        has_workers, has_iterations = trace_shape(name)
    except TraceError as exc:
        fail(f"{given}: {exc}; or record one with `qaina-bench traces record NAME`")
    if has_workers < workers:
        fail(f"{given}: the {table} table runs {workers} workers, the set has "
             f"{has_workers}: name a set of {workers} or more (`qaina-bench traces record "
             f"NAME --workers {workers}`)")
    if has_iterations < iterations:
        fail(f"--iterations {iterations}: trace {name} has {has_iterations} iterations "
             f"(the {table} table's): give at most {has_iterations}")


def check_table_traces(tables, opts: dict, table_traces: dict):
    """``bench testbed``: every chosen table's trace set (``table_traces``: table ->
    (option's parameter or None, the set without one or None: the runs' default,
    workers)) is found or recorded on first use, with its workers and ``--iterations``."""
    from ..config import RunConfig
    default = RunConfig().training.trace
    for table in tables:
        param, fixed, workers = table_traces[table]
        name = opts[param] if param else fixed or default
        option = "--" + param.replace("_", "-") if param else None
        check_trace(option, name, table, workers, opts["iterations"])


def check_table_options(ctx: click.Context, tables, uses: dict):
    """A UsageError (exit 2) for an option given on the command line that none of
    ``tables`` takes (``uses``: parameter -> the tables that take it), naming them."""
    from click.core import ParameterSource
    for param in ctx.command.params:
        takers = uses.get(param.name)
        source = ctx.get_parameter_source(param.name)
        if takers is None or source in (ParameterSource.DEFAULT, None):
            continue
        if not set(takers) & set(tables):
            flag = param.opts[0]
            names = (f"{', '.join(takers[:-1])} and {takers[-1]} tables" if len(takers) > 1
                     else f"{takers[0]} table only")
            raise click.UsageError(
                f"{flag} is used by the {names}, not by --table {', '.join(tables)}: "
                f"add --table {takers[0]} or leave {flag} out", ctx)


@contextlib.contextmanager
def benchmark_errors(stopped: str):
    """Around a benchmark's work: SIGTERM stops it as Ctrl-C does (what it started is
    torn down); a run the options cannot make, a trace that cannot be recorded, a
    ``--csv`` or another file that cannot be written end in one line, exit 1; Ctrl-C
    in one line saying ``stopped`` (what is kept), exit 130."""
    from ...hosts.traces import TraceError
    from ...settings import ConfigError
    from ..results.resultset import OutputError
    from ..running.processes import _terminate
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except (ConfigError, TraceError) as exc:
        fail(str(exc))
    except OutputError as exc:  # --csv, after the runs: the table printed stands
        fail(f"{exc}; the table above is what was measured")
    except OSError as exc:  # a file of the runs' (a full disk, a folder made read-only)
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: the benchmark stopped ({stopped})", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
