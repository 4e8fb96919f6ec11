"""The result tables the CLI prints: a run's job table (``print_summary``), its
fidelity verdicts and CPU cost (``print_fidelity``), and what the job table's columns
mean (``columns_help``). The metric columns are the registry's (``harness/results/metrics.py``:
every job metric with a ``table`` column, in registration order)."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import click

from .metrics import table_metrics

#: control characters (C0 but tab and newline, DEL, C1): a summary.json written by
#: another tool, or by hand, could move the cursor or retitle the terminal with them
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: Unicode's bidirectional controls (marks, embeddings, overrides, isolates): they
#: reorder what the terminal shows after them, so a run id could read as another
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character and bidirectional control shown as ``?``."""
    return BIDI.sub("?", CONTROL.sub("?", text))


def echo(text: str = "", **kwargs):
    """``click.echo`` of what a result set says, its control characters made harmless."""
    click.echo(printable(str(text)), **kwargs)

#: the job table's columns before the metrics: they describe the job's number format
FORMAT_HEAD = f"{'job':>3} {'b':>3} {'w':>3} {'m':>3}"
FORMAT_HELP = ("job; b bits per value; w lane width (bits of a lane sum); m values per "
               "32-bit register")


def job_head() -> str:
    return " ".join([FORMAT_HEAD] + [f"{m.table.head:>{m.table.width}}"
                                     for m in table_metrics()])


#: why a number of the tables is shown as it is although it is wrong: its only fault
NEGATIVE = "below 0"


def value_problem(value, fmt: str = "") -> str | None:
    """Why ``value`` is no number a table's column formatted by ``fmt`` can show (every
    number of the job table counts or times something: at least 0, and whole for
    ``d``); None if it is one, or is None (n/a)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    try:
        number = float(value)
    except OverflowError:  # an integer past float's range: JSON has them
        return "too large a number"
    if not math.isfinite(number):
        return "not a finite number"
    if fmt.endswith("d") and not number.is_integer():
        return "not a whole number"
    return NEGATIVE if number < 0 else None


class Cells:
    """Formats a summary's numbers for the tables, and keeps each of the wrong type
    (shown as n/a) or below 0 (shown as it is) with its field, for one warning."""

    def __init__(self):
        self.odd: list[str] = []

    def __call__(self, value, field: str, fmt: str = "", width: int = 0,
                 scale: float = 1.0) -> str:
        why = value_problem(value, fmt)
        if why:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            self.odd.append(f"{field} = {shown} ({why})")
        if value is None or why not in (None, NEGATIVE):
            return f"{'n/a':>{width}}"
        value = value * scale if scale != 1 else value
        return f"{round(value) if fmt.endswith('d') else value:>{width}{fmt}}"

    def warning(self, path: Path) -> str | None:
        """The warning line naming every odd value, or None if there was none."""
        if not self.odd:
            return None
        more = f"; and {len(self.odd) - 6} more" if len(self.odd) > 6 else ""
        return (f"warning: {path} holds values of the wrong type or range (shown as n/a, "
                f"one below 0 as it is): {'; '.join(self.odd[:6])}{more}")


def job_line(j: dict, cell: Cells | None = None, where: str = "job") -> str:
    """A job's row of the job table (``where``: how its fields are named in warnings)."""
    cell = cell or Cells()
    cells = [cell(j.get(k), f"{where}.{k}", "d", 3)
             for k in ("job_id", "bits", "lane_width", "lanes")]
    cells += [cell(j.get(m.name), f"{where}.{m.name}", m.table.fmt, m.table.width,
                   m.table.scale) for m in table_metrics()]
    return " ".join(cells)


def print_job(j: dict, cell: Cells, where: str):
    """A job's row, with what it learned (``--train``) and how a shared pool served it."""
    def num(key, fmt, width=0, of=j, at=where):
        return cell(of.get(key), f"{at}.{key}", fmt, width)
    if not j.get("iterations_done"):
        echo(f"{num('job_id', 'd', 3)} {num('bits', 'd', 3)}  no iteration completed")
        return
    echo(job_line(j, cell, where))
    if j.get("final_test_accuracy") is not None:
        reached = (f", {num('target_accuracy', '.2f')} after {num('time_to_target_s', '.1f')} "
                   f"s ({num('iterations_to_target', 'd')} iterations)"
                   if j.get("time_to_target_s") is not None else
                   f", {num('target_accuracy', '.2f')} not reached")
        echo(f"    test accuracy {num('final_test_accuracy', '.3f')}{reached}")
    fb = j.get("fallback")
    if isinstance(fb, dict) and fb and j.get("switch_share") is not None:
        at = f"{where}.fallback"
        echo(f"    shared pool: the switch summed {num('switch_share', '.0%')} of the "
             f"chunks, the fallback host {num('chunks_hosts', 'd', of=fb, at=at)} chunks "
             f"from {num('singles', 'd', of=fb, at=at)} singles")


