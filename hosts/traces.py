"""Real gradient traces: the gradients every worker of a data-parallel job computed.

A trace set is a directory ``<name>/`` holding:

``manifest.json``
    One JSON object. Required keys:

    * ``format`` (``"qaina-trace"``) and ``version`` (this module reads version 1);
    * ``name``, ``model`` (e.g. ``"mlp"``), ``dataset`` (free text);
    * ``layers``: list of ``{"name": str, "shape": [int, ...]}`` in gradient order;
    * ``elements``: total elements of one gradient, the sum of the layers' sizes;
    * ``workers`` and ``iterations``: how many gradients there are.

    Written by the recorder as well: ``model_detail``, ``seed``, ``worker_seeds``,
    ``learning_rate``, ``batch_size`` (per worker), ``shard_sizes``, ``loss`` (per
    iteration, the workers' mean minibatch loss), ``train_loss`` (per iteration, the
    whole training split's loss at that iteration's shared parameters),
    ``final_train_loss``, ``test_accuracy`` (``initial``/``final``) and ``created_by``
    (``{"recorder": ..., "version": ..., "numpy": ..., ...}``). Readers ignore keys
    they do not know.

``worker<k>.npz``
    One per worker ``k = 0..workers-1``, written by ``numpy.savez_compressed``. Array
    ``it<i>`` (``i = 0..iterations-1``) is that worker's gradient at iteration ``i``:
    float32, one dimension of ``elements`` values, the layers flattened (C order) and
    concatenated in manifest order.

All workers of iteration ``i`` computed their gradients at the same parameters; the
parameters then moved by plain SGD with the workers' mean gradient. The exact
aggregate of an iteration is the sum over workers (:meth:`TraceSet.exact_sum`).

Trace sets are found by name along a search path: the user's directories first, then
the sets bundled with the package (:func:`default_trace_dir`). The recorder
(:func:`record`) trains a real model on scikit-learn's bundled digits data set; ``mlp``
needs only numpy and scikit-learn, ``cnn`` needs PyTorch.

Command line: ``python -m qaina_bench.hosts.traces list|show|record ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "qaina-trace"
FORMAT_VERSION = 1
RECORDER = "qaina_bench.hosts.traces"
RECORDER_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED_KEYS = ("format", "version", "name", "model", "dataset", "layers", "elements",
                 "workers", "iterations")
TORCH_HINT = ("install the CPU build of PyTorch: pip install torch --index-url "
              "https://download.pytorch.org/whl/cpu (plain `pip install torch` takes a CUDA "
              "build of several GB on Linux)")


class TraceError(Exception):
    """A trace set that is missing, malformed or cannot be recorded."""


@dataclass(frozen=True)
class Layer:
    """One parameter tensor of the model: its name and shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def worker_file(k: int) -> str:
    return f"worker{k}.npz"


def iteration_key(i: int) -> str:
    return f"it{i}"


# -- reading ------------------------------------------------------------------------------

