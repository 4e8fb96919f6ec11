"""Trace sets from hostile input: a training that diverges is refused and writes
nothing, a manifest is always valid JSON, and a file or directory of a set that
cannot be read is named for what it is (not readable, not a regular file), not as
missing or as no trace set."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import as_nobody
from qaina_bench.harness.cli import main
from qaina_bench.hosts.recorder import record
from qaina_bench.hosts.traces import TraceError, TraceSet, write_trace

LAYERS = [("a.weight", (3, 4)), ("a.bias", (3,))]


def gradients(workers=2, iterations=2, elements=15):
    rng = np.random.default_rng(0)
    return [[rng.standard_normal(elements).astype(np.float32) for _ in range(iterations)]
            for _ in range(workers)]


def test_a_training_that_diverges_is_refused_in_one_line_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(main, ["traces", "record", "t3", "--out", str(tmp_path),
                                       "--workers", "2", "--iterations", "3", "--hidden", "8",
                                       "--lr", "1e30"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        "iteration 0: minibatch loss 2.2680, training loss 2.3377"]  # the progress before
    assert result.stderr.splitlines() == [
        "Error: the training diverged: the training loss at iteration 1 is not a finite "
        "number (learning rate 1e+30): record with a smaller --lr; nothing written"]
    assert list(tmp_path.iterdir()) == []  # no set, no staging directory


def test_a_divergence_at_the_last_step_is_refused_too(tmp_path):
    with pytest.raises(TraceError, match="the training loss after the last step is not a "
                       "finite number"):
        record("t1", tmp_path, workers=2, iterations=1, hidden=(8,), learning_rate=1e30)
    assert list(tmp_path.iterdir()) == []


def test_gradients_past_float16s_range_are_refused_not_stored_as_inf(tmp_path):
    with pytest.raises(TraceError, match=r"worker 0's gradient at iteration 2 holds values "
                       r"past float16's range \(65504\): record with --dtype float32"):
        record("half", tmp_path, workers=2, iterations=3, hidden=(8,), learning_rate=1e4,
               dtype="float16")
    assert list(tmp_path.iterdir()) == []
    trace = record("full", tmp_path, workers=2, iterations=3, hidden=(8,),
                   learning_rate=1e4)
    assert all(np.isfinite(trace.gradients(i)).all() for i in range(3))


def test_a_manifest_value_that_is_not_finite_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TraceError, match="the manifest's 'loss' holds a number that is not "
                       "finite"):
        write_trace(tmp_path / "x", gradients(), model="toy", dataset="d", layers=LAYERS,
                    loss=[1.0, float("nan")])
    assert list(tmp_path.iterdir()) == []
    trace = write_trace(tmp_path / "x", gradients(), model="toy", dataset="d",
                        layers=LAYERS, loss=[1.0, 2.0])

    def refuse(name):
        raise ValueError(name)
    manifest = json.loads((trace.path / "manifest.json").read_text(), parse_constant=refuse)
    assert manifest["loss"] == [1.0, 2.0]


@pytest.mark.parametrize("make, said", [
    (lambda p: p.mkdir(), "worker1.npz: not a regular file (a directory)"),
    (lambda p: p.symlink_to("/dev/zero"), "worker1.npz: not a regular file (a device)"),
    (lambda p: os.mkfifo(p), "worker1.npz: not a regular file (a pipe)"),
    (lambda p: p.symlink_to(p.parent / "gone.npz"), "worker1.npz: a symbolic link to nothing"),
    (lambda p: None, "missing worker1.npz (the manifest names 2 workers)"),
])
def test_a_worker_file_that_is_no_file_is_named_for_what_it_is(tmp_path, make, said):
    trace = write_trace(tmp_path / "set", gradients(), model="toy", dataset="d",
                        layers=LAYERS)
    (trace.path / "worker1.npz").unlink()
    make(trace.path / "worker1.npz")
    with pytest.raises(TraceError) as caught:
        TraceSet.open(trace.path)
    assert str(caught.value).endswith(said), caught.value


#: what a user who is not root runs: it opens and finds the sets of its argument
AS_USER = """
import sys
from qaina_bench.hosts.traces import TraceError, find_trace, open_trace
for name in sys.argv[1:]:
    try:
        open_trace(find_trace(name))
        print("opened", name)
    except TraceError as exc:
        print(exc)
"""


def as_a_user(*names: str) -> list[str]:
    """The lines of ``AS_USER`` run by an unprivileged user (``conftest.as_nobody``)."""
    run = as_nobody("-c", AS_USER, *names, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_a_set_this_user_cannot_read_is_said_to_be_unreadable_not_absent():
    base = Path(tempfile.mkdtemp(prefix="qb-traces-"))  # not under root's private tmp
    try:
        base.chmod(0o755)
        for name in ("locked", "secret", "hidden", "ok"):
            write_trace(base / name, gradients(), model="toy", dataset="d", layers=LAYERS)
        (base / "locked").chmod(0o000)
        (base / "secret" / "manifest.json").chmod(0o000)
        (base / "hidden" / "worker0.npz").chmod(0o000)
        assert as_a_user(*(str(base / n) for n in ("locked", "secret", "hidden", "ok"))) == [
            f"trace set {base / 'locked'}: not readable: permission denied (make it "
            "readable for this user, or name another set)",
            f"{base / 'secret' / 'manifest.json'}: not readable: permission denied",
            f"{base / 'hidden' / 'worker0.npz'}: not readable: permission denied",
            f"opened {base / 'ok'}"]
    finally:
        (base / "locked").chmod(0o755)
        shutil.rmtree(base)
