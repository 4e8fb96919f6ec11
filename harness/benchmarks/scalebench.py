"""``qaina-bench bench scale``: how a run grows with its workers, on this machine and on
a cluster (``--cluster``): one leaf-spine job at each size, and for each the bring-up
time (invoked to network up and programmed), the agents' start (programmed to the
start signal: every agent has loaded its trace), the job's completion time, the CPU
seconds per million aggregated elements (every switch, agent and the harness) and the
fidelity verdict (network-bound, or cpu-bound: the timings measure the machine)."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from .testbedbench import spread_text

#: the digits MLP's gradients of 32 workers (the bundled set has 8), recorded once
TRACE = "digits-mlp-32w"
RECIPE = dict(model="mlp", workers=32, iterations=2)
COLUMNS = ("where", "workers", "bring-up s", "agents s", "job s", "CPU s/Melem", "verdict")


def scale_config(workers: int, cluster: str | None, iterations: int, bw: float | None,
                 results_dir: Path, trace: Path) -> RunConfig:
    """One job of ``workers`` workers on a leaf-spine with a leaf per 4 workers (at
    least 2), so a cluster's leaves each take their share of the hosts."""
    leaves = max(2, workers // 4)
    return RunConfig.flat(topo=f"leafspine,leaves={leaves}", jobs=1, workers=workers,
                          trace=str(trace),
                          iterations=iterations, bw=bw, cluster=cluster,
                          results_dir=str(results_dir), timeout=600.0)


def measure(cfg: RunConfig) -> dict:
    """Run ``cfg``; the row of the table."""
    from ..running.run import Run
    run = Run(cfg, echo=lambda *a, **k: None)
    summary = run.execute()
    if run.signalled:  # Ctrl-C or SIGTERM: the run is torn down, the benchmark stops
        raise KeyboardInterrupt
    ev = summary["events"]
    cost = summary.get("cpu_cost") or {}
    total = sum(c.get("total_s", 0) for c in cost.get("components", {}).values())
    elements = cost.get("elements_aggregated") or 0
    job = summary["jobs"][0]
    return {"where": cfg.network.cluster or "this machine",
            "workers": cfg.workload.workers,
            "bring-up s": round(ev.get("programmed", ev["invoked"]) - ev["invoked"], 2),
            "agents s": (round(ev["agents_go"] - ev["programmed"], 2)
                         if "agents_go" in ev and "programmed" in ev else None),
            "job s": round(job.get("job_completion_s") or float("nan"), 2),
            "CPU s/Melem": round(total / elements * 1e6, 1) if elements else None,
            "verdict": (summary.get("fidelity") or {}).get("verdict", "-")
            if summary["complete"] else summary["status"]}


def scale_trace(results_dir: Path, echo=print) -> Path:
    """The 32-worker trace set, under the results directory, recorded there once."""
    from ...hosts.recorder import record
    from ...hosts.traces import TraceError, find_trace
    path = results_dir / "traces" / TRACE
    try:
        return find_trace(str(path))
    except TraceError:
        echo(f"recording trace set {TRACE} (32 workers) into {path.parent}, once")
        record(TRACE, out_dir=path.parent, **RECIPE)
        return path


def scale(sizes, clusters, iterations: int = 2, bw: float | None = None,
          results_dir: Path = Path("results/scale"), echo=print,
          repeat: int = 1) -> list[dict]:
    """Every size on every cluster (None: this machine), ``repeat`` times (the repeats
    interleaved), a line per run; with repeats, then mean (range) per point. The
    runs' results stay in ``results_dir``; returns a row per run (``CSV_COLUMNS``)."""
    results_dir = Path(results_dir).resolve()
    trace = scale_trace(results_dir, echo)  # a run copies it to the servers of its agents
    echo("  ".join(f"{c:>12}" for c in ("run",) + COLUMNS))
    rows = []
    for k in range(repeat):
        for cluster in clusters:
            for n in sizes:
                row = measure(scale_config(n, cluster, iterations, bw, results_dir, trace))
                rows.append({"run": k + 1, "bw": bw or "", **row})
                echo("  ".join(f"{str(v):>12}" for v in [k + 1] + [row[c] for c in COLUMNS]))
    if repeat > 1:
        echo(f"mean (range) of {repeat} runs")
        for point in dict.fromkeys((r["where"], r["workers"]) for r in rows):
            mine = [r for r in rows if (r["where"], r["workers"]) == point]
            cells = [spread_text([r[c] for r in mine]) for c in COLUMNS[2:-1]]
            found = sorted({str(r["verdict"]) for r in mine})
            echo(f"  {point[0]}, {point[1]} workers: " + ", ".join(
                f"{c} {v}" for c, v in zip(COLUMNS[2:-1], cells)) + f"; {'/'.join(found)}")
    return rows


#: the CSV of ``bench scale --csv``: a row per run
CSV_COLUMNS = {"run": "run", "where": "where", "workers": "workers", "bw": "bw_mbit",
               "bring-up s": "bring_up_s", "agents s": "agents_ready_s", "job s": "job_s",
               "CPU s/Melem": "cpu_s_per_melem", "verdict": "verdict"}


def write_csv(path: Path, rows: list[dict]):
    """The runs of ``scale`` as CSV (``CSV_COLUMNS``), written whole."""
    from ..results.resultset import write_csv_whole
    write_csv_whole(path, rows, CSV_COLUMNS)