class TraceSet:
    """An opened, validated trace set. Gradients are read from disk on demand."""

    def __init__(self, path: Path, manifest: dict):
        self.path = Path(path)
        self.manifest = manifest
        self.name = str(manifest["name"])
        self.model = str(manifest["model"])
        self.dataset = str(manifest["dataset"])
        self.workers = int(manifest["workers"])
        self.iterations = int(manifest["iterations"])
        self.elements = int(manifest["elements"])
        self.layers = [Layer(str(layer["name"]), tuple(int(d) for d in layer["shape"]))
                       for layer in manifest["layers"]]

    @classmethod
    def open(cls, path) -> "TraceSet":
        """Open the trace set in directory ``path``; TraceError says what is wrong."""
        path = Path(path)
        if not path.is_dir():
            raise TraceError(f"trace set {path}: no such directory")
        manifest = read_manifest(path)
        trace = cls(path, manifest)
        for k in range(trace.workers):
            trace._check_worker_file(k)
        return trace

    def __repr__(self):
        return (f"TraceSet({self.name!r}: {self.model} on {self.dataset}, {self.workers} "
                f"workers x {self.iterations} iterations x {self.elements} elements)")

    def gradient(self, worker: int, iteration: int) -> np.ndarray:
        """Worker ``worker``'s flattened float32 gradient at iteration ``iteration``."""
        if not 0 <= worker < self.workers:
            raise IndexError(f"worker {worker} of a {self.workers}-worker trace set")
        if not 0 <= iteration < self.iterations:
            raise IndexError(f"iteration {iteration} of {self.iterations}")
        file = self.path / worker_file(worker)
        try:
            with np.load(file) as npz:
                grad = npz[iteration_key(iteration)]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise TraceError(f"{file}: cannot read {iteration_key(iteration)}: {exc}") from exc
        if grad.dtype != np.float32 or grad.shape != (self.elements,):
            raise TraceError(f"{file}: {iteration_key(iteration)} is {grad.dtype} "
                             f"{grad.shape}, expected float32 ({self.elements},)")
        return grad

    def gradients(self, iteration: int, workers=None) -> np.ndarray:
        """Stacked float32 gradients, shape (len(workers), elements); all workers if None."""
        workers = range(self.workers) if workers is None else workers
        return np.stack([self.gradient(k, iteration) for k in workers])

    def exact_sum(self, iteration: int, workers=None, dtype=np.float64) -> np.ndarray:
        """The exact aggregate of an iteration: sum over ``workers`` (all if None)."""
        workers = range(self.workers) if workers is None else workers
        total = np.zeros(self.elements, dtype=np.float64)
        for k in workers:
            total += self.gradient(k, iteration)
        return total.astype(dtype, copy=False)

    def layer_views(self, grad: np.ndarray) -> dict[str, np.ndarray]:
        """Per layer name, a view of a flattened gradient in that layer's shape."""
        grad = np.asarray(grad)
        if grad.shape != (self.elements,):
            raise ValueError(f"gradient of shape {grad.shape}, expected ({self.elements},)")
        views, start = {}, 0
        for layer in self.layers:
            views[layer.name] = grad[start:start + layer.size].reshape(layer.shape)
            start += layer.size
        return views

    def _check_worker_file(self, k: int) -> None:
        """Check a worker file's arrays by their .npy headers, without loading them."""
        file = self.path / worker_file(k)
        if not file.is_file():
            raise TraceError(f"trace set {self.path}: missing {worker_file(k)} "
                             f"(the manifest names {self.workers} workers)")
        try:
            with zipfile.ZipFile(file) as archive:
                members = set(archive.namelist())
                for i in range(self.iterations):
                    member = iteration_key(i) + ".npy"
                    if member not in members:
                        raise TraceError(f"{file}: no array {iteration_key(i)} (the "
                                         f"manifest names {self.iterations} iterations)")
                    with archive.open(member) as stream:
                        shape, dtype = _npy_header(stream)
                    if dtype != np.float32 or shape != (self.elements,):
                        raise TraceError(f"{file}: {iteration_key(i)} is {dtype} {shape}, "
                                         f"expected float32 ({self.elements},)")
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise TraceError(f"{file}: not a readable .npz file: {exc}") from exc


def _npy_header(stream):
    """Shape and dtype from the header of a .npy stream."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f".npy format version {version} is not used by trace sets")
    return shape, dtype


def read_manifest(path) -> dict:
    """The checked manifest of the trace set in directory ``path``."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise TraceError(f"trace set {path}: missing {MANIFEST}")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{file}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise TraceError(f"{file}: expected a JSON object")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise TraceError(f"{file}: missing {', '.join(missing)}")
    if manifest["format"] != FORMAT:
        raise TraceError(f"{file}: format {manifest['format']!r} is not {FORMAT!r}")
    if manifest["version"] != FORMAT_VERSION:
        raise TraceError(f"{file}: format version {manifest['version']}, this reader "
                         f"knows version {FORMAT_VERSION}")
    for key in ("workers", "iterations", "elements"):
        if not isinstance(manifest[key], int) or manifest[key] < 1:
            raise TraceError(f"{file}: {key} must be a positive integer, "
                             f"not {manifest[key]!r}")
    try:
        layers = [Layer(str(layer["name"]), tuple(int(d) for d in layer["shape"]))
                  for layer in manifest["layers"]]
    except (TypeError, KeyError, ValueError) as exc:
        raise TraceError(f"{file}: layers must be a list of {{name, shape}}: {exc}") from exc
    total = sum(layer.size for layer in layers)
    if total != manifest["elements"]:
        raise TraceError(f"{file}: the layers hold {total} elements, the manifest says "
                         f"{manifest['elements']}")
    return manifest


# -- writing ------------------------------------------------------------------------------

