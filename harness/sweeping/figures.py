"""``qaina-bench plot SWEEP_DIR``: the figure a sweep's spec asks for, from its sweep.csv.

The spec's ``plot`` section says what to draw::

    plot:
      title: text
      x: jobs                 # an axis of the grid (or a sweep.csv column)
      xlabel: concurrent jobs
      series: scheme          # axis (or list of axes): one line / bar colour each
      facet: workers          # optional axis: one row of panels per value
      kind: line              # line, or bar (one group of bars per x value)
      logx: false
      speedup_over: fp32 ring # bar: annotate every bar with the baseline's time / its
      panels:
        - {y: job_completion_s, ylabel: job completion time (s)}
        - {y: elements_per_s, ylabel: aggregate throughput (Melem/s), scale: 1.0e-6, logy: true}
        - {served: true, ylabel: jobs served}   # most jobs the pool held, per series

Each mark is the mean over a point's finished repeats; error bars span their range
(min to max) and the figure says how many repeats each mark has. A mark with a
repeat that was not network-bound (its ``fidelity`` verdict; for sweeps made before
the verdict, a saturated CPU: ``cpu_saturated``) is drawn hollow, and the figure's
footnote says so. The numbers behind every mark go to ``figures/<name>.csv`` and are
printed.
"""

from __future__ import annotations

import csv
import math
import textwrap
from pathlib import Path

import numpy as np

from ..results.metrics import over_repeats
from .sweep import Spec, SweepError
from .sweeprun import CSV_FILE, SPEC_FILE

#: columns that do not depend on what bound the run: never drawn hollow
UNTIMED = {"rel_error", "register_bit_efficiency", "bytes_per_iteration", "bytes_sent",
           "steady_bytes_per_iteration", "switch_link_bytes",
           "slots_peak", "jobs_fit"}
PANEL_KEYS = {"y", "ylabel", "scale", "logy", "served"}
PLOT_KEYS = {"title", "x", "xlabel", "series", "facet", "kind", "logx", "speedup_over",
             "panels"}


def _number(value):
    if value in (None, ""):
        return None
    if value in ("True", "False"):
        return float(value == "True")
    try:
        return float(value)
    except ValueError:
        return value


def _key(value):
    """Sort key that puts numbers in order and text after them."""
    v = _number(value)
    return (0, v, "") if isinstance(v, float) else (1, 0.0, str(value))


def ordered(values) -> list:
    """Distinct values: numbers in order, otherwise as the spec lists them (rows come
    in point order)."""
    seen = list(dict.fromkeys(values))
    if all(isinstance(_number(v), float) for v in seen):
        return sorted(seen, key=_key)
    return seen


