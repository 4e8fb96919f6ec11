"""``up --train-script SCRIPT``: the user's PyTorch DDP script instead of the agents.

The script runs once per worker host of every job, in that host's namespace, with the
process group's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``: a rendezvous at the job's worker 0, inside the emulated network)
and ``QAINA_AGENT_CONFIG``: the path of the agent configuration the harness would give
that worker's agent. The script's hook (``qaina_bench.torch``) reads it, aggregates
the gradient buckets as that agent would and writes the agent's records, so the run's
monitoring, summary and teardown are those of any run. On a cluster, a host of
another server runs the copy kept in the result set, sent there with the run's
directory (``harness/running/rundir.py``).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import sys
from pathlib import Path

from ..settings import ConfigError

#: the environment variable that names a worker's agent configuration (JSON)
CONFIG_ENV = "QAINA_AGENT_CONFIG"
#: the rendezvous port of torch.distributed's TCP store on each job's worker 0
MASTER_PORT = 29500


def check_train_script(cfg) -> None:
    """ConfigError for a --train-script that cannot run."""
    tr = cfg.training
    script = Path(tr.train_script)
    if not script.is_file():
        what = "a directory, not a Python file" if script.is_dir() else "no such file"
        raise ConfigError(f"--train-script {tr.train_script}: {what}")
    if tr.train:
        raise ConfigError("--train-script and --train both say where gradients come from: "
                          "choose one")
    if cfg.compression.compress != "none":
        raise ConfigError(f"--train-script sends the DDP buckets as they are: --compress "
                          f"{cfg.compression.compress} is for the agents only")
    try:
        script_args(tr.train_args)
    except ValueError as exc:
        raise ConfigError(f"--train-args {tr.train_args!r}: {exc}") from None
    if importlib.util.find_spec("torch") is None:
        from ..hosts.models import TORCH_HINT
        raise ConfigError(f"--train-script needs PyTorch: {TORCH_HINT}")


def script_args(text: str) -> list[str]:
    """The script's arguments from ``--train-args`` (split like a POSIX shell)."""
    return shlex.split(text or "")


class ScriptLauncher:
    """What each worker of a run with ``--train-script`` starts: the script (a copy of
    it is kept in the result set, ``script/``), its arguments and its environment."""

    #: seconds for every worker's script to make its hook's state (PyTorch's imports
    #: take several seconds of CPU per process on a busy machine)
    START_WAIT = 120

    def __init__(self, script: str, args: str, result_dir: Path):
        self.source = Path(script).resolve()
        self.args = script_args(args)
        self.copy_dir = result_dir / "script"
        self.copy_dir.mkdir(parents=True, exist_ok=True)
        #: the copy, which the servers of a cluster run (it reaches them with the run's
        #: directory); this machine runs the script where it is, beside its own modules
        self.copy = self.copy_dir / self.source.name
        shutil.copy2(self.source, self.copy)

    def argv(self, remote: bool = False) -> list[str]:
        """The command line; ``remote``: on another server of a cluster (the copy)."""
        # unbuffered: the script's output reaches its log as it is printed
        return [sys.executable, "-u", str(self.copy if remote else self.source), *self.args]

    @staticmethod
    def env(base: dict, config_path: Path, rank: int, world: int, master: str,
            interface: str) -> dict:
        """``base`` plus the process group's variables (gloo on the host's ``interface``:
        the hosts share the machine's hostname, which resolves outside their network)
        and the agent configuration."""
        env = dict(base)
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1", MASTER_ADDR=master, MASTER_PORT=str(MASTER_PORT),
                   GLOO_SOCKET_IFNAME=interface)
        env[CONFIG_ENV] = str(config_path)
        return env

    @staticmethod
    def log_name(name: str) -> str:
        return f"script-{name}.log"
