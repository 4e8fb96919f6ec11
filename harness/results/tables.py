"""The result tables the CLI prints: a run's job table (``print_summary``), its
fidelity verdicts and CPU cost (``print_fidelity``), and what the job table's columns
mean (``columns_help``). The metric columns are the registry's (``harness/results/metrics.py``:
every job metric with a ``table`` column, in registration order)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import click

from .metrics import table_metrics

#: control characters (C0 but tab and newline, DEL, C1): a summary.json written by
#: another tool, or by hand, could move the cursor or retitle the terminal with them
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character shown as ``?``."""
    return CONTROL.sub("?", text)


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


def job_line(j: dict) -> str:
    cells = [f"{j['job_id']:>3} {j['bits']:>3} {j['lane_width']:>3} {j['lanes']:>3}"]
    cells += [m.table.cell(j.get(m.name)) for m in table_metrics()]
    return " ".join(cells)


def print_summary(summary: dict, directory: Path):
    echo(f"\n{summary['run_id']}: {summary['status']} ({summary['topology']}, "
               f"{summary['target']}, {summary.get('mode', 'ina')})")
    echo(job_head())
    for j in summary["jobs"]:
        if not j.get("iterations_done"):
            echo(f"{j['job_id']:>3} {j['bits']:>3}  no iteration completed")
            continue
        echo(job_line(j))
        if j.get("final_test_accuracy") is not None:
            reached = (f", {j['target_accuracy']:.2f} after {j['time_to_target_s']:.1f} s "
                       f"({j['iterations_to_target']} iterations)"
                       if j.get("time_to_target_s") is not None else
                       f", {j['target_accuracy']:.2f} not reached")
            echo(f"    test accuracy {j['final_test_accuracy']:.3f}{reached}")
        fb = j.get("fallback")
        if fb and j.get("switch_share") is not None:
            echo(f"    shared pool: the switch summed {j['switch_share']:.0%} of the "
                       f"chunks, the fallback host {fb['chunks_hosts']} chunks from "
                       f"{fb['singles']} singles")
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
