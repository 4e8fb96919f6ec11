"""The DDP communication hook (``qaina_bench.torch``) without Mininet: two worker
processes and a parameter server on loopback (real sockets, gloo for the process
group), the hooked gradients against plain DDP's and against what was sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import free_port
from qaina_bench.hosts.agent import AgentConfig
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.settings import Settings

torch = pytest.importorskip("torch", reason="PyTorch is not installed (make venv installs "
                            "its CPU build: TORCH=torch==2.13.0)")

HERE = Path(__file__).resolve().parent
WORKERS, STEPS = 2, 4


def run_workers(tmp_path: Path, bits: int, error_feedback: bool = False) -> list[Path]:
    """Both workers of a ps-mode job through ddp_check.py; their result files."""
    ps_port, master_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "qaina_bench.hosts.ps", str(ps_port),
                               str(WORKERS)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    go = tmp_path / "go"
    go.touch()
    run = Settings.flat(mode="ps", workers=WORKERS, bits=[bits], record_levels=True,
                        error_feedback=error_feedback)
    procs, outs = [], []
    for k in range(WORKERS):
        cfg = AgentConfig(run=run, job_id=1, worker=k, bits=bits, trace="",
                          aggregator="127.0.0.1", slot_base=0, slots=8,
                          output=str(tmp_path / f"j1w{k}.jsonl"), start_file=str(go),
                          start_timeout=30, ps_address="127.0.0.1", ps_port=ps_port)
        cfg.save(tmp_path / f"j1w{k}.json")
        env = dict(os.environ, RANK=str(k), WORLD_SIZE=str(WORKERS), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(master_port), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1", QAINA_AGENT_CONFIG=str(tmp_path / f"j1w{k}.json"))
        outs.append(tmp_path / f"out{k}.npz")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "ddp_check.py"),
                                       str(outs[-1]), str(STEPS)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            text = p.communicate(timeout=120)[0].decode(errors="replace")
            assert p.returncode == 0, text[-2000:]
        assert server.wait(timeout=30) == 0, server.stdout.read().decode()
    finally:
        for p in procs + [server]:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def scaled_sum(total, codes, fmt: LaneFormat, chunk: int) -> np.ndarray:
    """maxpow2's dequantized sum in float64: ``sum * 2**code / L`` per chunk."""
    scale = np.repeat(np.exp2(codes.astype(np.float64)), chunk)[:len(total)]
    return total * scale / fmt.levels


@pytest.mark.parametrize("bits", [8, 4])
def test_the_hook_returns_the_average_of_the_exact_sum_of_what_was_sent(tmp_path, bits):
    outs = run_workers(tmp_path, bits)
    got = [np.load(o) for o in outs]
    kept = [np.load(tmp_path / f"j1w{k}.npz") for k in range(WORKERS)]
    fmt = LaneFormat(bits, WORKERS)
    for i in range(STEPS):
        levels = np.stack([z[f"levels_{i}"].astype(np.int64) for z in kept])
        total = levels.sum(axis=0)
        expected = scaled_sum(total, kept[0][f"scale_{i}"], fmt, 32 * fmt.lanes)
        for k in range(WORKERS):
            assert np.array_equal(kept[k][f"sums_{i}"], total), f"worker {k} step {i}"
            np.testing.assert_allclose(kept[k][f"aggregate_{i}"], expected, rtol=3e-7)
            # the bucket's future: the dequantized sum over the world size, as float32
            assert np.array_equal(got[k][f"hooked_{i}"],
                                  (kept[k][f"aggregate_{i}"] / WORKERS).astype(np.float32))
        # every worker's model got the same gradient
        assert np.array_equal(got[0][f"hook_grad_{i}"], got[1][f"hook_grad_{i}"])


def test_at_32_bits_the_hook_agrees_with_plain_ddp(tmp_path):
    outs = run_workers(tmp_path, 32)
    for o in outs:
        z = np.load(o)
        for i in range(STEPS):
            plain, hook = z[f"plain_grad_{i}"], z[f"hook_grad_{i}"]
            assert np.abs(plain).max() > 1e-3  # a real gradient
            np.testing.assert_allclose(hook, plain, rtol=0, atol=1e-6 * np.abs(plain).max())


def test_at_4_bits_with_error_feedback_it_stays_near_plain_ddp(tmp_path):
    outs = run_workers(tmp_path, 4, error_feedback=True)
    z = np.load(outs[0])
    for i in range(STEPS):
        plain, hook = z[f"plain_grad_{i}"], z[f"hook_grad_{i}"]
        assert not np.array_equal(hook, plain)  # it did go through 4-bit levels
        # 4 bits (7 levels a side): each worker's value is off by at most a level
        assert np.abs(hook - plain).max() <= 2 * np.abs(plain).max() * 2 / 7 + 1e-6


def test_the_records_are_the_agents_one_iteration_per_step(tmp_path):
    run_workers(tmp_path, 8)
    for k in range(WORKERS):
        records = [json.loads(line) for line in open(tmp_path / f"j1w{k}.jsonl")]
        kinds = [r["type"] for r in records]
        assert kinds == ["start"] + ["iteration"] * STEPS + ["done"]
        steps = [r for r in records if r["type"] == "iteration"]
        assert [r["iteration"] for r in steps] == list(range(STEPS))
        assert all(r["elements"] == 64 * 32 + 32 + 32 * 10 + 10 for r in steps)
        assert all(r["bytes_sent"] > 0 and r["completion_s"] > 0 for r in steps)


def test_without_the_harness_the_state_says_how_to_start_it(monkeypatch):
    from qaina_bench.torch import HookError, TestbedState
    monkeypatch.delenv("QAINA_AGENT_CONFIG", raising=False)
    with pytest.raises(HookError, match="qaina-bench up --train-script"):
        TestbedState.from_env()


def test_python_started_in_the_repository_still_imports_pytorch():
    root = HERE.parent
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.nn.Linear)"],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch.nn.modules.linear.Linear" in out.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--train-script", "no-such-script.py"], "--train-script no-such-script.py: no such file"),
    (["--train-script", __file__, "--train"], "--train-script and --train"),
    (["--train-script", __file__, "--compress", "gradiveq"], "--compress gradiveq is for"),
    (["--train-script", __file__, "--train-args", "'unclosed"], "--train-args"),
])
def test_a_train_script_that_cannot_run_gets_one_line(args, fragment):
    from click.testing import CliRunner

    from qaina_bench.harness.cli import main
    result = CliRunner().invoke(main, ["up", "--dry-run", *args])
    assert result.exit_code != 0
    assert fragment in result.output and "Traceback" not in result.output, result.output


def test_a_dry_run_keeps_the_script_and_its_arguments():
    from click.testing import CliRunner

    from qaina_bench.harness.cli import main
    result = CliRunner().invoke(main, ["up", "--dry-run", "--train-script", __file__,
                                       "--train-args", "--comm allreduce --steps 5"])
    assert result.exit_code == 0, result.output
    assert "train_script:" in result.output and "--comm allreduce --steps 5" in result.output
