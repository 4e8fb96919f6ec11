"""Recording trace sets: train a real model data-parallel, keep every worker's gradient.

``record`` trains on scikit-learn's bundled digits data set (no download), deals the
training split into one shard per worker (``training.py``), and writes the set with
``write_trace`` (the format: ``traces.py``, ``TRACES.md``).
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path

import numpy as np

from .models import MODELS, NumpyMLP, check_shape, TorchModel, TorchResNet
from .traces import (DTYPES, MAX_WORKERS, TraceError, TraceSet, check_set_name,
                     default_record_dir, write_trace)
from .training import DIGITS, DataParallelJob
from ..settings import Training

#: the training options' one default (``settings.Training``, as ``up --train`` has them)
TRAINING = Training()

RECORDER = "qaina_bench.hosts.recorder"
RECORDER_VERSION = 1

#: trace sets the experiments use that are recorded on first use, not shipped (``record``
#: options; a few seconds each on 2 cores, 12 MB, 39 MB and 78 MB as float16)
RECIPES = {
    "digits-mlp-wide": dict(model="mlp", hidden=(512, 256), workers=8, iterations=6,
                            learning_rate=0.1, dtype="float16"),
    "digits-mlp-1m": dict(model="mlp", hidden=(1024, 1024), workers=4, iterations=6,
                          learning_rate=0.1, dtype="float16"),
    # the same model for 8 workers: the links figure (experiments/links.yaml)
    "digits-mlp-1m-8w": dict(model="mlp", hidden=(1024, 1024), workers=8, iterations=6,
                             learning_rate=0.1, dtype="float16"),
    # needs PyTorch (docs/compression.md, "Relative error on a real-size trace")
    "digits-resnet": dict(model="resnet", width=24, workers=8, iterations=12,
                          learning_rate=0.05, dtype="float16"),
}


def describe(recipe: dict) -> str:
    """``record``'s options of a recipe as `traces record` takes them."""
    return ", ".join(f"{k} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
                     for k, v in recipe.items())


def check_options(model="mlp", workers=8, iterations=12, seed=0, batch_size=1,
                  learning_rate=0.1, hidden=(1,), width=1, dtype="float32", **_) -> None:
    """TraceError naming the first of ``record``'s options whose type or value it cannot
    record with (a recipe written by hand: a sweep spec's ``traces``), before training."""
    def whole(value, name, low, high=None):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise TraceError(f"{name} must be a whole number {span}, not {value!r}")
    if model not in MODELS:
        raise TraceError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
    whole(workers, "workers", 1, MAX_WORKERS)
    whole(iterations, "iterations", 1)
    whole(seed, "seed", 0, 2**63 - 1)
    whole(batch_size, "batch size", 1)
    whole(width, "width", 1)
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real) \
            or not math.isfinite(learning_rate) or learning_rate <= 0:
        raise TraceError(f"the learning rate must be a number above 0, not {learning_rate!r}")
    if not isinstance(hidden, (list, tuple)) or not hidden or any(
            isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in hidden):
        raise TraceError(f"hidden must be a list of whole layer sizes, not {hidden!r}")
    if dtype not in DTYPES:
        raise TraceError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    check_shape(model, tuple(hidden), width)  # positive, and not too large


def ensure(name: str, dirs=None, log=None, recipe: dict | None = None) -> Path:
    """The directory of trace set ``name``, recorded first into the user's trace
    directory if it cannot be found: with ``recipe`` (``record``'s options), else with
    its ``RECIPES`` entry."""
    from .traces import find_trace
    try:
        return find_trace(name, dirs)
    except TraceError:
        if recipe is None and name not in RECIPES:
            raise
    recipe = RECIPES[name] if recipe is None else recipe
    if log:
        log(f"recording trace set {name} ({describe(recipe)}) into the user's trace "
            "directory, once")
    return record(name, **recipe, log=(lambda line: log(f"  {line}")) if log else None).path


def train(job: DataParallelJob, iterations: int, dtype: str = "float32", log=None):
    """Train ``job`` for ``iterations`` SGD steps: every worker's gradient per iteration
    (stored as ``dtype``), the workers' mean minibatch loss and the training split's
    loss per iteration, and that loss after the last step. TraceError (one line) as
    soon as the training diverges: a loss or a gradient that is not a finite number
    (or past float16's range when stored so); numpy's warnings on the way are not
    printed, the error says it."""
    with np.errstate(all="ignore"):
        gradients, losses, train_losses = _steps(job, iterations, dtype, log)
        final = _finite(job.train_loss(), "the training loss after the last step",
                        job.learning_rate)
    return gradients, losses, train_losses, final


