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
the sets bundled with the package (:func:`default_trace_dir`). ``recorder.py`` records
new sets from real training runs (``models.py``). Command line:
``qaina-bench traces list|show|record``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "qaina-trace"
FORMAT_VERSION = 2  # 2 adds "dtype" (float32 or float16); version 1 is float32
DTYPES = ("float32", "float16")
#: the most workers a recorded set has (``traces record --workers``, a sweep's recipes)
MAX_WORKERS = 256
MANIFEST = "manifest.json"
#: the largest manifest read (one of a 10,000-layer model is about 1 MB)
MAX_MANIFEST = 16 << 20
REQUIRED_KEYS = ("format", "version", "name", "model", "dataset", "layers", "elements",
                 "workers", "iterations")
#: the most workers, iterations or elements (and any layer dimension) a manifest may
#: name: a gradient of 2**32 float32 values is 16 GiB, past any set this reads
MAX_COUNT = 2 ** 32

class TraceError(Exception):
    """A trace set that is missing, malformed or cannot be recorded."""


@dataclass(frozen=True)
class Layer:
    """One parameter tensor of the model: its name and shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


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
        self.dtype = np.dtype(manifest.get("dtype", "float32"))  # as stored

    @classmethod
    def open(cls, path) -> "TraceSet":
        """Open the trace set in directory ``path``; TraceError says what is wrong."""
        path = Path(path)
        problem = path_problem(path, directory=True)
        if problem:
            raise TraceError(f"trace set {path}: "
                             + ("no such directory" if problem == MISSING else problem))
        manifest = read_manifest(path)
        trace = cls(path, manifest)
        for k in range(trace.workers):
            trace._check_worker_file(k)
        return trace

    def __repr__(self):
        return (f"TraceSet({self.name!r}: {self.model} on {self.dataset}, {self.workers} "
                f"workers x {self.iterations} iterations x {self.elements} elements)")

    def gradient(self, worker: int, iteration: int) -> np.ndarray:
        """Worker ``worker``'s flattened gradient at iteration ``iteration``, as float32."""
        if not 0 <= worker < self.workers:
            raise IndexError(f"worker {worker} of a {self.workers}-worker trace set")
        if not 0 <= iteration < self.iterations:
            raise IndexError(f"iteration {iteration} of {self.iterations}")
        file = self.path / worker_file(worker)
        try:
            with np.load(file) as npz:
                grad = npz[iteration_key(iteration)]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile, RuntimeError,
                NotImplementedError, MemoryError) as exc:
            raise TraceError(f"{file}: cannot read {iteration_key(iteration)}: "
                             f"{type(exc).__name__}: {exc}") from exc
        if grad.dtype != self.dtype or grad.shape != (self.elements,):
            raise TraceError(f"{file}: {iteration_key(iteration)} is {grad.dtype} "
                             f"{grad.shape}, expected {self.dtype} ({self.elements},)")
        return grad.astype(np.float32, copy=False)

    def gradients(self, iteration: int, workers=None) -> np.ndarray:
        """Stacked float32 gradients, shape (len(workers), elements); all workers if None."""
        workers = range(self.workers) if workers is None else workers
        return np.stack([self.gradient(k, iteration) for k in workers])

    def exact_sum(self, iteration: int, workers=None, dtype=np.float64,
                  checked: bool = False, peaks: dict | None = None) -> np.ndarray:
        """The exact aggregate of an iteration: sum over ``workers`` (all if None).
        ``checked``: TraceError if a gradient holds inf or nan, or the aggregate is
        beyond float32 (no job can deliver it, and its error would be inf or nan).
        ``peaks``: gets, per worker ``k``, its largest ``|g|`` (``peaks[k]``)."""
        workers = range(self.workers) if workers is None else workers
        total = np.zeros(self.elements, dtype=np.float64)
        for k in workers:
            grad = self.gradient(k, iteration)
            if checked and not np.isfinite(grad).all():
                raise TraceError(f"trace set {self.name}: worker {k}'s gradient at iteration "
                                 f"{iteration} holds inf or nan: replay finite gradients")
            if peaks is not None:
                peaks[k] = float(np.abs(grad).max(initial=0.0))
            total += grad
        if checked:
            peak = float(np.abs(total).max(initial=0.0))
            if peak > float(np.finfo(np.float32).max):
                raise TraceError(f"trace set {self.name}: the sum of {len(workers)} workers "
                                 f"at iteration {iteration} reaches {peak:.3g}, beyond "
                                 "float32 (3.4e38): no aggregate of it can be delivered")
        return total.astype(dtype, copy=False)

    def write_exact_sums(self, path, workers: int, iterations: int,
                         peaks: list | None = None) -> Path:
        """The exact aggregates of iterations ``0 .. iterations-1`` over workers ``0 ..
        workers-1``, as one float32 array (iterations, elements) in the ``.npy`` file
        ``path`` (written whole, by a rename): summed once for all the agents of a
        job, which read it with :func:`load_exact_sums`. ``peaks``: gets per iteration
        the largest ``|g|`` of each worker (a dict, as :meth:`exact_sum` fills)."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        sums = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32,
                                         shape=(iterations, self.elements))
        try:
            for i in range(iterations):
                seen = {} if peaks is not None else None
                sums[i] = self.exact_sum(i, range(workers), np.float32, checked=True,
                                         peaks=seen)
                if peaks is not None:
                    peaks.append(seen)
            sums.flush()
        except BaseException:
            del sums
            partial.unlink()
            raise
        del sums
        partial.rename(path)
        return path

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
        problem = path_problem(file)
        if problem == MISSING:
            raise TraceError(f"trace set {self.path}: missing {worker_file(k)} "
                             f"(the manifest names {self.workers} workers)")
        if problem:
            raise TraceError(f"{file}: {problem}")
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
                    if dtype != self.dtype or shape != (self.elements,):
                        raise TraceError(f"{file}: {iteration_key(i)} is {dtype} {shape}, "
                                         f"expected {self.dtype} ({self.elements},)")
                    if archive.getinfo(member).file_size < self.elements * dtype.itemsize:
                        raise TraceError(f"{file}: {iteration_key(i)} holds fewer bytes "
                                         f"than its {self.elements} elements")
        except OSError as exc:  # the file itself, not its format
            raise TraceError(f"{file}: cannot be read: {_why(exc)}") from None
        # encrypted members (RuntimeError), a compression zipfile lacks (NotImplementedError)
        except (zipfile.BadZipFile, ValueError, RuntimeError, NotImplementedError) as exc:
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


#: what ``path_problem`` says of a path where there is nothing
MISSING = "missing"


def path_problem(path: Path, directory: bool = False) -> str | None:
    """Why this user cannot read ``path`` as a regular file (a link to one is one) or,
    with ``directory``, enter it as a directory, in a few words: ``MISSING``, "not
    readable: permission denied", "not a regular file (a directory)", ...; None if they
    can. A device or a pipe is no regular file: a read of one may never end."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in it
        return "a symbolic link to nothing" if os.path.islink(path) else MISSING
    except OSError as exc:  # a directory on the way this user cannot enter, a link loop
        return MISSING if exc.errno == errno.ENAMETOOLONG else f"not readable: {_why(exc)}"
    if directory:
        if not stat.S_ISDIR(mode):
            return "not a directory"
        return None if os.access(path, os.X_OK) else "not readable: permission denied"
    if not stat.S_ISREG(mode):
        return f"not a regular file ({_kind(mode)})"
    return None if os.access(path, os.R_OK) else "not readable: permission denied"


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, by its mode."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def _why(exc: OSError) -> str:
    """An OSError's reason in words ("permission denied"), without its number and path."""
    return exc.strerror.lower() if exc.strerror else str(exc)