def print_summary(summary: dict, directory: Path):
    """A result set's job table, verdicts, warnings and errors; a value of the wrong
    type in its jobs is shown as n/a, with one warning naming it."""
    cell = Cells()
    echo(f"\n{summary['run_id']}: {summary['status']} ({summary['topology']}, "
         f"{summary['target']}, {summary.get('mode', 'ina')})")
    echo(job_head())
    for i, j in enumerate(summary["jobs"]):
        print_job(j, cell, f"jobs[{i}]")
    if summary.get("startup_to_first_send_s") is not None:
        echo(startup_line(summary))
    print_fidelity(summary)
    loss = loss_line(summary)
    if loss:
        echo(loss)
    for warning in summary.get("validity", {}).get("warnings", []):
        echo(f"warning: {warning}", err=True)
    for err in summary.get("errors", []):
        echo(f"error: {err}", err=True)
    odd = cell.warning(Path(directory) / "summary.json")
    if odd:
        echo(odd, err=True)
    echo(f"results: {directory}")


#: the run's events up to its first packet, in order, as ``startup_line`` names them
STARTUP_STEPS = [("network_up", "network up"), ("programmed", "switches programmed"),
                 ("agents_go", "agents ready")]


def startup_line(summary: dict) -> str:
    """When the first packet went, and where the time before it went: each step from
    the one before (``summary.json``'s ``events``), the last to the first send."""
    first = summary["startup_to_first_send_s"]
    events = summary.get("events") or {}
    if "invoked" not in events:
        return f"first packet {first:.1f} s after start"
    steps, last = [], events["invoked"]
    for key, name in STARTUP_STEPS:
        if events.get(key) is not None:
            steps.append(f"{name} {events[key] - last:.1f} s")
            last = events[key]
    steps.append(f"first send {events['invoked'] + first - last:.1f} s")
    return f"first packet {first:.1f} s after start: {', '.join(steps)}"


def loss_line(summary: dict) -> str | None:
    """What the links' loss rules lost (``summary.json``'s ``link_loss``), if counted."""
    loss = summary.get("link_loss")
    if not loss or not loss.get("bytes"):
        return None
    return (f"link loss {loss['percent']:g}% by {loss['by']}: {loss['lost']:,} of "
            f"{loss['frames']:,} frames lost, {100 * loss['lost_share']:.2f}% of the bytes")


def print_fidelity(summary: dict):
    """The run's fidelity verdict with each job's reason, and where its CPU went; a
    result set made before the verdict says so and gives its CPU saturation."""
    fid = summary.get("fidelity")
    if not fid:
        sat = ((summary.get("validity") or {}).get("cpu") or {}).get("saturated")
        echo("fidelity: not judged (a result set older than the verdict); CPU "
                   + (f"saturated: {sat}" if sat else "not saturated"))
        return
    echo(f"fidelity: {fid['verdict']}")
    for j in summary["jobs"]:
        f = j.get("fidelity") or {}
        echo(f"  job {j['job_id']}: {f.get('verdict', 'n/a')}, {f.get('reason', '')}")
    cost = summary.get("cpu_cost")
    if cost and cost.get("s_per_melem") is not None:
        parts = [f"{name} {c['s_per_melem']:.2f}" for name, c in cost["components"].items()]
        k = cost["kernel"]
        by, shared = cost.get("cores_by_server") or {}, cost.get("shared_kernel") or {}
        servers = (" (" + ", ".join(f"{n} {c if c else '?'}" if n not in shared else
                                    f"{n} on {shared[n]}'s kernel" for n, c in by.items())
                   + ")" if by else "")
        echo(f"CPU s per million elements: {', '.join(parts)}; softirq "
                   f"{k['s_per_melem']:.2f} (system-wide); {cost['total_s']:.1f} CPU s in "
                   f"{cost['window_s']:.1f} s on {cost['cores']} cores{servers}")


def columns_help() -> str:
    """What the job table's columns mean (``results show``)."""
    parts = [FORMAT_HELP] + [f"{m.table.head} {m.definition}" for m in table_metrics()]
    text = ("columns: " + "; ".join(parts) + ". n/a: not applicable (ring and ps "
            "modes: the switches only route). fidelity: what bound each job's iterations: "
            "its links (network-bound), the CPU (cpu-bound), or neither clearly (mixed). "
            "Definitions: README, \"Metrics\".")
    return "\n" + textwrap.fill(text, 88) + "\n"
