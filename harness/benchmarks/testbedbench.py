"""``bench testbed``: whole runs of the testbed, printed as tables (never timed tests).

``transport``: completion time against the links' own bound; ``repeat``: the spread of
repeats; ``comparison`` and ``ratio``: in-network b = 4 against b = 32 and the ring;
``cost``: end-to-end elements/s and CPU seconds per million aggregated elements by
component; ``headline``: the README's headline figures. ``ratio``, ``cost`` and
``headline`` return their rows, which ``--csv`` writes (``write_csv``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ..running.cpustat import COMPONENTS


def testbed_bench(topo: str, bits: int, bw: float | None, iterations: int, workdir: Path,
                  jobs: int, mode: str = "ina", workers: int = 4, **options) -> dict:
    """One ``up`` run; returns its summary."""
    from ..config import RunConfig
    from ..running.run import Run
    cfg = RunConfig.flat(topo=topo, jobs=jobs, workers=workers, bits=[bits],
                         iterations=iterations, bw=bw, results_dir=str(workdir), mode=mode,
                         **options)
    run = Run(cfg, echo=lambda *a, **k: None)
    summary = run.execute()
    if run.signalled:  # Ctrl-C or SIGTERM: the run is torn down, the benchmark stops
        raise KeyboardInterrupt
    return summary


def link_bound_time(summary: dict) -> float | None:
    """Seconds the busiest link direction needs for the bytes it carried in the run,
    at the configured link rate (None for unshaped links)."""
    bw = summary["links"]["bw_mbit"]
    if not bw or not summary["link_bytes"]:
        return None
    busiest = max(max(v["bytes_sent"], v["bytes_recv"]) for v in summary["link_bytes"].values())
    return busiest * 8 / (bw * 1e6)


def transport_table(workdir: Path, iterations: int, bandwidths=(0.3, 1.0, 10.0, None)):
    """Retransmissions, and time against what the links need, star, one job: per
    iteration (a worker's bytes of an iteration over its own link) and per run (the
    busiest link's bytes, warm-up and the gaps between iterations included)."""
    print(f"transport: star, 1 job x 4 workers, {iterations} iterations; 'link ms' is what "
          "a worker's link needs for the bytes of one iteration, 'link s' what the busiest "
          "link needs for all it carried")
    print(f"{'Mbit/s':>7} {'bits':>4} {'retx':>5} {'timeouts':>8} {'iter ms':>8} "
          f"{'link ms':>8} {'iter/link':>9} {'run s':>7} {'link s':>7} {'run/link':>8}")
    for bw in bandwidths:
        for bits in (4, 32):
            s = testbed_bench("star", bits, bw, iterations, workdir, 1)
            j = s["jobs"][0]
            bound = link_bound_time(s)
            it = j["iteration_completion_mean_s"]
            per_iteration = j["bytes_sent"] / (j["workers"] * j["iterations_done"])
            it_link = per_iteration * 8 / (bw * 1e6) if bw else None
            nan = float("nan")
            print(f"{bw or 'none':>7} {bits:>4} {j['retransmissions']:>5} {j['timeouts']:>8} "
                  f"{1e3 * it:>8.1f} {1e3 * it_link if it_link else nan:>8.1f} "
                  f"{it / it_link if it_link else nan:>9.2f} {s['span_s']:>7.2f} "
                  f"{bound if bound else nan:>7.2f} "
                  f"{s['span_s'] / bound if bound else nan:>8.2f}", flush=True)


def repeat_table(workdir: Path, iterations: int, bw: float, repeat: int):
    """The same run ``repeat`` times: mean iteration time per run and their spread."""
    means = []
    print(f"repeatability: leafspine, 2 jobs x 4 workers, b=4, {bw} Mbit/s, {iterations} "
          f"iterations, {repeat} runs")
    for k in range(repeat):
        s = testbed_bench("leafspine", 4, bw, iterations, workdir, 2)
        m = float(np.mean([j["iteration_completion_mean_s"] for j in s["jobs"]]))
        retx = sum(j["retransmissions"] for j in s["jobs"])
        means.append(m)
        print(f"  run {k + 1}: iteration {1e3 * m:.1f} ms, {retx} retransmissions", flush=True)
    mean, sd = float(np.mean(means)), float(np.std(means, ddof=1)) if repeat > 1 else 0.0
    print(f"  mean {1e3 * mean:.1f} ms, sd {1e3 * sd:.1f} ms, coefficient of variation "
          f"{100 * sd / mean:.1f}%")


def comparison_table(workdir: Path, iterations: int, bw: float):
    """Elements/s of b=4 against b=32 and against a b=4 ring all-reduce."""
    print(f"links {bw} Mbit/s, 4 workers per job, {iterations} iterations")
    print(f"{'topology':>10} {'jobs':>4} {'mode':>4} {'bits':>4} {'Melem/s':>9} "
          f"{'iter ms':>8} {'p99 ms':>7} {'up->first pkt s':>15}")
    for topo, jobs in (("star", 1), ("leafspine", 2)):
        rates = {}
        for mode, bits in (("ina", 4), ("ina", 32), ("ring", 4)):
            s = testbed_bench(topo, bits, bw, iterations, workdir, jobs, mode)
            for j in s["jobs"]:
                rates.setdefault((mode, bits), []).append(j["elements_per_s"])
                print(f"{topo:>10} {jobs:>4} {mode:>4} {bits:>4} "
                      f"{j['elements_per_s'] / 1e6:>9.4f} "
                      f"{1e3 * j['iteration_completion_mean_s']:>8.1f} "
                      f"{1e3 * j['iteration_completion_p99_s']:>7.1f} "
                      f"{s['startup_to_first_send_s']:>15.2f}", flush=True)
        total = {key: sum(v) for key, v in rates.items()}
        print(f"{topo:>10}: in the switch, b=4 moves "
              f"{total['ina', 4] / total['ina', 32]:.1f}x the elements/s of b=32 and "
              f"{total['ina', 4] / total['ring', 4]:.1f}x those of a b=4 ring all-reduce")


def ratio_table(workdir: Path, iterations: int, bw: float, repeat: int, workers: int = 8,
                words: int = 256, trace: str = "digits-mlp-wide") -> list[dict]:
    """In-network against ring all-reduce at b=4, n=``workers``, link-bound on the star:
    mean iteration time of each over ``repeat`` runs, and their ratio (in-network /
    ring; ring all-reduce moves 2(n-1)/n of the data per worker, so the ideal is
    n / (2(n-1)): 0.57 at n = 8). Returns a row per run (its CSV)."""
    print(f"in-network against ring: star, 1 job x {workers} workers, b=4, {bw} Mbit/s, "
          f"{words}-word packets, trace {trace}, {iterations} iterations, {repeat} runs each")
    from ...hosts.recorder import ensure
    ensure(trace, log=print)
    rows = []
    for k in range(repeat):
        row: dict = {"run": k + 1}
        for mode, name in (("ina", "in_network"), ("ring", "ring")):
            s = testbed_bench("star", 4, bw, iterations, workdir, 1, mode, workers,
                              payload_words=words, trace=trace)
            j = s["jobs"][0]
            row[f"{name}_ms"] = round(1e3 * j["iteration_completion_mean_s"], 1)
            row[f"{name}_verdict"] = (s.get("fidelity") or {}).get("verdict", "n/a")
            cpu = (s["validity"].get("cpu") or {}).get("saturated")
            print(f"  run {k + 1} {mode:>4}: iteration {row[f'{name}_ms']:.1f} ms, "
                  f"{j['retransmissions']} retransmissions, {row[f'{name}_verdict']}"
                  + (f" [CPU saturated: {cpu}]" if cpu else ""), flush=True)
        rows.append(row)
    ina = [r["in_network_ms"] for r in rows]
    ring = [r["ring_ms"] for r in rows]
    ideal = workers / (2 * (workers - 1))
    print(f"  in-network {np.mean(ina):.1f} ms, ring {np.mean(ring):.1f} ms: ratio "
          f"{np.mean(ina) / np.mean(ring):.2f} (range {min(ina) / max(ring):.2f}-"
          f"{max(ina) / min(ring):.2f}; ideal {ideal:.2f})")
    return rows


def write_csv(path, rows: list[dict]):
    """``rows`` as ``path``'s CSV (a column per key of the first row; None as empty),
    written whole once the table is complete: an interrupt keeps the file that was
    there."""
    from ..results.resultset import write_csv_whole
    write_csv_whole(path, rows)


COST_MODES = ("ina", "ring", "ps")  # by default; --mode takes any registered mode
COST_WORKERS = (4, 8)
COST_TRACE = "digits-mlp-wide"  # the trace set of the cost table
COST_BANDWIDTHS = (None, 16.0)  # unshaped, and links of 16 Mbit/s
COST_PARTS = COMPONENTS + ("kernel",)  # the run's components, then softirq
COST_METRICS = ("melem_s",) + COST_PARTS + ("total",)


def cost_figures(summary: dict) -> dict:
    """Melem/s, CPU seconds per million aggregated elements by component (None where a
    component has no process, e.g. ``ps`` outside ``--mode ps``) and the verdict.
    A run that did not complete (an error, a job that failed) gives no figures (all
    None) and its status as the verdict, so it counts in no mean."""
    if not summary.get("complete"):
        return {"melem_s": None, "melem_s_per_job": None, "total": None, "kernel": None,
                "verdict": summary.get("status", "failed"),
                **{name: None for name in COST_PARTS[:-1]}}
    cost = summary.get("cpu_cost") or {}
    parts = cost.get("components", {})
    rates = [(j.get("elements_per_s") or 0) / 1e6 for j in summary["jobs"]]
    out = {"melem_s": sum(rates), "melem_s_per_job": float(np.mean(rates)),
           "total": cost.get("s_per_melem"),
           "kernel": (cost.get("kernel") or {}).get("s_per_melem"),
           "verdict": (summary.get("fidelity") or {}).get("verdict", "n/a")}
    for name in COST_PARTS[:-1]:
        out[name] = (parts.get(name) or {}).get("s_per_melem")
    return out


def spread(values: list) -> tuple:
    """(mean, min, max) of the values that exist (not None, not NaN), or three Nones."""
    v = [float(x) for x in values if isinstance(x, (int, float)) and x == x]
    return (float(np.mean(v)), min(v), max(v)) if v else (None, None, None)


def spread_text(values: list, digits: int = 2) -> str:
    """``mean (min-max)`` of the values that exist, ``n/a`` if none does."""
    mean, lo, hi = spread(values)
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _num(x) -> float:
    """``x`` for a ``%f`` format: NaN where there is no figure."""
    return float("nan") if x is None else x


def cost_table(workdir: Path, iterations: int, repeat: int,
               trace: str = COST_TRACE, words: int = 256, modes=COST_MODES,
               workers=COST_WORKERS) -> list[dict]:
    """End-to-end Melem/s and CPU seconds per million aggregated elements by component
    (agents, switches, parameter servers, the harness, softirq system-wide; total: the
    run's processes), in-network, ring and parameter server at n = 4 and 8 on the star,
    b=4, unshaped and at 16 Mbit/s: mean and range over ``repeat`` runs of each (the
    repeats interleaved), and the fidelity verdicts: a row per point (its CSV)."""
    from ...hosts.recorder import ensure
    print(f"CPU cost: star, 1 job, b=4, {words}-word packets, trace {trace}, {iterations} "
          f"iterations, {repeat} runs each; CPU s per million aggregated elements")
    ensure(trace, log=print)
    points = [(bw, n, mode) for bw in COST_BANDWIDTHS for n in workers for mode in modes]
    runs: dict[tuple, list[dict]] = {pt: [] for pt in points}
    for k in range(repeat):
        for bw, n, mode in points:
            s = testbed_bench("star", 4, bw, iterations, workdir, 1, mode, n,
                              payload_words=words, trace=trace)
            f = cost_figures(s)
            runs[bw, n, mode].append(f)
            print(f"  run {k + 1}: {mode:>4} n={n} {bw or 'unshaped'} Mbit/s: "
                  f"{_num(f['melem_s']):.3f} Melem/s, {_num(f['total']):.1f} CPU s/Melem, "
                  f"{f['verdict']}", flush=True)
    rows = [_cost_row(pt, runs[pt]) for pt in points]
    _print_cost(rows)
    return rows


def _cost_row(point: tuple, runs: list[dict]) -> dict:
    bw, n, mode = point
    row = {"mode": mode, "workers": n, "bw_mbit": bw or "unshaped", "runs": len(runs)}
    for m in COST_METRICS:
        row[f"{m}_mean"], row[f"{m}_min"], row[f"{m}_max"] = spread([r[m] for r in runs])
    verdicts = [r["verdict"] for r in runs]
    row["verdicts"] = "; ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts)))
    return row


def _print_cost(rows: list[dict]):
    def cell(r, m, width):
        mean, lo, hi = r[f"{m}_mean"], r[f"{m}_min"], r[f"{m}_max"]
        text = "n/a" if mean is None else (f"{mean:.3g}" if lo == hi else
                                           f"{mean:.3g} ({lo:.3g}-{hi:.3g})")
        return f"{text:>{width}}"
    print(f"{'Mbit/s':>8} {'n':>2} {'mode':>4} {'Melem/s':>20} "
          + " ".join(f"{p:>18}" for p in COST_PARTS + ("total",)) + "  verdicts")
    for r in rows:
        print(f"{r['bw_mbit']:>8} {r['workers']:>2} {r['mode']:>4} {cell(r, 'melem_s', 20)} "
              + " ".join(cell(r, m, 18) for m in COST_PARTS + ("total",))
              + f"  {r['verdicts']}")


#: jobs of the headline's runs, which share the switch's pool of slots
HEADLINE_JOBS = 2


def headline_table(workdir: Path, iterations: int, repeat: int,
                   trace: str = "digits-mlp-wide", slots=(32,)) -> list[dict]:
    """``up --topo star --jobs 2 --workers 8 --bits 4 --payload-words 256 --trace
    digits-mlp-wide``, unshaped, in-network (with each of ``slots`` per job: the
    window; 32 is ``up``'s default) and ring: Melem/s per job and the agents' and the
    switch's CPU seconds per million aggregated elements, mean and range over
    ``repeat`` runs (interleaved). Returns a row per run (its CSV)."""
    from ...hosts.recorder import ensure
    print(f"headline: star, 2 jobs x 8 workers, b=4, 256-word packets, trace {trace}, "
          f"{iterations} iterations, unshaped, {repeat} runs each")
    ensure(trace, log=print)
    points = [("ina", n) for n in slots] + [("ring", None)]
    rows = []
    for k in range(repeat):
        for mode, window in points:
            extra = {"slots": window} if window else {}
            s = testbed_bench("star", 4, None, iterations, workdir, HEADLINE_JOBS, mode, 8,
                              payload_words=256, trace=trace, **extra)
            f = cost_figures(s)
            rows.append({"run": k + 1, "mode": mode, "slots": window or "",
                         "melem_s_per_job": f["melem_s_per_job"],
                         "agents_s_per_melem": f["agents"],
                         "switches_s_per_melem": f["switches"], "verdict": f["verdict"]})
            print(f"  run {k + 1} {_point(mode, window)}: {_num(f['melem_s_per_job']):.3f} "
                  f"Melem/s per job, agents {_num(f['agents']):.2f}, switch "
                  f"{_num(f['switches']):.2f} CPU s/Melem, {f['verdict']}", flush=True)
    for mode, window in points:
        mine = [r for r in rows if r["mode"] == mode and r["slots"] == (window or "")]
        print(f"  {_point(mode, window)}: "
              f"{spread_text([r['melem_s_per_job'] for r in mine], 3)} Melem/s per job; "
              f"agents {spread_text([r['agents_s_per_melem'] for r in mine])} CPU s/Melem")
    return rows


def _point(mode: str, slots: int | None) -> str:
    return f"{mode:>4}" + (f", {slots} slots" if slots else "")


#: what ``coalescing`` compares: label -> the environment of the run's agents and switch
COALESCING = {"off": {"QAINA_AGENT_COALESCE": "0", "QAINA_SWITCH_COALESCE": "0"},
              "agents": {"QAINA_AGENT_COALESCE": "1", "QAINA_SWITCH_COALESCE": "0"},
              "agents+switch": {"QAINA_AGENT_COALESCE": "1", "QAINA_SWITCH_COALESCE": "500"}}
COALESCING_BANDWIDTHS = (16.0, 64.0, None)
#: what ``sampling`` compares: label -> the seconds between the sampler's slot reads
SAMPLING = {"10 ms": 0.01, "100 ms": 0.1}
SAMPLING_BANDWIDTHS = (16.0, None)


def coalescing_table(workdir: Path, iterations: int, repeat: int,
                     trace: str = "digits-mlp-wide") -> list[dict]:
    """In-network, one job of 8 workers on the star, b=4, 256-word packets, at 16 and
    64 Mbit/s and unshaped, with receive coalescing off, in the agents only, and in
    the agents and the switch (``COALESCING``; the repeats interleaved): Melem/s, CPU
    seconds per million aggregated elements (agents, switch, total), results per
    agent wakeup, verdict. Returns a row per run (its CSV)."""
    return _variants_table(workdir, iterations, repeat, trace, "coalescing",
                           {label: (env, {}) for label, env in COALESCING.items()},
                           COALESCING_BANDWIDTHS)


def sampling_table(workdir: Path, iterations: int, repeat: int,
                   trace: str = "digits-mlp-wide") -> list[dict]:
    """What measuring costs the run: the same in-network runs as ``coalescing`` (at 16
    Mbit/s and unshaped) with the sampler reading the switch's slot counters every 10
    ms (``up``'s default) and every 100 ms (``SAMPLING``; the repeats interleaved)."""
    return _variants_table(workdir, iterations, repeat, trace, "sampling",
                           {label: ({}, {"sample_interval": interval})
                            for label, interval in SAMPLING.items()},
                           SAMPLING_BANDWIDTHS)


def _variants_table(workdir: Path, iterations: int, repeat: int, trace: str, column: str,
                    variants: dict, bandwidths) -> list[dict]:
    """One job of 8 workers, in-network, for each link rate of ``bandwidths`` and each
    variant (label -> (environment of the run's processes, ``up`` options)), the
    repeats interleaved: a row per run, printed as it ends."""
    import os

    from ...hosts.recorder import ensure
    print(f"{column}: star, 1 job x 8 workers, in-network, b=4, 256-word packets, trace "
          f"{trace}, {iterations} iterations, {repeat} runs each")
    ensure(trace, log=print)
    rows = []
    for k in range(repeat):
        for bw in bandwidths:
            for label, (env, options) in variants.items():
                saved = {name: os.environ.get(name) for name in env}
                os.environ.update(env)  # the run's agents and switch inherit it
                try:
                    s = testbed_bench("star", 4, bw, iterations, workdir, 1, "ina", 8,
                                      payload_words=256, trace=trace, **options)
                finally:
                    for name, value in saved.items():
                        if value is None:
                            os.environ.pop(name, None)
                        else:
                            os.environ[name] = value
                f = cost_figures(s)
                rows.append({"run": k + 1, "bw_mbit": bw or "unshaped", column: label,
                             "melem_s": f["melem_s"], "agents_s_per_melem": f["agents"],
                             "switches_s_per_melem": f["switches"],
                             "harness_s_per_melem": f["harness"],
                             "total_s_per_melem": f["total"],
                             "results_per_wakeup": _results_per_wakeup(s, workdir),
                             "slot_interval_target_s": (s.get("slot_sampling") or {}).get(
                                 "interval_target_s"),
                             "slot_interval_s": (s.get("slot_sampling") or {}).get(
                                 "interval_median_s"),
                             "verdict": f["verdict"]})
                r = rows[-1]
                print(f"  run {k + 1}: {f'{bw:g} Mbit/s' if bw else 'unshaped'}, {label}: "
                      f"{_num(r['melem_s']):.3f} Melem/s, agents "
                      f"{_num(r['agents_s_per_melem']):.2f}, switch "
                      f"{_num(r['switches_s_per_melem']):.2f}, harness "
                      f"{_num(r['harness_s_per_melem']):.2f}, total "
                      f"{_num(r['total_s_per_melem']):.2f} CPU s/Melem, "
                      f"{_num(r['results_per_wakeup']):.1f} results per wakeup, slot reads "
                      f"{1e3 * _num(r['slot_interval_s']):.0f} ms apart, {r['verdict']}",
                      flush=True)
    return rows


def _results_per_wakeup(summary: dict, workdir: Path) -> float | None:
    """Results an agent took per wakeup, over the run's agents and iterations (its
    ``iterations.csv``)."""
    path = workdir / summary["run_id"] / "iterations.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    wakeups = sum(int(r["wakeups"] or 0) for r in rows)
    return sum(int(r["packets_received"] or 0) for r in rows) / wakeups if wakeups else None


TESTBED_TABLES = ("transport", "repeat", "comparison", "ratio", "cost", "headline",
                  "coalescing", "sampling")
#: the tables ``--csv`` can write
CSV_TABLES = ("ratio", "cost", "headline", "coalescing", "sampling")
#: the tables that take each option of ``bench testbed`` (by its parameter's name;
#: ``--iterations`` all of them): one given for none of those chosen is refused
TABLE_OPTIONS = {"bw": ("repeat", "comparison"),
                 "repeat": ("repeat", "ratio", "cost", "headline", "coalescing", "sampling"),
                 "ratio_bw": ("ratio",), "ratio_trace": ("ratio",),
                 "modes": ("cost",), "workers": ("cost",),
                 "headline_trace": ("headline",), "slots": ("headline",),
                 "variants_trace": ("coalescing", "sampling")}
#: per table: the option naming its trace set (by its parameter's name), else the set
#: it replays (None: the runs' default), and the workers of its largest runs
TABLE_TRACES = {"transport": (None, None, 4), "repeat": (None, None, 4),
                "comparison": (None, None, 4), "ratio": ("ratio_trace", None, 8),
                "cost": (None, COST_TRACE, max(COST_WORKERS)),
                "headline": ("headline_trace", None, 8),
                "coalescing": ("variants_trace", None, 8),
                "sampling": ("variants_trace", None, 8)}
