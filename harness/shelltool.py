"""p4runtime-shell, attached to a switch of a live run (``qaina-bench shell``).

p4runtime-shell pins protobuf < 3.21 (the pure-Python runtime) and p4runtime 1.4.1,
which cannot share an environment with the harness's protobuf 6; it lives in a venv
of its own, ``.venv-shell/`` in the project folder (``make shell-tool``), or where
``$QAINA_SHELL_VENV`` says.

The shell comes in as a backup client: its election id is below the harness's
(``control.PRIMARY_ELECTION_ID``), so the harness stays primary and the shell reads
(tables, counters, registers where the target serves them). It takes the P4Info
from the switch (GetForwardingPipelineConfig): p4runtime-shell's ``--config`` would
push a pipeline, which starts the switch afresh, and is never given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .config import RUN_ID
from .switches.control import PRIMARY_ELECTION_ID
from .running.record import RunRecord, live_records, record_dir

PROJECT_DIR = Path(__file__).resolve().parent.parent


class ShellError(RuntimeError):
    """The shell cannot be started; the message says what to do."""


def shell_venv() -> Path:
    """The venv that holds p4runtime-shell."""
    return Path(os.environ.get("QAINA_SHELL_VENV", PROJECT_DIR / ".venv-shell"))


def shell_python() -> Path:
    """The tool venv's python, if p4runtime-shell is installed there."""
    venv = shell_venv()
    python = venv / "bin" / "python"
    try:
        there = python.exists() and bool(list(venv.glob("lib/python*/site-packages/"
                                                        "p4runtime_sh")))
    except OSError as exc:  # a venv this user may not look into (root's, say)
        raise ShellError(f"p4runtime-shell's venv {venv} cannot be read: {exc.strerror}") \
            from None
    if not there:
        raise ShellError(f"p4runtime-shell is not installed in {venv}: run `make shell-tool` "
                         "in the project folder")
    return python


def backup_election_id() -> tuple[int, int]:
    """An election id below the harness's ``PRIMARY_ELECTION_ID`` (1, 0), of this
    process alone: two clients of a switch may not share one."""
    return (PRIMARY_ELECTION_ID[0] - 1, os.getpid())


@dataclass(frozen=True)
class SwitchAddress:
    """Where one switch of a live run answers P4Runtime."""

    run_id: str
    name: str
    grpc_addr: str
    device_id: int
    target: str


def _live_run(run_id: str | None, directory: Path | None) -> RunRecord:
    live = live_records(directory)
    if run_id is None:
        if not live:
            raise ShellError("no run is up: start one with `qaina-bench up --hold`")
        if len(live) > 1:
            raise ShellError(f"runs {', '.join(r.run_id for r in live)} are up: choose one "
                             "with --run")
        return live[0]
    if not RUN_ID.fullmatch(run_id):
        raise ShellError(f"--run {run_id!r}: a run id (letters, digits, '.', '_', '-'), "
                         "as `up` printed it")
    for rec in live:
        if rec.run_id == run_id:
            return rec
    if (Path(directory or record_dir()) / f"{run_id}.json").exists():
        raise ShellError(f"run {run_id} is no longer up (its process is gone): "
                         "`qaina-bench clean` removes what it left")
    raise ShellError(f"no run {run_id} is up"
                     + (f" (up: {', '.join(r.run_id for r in live)})" if live else ""))


def find_switch(name: str, run_id: str | None = None,
                directory: Path | None = None) -> SwitchAddress:
    """The P4Runtime address of switch ``name`` of a live run (the only one up if
    ``run_id`` is None), from the run's record."""
    rec = _live_run(run_id, directory)
    switches = rec.data.get("switches") or {}
    if name not in switches:
        known = ", ".join(switches) or "none recorded (still starting?)"
        raise ShellError(f"run {rec.run_id} has no switch {name!r}; its switches: {known}")
    sw = switches[name]
    return SwitchAddress(rec.run_id, name, sw["grpc_addr"], sw["device_id"], sw["target"])


def shell_command(python: Path, switch: SwitchAddress,
                  election_id: tuple[int, int]) -> list[str]:
    """The command line of p4runtime-shell on ``switch`` (``-I``: the current folder,
    a checkout with a ``p4/`` folder maybe, stays off its import path)."""
    return [str(python), "-I", "-m", "p4runtime_sh", "--grpc-addr", switch.grpc_addr,
            "--device-id", str(switch.device_id),
            "--election-id", f"{election_id[0]},{election_id[1]}"]
