"""Recording trace sets: train a real model data-parallel, keep every worker's gradient.

``record`` trains on scikit-learn's bundled digits data set (no download), deals the
training split into one shard per worker, and writes the set with ``write_trace``
(the format: ``traces.py``, ``TRACES.md``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .models import NumpyMLP, TorchCNN, make_model
from .traces import TraceError, TraceSet, write_trace

RECORDER = "qaina_bench.hosts.recorder"
RECORDER_VERSION = 1


DIGITS = "scikit-learn digits (1797 8x8 grey images, 10 classes, pixels scaled to [0, 1])"


def load_digits_split(seed: int, test_fraction: float = 0.2):
    """scikit-learn's bundled digits, scaled to [0, 1], split stratified by ``seed``."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise TraceError("recording needs scikit-learn: pip install scikit-learn") from exc
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return train_test_split(x, digits.target.astype(np.int64), test_size=test_fraction,
                            random_state=seed, stratify=digits.target)


class Shard:
    """One worker's part of the training data, visited in reshuffled epochs."""

    def __init__(self, indices: np.ndarray, rng: np.random.Generator):
        self.indices = np.asarray(indices)
        self.rng = rng
        self.order = rng.permutation(self.indices)
        self.position = 0

    def next_batch(self, size: int) -> np.ndarray:
        if size > len(self.indices):
            raise TraceError(f"batch size {size} exceeds a worker's shard of "
                             f"{len(self.indices)} examples")
        if self.position + size > len(self.order):
            self.order = self.rng.permutation(self.indices)
            self.position = 0
        batch = self.order[self.position:self.position + size]
        self.position += size
        return batch


def record(name: str, out_dir, model: str = "mlp", workers: int = 4, iterations: int = 8,
           seed: int = 0, *, batch_size: int = 32, learning_rate: float = 0.1,
           hidden=(128, 64), test_fraction: float = 0.2, overwrite: bool = False,
           log=None) -> TraceSet:
    """Train ``model`` data-parallel on the digits and write every worker's gradients.

    The training split is dealt into ``workers`` disjoint shards. At each iteration
    every worker draws a minibatch of ``batch_size`` from its own shard with its own
    generator (seeded ``[seed, k + 1]``) and computes its gradient at the current
    shared parameters; the parameters then take one SGD step with the mean gradient.
    The set goes to ``out_dir/name``; ``log`` (e.g. ``print``) gets one line per
    iteration.
    """
    if workers < 1 or iterations < 1 or batch_size < 1:
        raise TraceError("workers, iterations and batch size must be positive")
    net = make_model(model, hidden, seed)
    x_train, x_test, y_train, y_test = load_digits_split(seed, test_fraction)
    split_rng = np.random.default_rng(seed)
    params = net.init_params(split_rng)
    shard_indices = np.array_split(split_rng.permutation(len(x_train)), workers)
    worker_seeds = [[seed, k + 1] for k in range(workers)]
    shards = [Shard(indices, np.random.default_rng(s))
              for indices, s in zip(shard_indices, worker_seeds)]
    initial_accuracy = net.accuracy(params, x_test, y_test)
    gradients = [[] for _ in range(workers)]
    losses, train_losses = [], []
    for i in range(iterations):
        train_losses.append(net.loss(params, x_train, y_train))
        batch_losses, total = [], np.zeros(net.elements, dtype=np.float32)
        for k, shard in enumerate(shards):
            batch = shard.next_batch(batch_size)
            loss, grad = net.loss_and_grad(params, x_train[batch], y_train[batch])
            gradients[k].append(grad)
            batch_losses.append(loss)
            total += grad
        losses.append(float(np.mean(batch_losses)))
        params = params - np.float32(learning_rate / workers) * total
        if log:
            log(f"iteration {i}: minibatch loss {losses[-1]:.4f}, "
                f"training loss {train_losses[-1]:.4f}")
    created_by = {"recorder": RECORDER, "version": RECORDER_VERSION, "numpy": np.__version__}
    try:
        import sklearn
        created_by["scikit-learn"] = sklearn.__version__
    except ImportError:
        pass
    if isinstance(net, TorchCNN):
        created_by["torch"] = net.torch.__version__
    architecture = {"hidden": list(net.sizes[1:-1])} if isinstance(net, NumpyMLP) else {}
    return write_trace(
        Path(out_dir) / name, gradients, name=name, model=net.kind, dataset=DIGITS,
        layers=net.layers, overwrite=overwrite,
        model_detail=net.describe(), **architecture,
        seed=seed, worker_seeds=worker_seeds, data_split_seed=seed,
        test_fraction=test_fraction,
        shard_sizes=[len(s) for s in shard_indices],
        batch_size=batch_size, learning_rate=learning_rate, optimizer="sgd",
        loss=[round(v, 6) for v in losses],
        train_loss=[round(v, 6) for v in train_losses],
        final_train_loss=round(net.loss(params, x_train, y_train), 6),
        test_accuracy={"initial": round(initial_accuracy, 4),
                       "final": round(net.accuracy(params, x_test, y_test), 4)},
        created_by=created_by,
    )
