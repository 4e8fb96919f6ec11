"""Gradient trace sets: format and lookup (hosts/traces.py), models (hosts/models.py),
the recorder (hosts/recorder.py), the bundled set, the traces command line."""

import json
import os
import sys

import numpy as np
import pytest

from click.testing import CliRunner

from qaina_bench.harness.cli import main as cli
from qaina_bench.hosts import recorder
from qaina_bench.hosts import traces as traces_mod
from qaina_bench.hosts.models import NumpyMLP
from qaina_bench.hosts.recorder import record
from qaina_bench.hosts.sources import TraceReplay
from qaina_bench.hosts.traces import (Layer, TraceError, TraceSet, default_trace_dir,
                                      find_trace, list_traces, load_exact_sums, open_trace,
                                      write_trace)

LAYERS = [("a.weight", (3, 4)), ("a.bias", (3,))]


def small_gradients(workers=3, iterations=2, elements=15, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(elements).astype(np.float32) for _ in range(iterations)]
            for _ in range(workers)]


@pytest.fixture
def small_trace(tmp_path):
    grads = small_gradients()
    trace = write_trace(tmp_path / "small", grads, model="toy", dataset="random",
                        layers=LAYERS, seed=7, note={"any": [1, 2]})
    return trace, grads


# -- format -------------------------------------------------------------------------------

def test_round_trip(small_trace):
    written, grads = small_trace
    trace = TraceSet.open(written.path)
    assert (trace.workers, trace.iterations, trace.elements) == (3, 2, 15)
    assert (trace.name, trace.model, trace.dataset) == ("small", "toy", "random")
    assert trace.layers == [Layer("a.weight", (3, 4)), Layer("a.bias", (3,))]
    assert trace.manifest["seed"] == 7 and trace.manifest["note"] == {"any": [1, 2]}
    for k in range(3):
        for i in range(2):
            grad = trace.gradient(k, i)
            assert grad.dtype == np.float32
            np.testing.assert_array_equal(grad, grads[k][i])
    exact = trace.exact_sum(1)
    assert exact.dtype == np.float64
    np.testing.assert_array_equal(exact, sum(g[1].astype(np.float64) for g in grads))
    np.testing.assert_array_equal(trace.exact_sum(0, workers=[0, 2]),
                                  grads[0][0].astype(np.float64) + grads[2][0])
    np.testing.assert_array_equal(trace.gradients(0), np.stack([g[0] for g in grads]))
    views = trace.layer_views(grads[0][0])
    assert views["a.weight"].shape == (3, 4) and views["a.bias"].shape == (3,)
    np.testing.assert_array_equal(views["a.bias"], grads[0][0][12:])


