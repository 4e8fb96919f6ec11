"""The plots of a result set: slots held per job over time, iteration times, and for
a closed-loop run (``--train``) the test accuracy over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(directory: Path, rows: list[dict], slot_samples: list[dict], meta: dict):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if slot_samples:
        t0 = min(float(s["time"]) for s in slot_samples)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        agg = meta.get("aggregator")
        for job in meta["jobs"]:
            pts = [(float(s["time"]) - t0, float(s["slots_in_use"])) for s in slot_samples
                   if int(s["job"]) == job["job_id"] and (agg is None or s["switch"] == agg)]
            if pts:
                ax.step(*zip(*pts), where="post",
                        label=f"job {job['job_id']} (b={job['bits']}, m={job['lanes']})")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("slots in use")
        ax.set_title("Aggregator slots held per job")
        ax.legend()
        fig.tight_layout()
        fig.savefig(directory / "slots.png", dpi=120)
        plt.close(fig)
    if rows:
        learned = [r for r in rows if r.get("test_accuracy") is not None]
        if learned:
            fig, (ax, acc) = plt.subplots(1, 2, figsize=(11, 3.5))
        else:
            fig, ax = plt.subplots(figsize=(7, 3.5))
        for job in meta["jobs"]:
            mine = [r for r in rows if r["job"] == job["job_id"]]
            its = sorted({r["iteration"] for r in mine})
            means = [np.mean([r["completion_s"] for r in mine if r["iteration"] == i]) * 1e3
                     for i in its]
            ax.plot(its, means, marker="o", label=f"job {job['job_id']} (b={job['bits']})")
        ax.set_xlabel("iteration")
        ax.set_ylabel("completion time (ms)")
        ax.set_title("Iteration completion time (mean over workers)")
        ax.legend()
        if learned:
            start = min(r["start"] for r in rows)
            for job in meta["jobs"]:
                pts = sorted((r["end"] - start, r["test_accuracy"]) for r in learned
                             if r["job"] == job["job_id"])
                if pts:
                    acc.plot(*zip(*pts), marker="o", label=f"job {job['job_id']} "
                             f"(b={job['bits']})")
            acc.set_xlabel("time since the first send (s)")
            acc.set_ylabel("test accuracy")
            acc.set_ylim(0, 1)
            acc.set_title("Test accuracy while training from the aggregates")
            acc.legend()
        fig.tight_layout()
        fig.savefig(directory / "iterations.png", dpi=120)
        plt.close(fig)