def write_trace(path, gradients, *, name: str | None = None, model: str, dataset: str,
                layers, overwrite: bool = False, **info) -> TraceSet:
    """Write a trace set to directory ``path`` and return it opened.

    ``gradients[k][i]`` is worker k's gradient at iteration i (anything numpy turns
    into a flat float32 array of the layers' total size). ``layers`` is a sequence of
    :class:`Layer` or ``(name, shape)`` pairs; ``info`` goes into the manifest as is
    (JSON-serialisable values). The set is written next to ``path`` and moved into
    place at the end, so an interrupted write leaves no half trace set behind.
    """
    path = Path(path)
    layers = [layer if isinstance(layer, Layer) else Layer(str(layer[0]), tuple(layer[1]))
              for layer in layers]
    elements = sum(layer.size for layer in layers)
    workers = len(gradients)
    if workers < 1:
        raise TraceError("a trace set needs at least one worker")
    iterations = len(gradients[0])
    if iterations < 1 or any(len(per_worker) != iterations for per_worker in gradients):
        raise TraceError("every worker needs the same, positive number of iterations")
    if path.exists() and not overwrite:
        raise TraceError(f"{path} exists (pass overwrite=True to replace it)")
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "name": name or path.name,
        "model": model,
        "dataset": dataset,
        "layers": [{"name": layer.name, "shape": list(layer.shape)} for layer in layers],
        "elements": elements,
        "workers": workers,
        "iterations": iterations,
        **info,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private
    try:
        for k, per_worker in enumerate(gradients):
            arrays = {}
            for i, grad in enumerate(per_worker):
                grad = np.asarray(grad, dtype=np.float32).reshape(-1)
                if grad.shape != (elements,):
                    raise TraceError(f"worker {k} iteration {i}: {grad.size} elements, "
                                     f"the layers hold {elements}")
                arrays[iteration_key(i)] = grad
            np.savez_compressed(staging / worker_file(k), **arrays)
        (staging / MANIFEST).write_text(_manifest_text(manifest), encoding="utf-8")
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return TraceSet.open(path)