@pytest.mark.parametrize("value, workers, fragment", [
    (np.nan, 2, "worker 1's gradient at iteration 1 holds inf or nan"),
    (np.inf, 2, "worker 1's gradient at iteration 1 holds inf or nan"),
    (1.5e38, 3, "the sum of 3 workers at iteration 1 reaches 4.5e\\+38, beyond float32"),
])
def test_exact_sums_refuse_what_no_job_can_deliver(tmp_path, value, workers, fragment):
    """A gradient of inf or nan, or workers whose sum is beyond float32, is one line
    (the run says it before its network comes up), and no partial file is left."""
    grads = small_gradients(workers=3)
    grads[1][1][4] = value
    for k in (0, 2):
        grads[k][1][4] = 1.5e38
    trace = write_trace(tmp_path / "t", grads, model="toy", dataset="random", layers=LAYERS)
    assert trace.write_exact_sums(tmp_path / "first.npy", workers=3, iterations=1).exists()
    with pytest.raises(TraceError, match=fragment):
        trace.write_exact_sums(tmp_path / "e.npy", workers=workers, iterations=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.npy", "t"]


def test_exact_sums_written_once_read_as_the_trace_sums_them(small_trace, tmp_path):
    """The harness's file of a job's exact sums (workers 0 .. n-1) holds what
    ``exact_sum`` gives, and a replaying agent reads it instead of summing."""
    written, grads = small_trace
    trace = TraceSet.open(written.path)
    path = trace.write_exact_sums(tmp_path / "exact.npy", workers=2, iterations=2)
    assert not list(tmp_path.glob(".*partial"))
    sums = load_exact_sums(path, 2, trace.elements)
    for i in range(2):
        assert sums[i].dtype == np.float32 and type(sums[i]) is np.ndarray
        np.testing.assert_array_equal(sums[i], trace.exact_sum(i, range(2), np.float32))
    assert len(load_exact_sums(path, 1, trace.elements)) == 1
    replay = TraceReplay(str(written.path), 1, 2, 2, exact_sums=str(path))
    alone = TraceReplay(str(written.path), 1, 2, 2)
    for i in range(2):
        np.testing.assert_array_equal(replay.exact(i), alone.exact(i))
        np.testing.assert_array_equal(replay.gradient(i), grads[1][i])
    with pytest.raises(TraceError, match=r"expected float32 \(3 or more, 15\)"):
        load_exact_sums(path, 3, trace.elements)
    with pytest.raises(TraceError, match="cannot read them"):
        load_exact_sums(tmp_path / "none.npy", 2, trace.elements)
    np.save(tmp_path / "wide.npy", np.zeros((2, 16), np.float32))
    with pytest.raises(TraceError, match=r"float32 \(2, 16\)"):
        TraceReplay(str(written.path), 0, 2, 2, exact_sums=str(tmp_path / "wide.npy"))


def test_files_on_disk_are_the_documented_layout(small_trace):
    trace, grads = small_trace
    assert sorted(p.name for p in trace.path.iterdir()) == [
        "manifest.json", "worker0.npz", "worker1.npz", "worker2.npz"]
    manifest = json.loads((trace.path / "manifest.json").read_text())
    assert manifest["format"] == "qaina-trace" and manifest["version"] == 2
    assert manifest["dtype"] == "float32"
    assert manifest["layers"] == [{"name": "a.weight", "shape": [3, 4]},
                                  {"name": "a.bias", "shape": [3]}]
    with np.load(trace.path / "worker1.npz") as npz:
        assert sorted(npz.files) == ["it0", "it1"]
        np.testing.assert_array_equal(npz["it1"], grads[1][1])


def test_out_of_range_indices(small_trace):
    trace, _ = small_trace
    with pytest.raises(IndexError):
        trace.gradient(3, 0)
    with pytest.raises(IndexError):
        trace.gradient(0, 2)


def test_write_refuses_to_clobber_and_leaves_nothing_half_written(tmp_path, small_trace):
    trace, _ = small_trace
    with pytest.raises(TraceError, match="exists"):
        write_trace(trace.path, small_gradients(), model="toy", dataset="d", layers=LAYERS)
    replaced = write_trace(trace.path, small_gradients(workers=2, seed=1), model="toy",
                           dataset="d", layers=LAYERS, overwrite=True)
    assert replaced.workers == 2
    with pytest.raises(TraceError, match="16 elements"):
        write_trace(tmp_path / "bad", small_gradients(elements=16), model="toy",
                    dataset="d", layers=LAYERS)
    assert not (tmp_path / "bad").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # no staging left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a 64 KiB tmpfs (root)")
def test_a_trace_set_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """`traces record` onto a full file system: one line naming the set (it was a
    traceback), and no half-written staging directory."""
    import subprocess
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], check=True)
    try:
        with pytest.raises(TraceError, match=f"cannot write trace set {tiny / 'big'}: No "
                                             "space left on device"):
            write_trace(tiny / "big", small_gradients(workers=2, elements=100_000),
                        model="toy", dataset="d", layers=[("a.weight", (100_000,))])
        result = CliRunner().invoke(cli, ["traces", "record", "t", "--workers", "2",
                                          "--iterations", "2", "--out", str(tiny)])
        assert result.exit_code == 1 and result.output.splitlines()[-1] == (
            f"Error: cannot write trace set {tiny / 't'}: No space left on device (free "
            "space there, or record it elsewhere)"), result.output
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=True)


