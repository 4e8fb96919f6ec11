"""Result sets as pandas DataFrames: ``load(RUN_DIR)`` and ``load_sweep(SWEEP_DIR)``.

This directory is also where ``qaina-bench up`` writes its result sets
(``results/<run-id>/``, git-ignored); the code is ``harness/results/frames.py``,
whose docstring documents every column. Needs the extra ``data`` (pandas)::

    from qaina_bench.results import load, load_sweep
    run = load("results/<run-id>")
    run.jobs[["job_id", "bits", "iteration_completion_mean_s", "elements_per_s"]]
    run.iterations.groupby("iteration")["completion_s"].max()
    sweep = load_sweep("results/sweeps/qaina-jobs")
"""

from ..harness.results.frames import (FIDELITY_FIELDS, JOB_FIELDS, VALIDITY_COLUMNS,
                                      ResultsError, Run, job_columns, load, load_sweep)

__all__ = ["Run", "ResultsError", "load", "load_sweep", "job_columns", "JOB_FIELDS",
           "FIDELITY_FIELDS", "VALIDITY_COLUMNS"]