def _manifest_text(manifest: dict) -> str:
    """JSON with one top-level key per line, and one line per entry of a list of objects."""
    lines = []
    for key, value in manifest.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = ",\n".join(f"  {json.dumps(v)}" for v in value)
            lines.append(f" {json.dumps(key)}: [\n{items}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


# -- finding ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceEntry:
    """A trace set found on the search path, described by its manifest alone."""

    name: str
    path: Path
    model: str = ""
    dataset: str = ""
    workers: int = 0
    iterations: int = 0
    elements: int = 0
    problem: str | None = None  # why the manifest is unusable, if it is


def default_trace_dir() -> Path:
    """The trace sets bundled with the package (``qaina_bench/hosts/traces``)."""
    return Path(__file__).resolve().parent / "traces"


def trace_search_path(dirs=None) -> list[Path]:
    """Where trace names are looked up: ``dirs`` in order, then the bundled sets."""
    search = [Path(d).expanduser() for d in (dirs or ())]
    bundled = default_trace_dir()
    if bundled not in search:
        search.append(bundled)
    return search


def list_traces(dirs=None) -> list[TraceEntry]:
    """Trace sets on the search path, sorted by name; an earlier directory shadows."""
    found: dict[str, TraceEntry] = {}
    for directory in trace_search_path(dirs):
        if not directory.is_dir():
            continue
        for child in sorted(directory.iterdir()):
            if child.name in found or not (child / MANIFEST).is_file():
                continue
            try:
                m = read_manifest(child)
            except TraceError as exc:
                found[child.name] = TraceEntry(child.name, child, problem=str(exc))
                continue
            found[child.name] = TraceEntry(child.name, child, m["model"], m["dataset"],
                                           m["workers"], m["iterations"], m["elements"])
    return [found[name] for name in sorted(found)]


def find_trace(name, dirs=None) -> Path:
    """The directory of trace set ``name``: a path to one, or a name on the search path."""
    as_path = Path(name).expanduser()
    if as_path.is_dir() and (as_path / MANIFEST).is_file():
        return as_path
    if os.sep not in str(name) and not as_path.is_absolute():
        for directory in trace_search_path(dirs):
            if (directory / str(name) / MANIFEST).is_file():
                return directory / str(name)
    known = ", ".join(entry.name for entry in list_traces(dirs)) or "none"
    searched = ", ".join(str(d) for d in trace_search_path(dirs))
    raise TraceError(f"no trace set {name!r} (searched {searched}; known: {known})")


def open_trace(name, dirs=None) -> TraceSet:
    """Find trace set ``name`` (see :func:`find_trace`) and open it."""
    return TraceSet.open(find_trace(name, dirs))


# -- models -------------------------------------------------------------------------------

class NumpyMLP:
    """A fully connected ReLU network with softmax cross-entropy, in numpy.

    Parameters live in one flat vector in layer order ``fc1.weight`` (out x in),
    ``fc1.bias``, ``fc2.weight``, ...; computations run in that vector's dtype.
    """

    kind = "mlp"

    def __init__(self, sizes=(64, 128, 64, 10)):
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"layer sizes {sizes}: need at least input and output")
        self.layers = []
        for j, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:]), start=1):
            self.layers += [Layer(f"fc{j}.weight", (fan_out, fan_in)),
                            Layer(f"fc{j}.bias", (fan_out,))]
        self.elements = sum(layer.size for layer in self.layers)

    def describe(self) -> str:
        return "-".join(map(str, self.sizes)) + " fully connected, ReLU, softmax cross-entropy"

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """He-initialised weights, zero biases, float32."""
        parts = []
        for fan_in, fan_out in zip(self.sizes, self.sizes[1:]):
            parts.append(rng.standard_normal((fan_out, fan_in)).ravel() * np.sqrt(2.0 / fan_in))
            parts.append(np.zeros(fan_out))
        return np.concatenate(parts).astype(np.float32)

    def _unflatten(self, params):
        views, start = [], 0
        for layer in self.layers:
            views.append(params[start:start + layer.size].reshape(layer.shape))
            start += layer.size
        return views[0::2], views[1::2]

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The network's outputs for the rows of ``x``."""
        weights, biases = self._unflatten(params)
        h = np.asarray(x, dtype=params.dtype)
        for j, (w, b) in enumerate(zip(weights, biases)):
            h = h @ w.T + b
            if j < len(weights) - 1:
                h = np.maximum(h, 0)
        return h

    def loss(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Mean cross-entropy over the batch."""
        return float(_cross_entropy(self.logits(params, x), y)[0])

    def accuracy(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Fraction of rows classified right."""
        return float(np.mean(self.logits(params, x).argmax(axis=1) == y))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray):
        """Mean cross-entropy over the batch and its gradient (flat, params' dtype)."""
        weights, biases = self._unflatten(params)
        activations = [np.asarray(x, dtype=params.dtype)]
        for j, (w, b) in enumerate(zip(weights, biases)):
            z = activations[-1] @ w.T + b
            activations.append(np.maximum(z, 0) if j < len(weights) - 1 else z)
        loss, delta = _cross_entropy(activations[-1], y)  # delta = dLoss/dlogits
        grads = [None] * (2 * len(weights))
        for j in range(len(weights) - 1, -1, -1):
            grads[2 * j] = delta.T @ activations[j]
            grads[2 * j + 1] = delta.sum(axis=0)
            if j:
                delta = (delta @ weights[j]) * (activations[j] > 0)
        return float(loss), np.concatenate([g.ravel() for g in grads]).astype(params.dtype)


