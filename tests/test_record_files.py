"""What ``clean``, ``shell`` and ``up`` make of hostile files in the run-record
directory: a pipe, a device or a huge file is named and left, never read without end;
a PID without its start time, or with one that is no time, is never the run's."""

import json
import os
import subprocess
import sys

import pytest

from qaina_bench.harness.running.record import (RunRecord, live_records, stale_records,
                                                unreadable_records)

DEAD = 2 ** 22 + 12399  # no such process


def cli(directory, *args, stdin: str | None = None, timeout: float = 60):
    """``qaina-bench ARGS`` with its records in ``directory`` (killed after ``timeout``
    seconds, which fails the test)."""
    env = dict(os.environ, QAINA_RECORD_DIR=str(directory))
    return subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", *args],
                          input=stdin, capture_output=True, text=True, env=env,
                          timeout=timeout)


def scan(directory, timeout: float = 30) -> str:
    """What ``up`` reads of the records: how many are live, how many stale, and why
    the others are unreadable (as ``clean`` says it, without their path); from another
    process, so that a read without end fails the test instead of hanging it."""
    code = ("import sys; from qaina_bench.harness.running.record import live_records, "
            "stale_records, unreadable_records as u; d = sys.argv[1]; "
            "print(len(live_records(d)), len(stale_records(d)), "
            "[w.replace(str(p), '').strip(' :') for p, w in u(d)])")
    res = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def sleeper():
    """A live process that no run started."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def write_record(directory, run_id: str, **fields):
    data = {"run_id": run_id, "owner": DEAD, "owner_started": None, "processes": [],
            "interfaces": []} | fields
    path = directory / f"{run_id}.json"
    path.write_text(json.dumps(data))
    return path


def make_special(path, kind: str):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_pipe_or_device_among_the_records_is_named_and_left_unread(tmp_path, kind):
    make_special(tmp_path / "odd.json", kind)
    assert scan(tmp_path).startswith("0 0 ['not a regular file")
    res = cli(tmp_path, "clean")
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert f"{tmp_path / 'odd.json'}: no run record this can read (not a regular" in res.stdout
    res = cli(tmp_path, "shell", "s1")
    assert "Traceback" not in res.stdout + res.stderr and "no run is up" in res.stderr
    assert os.path.lexists(tmp_path / "odd.json")


def test_a_record_file_larger_than_any_run_writes_is_not_read(tmp_path):
    """A record is kilobytes: one of 17 MB (valid JSON, padded) is named, not loaded."""
    path = write_record(tmp_path, "huge")
    with open(path, "a") as f:
        f.write(" " * (17 << 20))
    assert stale_records(tmp_path) == [] and live_records(tmp_path) == []
    (found, why), = unreadable_records(tmp_path)
    assert found == path and "larger than 16 MB" in why


def test_a_record_nested_past_the_recursion_limit_is_named_not_a_crash(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 200000)
    (found, why), = unreadable_records(tmp_path)
    assert found.name == "deep.json" and why
    res = cli(tmp_path, "clean")
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert "deep.json: no run record this can read" in res.stdout


def test_a_process_recorded_without_its_start_time_is_never_signalled(tmp_path, sleeper):
    """README: a PID counts as the run's only while it has the start time recorded with
    it; ``clean`` says why it left it."""
    write_record(tmp_path, "fake1", processes=[
        {"pid": sleeper.pid, "what": "agent j1w0", "started": None}])
    res = cli(tmp_path, "clean")
    assert sleeper.poll() is None, res.stdout
    assert (f"fake1: not stopped agent j1w0 (pid {sleeper.pid}): no start time recorded"
            in res.stdout), res.stdout
    assert not (tmp_path / "fake1.json").exists()


@pytest.mark.parametrize("started", ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 400],
                         ids=["nan", "inf", "-inf", "1e400", "int-beyond-float"])
def test_a_start_time_that_is_no_time_matches_no_process(tmp_path, sleeper, started):
    path = tmp_path / "nan.json"
    path.write_text('{"run_id": "nan", "owner": %d, "owner_started": null, "processes": '
                    '[{"pid": %d, "what": "agent", "started": %s}], "interfaces": []}'
                    % (DEAD, sleeper.pid, started))
    res = cli(tmp_path, "clean")
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert sleeper.poll() is None, res.stdout


def test_the_run_s_own_remove_and_leftovers_pass_over_a_pid_without_start_time(
        tmp_path, sleeper):
    """What a run records as None (its process had ended) is not a later holder of
    that PID: not stopped by the teardown, not reported as left over."""
    rec = RunRecord("own", directory=tmp_path)
    rec.data["processes"].append({"pid": sleeper.pid, "what": "gone", "started": None})
    assert rec.leftovers(wait=0) == []
    assert rec.remove_resources() == [
        f"not stopped gone (pid {sleeper.pid}): no start time recorded"]
    assert sleeper.poll() is None


def test_a_server_s_part_without_start_times_stops_nothing_there(sleeper):
    part = {"processes": [{"pid": sleeper.pid, "what": "agent", "started": None}]}
    for action in ("leftovers", "remove"):
        res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.running.remote",
                              action], input=json.dumps(part), capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert sleeper.poll() is None, (action, res.stdout)


@pytest.mark.parametrize("owner_started", ["null", "NaN", '"x"', "[]", "1e400"])
def test_an_owner_without_a_usable_start_time_is_not_a_live_run(tmp_path, sleeper,
                                                                 owner_started):
    """A live PID whose start time the record lacks is not the run's owner: the record
    does not hold off every ``up`` as a run still going (one whose start time is no
    time is no record of ours), and nothing crashes."""
    (tmp_path / "own.json").write_text(
        '{"run_id": "own", "owner": %d, "owner_started": %s, "processes": [], '
        '"interfaces": []}' % (sleeper.pid, owner_started))
    assert scan(tmp_path).startswith("0 1 []" if owner_started == "null"
                                     else "0 0 ['not a run record (owner_started is no")
    res = cli(tmp_path, "clean")
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert sleeper.poll() is None


@pytest.mark.parametrize("pid", [-1, 0, True, 2 ** 70])
def test_a_pid_that_is_no_process_id_is_no_crash(tmp_path, pid):
    write_record(tmp_path, "badpid", owner=pid, processes=[
        {"pid": pid, "what": "agent", "started": 1.0}])
    res = cli(tmp_path, "clean")
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert scan(tmp_path).startswith("0 ")
