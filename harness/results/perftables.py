"""The tables and values of ``docs/performance.md``: the CPU cost, receive coalescing,
the headline, scale, the switch under overload, and figures of earlier sittings."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np

from .docformat import DocData, f1, f2, spread, table, values, verdicts


COST_PARTS = ("melem_s", "agents", "switches", "ps", "harness", "kernel", "total")
SCHEMES = {"ina": "in-network", "ring": "ring", "ps": "parameter server"}


def cost(name: str) -> Callable[[DocData], str]:
    """``bench testbed --table cost --csv``: a row per scheme, link rate and n."""
    return lambda d: _cost(d, name)


def _cost(d: DocData, name: str) -> str:
    body = []
    for r in d.rows(name):
        bw = "unshaped" if r["bw_mbit"] == "unshaped" else f"{float(r['bw_mbit']):g} Mbit/s"
        cells = [bw, r["workers"], SCHEMES[r["mode"]]]
        for part in COST_PARTS:
            cells.append("n/a" if not r[f"{part}_mean"] else
                         f"{float(r[part + '_mean']):.2f} ({float(r[part + '_min']):.2f}-"
                         f"{float(r[part + '_max']):.2f})")
        body.append(cells + [r["verdicts"]])
    return table(["links", "n", "scheme", "Melem/s", "agents", "switches", "ps", "harness",
                  "softirq", "total", "verdicts"], body)


def variants(name: str, column: str) -> Callable[[DocData], str]:
    """``bench testbed --table coalescing`` or ``--table sampling`` with ``--csv``
    (``column`` names the variant): per link rate and variant, mean (range) of its
    runs; the harness and the slot reads' interval where the CSV has them."""
    return lambda d: _variants(d, name, column)


def _variants(d: DocData, name: str, column: str) -> str:
    points: dict[tuple, list[dict]] = defaultdict(list)
    for r in d.rows(name):
        points[(r["bw_mbit"], r[column])].append(r)
    first = next(iter(points.values()))[0]
    parts = ["melem_s", "agents_s_per_melem", "switches_s_per_melem"] + (
        ["harness_s_per_melem"] if "harness_s_per_melem" in first else []) + [
        "total_s_per_melem"]
    reads = "slot_interval_s" in first
    body = [["unshaped" if bw == "unshaped" else f"{float(bw):g} Mbit/s", label]
            + [spread(values(rs, c), f2) for c in parts]
            + [spread(values(rs, "results_per_wakeup"), f1)]
            + ([spread([1e3 * v for v in values(rs, "slot_interval_s")], f1)] if reads else [])
            + [verdicts(rs, "verdict")]
            for (bw, label), rs in points.items()]
    runs = max(len(rs) for rs in points.values())
    return table(["links", column, f"Melem/s ({runs} runs)", "agents", "switch"]
                 + (["harness"] if "harness_s_per_melem" in parts else []) + ["total",
                 "results per wakeup"] + (["slot reads ms apart (median)"] if reads else [])
                 + ["verdicts"], body)


def headline(d: DocData) -> str:
    """In-network with each window (``slots``, when the CSV has them) and the ring."""
    points: dict[str, list[dict]] = defaultdict(list)
    for r in d.rows("headline"):
        window = r.get("slots") or ""
        points[SCHEMES[r["mode"]] + (f", {window} slots" if window else "")].append(r)
    switch = any("switches_s_per_melem" in r for r in d.rows("headline"))
    body = [[label, spread(values(rs, "melem_s_per_job"), f2),
             spread(values(rs, "agents_s_per_melem"), f2)]
            + ([spread(values(rs, "switches_s_per_melem"), f2)] if switch else [])
            + [verdicts(rs, "verdict")] for label, rs in points.items()]
    runs = max(len(rs) for rs in points.values())
    return table(["", f"Melem/s per job, mean (range), {runs} runs",
                  "agents' CPU s per million aggregated elements"]
                 + (["the switch's"] if switch else []) + ["verdicts"], body)


