"""The run's directory on a server without a shared file system
(``harness/running/rundir.py``, ``follow.py``): followed over a real ``remote
follow`` session (the server here is this machine, so "ssh" is the command itself,
and the copy here is another directory), copied back with tar, removed there with
the parents the run made, and a copy that fails as one line."""

from __future__ import annotations

import time

from qaina_bench.harness.running.cluster import Server
from qaina_bench.harness.running.remote import rmtree
from qaina_bench.harness.running.rundir import RemoteDirectory, gather

HERE = Server("localhost")


def wait_for(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.02)


def test_files_sent_there_are_in_place_and_what_grows_there_comes_here(tmp_path):
    there, here = tmp_path / "there" / "results" / "run", tmp_path / "here" / "run"
    remote = RemoteDirectory(HERE, there, local=here)
    remote.open()
    try:
        assert remote.made == str(tmp_path / "there")  # the topmost directory it made
        remote.put("agents/j1w0.json", '{"job": 1}')
        assert (there / "agents" / "j1w0.json").read_text() == '{"job": 1}'  # before put returns
        (there / "logs").mkdir()
        with open(there / "logs" / "agent.log", "w") as log:
            log.write("first\n")
            log.flush()
            wait_for(lambda: (here / "logs" / "agent.log").is_file()
                     and (here / "logs" / "agent.log").read_text() == "first\n")
            log.write("second\n")
        wait_for(lambda: (here / "logs" / "agent.log").read_text() == "first\nsecond\n")
        (there / "stats.json").write_text("a longer first version")
        wait_for(lambda: (here / "stats.json").is_file())
        (there / "stats.json").write_text("short")  # replaced by a shorter one: sent whole
        wait_for(lambda: (here / "stats.json").read_text() == "short")
        assert not (here / "agents" / "j1w0.json").exists()  # what was sent is not echoed
    finally:
        remote.close()
    assert remote.popen.returncode == 0


def test_gather_copies_back_and_removes_the_copy_with_the_parents_made(tmp_path):
    there, here = tmp_path / "there" / "results" / "run", tmp_path / "here" / "run"
    (there / "logs").mkdir(parents=True)
    (there / "logs" / "sp1.log").write_text("switch\n")
    (there / "agents").mkdir()
    (there / "agents" / "j1w1.jsonl").write_text('{"type": "done"}\n')
    (tmp_path / "there" / "other").mkdir()  # not the run's: stays, and so does its parent
    assert gather(HERE, str(there), str(tmp_path / "there" / "results"), here) is None
    assert (here / "logs" / "sp1.log").read_text() == "switch\n"
    assert (here / "agents" / "j1w1.jsonl").read_text() == '{"type": "done"}\n'
    assert not (tmp_path / "there" / "results").exists()
    assert (tmp_path / "there" / "other").is_dir()


def test_a_copy_that_fails_is_one_line_and_keeps_the_rest(tmp_path):
    here = tmp_path / "here" / "run"
    (here / "logs").mkdir(parents=True)
    (here / "logs" / "mininet.log").write_text("kept\n")
    problem = gather(HERE, str(tmp_path / "gone"), str(tmp_path / "gone"), here)
    assert problem.startswith("localhost: its part of the run's directory was not copied back")
    assert "\n" not in problem and str(tmp_path / "gone") in problem
    assert (here / "logs" / "mininet.log").read_text() == "kept\n"


def test_rmtree_removes_only_below_the_directory_it_is_given(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert rmtree(str(tmp_path / "a" / "b"), str(tmp_path / "c")) == 2
    assert (tmp_path / "a" / "b").is_dir()
    for root in ("/", "//", "///", "/tmp/..", "/./"):  # the root, however it is spelt
        assert rmtree(root, root) == 2 and rmtree(root + "/tmp", root) == 2
    (tmp_path / "link").symlink_to(tmp_path / "a")  # a link out of the top is followed
    assert rmtree(str(tmp_path / "link" / "b"), str(tmp_path / "link")) == 0
    assert not (tmp_path / "a").exists()  # and the top, empty (as below)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert rmtree(str(tmp_path / "a" / "b"), str(tmp_path / "a")) == 0
    assert not (tmp_path / "a").exists()


def test_a_run_whose_server_copy_fails_keeps_one_line_per_server_and_the_rest(tmp_path):
    from qaina_bench.harness.running.record import RunRecord
    from qaina_bench.harness.running.rundir import RunFiles
    here = tmp_path / "here" / "run"
    record = RunRecord("gather-test", tmp_path / "records")
    files = RunFiles(None, here, record)
    ok = RemoteDirectory(HERE, tmp_path / "ok" / "run", record, local=here)
    lost = RemoteDirectory(HERE, tmp_path / "lost" / "run", record, local=here)
    for remote in (ok, lost):
        remote.open()
        files.remote.append(remote)
    (tmp_path / "ok" / "run" / "sp1.log").write_text("switch\n")
    (tmp_path / "lost" / "run").rename(tmp_path / "lost" / "moved")  # the copy will fail
    problems = files.gather()
    assert len(problems) == 1 and "\n" not in problems[0]
    assert str(tmp_path / "lost" / "run") in problems[0]
    assert (here / "sp1.log").read_text() == "switch\n"
    assert not (tmp_path / "ok").exists()
    # copied and removed: no longer listed; the one not copied stays listed for clean
    assert [d["path"] for d in record.remote_directories("localhost")] == [
        str(tmp_path / "lost" / "run")]


def test_a_trace_set_is_copied_there_read_from_there_and_never_copied_back(tmp_path):
    import filecmp
    import pytest
    from qaina_bench.hosts.traces import TraceSet, default_trace_dir
    from qaina_bench.harness.running.rundir import RunFiles
    trace = default_trace_dir() / "digits-mlp"
    there, here = tmp_path / "there" / "results" / "run", tmp_path / "here" / "run"
    files = RunFiles(None, here)
    remote = RemoteDirectory(HERE, there, local=here)
    remote.open()
    files.remote.append(remote)
    lines = []
    try:
        assert files.send_inputs(trace, {"node9"}) == {}  # no agent there: nothing sent
        copies = files.send_inputs(trace, {"localhost", None}, lines.append)
        copy = there / ".inputs" / "digits-mlp"
        assert copies == {"localhost": str(copy)}
        assert lines and "digits-mlp" in lines[0] and "copied to localhost" in lines[0]
        names = sorted(p.name for p in trace.iterdir())
        assert sorted(p.name for p in copy.iterdir()) == names
        assert filecmp.cmpfiles(trace, copy, names, shallow=False)[0] == names
        assert TraceSet.open(copy).workers == TraceSet.open(trace).workers
        (there / "logs").mkdir()
        (there / "logs" / "agent.log").write_text("read it\n")  # what the run writes comes
        wait_for(lambda: (here / "logs" / "agent.log").is_file())
        time.sleep(0.2)  # a few more scans of the follower
        assert not (here / ".inputs").exists()  # ... the copy does not
    finally:
        remote.close()
    assert gather(HERE, str(there), remote.made, here) is None
    assert (here / "logs" / "agent.log").read_text() == "read it\n"
    assert not (here / ".inputs").exists() and not (tmp_path / "there").exists()
    # a copy that cannot be made there is one line naming the server
    (tmp_path / "blocked").write_text("a file where the directory would go")
    files.directory = tmp_path / "blocked"
    files.remote = [RemoteDirectory(HERE, tmp_path / "blocked")]
    with pytest.raises(OSError) as err:
        files.send_inputs(trace, {"localhost"})
    assert str(err.value).startswith("localhost: copying ") and "\n" not in str(err.value)