def load(sweep_dir: Path) -> tuple[Spec, list[dict]]:
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / SPEC_FILE).exists() or not (sweep_dir / CSV_FILE).exists():
        raise SweepError(f"{sweep_dir} is not a sweep directory (no {SPEC_FILE} and "
                         f"{CSV_FILE}): give the --out of a `qaina-bench sweep`")
    spec = Spec.load(sweep_dir / SPEC_FILE)
    try:
        with open(sweep_dir / CSV_FILE, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SweepError(f"{sweep_dir / CSV_FILE} is unreadable: {exc}") from None
    if rows and not {"status", "point"} <= set(rows[0]):
        raise SweepError(f"{sweep_dir / CSV_FILE} is not a sweep table (no status column)")
    return spec, rows


def check_plot(spec: Spec, rows: list[dict]) -> dict:
    p = dict(spec.plot or {})
    if not p:
        raise SweepError(f"the spec of {spec.name} has no plot section")
    bad = sorted(set(p) - PLOT_KEYS)
    if bad:
        raise SweepError(f"plot: unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(PLOT_KEYS))}")
    cols = set(rows[0]) if rows else set()
    series = p.get("series") or []
    p["series"] = [series] if isinstance(series, str) else list(series)
    for name in [p.get("x")] + p["series"] + ([p["facet"]] if p.get("facet") else []):
        if not name or (rows and name not in cols):
            raise SweepError(f"plot: {name!r} is not a column of {CSV_FILE}")
    panels = p.get("panels") or []
    if not panels:
        raise SweepError("plot: give at least one panel")
    for panel in panels:
        if not isinstance(panel, dict) or set(panel) - PANEL_KEYS:
            raise SweepError(f"plot: a panel is a mapping of {', '.join(sorted(PANEL_KEYS))}")
        if not panel.get("served") and (not panel.get("y") or (rows and panel["y"] not in cols)):
            raise SweepError(f"plot: panel y {panel.get('y')!r} is not a column of {CSV_FILE}")
    if p.get("kind", "line") not in ("line", "bar"):
        raise SweepError("plot: kind is line or bar")
    return p


def not_network_bound(row: dict) -> bool:
    """Whether a run's timings measure the machine as much as the network: its
    fidelity verdict, or for a sweep made before the verdict its CPU saturation."""
    if row.get("fidelity"):
        return row["fidelity"] != "network-bound"
    return _number(row.get("cpu_saturated")) == 1.0


def marks(p: dict, rows: list[dict], y: str, facet_value=None) -> list[dict]:
    """One mark per (series, x): mean, min, max, repeats, and how many repeats were
    not network-bound (``hollow``), over finished runs."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") != "complete" or not isinstance(_number(r.get(y)), float):
            continue
        if p.get("facet") and r.get(p["facet"]) != facet_value:
            continue
        key = (tuple(str(r.get(s)) for s in p["series"]), str(r.get(p["x"])))
        groups.setdefault(key, []).append(r)
    out = []
    for (series, x), rs in groups.items():
        out.append({"series": " ".join(series) or y, "x": x, "y": y,
                    **over_repeats([_number(r[y]) for r in rs]),
                    "hollow": 0 if y in UNTIMED else sum(map(not_network_bound, rs))})
    xs = ordered(r[p["x"]] for r in rows)
    names = ordered(" ".join(r[s] for s in p["series"]) or y for r in rows)
    return sorted(out, key=lambda m: (names.index(m["series"]), xs.index(m["x"])))


def served(p: dict, rows: list[dict], facet_value=None) -> list[dict]:
    """Per series: the most jobs of a point that completed, the fewest jobs the pool
    refused (the point where it runs out), and pool slots // slots per job."""
    out: dict[str, dict] = {}
    for r in rows:
        if p.get("facet") and r[p["facet"]] != facet_value:
            continue
        name = " ".join(r[s] for s in p["series"])
        m = out.setdefault(name, {"series": name, "served": 0, "refused_at": None,
                                  "pool_holds": None})
        try:
            jobs = int(float(r["jobs"]))
        except (KeyError, TypeError, ValueError):
            continue
        slots, pool = _number(r.get("slots")), _number(r.get("pool_slots"))
        if isinstance(slots, float) and isinstance(pool, float) and slots >= 1:
            m["pool_holds"] = int(pool) // int(slots)  # what the pool holds at this window
        if r["status"] == "complete":
            m["served"] = max(m["served"], jobs)
        elif r["status"] == "refused":
            m["refused_at"] = min(jobs, m["refused_at"] or jobs)
    names = ordered(" ".join(r[s] for s in p["series"]) for r in rows)
    return sorted(out.values(), key=lambda m: names.index(m["series"]))


def plot_sweep(sweep_dir: Path, echo=print) -> list[Path]:
    """Draw the spec's figure; returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    spec, rows = load(sweep_dir)
    p = check_plot(spec, rows)
    if not any(r["status"] == "complete" for r in rows):
        raise SweepError(f"{sweep_dir}: no run has finished yet (run the sweep first)")
    facets = (sorted({r[p["facet"]] for r in rows}, key=_key) if p.get("facet") else [None])
    panels = p["panels"]
    width = max(6.4, 4.6 * len(panels))
    fig, axes = plt.subplots(len(facets), len(panels), squeeze=False,
                             figsize=(width, 3.6 * len(facets) + 0.8))
    table = []
    for i, facet in enumerate(facets):
        for j, panel in enumerate(panels):
            ax = axes[i][j]
            made = (_served_panel(ax, p, rows, facet, panel) if panel.get("served")
                    else _panel(ax, p, rows, facet, panel))
            for m in made:
                m["facet"] = "" if facet is None else f"{p['facet']}={facet}"
            table += made
            if facet is not None:
                ax.set_title(f"{p['facet']} = {facet}", fontsize=9)
    hollow = sum(m.get("hollow", 0) for m in table)
    repeats = sorted({m["repeats"] for m in table if "repeats" in m})
    note = (f"mean of {'/'.join(map(str, repeats))} repeat(s) per mark, bars: min to max. "
            + (f"Hollow marks, hatched bars: not network-bound in at least one repeat "
               f"({hollow} runs; the fidelity verdict, or a saturated CPU for runs made "
               "before it): the timing measures the machine as much as the network."
               if hollow else "No run behind these marks was judged other than "
               "network-bound."))
    fig.suptitle("\n".join(textwrap.wrap(p.get("title", spec.name), int(width * 11))),
                 fontsize=11)
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(note, int(width * 17))), fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    out_dir = sweep_dir / "figures"
    out_dir.mkdir(exist_ok=True)
    png = out_dir / f"{spec.name}.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    data = out_dir / f"{spec.name}.csv"
    _write_table(data, table)
    _print_table(table, echo)
    return [png, data]


def _panel(ax, p, rows, facet, panel) -> list[dict]:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    y, scale = panel["y"], float(panel.get("scale", 1.0))
    ms = marks(p, rows, y, facet)
    kind = p.get("kind", "line")
    names = list(dict.fromkeys(m["series"] for m in ms))
    xs = ordered(m["x"] for m in ms)
    colours = {n: f"C{k % 10}" for k, n in enumerate(names)}
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        mine = [m for m in ms if m["series"] == name]
        pos = ([xs.index(m["x"]) + (k - (len(names) - 1) / 2) * width for m in mine]
               if kind == "bar" else [_number(m["x"]) for m in mine])
        mean = np.array([m["mean"] for m in mine]) * scale
        err = np.array([[m["mean"] - m["min"], m["max"] - m["mean"]] for m in mine]).T * scale
        hollow = [m["hollow"] > 0 for m in mine]
        if kind == "bar":
            colour = ([f"C{xs.index(m['x']) % 10}" for m in mine] if len(names) == 1
                      else colours[name])  # one series: a colour per bar
            ax.bar(pos, mean, width, yerr=err, capsize=3, color=colour, label=name,
                   edgecolor="black")
            for x, h, sat in zip(pos, mean, hollow):
                if sat:
                    ax.bar([x], [h], width, fill=False, hatch="//", edgecolor="white")
        else:
            ax.errorbar(pos, mean, yerr=err, capsize=3, color=colours[name], label=name,
                        linestyle="-", marker=None)
            for x, v, sat in zip(pos, mean, hollow):
                ax.plot([x], [v], "o", color=colours[name],
                        markerfacecolor="white" if sat else colours[name])
    if kind == "bar":
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs, rotation=15 if max(map(len, xs), default=0) > 8 else 0,
                           fontsize=8)
        base = p.get("speedup_over")
        if base:
            _speedups(ax, ms, base, xs, names, width, scale)
    elif p.get("logx"):
        ax.set_xscale("log")
        ax.set_xticks([_number(x) for x in xs])
        ax.set_xticklabels([f"{_number(x):g}" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif all(float(_number(x)).is_integer() for x in xs if isinstance(_number(x), float)):
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.get("logy"):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(p.get("xlabel", p["x"]))
    ax.set_ylabel(panel.get("ylabel", y))
    ax.grid(True, alpha=0.3)
    if names and names != [y]:
        ax.legend(fontsize=7)
    return ms


def _speedups(ax, ms, base, xs, names, width, scale):
    """Write baseline / this over every bar (the speed-up over the baseline)."""
    for m in ms:
        ref = [b for b in ms if b["x"] == base or b["series"] == base]
        if not ref:
            continue
        ref_mean = ref[0]["mean"]
        k = names.index(m["series"])
        x = xs.index(m["x"]) + (k - (len(names) - 1) / 2) * width
        m["speedup"] = ref_mean / m["mean"] if m["mean"] else math.nan
        ax.annotate(f"{m['speedup']:.1f}x", (x, m["max"] * scale), ha="center",
                    va="bottom", fontsize=8)


def _served_panel(ax, p, rows, facet, panel) -> list[dict]:
    ms = served(p, rows, facet)
    names = [m["series"] for m in ms]
    ax.bar(range(len(ms)), [m["served"] for m in ms],
           color=[f"C{k % 10}" for k in range(len(ms))], edgecolor="black")
    for k, m in enumerate(ms):
        label = (f"refused at {m['refused_at']}" if m["refused_at"] else "all fit")
        if m["pool_holds"] is not None:
            label += f"\n(pool holds {m['pool_holds']})"
        ax.annotate(label, (k, m["served"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(ms)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(panel.get("ylabel", "jobs served"))
    ax.set_xlabel("scheme")
    ax.grid(True, axis="y", alpha=0.3)
    return [{"y": "jobs_served", **m} for m in ms]


TABLE_COLUMNS = ["y", "facet", "series", "x", "mean", "min", "max", "repeats", "hollow", "speedup",
                 "served", "refused_at", "pool_holds"]


def _write_table(path: Path, table: list[dict]):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, TABLE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(table)


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _print_table(table: list[dict], echo):
    for m in table:
        if m["y"] == "jobs_served":
            echo(f"  jobs served {m['facet']:>10} {m['series']:>24}: {m['served']}"
                 + (f" (pool refused {m['refused_at']})" if m["refused_at"] else "")
                 + (f"; the pool holds {m['pool_holds']}" if m["pool_holds"] else ""))
            continue
        extra = f"  {m['speedup']:.2f}x" if m.get("speedup") else ""
        sat = (f"  [{m['hollow']}/{m['repeats']} not network-bound]" if m["hollow"]
               else "")
        series = "" if m["series"] == m["y"] else m["series"]
        echo(f"  {m['y']:>20} {m['facet']:>10} {series:>24} {str(m['x']):>10}: {_fmt(m['mean'])} "
             f"({_fmt(m['min'])}..{_fmt(m['max'])}, n={m['repeats']}){extra}{sat}")