def _cross_entropy(logits: np.ndarray, y: np.ndarray):
    """Mean softmax cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_prob = shifted - log_norm
    rows = np.arange(len(y))
    loss = -log_prob[rows, y].mean()
    delta = np.exp(log_prob)
    delta[rows, y] -= 1
    return loss, delta / len(y)


class TorchCNN:
    """A small convolutional net for the 8x8 digits, in PyTorch, behind the same API.

    conv 1->8 (3x3, pad 1), ReLU, 2x2 max-pool, conv 8->16 (3x3, pad 1), ReLU, 2x2
    max-pool, linear 64->10; softmax cross-entropy.
    """

    kind = "cnn"

    def __init__(self, seed: int = 0):
        try:
            import torch
        except ImportError as exc:
            raise TraceError(f"the cnn model needs PyTorch: {TORCH_HINT}") from exc
        self.torch = torch
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            self.net = torch.nn.Sequential()
            self.net.add_module("conv1", torch.nn.Conv2d(1, 8, 3, padding=1))
            self.net.add_module("relu1", torch.nn.ReLU())
            self.net.add_module("pool1", torch.nn.MaxPool2d(2))
            self.net.add_module("conv2", torch.nn.Conv2d(8, 16, 3, padding=1))
            self.net.add_module("relu2", torch.nn.ReLU())
            self.net.add_module("pool2", torch.nn.MaxPool2d(2))
            self.net.add_module("flatten", torch.nn.Flatten())
            self.net.add_module("fc", torch.nn.Linear(64, 10))
        finally:
            torch.random.set_rng_state(generator_state)
        self.layers = [Layer(name, tuple(p.shape)) for name, p in self.net.named_parameters()]
        self.elements = sum(layer.size for layer in self.layers)

    def describe(self) -> str:
        return ("conv 1-8 3x3, ReLU, maxpool 2, conv 8-16 3x3, ReLU, maxpool 2, "
                "linear 64-10, softmax cross-entropy")

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """PyTorch's default initialisation, made from the seed given to the constructor."""
        vector = self.torch.nn.utils.parameters_to_vector(self.net.parameters())
        return vector.detach().numpy().astype(np.float32)

    def _load(self, params: np.ndarray) -> None:
        self.torch.nn.utils.vector_to_parameters(
            self.torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32)),
            self.net.parameters())

    def _images(self, x: np.ndarray):
        return self.torch.from_numpy(np.asarray(x, dtype=np.float32).reshape(-1, 1, 8, 8))

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        self._load(params)
        with self.torch.no_grad():
            return self.net(self._images(x)).numpy()

    def loss(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(_cross_entropy(self.logits(params, x).astype(np.float64), y)[0])

    def accuracy(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.logits(params, x).argmax(axis=1) == y))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray):
        """Mean cross-entropy over the batch and its flat float32 gradient."""
        torch = self.torch
        self._load(params)
        self.net.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(self.net(self._images(x)),
                                                 torch.from_numpy(np.asarray(y, np.int64)))
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in self.net.parameters()])
        return loss.item(), grad.numpy().astype(np.float32)


def make_model(model: str, hidden=(128, 64), seed: int = 0):
    """The model the recorder trains: ``"mlp"`` (numpy) or ``"cnn"`` (PyTorch)."""
    if model == "mlp":
        return NumpyMLP((64, *hidden, 10))
    if model == "cnn":
        return TorchCNN(seed)
    raise TraceError(f"unknown model {model!r}: use 'mlp' or 'cnn'")


# -- recording ----------------------------------------------------------------------------

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


# -- command line -------------------------------------------------------------------------

def main(argv=None) -> int:
    """``list``, ``show NAME`` or ``record NAME`` trace sets."""
    parser = argparse.ArgumentParser(prog="python -m qaina_bench.hosts.traces",
                                     description="List, inspect and record gradient traces.")
    parser.add_argument("--dir", action="append", default=[], metavar="DIR",
                        help="search DIR for trace sets before the bundled ones")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list trace sets on the search path")
    show = commands.add_parser("show", help="print a trace set's manifest")
    show.add_argument("name")
    rec = commands.add_parser("record", help="train on the digits and record gradients")
    rec.add_argument("name")
    rec.add_argument("--out", required=True, help="directory to write NAME/ into")
    rec.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    rec.add_argument("--workers", type=int, default=4)
    rec.add_argument("--iterations", type=int, default=8)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--batch-size", type=int, default=32)
    rec.add_argument("--lr", type=float, default=0.1)
    rec.add_argument("--hidden", default="128,64", help="mlp hidden sizes, e.g. 128,64")
    rec.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for entry in list_traces(args.dir):
                if entry.problem:
                    print(f"{entry.name}\tUNUSABLE: {entry.problem}")
                else:
                    print(f"{entry.name}\t{entry.model}\t{entry.workers} workers\t"
                          f"{entry.iterations} iterations\t{entry.elements} elements\t"
                          f"{entry.path}")
        elif args.command == "show":
            trace = open_trace(args.name, args.dir)
            print(trace.path)
            print(json.dumps(trace.manifest, indent=1))
        else:
            hidden = tuple(int(h) for h in args.hidden.split(",") if h)
            trace = record(args.name, args.out, args.model, args.workers, args.iterations,
                           args.seed, batch_size=args.batch_size, learning_rate=args.lr,
                           hidden=hidden, overwrite=args.overwrite, log=print)
            print(trace)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