# -- errors -------------------------------------------------------------------------------

def test_missing_directory(tmp_path):
    with pytest.raises(TraceError, match="no such directory"):
        TraceSet.open(tmp_path / "nothing")


def test_missing_manifest(small_trace):
    trace, _ = small_trace
    (trace.path / "manifest.json").unlink()
    with pytest.raises(TraceError, match="missing manifest.json"):
        TraceSet.open(trace.path)


def edit_manifest(trace, **changes):
    file = trace.path / "manifest.json"
    manifest = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            del manifest[key]
        else:
            manifest[key] = value
    file.write_text(json.dumps(manifest))


@pytest.mark.parametrize("changes,message", [
    ({"workers": None, "layers": None}, "missing layers, workers"),
    ({"format": "npz"}, "format 'npz'"),
    ({"version": 3}, "format version 3"),
    ({"dtype": "int8"}, "dtype 'int8'"),
    ({"workers": 0}, "workers must be a positive integer"),
    ({"elements": 16}, "the layers hold 15 elements, the manifest says 16"),
    ({"layers": [{"name": "x"}]}, "layers must be a list"),
    ({"workers": 4}, "missing worker3.npz"),
    ({"iterations": 3}, "no array it2"),
    ({"elements": 10**30, "layers": [{"name": "x", "shape": [10**30]}]},
     "elements must be a positive integer of at most 4294967296, not 1000000"),
    ({"layers": [{"name": "x", "shape": [10**30, 0]}]}, "layer 'x': a dimension must be"),
    ({"layers": [{"name": "x", "shape": [-1, -15]}]}, "layer 'x': a dimension must be"),
    ({"layers": [{"name": "x", "shape": [float("inf")]}]}, "layer 'x': a dimension must be"),
    ({"layers": [{"name": "x", "shape": [3.9, 5]}]}, r"a dimension must be .*, not 3\.9"),
    ({"layers": [{"name": "x", "shape": ["3", 5]}]}, "a dimension must be .*, not '3'"),
    ({"layers": [{"name": "x", "shape": 15}]}, "layers must be a list"),
    ({"workers": True}, "workers must be a positive integer"),
    ({"name": "a\x1b]0;x\x07"}, "name must be printable text"),
    ({"name": "\ud800"}, "name must be printable text"),
])
def test_bad_manifest(small_trace, changes, message):
    trace, _ = small_trace
    edit_manifest(trace, **changes)
    with pytest.raises(TraceError, match=message):
        TraceSet.open(trace.path)


