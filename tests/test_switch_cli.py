"""The embedded switch's command line: what it refuses, in one line, before it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

SWITCH = [sys.executable, "-m", "qaina_bench.p4.embedded"]


@pytest.mark.parametrize("args, fragment", [
    (["-i", "x@lo"], "'x@lo': expected PORT@IFNAME"),
    (["-i", "600@lo"], "port numbers are 0..510"),
    (["-i", "1@lo", "-i", "1@lo"], "a port number is given twice"),
    (["--device-id", "-1"], "a device id is a whole number 0..2**64-1"),
    (["--device-id", str(2 ** 64)], "a device id is a whole number"),
    (["--grpc-addr", "127.0.0.1:99999"], "expected HOST:PORT with a port 0..65535"),
    (["--grpc-addr", "nonsense"], "expected HOST:PORT"),
    (["--cpu", "99"], "--cpu 99: not a CPU this process may run on"),
    (["--stats", "/nonexistent/x.json"], "its directory /nonexistent does not exist"),
    (["--log", "/nonexistent/x.log"], "its directory /nonexistent does not exist"),
    (["--coalesce-us", "-1"], "a whole number of microseconds 0..100000"),
    (["--coalesce-us", "200000"], "a whole number of microseconds 0..100000"),
    (["-i", "1@lo", "-i", "2@lo"], "an interface is given as two ports"),
    # the kernel takes "lo:x" for lo (an address label): lo twice, under two names
    (["-i", "1@lo", "-i", "2@lo:x"], "'lo:x' is not an interface name"),
    (["-i", "1@a/b"], "'a/b' is not an interface name"),
    (["-i", "1@a b"], "'a b' is not an interface name"),
    (["--log", "/tmp"], "'/tmp': a directory, not a file"),
    (["--stats", "/tmp"], "'/tmp': a directory, not a file"),
    (["--stats", "/dev/null"], "'/dev/null' exists and is not a regular file"),
    (["--device-id", "\u0661\u0662"], "a device id is a whole number"),
    (["--grpc-addr", "127.0.0.1:\u0665\u0665\u0665\u0665"], "expected HOST:PORT"),
    (["-i", "\u0661@lo"], "expected PORT@IFNAME"),
])
def test_bad_options_are_one_line_and_exit_2(args, fragment):
    res = subprocess.run(SWITCH + args, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert fragment in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("python -m qaina_bench.p4.embedded")


def test_version_names_the_package_and_the_p4runtime_api_it_serves():
    """Like `simple_switch_grpc --version`: one line, exit 0, without starting."""
    from importlib.metadata import version
    from qaina_bench.p4.embedded.runtime import API_VERSION
    res = subprocess.run(SWITCH + ["--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == (
        f"qaina embedded switch, qaina-bench {version('qaina-bench')}, P4Runtime API "
        f"{API_VERSION}\n")


def test_stats_never_replace_a_link(tmp_path):
    """The switch replaces its --stats file when it stops: a link there (to a file, or
    to a device as root) would be replaced, not written; it is refused at the start."""
    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "stats.json"
    link.symlink_to(target)
    res = subprocess.run(SWITCH + ["--stats", str(link)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "exists and is not a regular file" in res.stderr
    assert link.is_symlink() and target.read_text() == "keep"


@pytest.mark.root
def test_a_missing_interface_is_one_line():
    res = subprocess.run(SWITCH + ["-i", "1@qb-nosuchif", "--grpc-addr", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == \
        "qaina switch: port 1: interface 'qb-nosuchif': No such device"


def test_an_address_it_cannot_listen_on_is_one_line_and_in_its_log(tmp_path):
    """Taken (a listener is there), not of this machine, or not resolving: standard
    error holds exactly the switch's line (no gRPC core message, no log line
    repeating it); with --log the log has it too."""
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for address, why in [(f"127.0.0.1:{port}", "the address is taken (another switch "
                              "may still run there)"),
                             ("192.0.2.1:9559", "not an address of this machine"),
                             ("qb-nosuchhost.invalid:9559", "the host does not resolve")]:
            res = subprocess.run(SWITCH + ["--grpc-addr", address], capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 2
            assert res.stderr.startswith(f"qaina switch: cannot listen for P4Runtime on "
                                         f"{address}: {why}"), res.stderr
            assert len(res.stderr.splitlines()) == 1, res.stderr
        log = tmp_path / "s.log"
        res = subprocess.run(SWITCH + ["--grpc-addr", f"127.0.0.1:{port}", "--log", str(log)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
        assert "ERROR cannot listen for P4Runtime" in log.read_text()


def test_port_0_listens_where_the_kernel_chose_and_the_log_says_where(tmp_path):
    import time
    log = tmp_path / "s.log"
    proc = subprocess.Popen(SWITCH + ["--grpc-addr", "127.0.0.1:0", "--log", str(log)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "P4Runtime on" not in (
                log.read_text() if log.exists() else ""):
            time.sleep(0.1)
        line = next(x for x in log.read_text().splitlines() if "P4Runtime on" in x)
        port = int(line.split("P4Runtime on 127.0.0.1:")[1].split(",")[0])
        assert port > 0
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