def _steps(job: DataParallelJob, iterations: int, dtype: str, log):
    """``train``'s iterations: gradients, minibatch losses and training losses."""
    store = np.float16 if dtype == "float16" else np.float32
    lr = job.learning_rate
    gradients = [[] for _ in range(job.workers)]
    losses, train_losses = [], []
    for i in range(iterations):
        train_losses.append(_finite(job.train_loss(), f"the training loss at iteration {i}",
                                    lr))
        batch_losses, total = [], np.zeros(job.net.elements, dtype=np.float32)
        for k in range(job.workers):
            loss, grad = job.gradient(k)
            _finite(loss, f"worker {k}'s minibatch loss at iteration {i}", lr)
            gradients[k].append(_storable(grad, store, f"worker {k}'s gradient at "
                                          f"iteration {i}", lr))
            batch_losses.append(loss)
            total += grad
        losses.append(float(np.mean(batch_losses)))
        job.step(total)
        if log:
            log(f"iteration {i}: minibatch loss {losses[-1]:.4f}, "
                f"training loss {train_losses[-1]:.4f}")
    return gradients, losses, train_losses


def _finite(value: float, what: str, lr: float) -> float:
    """``value`` as a float if it is a finite number; TraceError (``_diverged``) if not."""
    value = float(value)
    if not math.isfinite(value):
        _diverged(what, lr)
    return value


def _storable(grad: np.ndarray, store, what: str, lr: float) -> np.ndarray:
    """``grad`` as ``store`` (float32 or float16); TraceError if it holds a value that
    is not a finite number, or becomes one as float16 (past 65504)."""
    if not np.isfinite(grad).all():
        _diverged(what, lr)
    stored = grad.astype(store)
    if not np.isfinite(stored).all():
        raise TraceError(f"{what} holds values past float16's range (65504): record with "
                         "--dtype float32 (or a smaller --lr); nothing written")
    return stored


def _diverged(what: str, lr: float):
    """TraceError: the training diverged at ``what``; nothing of the set is written."""
    raise TraceError(f"the training diverged: {what} is not a finite number (learning rate "
                     f"{lr:g}): record with a smaller --lr; nothing written")


def record(name: str, out_dir=None, model: str = "mlp", workers: int = 8,
           iterations: int = 12, seed: int = 0, *, batch_size: int = TRAINING.batch_size,
           learning_rate: float = TRAINING.lr, hidden=tuple(TRAINING.hidden),
           width: int = TRAINING.width,
           test_fraction: float = 0.2, dtype: str = "float32", overwrite: bool = False,
           log=None) -> TraceSet:
    """Train ``model`` data-parallel on the digits and write every worker's gradients.

    The training split is dealt into ``workers`` disjoint shards. At each iteration
    every worker draws a minibatch of ``batch_size`` from its own shard with its own
    generator (seeded ``[seed, k + 1]``) and computes its gradient at the current
    shared parameters; the parameters then take one SGD step with the mean gradient
    (``training.DataParallelJob``). The set goes to ``out_dir/name`` (by default the
    user's trace directory, which ``up`` searches), stored as ``dtype`` (``float16``
    halves big sets); ``log`` (e.g. ``print``) gets one line per iteration.
    """
    check_options(model, workers, iterations, seed, batch_size, learning_rate, hidden, width,
                  dtype)
    target = Path(out_dir or default_record_dir()) / check_set_name(name)
    if target.exists() and not overwrite:  # said before the training, not after it
        raise TraceError(f"{target} exists (replace it with --overwrite, or overwrite=True)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot make {target.parent}: {exc.strerror or exc}; choose "
                         "another --out") from None
    if not os.access(target.parent, os.W_OK):
        raise TraceError(f"{target.parent} is not writable: choose another --out")
    job = DataParallelJob(model, workers, seed, batch_size=batch_size,
                          learning_rate=learning_rate, hidden=hidden, width=width,
                          test_fraction=test_fraction)
    net = job.net
    initial_accuracy = job.test()[1]
    gradients, losses, train_losses, final_train_loss = train(job, iterations, dtype, log)
    created_by = {"recorder": RECORDER, "version": RECORDER_VERSION, "numpy": np.__version__}
    try:
        import sklearn
        created_by["scikit-learn"] = sklearn.__version__
    except ImportError:
        pass
    if isinstance(net, TorchModel):
        created_by["torch"] = net.torch.__version__
    architecture = ({"hidden": list(net.sizes[1:-1])} if isinstance(net, NumpyMLP) else
                    {"width": net.width} if isinstance(net, TorchResNet) else {})
    return write_trace(
        Path(out_dir or default_record_dir()) / name, gradients, name=name, model=net.kind,
        dataset=DIGITS, layers=net.layers, overwrite=overwrite, dtype=dtype,
        model_detail=net.describe(), **architecture,
        seed=seed, worker_seeds=job.worker_seeds, data_split_seed=seed,
        test_fraction=test_fraction,
        shard_sizes=[len(s) for s in job.shard_indices],
        batch_size=batch_size, learning_rate=learning_rate, optimizer="sgd",
        loss=[round(v, 6) for v in losses],
        train_loss=[round(v, 6) for v in train_losses],
        final_train_loss=round(final_train_loss, 6),
        test_accuracy={"initial": round(initial_accuracy, 4),
                       "final": round(job.test()[1], 4)},
        created_by=created_by,
    )