def test_corrupt_manifest(small_trace):
    trace, _ = small_trace
    (trace.path / "manifest.json").write_text("{ not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        TraceSet.open(trace.path)


def test_a_manifest_that_is_not_a_file_is_named_not_read(small_trace, tmp_path):
    """A pipe as manifest.json would block a reader forever: it is one clear line, by
    path and by name on the search path."""
    trace, _ = small_trace
    (trace.path / "manifest.json").unlink()
    os.mkfifo(trace.path / "manifest.json")
    with pytest.raises(TraceError, match="manifest.json: not a regular file"):
        TraceSet.open(trace.path)
    with pytest.raises(TraceError, match="manifest.json: not a regular file"):
        open_trace("small", [str(trace.path.parent)])
    entry = {e.name: e for e in list_traces([str(trace.path.parent)])}["small"]
    assert "not a regular file" in entry.problem


def test_a_manifest_past_the_limit_is_refused(small_trace, monkeypatch):
    trace, _ = small_trace
    monkeypatch.setattr(traces_mod, "MAX_MANIFEST", 100)
    with pytest.raises(TraceError, match="larger than"):
        TraceSet.open(trace.path)


@pytest.mark.parametrize("option, fragment", [
    ({"dtype": "int8"}, "dtype 'int8'"), ({"workers": 1.5}, "workers must be a whole"),
    ({"hidden": (64, 0)}, "give positive layer sizes"),
    ({"hidden": (64, "8")}, "hidden must be a list of whole layer sizes"), ({"hidden": (10**6,) * 3}, "more than"), ({"seed": -1}, "seed must be"),
    ({"learning_rate": float("nan")}, "learning rate must be"), ({"model": "x"}, "unknown model"),
])
def test_record_refuses_its_options_before_training(tmp_path, option, fragment):
    with pytest.raises(TraceError, match=fragment):
        record("r", tmp_path, **{"iterations": 1, "workers": 2, **option})
    assert not (tmp_path / "r").exists()


def test_missing_worker_file(small_trace):
    trace, _ = small_trace
    (trace.path / "worker1.npz").unlink()
    with pytest.raises(TraceError, match="missing worker1.npz"):
        TraceSet.open(trace.path)


def test_shape_mismatch(small_trace):
    trace, _ = small_trace
    np.savez_compressed(trace.path / "worker2.npz", it0=np.zeros(15, np.float32),
                        it1=np.zeros(14, np.float32))
    with pytest.raises(TraceError, match=r"worker2.npz: it1 is float32 \(14,\), "
                                         r"expected float32 \(15,\)"):
        TraceSet.open(trace.path)
    np.savez_compressed(trace.path / "worker2.npz", it0=np.zeros(15, np.float64),
                        it1=np.zeros(15, np.float32))
    with pytest.raises(TraceError, match="it0 is float64"):
        TraceSet.open(trace.path)


def test_corrupt_manifest_past_pythons_limits(small_trace):
    trace, _ = small_trace
    (trace.path / "manifest.json").write_text('{"seed": ' + "9" * 5000 + "}")
    with pytest.raises(TraceError, match="not valid JSON: Exceeds the limit"):
        TraceSet.open(trace.path)


def _npz_of_headers(path, elements: int, iterations: int):
    """A worker file whose members are .npy headers of ``elements`` float32 and no data."""
    import io
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        for i in range(iterations):
            head = io.BytesIO()
            np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False,
                                                        "shape": (elements,)})
            z.writestr(f"it{i}.npy", head.getvalue())


def test_a_worker_file_smaller_than_its_header_says_is_refused_before_reading(small_trace):
    """A few hundred bytes whose headers promise 2**32 elements (16 GiB to allocate):
    refused when the set is opened, from the member's size."""
    trace, _ = small_trace
    edit_manifest(trace, elements=2 ** 32, layers=[{"name": "x", "shape": [2 ** 32]}])
    for k in range(trace.workers):
        _npz_of_headers(trace.path / f"worker{k}.npz", 2 ** 32, trace.iterations)
    with pytest.raises(TraceError, match="it0 holds fewer bytes than its 4294967296 elements"):
        TraceSet.open(trace.path)


def test_an_encrypted_worker_file_is_one_error(small_trace):
    trace, _ = small_trace
    data = bytearray((trace.path / "worker0.npz").read_bytes())
    at = data.find(b"PK\x03\x04")  # the first local header: set its "encrypted" bit
    data[at + 6] |= 1
    at = data.find(b"PK\x01\x02")  # and its central directory entry's
    data[at + 8] |= 1
    (trace.path / "worker0.npz").write_bytes(bytes(data))
    with pytest.raises(TraceError, match="worker0.npz: not a readable .npz file: .*encrypted"):
        TraceSet.open(trace.path)


def test_a_name_too_long_for_a_path_is_no_trace_set(tmp_path):
    with pytest.raises(TraceError, match=r"no trace set 'a{80}\.\.\.'"):
        find_trace("a" * 300, [tmp_path])


