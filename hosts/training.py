"""Data-parallel training on scikit-learn's bundled digits: what the recorder replays
open loop and what the agents (``up --train``) and the offline evaluation run closed
loop, from the aggregates they receive.

``DataParallelJob`` holds the model, the data split and one shard per worker, all
made from the seed alone, so every worker of a job (one process each) builds the
same job and keeps the same parameters as long as it applies the same aggregates.
"""

from __future__ import annotations

import numpy as np

from .models import make_model
from .traces import TraceError

DIGITS = "scikit-learn digits (1797 8x8 grey images, 10 classes, pixels scaled to [0, 1])"


def load_digits_split(seed: int, test_fraction: float = 0.2):
    """scikit-learn's bundled digits, scaled to [0, 1], split stratified by ``seed``."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise TraceError("training needs scikit-learn: pip install scikit-learn") from exc
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


class DataParallelJob:
    """A model, the digits split into a test part and ``workers`` training shards,
    and plain SGD on the mean of the workers' gradients.

    Worker ``k`` draws its minibatches from its own shard with its own generator
    (seeded ``[seed, k + 1]``); ``step(total)`` moves the parameters by
    ``-learning_rate / workers * total``, ``total`` being the sum of the workers'
    gradients (exact, or as an aggregation delivered it).
    """

    def __init__(self, model: str = "mlp", workers: int = 4, seed: int = 0, *,
                 batch_size: int = 32, learning_rate: float = 0.1, hidden=(128, 64),
                 width: int = 24, test_fraction: float = 0.2):
        if workers < 1 or batch_size < 1:
            raise TraceError("workers and batch size must be positive")
        self.workers, self.seed = workers, seed
        self.batch_size, self.learning_rate = batch_size, learning_rate
        self.test_fraction = test_fraction
        self.net = make_model(model, hidden, seed, width=width)
        self.x_train, self.x_test, self.y_train, self.y_test = load_digits_split(
            seed, test_fraction)
        split_rng = np.random.default_rng(seed)
        self.params = self.net.init_params(split_rng)
        self.shard_indices = np.array_split(split_rng.permutation(len(self.x_train)), workers)
        self.worker_seeds = [[seed, k + 1] for k in range(workers)]
        self.shards = [Shard(indices, np.random.default_rng(s))
                       for indices, s in zip(self.shard_indices, self.worker_seeds)]

    @property
    def elements(self) -> int:
        return self.net.elements

    def gradient(self, k: int) -> tuple[float, np.ndarray]:
        """Worker ``k``'s minibatch loss and gradient at the current parameters."""
        batch = self.shards[k].next_batch(self.batch_size)
        return self.net.loss_and_grad(self.params, self.x_train[batch], self.y_train[batch])

    def step(self, total: np.ndarray):
        """One SGD step with the sum of the workers' gradients."""
        self.params = self.params - np.float32(self.learning_rate / self.workers) * \
            np.asarray(total, dtype=np.float32)

    def train_loss(self) -> float:
        return self.net.loss(self.params, self.x_train, self.y_train)

    def test(self) -> tuple[float, float]:
        """Loss and accuracy on the test part."""
        return (self.net.loss(self.params, self.x_test, self.y_test),
                self.net.accuracy(self.params, self.x_test, self.y_test))
