"""Carrying out a sweep: every planned run in order, skipping those already finished.

``run_sweep`` writes the resolved spec, records any trace set the spec asks for, then
runs each point's repeats one after another (``Run.execute``, as ``qaina-bench up``
does), with one progress line per run and the runs' own output in ``sweep.log``.
``sweep.csv`` is rewritten after every run, so it always joins what has finished.
Ctrl-C (or SIGTERM) ends the run under way cleanly, keeps its result set and stops
the sweep; running the same command again resumes it.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import sweepcsv
from .sweep import Spec, SweepError, Task, plan, prepare_traces, set_aside, spec_digest, \
    stored_status

SPEC_FILE = "spec.yaml"
CSV_FILE = "sweep.csv"
LOG_FILE = "sweep.log"


class SweepInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the sweep; what finished is kept."""


def bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def check_directory(spec: Spec, sweep_dir: Path):
    """Refuse a sweep directory that holds another spec's sweep."""
    stored = sweep_dir / SPEC_FILE
    if not stored.exists():
        return
    try:
        other = Spec.load(stored)
    except SweepError as exc:
        raise SweepError(f"{sweep_dir} holds an unreadable {SPEC_FILE} ({exc}): use another "
                         "--out, or remove it") from None
    if other.name != spec.name or spec_digest(other) != spec_digest(spec):
        raise SweepError(f"{sweep_dir} holds the sweep of another spec ({other.name}, "
                         f"{other.path}): use another --out, or remove it")


def collect(spec: Spec, tasks: list[Task], cache: dict[int, dict]) -> list[dict]:
    """The rows of sweep.csv: every run with a result set, and every refused point.
    ``cache`` keeps the rows already made (by task index); drop a task's entry when
    its run changes."""
    rows = []
    for k, t in enumerate(tasks):
        if k not in cache:
            cache[k] = _row(spec, t)
        if cache[k] is not None:
            rows.append(cache[k])
    return rows


def _row(spec: Spec, t: Task) -> dict | None:
    row = {"point": t.point.index, "repeat": t.repeat, **t.point.values}
    if t.cfg is None:
        cfg = spec.config(t.point, Path("."), t.repeat)
        row.update(sweepcsv.config_row(cfg), status="refused", note=t.refused, jobs_fit=0)
    elif t.directory.exists():
        row.update(sweepcsv.config_row(t.cfg), run_id=t.cfg.output.run_id,
                   **sweepcsv.run_row(t.directory))
    else:
        return None
    return row


def run_sweep(spec: Spec, sweep_dir: Path, echo, retry_failed: bool = True) -> dict:
    """Carry out the sweep; returns counts by outcome. Raises SweepInterrupted on
    Ctrl-C (after the run under way has been torn down and written)."""
    from ..running.run import Run
    sweep_dir = Path(sweep_dir)
    check_directory(spec, sweep_dir)
    plan(spec, sweep_dir)  # every point checked before a trace is recorded
    prepare_traces(spec, echo)
    tasks = plan(spec, sweep_dir)
    statuses = [stored_status(t) if t.cfg else "refused" for t in tasks]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "runs").mkdir(exist_ok=True)
    (sweep_dir / SPEC_FILE).write_text(spec.to_yaml())
    axes = list(spec.grid)
    csv_path = sweep_dir / CSV_FILE
    rows: dict[int, dict] = {}  # sweep.csv's rows by task, each made once
    sweepcsv.write(csv_path, axes, collect(spec, tasks, rows))
    todo = [k for k, s in enumerate(statuses)
            if s not in ("complete", "refused") and (retry_failed or s is None)]
    counts = {"complete": 0, "skipped": len(tasks) - len(todo), "failed": 0,
              "refused": statuses.count("refused")}
    echo(f"sweep {spec.name}: {len(spec.points())} points x {spec.repeats} repeats = "
         f"{len(tasks)} runs; {len(todo)} to run, {counts['skipped']} already done or "
         f"refused by the pool; results in {sweep_dir}")
    log = open(sweep_dir / LOG_FILE, "a", buffering=1)
    start, done = time.monotonic(), len(tasks) - len(todo)
    current = None
    try:
        for n, k in enumerate(todo):
            current = k
            task = tasks[k]
            rows.pop(k, None)
            if task.directory.exists():
                kept = set_aside(task.directory)
                log.write(f"kept the unfinished {task.cfg.output.run_id} as {kept.name}\n")
            log.write(f"\n== {task.cfg.output.run_id}: {task.point.describe()} "
                      f"(repeat {task.repeat})\n")
            t0 = time.monotonic()
            status, signalled = _one(Run, task, log)
            done += 1
            counts["complete" if status == "complete" else "failed"] += 1
            rows.pop(k, None)
            sweepcsv.write(csv_path, axes, collect(spec, tasks, rows))
            left = (time.monotonic() - start) / (n + 1) * (len(todo) - n - 1)
            echo(f"{bar(done, len(tasks))} {task.cfg.output.run_id} {task.point.describe()} "
                 f"r{task.repeat}: {status} in {time.monotonic() - t0:.1f} s"
                 + (f", about {_duration(left)} left" if n + 1 < len(todo) else ""))
            if status == "interrupted" or signalled:
                raise SweepInterrupted(task.cfg.output.run_id)
    except KeyboardInterrupt:
        raise SweepInterrupted(None) from None
    finally:
        log.close()
        if current is not None:  # the run under way when the sweep stopped
            rows.pop(current, None)
        sweepcsv.write(csv_path, axes, collect(spec, tasks, rows))
    return counts


def _one(Run, task: Task, log) -> tuple[str, bool]:
    """Run one task: its status ('complete', 'failed', 'interrupted', 'timeout', ...),
    and whether Ctrl-C or SIGTERM came during it (also while it was torn down)."""
    from ..switches.control import ControlError
    from ..running.run import RunError
    from ..switches.targets import TargetError

    def echo(*parts, nl=True, **_):
        text = " ".join(str(x) for x in parts)
        if not text.startswith("\r"):  # progress lines are for a terminal
            log.write(text + ("\n" if nl else ""))
    from ..config import ConfigError
    try:
        run = Run(task.cfg, echo=echo)
    except ConfigError as exc:  # e.g. another run is live
        log.write(f"not started: {exc}\n")
        return "failed", False
    try:
        summary = run.execute()
    except (RunError, ControlError, TargetError, OSError) as exc:
        log.write(f"failed: {exc}\n")
        return "failed", run.signalled
    return summary.get("status", "failed"), run.signalled