def test_corrupt_worker_file(small_trace):
    trace, _ = small_trace
    (trace.path / "worker0.npz").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(TraceError, match="worker0.npz: not a readable .npz file"):
        TraceSet.open(trace.path)


# -- finding ------------------------------------------------------------------------------

def test_bundled_traces_are_found_by_name():
    assert (default_trace_dir() / "digits-mlp" / "manifest.json").is_file()
    assert find_trace("digits-mlp") == default_trace_dir() / "digits-mlp"
    assert "digits-mlp" in [entry.name for entry in list_traces()]


def test_user_directories_come_first(tmp_path):
    user = tmp_path / "user"
    write_trace(user / "digits-mlp", small_gradients(), model="toy", dataset="d",
                layers=LAYERS)
    write_trace(user / "mine", small_gradients(), model="toy", dataset="d", layers=LAYERS)
    (user / "broken").mkdir()
    (user / "broken" / "manifest.json").write_text("[]")
    (user / "not-a-trace").mkdir()
    assert find_trace("digits-mlp", [user]) == user / "digits-mlp"
    assert open_trace("digits-mlp", [user]).model == "toy"
    assert open_trace(str(user / "mine")).name == "mine"  # a path works too
    entries = {entry.name: entry for entry in list_traces([tmp_path / "absent", user])}
    # (the user's record directory comes next: what this machine recorded is not ours)
    assert {n for n, e in entries.items() if e.path.parent == user} == {
        "broken", "digits-mlp", "mine"}
    assert entries["digits-mlp"].path == user / "digits-mlp"
    assert entries["mine"].workers == 3 and entries["mine"].problem is None
    assert "JSON object" in entries["broken"].problem


def test_one_absurd_set_does_not_break_the_listing(tmp_path, small_trace):
    """A manifest naming 10**30 elements is one line in ``show`` and ``up``, and one
    unusable entry in ``list``, which lists the other sets as before."""
    trace, _ = small_trace
    big = trace.path.parent / "big"
    write_trace(big, small_gradients(), model="toy", dataset="d", layers=LAYERS)
    edit_manifest(TraceSet.open(big), elements=10**30,
                  layers=[{"name": "x", "shape": [10**30]}])
    entries = {e.name: e for e in list_traces([trace.path.parent])}
    assert entries["small"].problem is None and entries["small"].workers == 3
    assert "elements must be a positive integer of at most" in entries["big"].problem
    run = CliRunner().invoke(cli, ["traces", "list", "--trace-dir", str(trace.path.parent)])
    assert run.exit_code == 0 and "big  UNUSABLE: " in run.output
    assert "small  toy  3 workers x 2 iterations" in run.output
    for args in (["traces", "show", str(big)], ["up", "--trace", str(big), "--dry-run"]):
        run = CliRunner().invoke(cli, args)
        assert run.exit_code != 0 and not isinstance(run.exception, OverflowError)
        assert "elements must be a positive integer of at most" in run.output


def test_unknown_name_says_where_it_looked_and_what_up_records(tmp_path):
    """Every name `up` takes is in the line: a set found, or one recorded on first use."""
    with pytest.raises(TraceError, match=r"no trace set 'nope' \(searched .*known: .*digits-mlp"
                       ) as caught:
        find_trace("nope", [tmp_path])
    said = str(caught.value)
    assert all(name in said for name in recorder.RECIPES), said
    assert said.count("recorded on first use by `up`: ") <= 1, said


def test_command_line(small_trace):
    trace, _ = small_trace
    run = CliRunner().invoke(cli, ["traces", "list", "--trace-dir", str(trace.path.parent)])
    assert run.exit_code == 0
    assert "digits-mlp" in run.output and "small  toy  3 workers x 2 iterations" in run.output
    run = CliRunner().invoke(cli, ["traces", "show", str(trace.path)])
    assert run.exit_code == 0 and '"workers": 3' in run.output
    run = CliRunner().invoke(cli, ["traces", "show", "nope"])
    assert run.exit_code != 0 and "no trace set 'nope'" in run.output


