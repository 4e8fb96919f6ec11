"""The command line at its edges: Ctrl-C while the installed command loads, input
that YAML reads other than it looks, and names of results that exist or are files."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from test_cli import run_cli


def test_ctrl_c_while_the_command_loads_ends_it_in_one_line():
    """The installed command interrupted while its imports run (numpy's library
    mapped, the rest still to come): one line and status 130, or, on a machine that
    finished first, the command's own end; never a traceback."""
    import time
    from pathlib import Path
    command = Path(sys.executable).with_name("qaina-bench")
    if not command.exists():
        pytest.skip(f"{command} is not installed (pip install -e .)")

    def loading(pid: int) -> bool:
        try:
            return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return True  # it ended
    proc = subprocess.Popen([str(command), "up", "--dry-run"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not loading(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert b"Traceback" not in out and b"KeyboardInterrupt" not in out, out.decode()
    assert proc.returncode in (130, 0), (proc.returncode, out.decode()[-300:])
    if proc.returncode == 130:
        assert out.decode().strip().endswith("interrupted"), out.decode()[-300:]


def test_a_number_yaml_reads_as_text_is_refused_with_how_to_write_it(tmp_path):
    """YAML 1.1 reads 1e3 (no dot) as text: refused, saying how to write the number
    (reading it as a number would change what saved configs and specs say)."""
    saved = tmp_path / "config.yaml"
    saved.write_text("output:\n  timeout: 1e3\n")
    code, out = run_cli("run", str(saved), "--dry-run")
    assert code != 0 and "timeout is '1e3', which is not a finite number (YAML reads 1e3 " \
        "as text: without a dot, or quoted; write 1000.0)" in out, out
    for quoted in ('"2"', "２"):  # a whole number quoted, or in full-width digits
        saved.write_text(f"workload:\n  jobs: {quoted}\n")
        code, out = run_cli("run", str(saved), "--dry-run")
        assert code != 0 and "(text, not a number: write 2, unquoted ASCII digits)" in out, out


def test_results_list_of_a_file_says_it_is_not_a_directory(tmp_path):
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path / "nope"))
    assert code != 0 and "no such directory" in out, out
    (tmp_path / "afile").write_text("")
    code, out = run_cli("results", "list", "--results-dir", str(tmp_path / "afile"))
    assert code != 0 and out.strip().endswith("afile is not a directory"), out


def test_a_dry_run_refuses_a_run_id_whose_results_exist_as_up_does(tmp_path):
    (tmp_path / "taken").mkdir()
    code, out = run_cli("up", "--dry-run", "--results-dir", str(tmp_path), "--run-id", "taken")
    assert code != 0 and "taken exists; choose another --run-id" in out, out
    code, out = run_cli("up", "--dry-run", "--results-dir", str(tmp_path), "--run-id", "free")
    assert code == 0, out
