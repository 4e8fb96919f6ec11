"""Compare two runs and draw a figure from a sweep, with ``qaina_bench.results``.

    python examples/compare_runs.py RUN_A RUN_B SWEEP_DIR [--out sweep.png]
        [--x bits] [--y elements_per_s]

Prints, per job, a few metrics of the two runs side by side and their iteration
times per iteration (slowest worker), then plots ``--y`` against ``--x`` from the
sweep (mean over repeats, with the range of the repeats as error bars), one line per
value of every other configuration column that varies. Needs the extra ``data``
(pandas); matplotlib is a dependency of the testbed.
"""

from __future__ import annotations

import argparse
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from qaina_bench.results import ResultsError, load, load_sweep  # noqa: E402

METRICS = ["bits", "iterations_done", "iteration_completion_mean_s", "elements_per_s",
           "bytes_sent", "rel_error_mean"]
#: configuration columns of sweep.csv that may tell the lines apart
CONFIG = ["topo", "target", "mode", "jobs", "workers", "bits", "quantizer", "compress",
          "payload_words", "bw", "loss", "slots", "iterations", "levels", "allocation"]


def compare(a, b) -> str:
    """Two runs' job metrics side by side, and each iteration's slowest completion."""
    jobs = pd.concat({name: r.jobs.set_index("job_id")[METRICS].astype(object).T
                      for name, r in (("A", a), ("B", b))}, axis=1)
    jobs.columns = [f"{name} job {job}" for name, job in jobs.columns]
    slowest = [r.iterations.groupby(["job", "iteration"])["completion_s"].max()
               for r in (a, b)]
    times = slowest[0].to_frame("A completion_s").join(slowest[1].rename("B completion_s"),
                                                       how="outer")
    return (f"A = {a.run_id}\nB = {b.run_id}\n\n{jobs.to_string()}\n\n"
            f"slowest worker per iteration (s):\n{times.to_string()}")


def plot_sweep(sweep, x: str, y: str, out: str) -> int:
    """``y`` against ``x`` over the sweep's complete runs; returns the lines drawn."""
    done = sweep[sweep["status"] == "complete"]
    if x not in done.columns or y not in done.columns:
        raise SystemExit(f"sweep.csv has no column {x if x not in done.columns else y}")
    by = [c for c in CONFIG if c != x and c in done.columns and done[c].nunique() > 1]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    groups = done.groupby(by, dropna=False) if by else [((), done)]
    lines = 0
    for key, rows in groups:
        stats = rows.groupby(x, sort=True)[y].agg(["mean", "min", "max"])
        label = ", ".join(f"{c}={v}" for c, v in zip(by, key if by else ())) or y
        ax.errorbar(stats.index.astype(str), stats["mean"],
                    yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                    marker="o", capsize=3, label=label)
        lines += 1
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("sweep_dir")
    p.add_argument("--x", default="bits")
    p.add_argument("--y", default="elements_per_s")
    p.add_argument("--out", default="sweep.png")
    args = p.parse_args(argv)
    try:
        a, b = load(args.run_a), load(args.run_b)
        sweep = load_sweep(args.sweep_dir)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(compare(a, b))
    lines = plot_sweep(sweep, args.x, args.y, args.out)
    print(f"\n{args.out}: {args.y} against {args.x}, {lines} line(s) from "
          f"{len(sweep)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