# -- the numpy model ----------------------------------------------------------------------

def test_mlp_gradient_matches_finite_differences():
    from sklearn.datasets import load_digits
    digits = load_digits()
    x, y = digits.data[:20] / 16.0, digits.target[:20]
    net = NumpyMLP((64, 16, 12, 10))
    params = net.init_params(np.random.default_rng(0)).astype(np.float64)
    params += np.random.default_rng(1).normal(0, 0.05, len(params))  # non-zero biases
    loss, grad = net.loss_and_grad(params, x, y)
    assert grad.shape == (net.elements,) and grad.dtype == np.float64
    assert loss == pytest.approx(net.loss(params, x, y))
    # every bias and 40 weights of each layer, by central differences
    rng, start, coords = np.random.default_rng(2), 0, []
    for layer in net.layers:
        picks = np.arange(layer.size) if len(layer.shape) == 1 else rng.choice(layer.size, 40)
        coords.extend(start + picks)
        start += layer.size
    eps = 1e-6
    numeric = []
    for j in coords:
        step = np.zeros_like(params)
        step[j] = eps
        numeric.append((net.loss(params + step, x, y) - net.loss(params - step, x, y)) / (2 * eps))
    np.testing.assert_allclose(grad[coords], numeric, rtol=1e-5, atol=1e-8)
    assert np.abs(grad[coords]).max() > 1e-3  # a vanishing gradient would pass trivially


def test_mlp_layers_follow_the_torch_naming():
    net = NumpyMLP((64, 128, 64, 10))
    assert [(layer.name, layer.shape) for layer in net.layers] == [
        ("fc1.weight", (128, 64)), ("fc1.bias", (128,)), ("fc2.weight", (64, 128)),
        ("fc2.bias", (64,)), ("fc3.weight", (10, 64)), ("fc3.bias", (10,))]
    assert net.elements == 17226


# -- the recorder -------------------------------------------------------------------------

def test_recorder_trains_and_records_per_worker_gradients(tmp_path):
    trace = record("rec", tmp_path, workers=3, iterations=6, seed=3, hidden=(32,),
                   learning_rate=0.3, batch_size=24)
    assert (trace.workers, trace.iterations) == (3, 6)
    assert trace.elements == 64 * 32 + 32 + 32 * 10 + 10
    m = trace.manifest
    assert m["model"] == "mlp" and m["hidden"] == [32] and m["batch_size"] == 24 and m["learning_rate"] == 0.3
    assert m["worker_seeds"] == [[3, 1], [3, 2], [3, 3]]
    assert sum(m["shard_sizes"]) == 1437 and len(m["loss"]) == 6
    train_loss = m["train_loss"] + [m["final_train_loss"]]
    assert np.all(np.diff(train_loss) < 0), train_loss
    assert train_loss[-1] < 0.8 * train_loss[0]
    assert m["test_accuracy"]["final"] > m["test_accuracy"]["initial"]
    for i in range(trace.iterations):
        grads = trace.gradients(i)
        assert np.all(np.isfinite(grads)) and np.abs(grads).max() > 0
        for a in range(3):
            for b in range(a + 1, 3):
                assert not np.allclose(grads[a], grads[b])
    # the workers' gradients agree in direction: they are gradients of one model
    g0, g1 = trace.gradient(0, 0), trace.gradient(1, 0)
    assert g0 @ g1 > 0.3 * np.linalg.norm(g0) * np.linalg.norm(g1)


def test_recorder_checks_its_arguments(tmp_path):
    with pytest.raises(TraceError, match="unknown model"):
        record("x", tmp_path, model="rnn")
    with pytest.raises(TraceError, match="batch size 500 exceeds"):
        record("x", tmp_path, workers=8, iterations=1, batch_size=500)
    assert not (tmp_path / "x").exists()


