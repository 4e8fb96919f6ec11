"""p4runtime-shell, in a venv of its own.

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
from pathlib import Path

from .control import PRIMARY_ELECTION_ID

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
    if not python.exists() or not list(venv.glob("lib/python*/site-packages/p4runtime_sh")):
        raise ShellError(f"p4runtime-shell is not installed in {venv}: run `make shell-tool` "
                         "in the project folder")
    return python


def backup_election_id() -> tuple[int, int]:
    """An election id below the harness's ``PRIMARY_ELECTION_ID`` (1, 0), of this
    process alone: two clients of a switch may not share one."""
    return (PRIMARY_ELECTION_ID[0] - 1, os.getpid())
