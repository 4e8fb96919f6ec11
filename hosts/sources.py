"""Where a worker's gradients come from: a trace set replayed (open loop), or the
digits job trained from the aggregates the worker receives (closed loop, ``--train``).

Both give, per iteration, this worker's gradient before the exchange and take the
aggregate after it; the replay also knows the exact sum of the job's gradients (the
reference of the aggregation error), training knows the model's test accuracy.
"""

from __future__ import annotations

import time

import numpy as np

from .traces import TraceSet, load_exact_sums
from .training import DataParallelJob


class TraceReplay:
    """One worker's gradients of a trace set, read before the run starts (the timed
    path only quantizes, sends, receives and dequantizes)."""

    def __init__(self, path: str, worker: int, workers: int, iterations: int,
                 exact_sums: str = ""):
        trace = TraceSet.open(path)
        if workers > trace.workers:
            raise ValueError(f"trace {trace.name} has {trace.workers} workers, the job has "
                             f"{workers}")
        if iterations > trace.iterations:
            raise ValueError(f"trace {trace.name} has {trace.iterations} iterations, "
                             f"{iterations} asked for")
        self.name = trace.name
        self.layers = [(layer.name, layer.size) for layer in trace.layers]
        self.elements = trace.elements
        self.gradients = [trace.gradient(worker, i) for i in range(iterations)]
        # The reference of the aggregation error: the harness's file of the job's exact
        # sums where it wrote one (summed once), else summed here from every worker's.
        self.exact_sums = (load_exact_sums(exact_sums, iterations, trace.elements)
                           if exact_sums else
                           [trace.exact_sum(i, workers=range(workers), dtype=np.float32)
                            for i in range(iterations)])

    def gradient(self, i: int) -> np.ndarray:
        return self.gradients[i]

    def exact(self, i: int) -> np.ndarray | None:
        return self.exact_sums[i]

    def apply(self, i: int, aggregate: np.ndarray) -> dict:
        """Open loop: the aggregate changes nothing; no record fields."""
        return {}


class LiveTraining:
    """The digits job trained closed loop: worker ``worker``'s minibatch gradient at
    the current parameters, one SGD step with every aggregate. Every worker builds
    the same job from the seed and applies the same aggregates, so all keep the same
    parameters. Worker 0 measures the test accuracy every ``eval_every`` iterations
    and after the last (outside the timed exchange)."""

    def __init__(self, worker: int, workers: int, iterations: int, model: str, seed: int,
                 learning_rate: float, batch_size: int, hidden, width: int, eval_every: int):
        self.job = DataParallelJob(model, workers, seed, batch_size=batch_size,
                                   learning_rate=learning_rate, hidden=hidden, width=width)
        self.name = f"{model} on the digits, trained"
        self.worker, self.iterations, self.eval_every = worker, iterations, eval_every
        self.layers = [(layer.name, layer.size) for layer in self.job.net.layers]
        self.elements = self.job.elements
        self.loss = None

    def gradient(self, i: int) -> np.ndarray:
        self.loss, grad = self.job.gradient(self.worker)
        return grad

    def exact(self, i: int) -> np.ndarray | None:
        return None  # the other workers' gradients are theirs alone

    def apply(self, i: int, aggregate: np.ndarray) -> dict:
        """One SGD step with the aggregate; the minibatch loss, and on worker 0 now
        and then the test loss and accuracy, for the iteration's record."""
        if not np.isfinite(aggregate).all():
            return {"train_loss": self.loss, "diverged": True}
        self.job.step(aggregate)
        out = {"train_loss": self.loss}
        if self.worker == 0 and ((i + 1) % self.eval_every == 0 or i + 1 == self.iterations):
            t = time.perf_counter()
            out["test_loss"], out["test_accuracy"] = self.job.test()
            out["eval_s"] = time.perf_counter() - t
        return out