def _headline_melem(d: DocData, mode: str, window: int | None = None) -> float:
    """Mean Melem/s per job of the headline's ``mode`` runs (in-network: with
    ``window`` slots; rows without a ``slots`` column ran with up's default, 32)."""
    rows = [r for r in d.rows("headline") if r["mode"] == mode
            and (window is None or int(r.get("slots") or 32) == window)]
    return float(np.mean(values(rows, "melem_s_per_job")))


def _headline_before(d: DocData) -> float:
    """Melem/s per job of the in-network agents before the batched path (5113c12),
    as the headline's history has it."""
    row = next(r for r in d.rows("headline-history") if "5113c12" in r["label"])
    return float(row["Melem/s per job, mean (range), 3 runs"].split()[0])


def scale(name: str) -> Callable[[DocData], str]:
    """``bench scale --csv``: per place, size and link rate, mean (range) of its runs."""
    def make(d: DocData) -> str:
        points: dict[tuple, list[dict]] = defaultdict(list)
        for r in d.rows(name):
            points[(r["where"], int(r["workers"]), r["bw_mbit"])].append(r)
        # the agents' start is in the CSVs of bench scale since it forks them
        agents = all(r.get("agents_ready_s") for rs in points.values() for r in rs)
        columns = ["bring_up_s"] + ["agents_ready_s"] * agents + ["job_s", "cpu_s_per_melem"]
        body = [[where, str(n), f"{float(bw):g} Mbit/s" if bw else "unshaped"]
                + [spread(values(rs, c), f2) for c in columns]
                + [verdicts(rs, "verdict")] for (where, n, bw), rs in points.items()]
        runs = max(len(rs) for rs in points.values())
        return table(["where", "workers", "links", f"bring-up s ({runs} runs)"]
                     + ["agents s"] * agents + ["job s", "CPU s/Melem", "verdicts"], body)
    return make


def history(name: str) -> Callable[[DocData], str]:
    """A table of figures measured in an earlier sitting, as the CSV holds them (a
    first column named ``label`` has no heading)."""
    def make(d: DocData) -> str:
        rows = d.rows(name)
        keys = list(rows[0])
        return table(["" if k == "label" else k for k in keys],
                     [[r[k] for k in keys] for r in rows])
    return make


def _overload(d: DocData, name: str = "overload") -> list[dict]:
    return [r for r in d.rows(name) if r["target"] == "embedded"]


def overload(name: str) -> Callable[[DocData], str]:
    """``bench switch --csv``: aggregated pps per offered rate, with the share of the
    peak at about twice it."""
    return lambda d: _overload_table(d, name)


def _overload_table(d: DocData, name: str) -> str:
    body = []
    for r in _overload(d, name):
        agg, lo, hi = (int(r[k]) for k in ("aggregated_pps", "aggregated_min",
                                           "aggregated_max"))
        cell = f"{agg:,} ({lo:,}-{hi:,})"
        if r["peak_pps"]:
            peak = int(r["peak_pps"])
            cell += (f": {100 * agg / peak:.0f}% ({100 * lo / peak:.0f}-"
                     f"{100 * hi / peak:.0f}%) of the peak at "
                     f"{int(r['offered_pps']) / peak:.2f}x")
        body.append([r["bits"], f"{int(r['offered_pps']) / 1e3:.0f}", cell])
    return table(["b", "offered kpps", "aggregated pps, mean (range)"], body)


def overload_kept(bits: str) -> Callable[[DocData], str]:
    """The share of its peak the switch kept at twice the peak, at ``bits``."""
    def make(d: DocData) -> str:
        r = next(r for r in _overload(d) if r["bits"] == bits and r["peak_pps"])
        return f"{100 * int(r['aggregated_pps']) / int(r['peak_pps']):.0f}%"
    return make