def read_manifest(path) -> dict:
    """The checked manifest of the trace set in directory ``path``."""
    file = Path(path) / MANIFEST
    problem = path_problem(file)  # a pipe would be read forever
    if problem == MISSING:
        raise TraceError(f"trace set {path}: missing {MANIFEST}")
    if problem:
        raise TraceError(f"{file}: {problem}")
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_MANIFEST + 1)
    except OSError as exc:
        raise TraceError(f"{file}: cannot be read: {_why(exc)}") from None
    try:
        if len(data) > MAX_MANIFEST:
            raise ValueError(f"larger than {MAX_MANIFEST >> 20} MB")
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, an integer past 4300 digits
        raise TraceError(f"{file}: not valid JSON: {str(exc).splitlines()[0]}") from exc
    except RecursionError:
        raise TraceError(f"{file}: not a manifest (nested too deep)") from None
    if not isinstance(manifest, dict):
        raise TraceError(f"{file}: expected a JSON object")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise TraceError(f"{file}: missing {', '.join(missing)}")
    if not isinstance(manifest["name"], str) or not manifest["name"].isprintable():
        raise TraceError(f"{file}: name must be printable text (no control characters)")
    if manifest["format"] != FORMAT:
        raise TraceError(f"{file}: format {manifest['format']!r} is not {FORMAT!r}")
    if manifest["version"] not in (1, FORMAT_VERSION):
        raise TraceError(f"{file}: format version {manifest['version']}, this reader "
                         f"knows versions 1 and {FORMAT_VERSION}")
    if manifest.get("dtype", "float32") not in DTYPES:
        raise TraceError(f"{file}: dtype {manifest['dtype']!r} is not one of "
                         f"{', '.join(DTYPES)}")
    for key in ("workers", "iterations", "elements"):
        _count(manifest[key], f"{file}: {key}")
    try:
        layers = [Layer(str(layer["name"]), tuple(layer["shape"]))
                  for layer in manifest["layers"]]
    except (TypeError, KeyError, ValueError, OverflowError) as exc:
        raise TraceError(f"{file}: layers must be a list of {{name, shape}}: {exc}") from exc
    for layer in layers:
        for d in layer.shape:  # as written: 64.5 or "64" is not a dimension
            _count(d, f"{file}: layer {layer.name[:40]!r}: a dimension")
    total = sum(layer.size for layer in layers)
    if total != manifest["elements"]:
        raise TraceError(f"{file}: the layers hold {total} elements, the manifest says "
                         f"{manifest['elements']}")
    return manifest