def test_cnn_without_torch_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(TraceError, match=r"download\.pytorch\.org/whl/cpu"):
        record("cnn", tmp_path, model="cnn", workers=2, iterations=1)


def test_cnn_records_with_torch(tmp_path):
    pytest.importorskip("torch")
    trace = record("cnn", tmp_path, model="cnn", workers=2, iterations=5, seed=1,
                   learning_rate=0.5)
    assert trace.model == "cnn"
    assert [layer.name for layer in trace.layers] == [
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"]
    assert trace.elements == 8 * 9 + 8 + 16 * 8 * 9 + 16 + 64 * 10 + 10
    assert trace.manifest["final_train_loss"] < trace.manifest["train_loss"][0]
    assert not np.allclose(trace.gradient(0, 0), trace.gradient(1, 0))
    assert "torch" in trace.manifest["created_by"]


# -- the bundled trace set ----------------------------------------------------------------

def test_bundled_default_trace():
    trace = open_trace("digits-mlp")
    assert (trace.workers, trace.iterations) == (8, 12)
    assert trace.model == "mlp" and trace.manifest["created_by"]["recorder"] == recorder.RECORDER
    size = sum(p.stat().st_size for p in trace.path.iterdir())
    assert size <= 3 * 2**20
    train_loss = trace.manifest["train_loss"] + [trace.manifest["final_train_loss"]]
    assert train_loss[-1] < 0.7 * train_loss[0]
    last = trace.gradients(trace.iterations - 1)
    assert np.all(np.isfinite(last)) and not np.allclose(last[0], last[1])


def test_bundled_trace_is_what_the_recorder_makes(tmp_path):
    shipped = open_trace("digits-mlp")
    m = shipped.manifest
    again = record("again", tmp_path, m["model"], m["workers"], 2, m["seed"],
                   batch_size=m["batch_size"], learning_rate=m["learning_rate"],
                   hidden=tuple(m["hidden"]),
                   test_fraction=m["test_fraction"])
    assert again.layers == shipped.layers
    for i in range(2):
        for k in range(m["workers"]):
            np.testing.assert_allclose(again.gradient(k, i), shipped.gradient(k, i),
                                       rtol=1e-4, atol=1e-6)


def test_float16_sets_are_half_the_size_and_read_as_float32(tmp_path):
    grads = small_gradients(workers=2, iterations=2, elements=15)
    half = write_trace(tmp_path / "half", grads, model="toy", dataset="random",
                       layers=LAYERS, dtype="float16")
    assert half.dtype == np.float16 and half.manifest["dtype"] == "float16"
    g = half.gradient(1, 1)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, grads[1][1], rtol=1e-3, atol=1e-3)
    assert np.array_equal(g, grads[1][1].astype(np.float16).astype(np.float32))


def test_version_1_sets_still_read():
    trace = open_trace("digits-mlp")  # the bundled set is version 1, float32
    assert trace.manifest["version"] == 1 and trace.dtype == np.float32


def test_recorded_sets_land_in_the_users_trace_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("QAINA_TRACE_DIR", str(tmp_path / "mine"))
    trace = record("mine", workers=2, iterations=2, hidden=(8,))
    assert trace.path == tmp_path / "mine" / "mine"
    assert find_trace("mine") == trace.path  # up finds it without --trace-dir


def test_ctrl_c_while_recording_writes_nothing_and_says_so(tmp_path):
    """SIGINT while `traces record` trains: exit 130, one line, no set and no staging
    directory left (the set is written whole or not at all)."""
    import signal
    import subprocess
    proc = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "traces", "record",
                             "intr", "--workers", "8", "--iterations", "400", "--out",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        for line in proc.stdout:
            if line.startswith("iteration 1:"):  # training: the set is not written yet
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted: trace set intr not recorded (nothing of it written)"
    assert list(tmp_path.iterdir()) == []