def _count(value, what: str):
    """TraceError (one line) unless ``value`` is a whole number in 1..MAX_COUNT."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise TraceError(f"{what} must be a positive integer of at most {MAX_COUNT}, "
                         f"not {shown}")


# -- writing ------------------------------------------------------------------------------

#: a recorded trace set's name: one directory name
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_set_name(name) -> str:
    """``name`` if it can name a trace set's directory; TraceError (one line) if not."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise TraceError(f"trace set name {name!r}: use letters, digits, '.', '_' and '-' "
                         "(at most 100, the first a letter or digit)")
    return name


def write_trace(path, gradients, *, name: str | None = None, model: str, dataset: str,
                layers, overwrite: bool = False, dtype: str = "float32", **info) -> TraceSet:
    """Write a trace set to directory ``path`` and return it opened.

    ``gradients[k][i]`` is worker k's gradient at iteration i (anything numpy turns
    into a flat array of the layers' total size), stored as ``dtype`` (float32, or
    float16 for big sets: half the size). ``layers`` is a sequence of
    :class:`Layer` or ``(name, shape)`` pairs; ``info`` goes into the manifest as is
    (JSON-serialisable values). The set is written next to ``path`` and moved into
    place at the end, so an interrupted write leaves no half trace set behind.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):  # replacing it would replace its parent
        raise TraceError(f"{path}: a trace set needs a directory of its own")
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
        raise TraceError(f"{path} exists (replace it with --overwrite, or overwrite=True)")
    if dtype not in DTYPES:
        raise TraceError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
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
        "dtype": dtype,
        **info,
    }
    text = _manifest_text(manifest)  # before anything is written
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise TraceError(f"cannot write trace set {path}: {exc.strerror or exc}") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private
    try:
        for k, per_worker in enumerate(gradients):
            arrays = {}
            for i, grad in enumerate(per_worker):
                grad = np.asarray(grad, dtype=dtype).reshape(-1)
                if grad.shape != (elements,):
                    raise TraceError(f"worker {k} iteration {i}: {grad.size} elements, "
                                     f"the layers hold {elements}")
                arrays[iteration_key(i)] = grad
            np.savez_compressed(staging / worker_file(k), **arrays)
        (staging / MANIFEST).write_text(text, encoding="utf-8")
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except OSError as exc:  # a full or read-only disk: nothing half written is left
        shutil.rmtree(staging, ignore_errors=True)
        raise TraceError(f"cannot write trace set {path}: {exc.strerror or exc} (free "
                         "space there, or record it elsewhere)") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return TraceSet.open(path)


def _manifest_text(manifest: dict) -> str:
    """JSON with one top-level key per line, and one line per entry of a list of objects;
    TraceError for a value that is not a finite number (NaN, infinity: no JSON has them)."""
    lines = []
    for key, value in manifest.items():
        try:
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                items = ",\n".join(f"  {_json(v)}" for v in value)
                lines.append(f" {_json(key)}: [\n{items}\n ]")
            else:
                lines.append(f" {_json(key)}: {_json(value)}")
        except ValueError:
            raise TraceError(f"the manifest's {key!r} holds a number that is not finite "
                             "(NaN or infinity): a trace set is not written with it") from None
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _json(value) -> str:
    """``value`` as JSON, strictly: ValueError for NaN or infinity."""
    return json.dumps(value, allow_nan=False)


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


def default_record_dir() -> Path:
    """The user's trace directory: where ``traces record`` writes and ``up`` looks
    (``$QAINA_TRACE_DIR``, else ``$XDG_DATA_HOME/qaina-bench/traces``, else
    ``~/.local/share/qaina-bench/traces``)."""
    if os.environ.get("QAINA_TRACE_DIR"):
        return Path(os.environ["QAINA_TRACE_DIR"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "qaina-bench" / "traces"


def trace_search_path(dirs=None) -> list[Path]:
    """Where trace names are looked up: ``dirs`` in order, then the user's trace
    directory, then the bundled sets."""
    search = [Path(d).expanduser() for d in (dirs or ())]
    for default in (default_record_dir(), default_trace_dir()):
        if default not in search:
            search.append(default)
    return search


def list_traces(dirs=None) -> list[TraceEntry]:
    """Trace sets on the search path, sorted by name; an earlier directory shadows."""
    found: dict[str, TraceEntry] = {}
    for directory in trace_search_path(dirs):
        try:
            children = sorted(directory.iterdir()) if directory.is_dir() else []
        except OSError:  # a directory this user cannot read holds no set for them
            continue
        for child in children:
            if child.name not in found and _has_manifest(child):
                found[child.name] = _entry(child)
    return [found[name] for name in sorted(found)]


def _has_manifest(child: Path) -> bool:
    """Whether ``child`` holds a manifest (a manifest that is not a file is listed with
    its problem)."""
    try:
        return (child / MANIFEST).exists()
    except OSError:  # a directory this user cannot enter, a name too long (ENAMETOOLONG)
        return False


def _entry(child: Path) -> TraceEntry:
    """The listing's entry of one set: its manifest's figures, or why it is unusable
    (one bad set never hides the others)."""
    try:
        m = read_manifest(child)
    except TraceError as exc:
        return TraceEntry(child.name, child, problem=str(exc))
    except Exception as exc:  # a manifest the checks did not foresee: still one line
        return TraceEntry(child.name, child, problem=f"{child / MANIFEST}: unreadable "
                          f"({type(exc).__name__}: {exc})")
    return TraceEntry(child.name, child, str(m["model"]), str(m["dataset"]),
                      m["workers"], m["iterations"], m["elements"])


def _unreadable_set(candidate: Path) -> str | None:
    """Why this user cannot read directory ``candidate`` (e.g. "not readable:
    permission denied"); None if they can, or if it is no directory."""
    problem = path_problem(candidate, directory=True)
    return None if problem in (None, MISSING, "not a directory",
                               "a symbolic link to nothing") else problem


def find_trace(name, dirs=None) -> Path:
    """The directory of trace set ``name``: a path to one, or a name on the search path."""
    as_path = Path(name).expanduser()
    candidates = [as_path]
    if os.sep not in str(name) and not as_path.is_absolute():
        candidates += [directory / str(name) for directory in trace_search_path(dirs)]
    unreadable = []
    for candidate in candidates:
        problem = _unreadable_set(candidate)
        if problem:
            unreadable.append(f"trace set {candidate}: {problem} (make it readable for "
                              "this user, or name another set)")
        elif _has_manifest(candidate):
            return candidate
    if unreadable:  # not "no trace set": one is there, this user cannot read it
        raise TraceError(unreadable[0])
    from .recorder import RECIPES  # (it reads trace sets through this module)
    found = [entry.name for entry in list_traces(dirs)]
    known = ", ".join(found) or "none"
    recipes = ", ".join(r for r in RECIPES if r not in found)
    searched = ", ".join(str(d) for d in trace_search_path(dirs))
    shown = str(name) if len(str(name)) <= 80 else str(name)[:80] + "..."
    raise TraceError(f"no trace set {shown!r} (searched {searched}; known: {known}"
                     + (f"; recorded on first use by `up`: {recipes}" if recipes else "") + ")")


def load_exact_sums(path, iterations: int, elements: int) -> list[np.ndarray]:
    """The exact aggregates of iterations ``0 .. iterations-1`` from a file of
    :meth:`TraceSet.write_exact_sums` (mapped, not read: the agents of a job share
    the pages); TraceError (one line) if it is missing or of another shape."""
    try:
        sums = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise TraceError(f"exact sums {path}: cannot read them: {exc}") from None
    if sums.dtype != np.float32 or sums.ndim != 2 or sums.shape[0] < iterations \
            or sums.shape[1] != elements:
        raise TraceError(f"exact sums {path}: {sums.dtype} {sums.shape}, expected float32 "
                         f"({iterations} or more, {elements})")
    return [np.asarray(sums[i]) for i in range(iterations)]


def open_trace(name, dirs=None) -> TraceSet:
    """Find trace set ``name`` (see :func:`find_trace`) and open it."""
    return TraceSet.open(find_trace(name, dirs))
