"""Mininet nodes whose shell cannot answer the run's teardown: ended (killed by hand,
or by the OOM killer), or alive but not answering (stopped by a signal, or on a cluster
server that stopped answering: the shell is then the local ssh to it). Mininet would
write each command to that shell and wait for its output for ever (deleting a link
asks both ends' shells). Their commands become no-ops; a link of such a node goes
when its other end is deleted (a veth pair goes whole), or with the node's namespace
once nothing holds it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from mininet.log import lg

from ..switches.targets import stopped

#: seconds a node's shell has to finish one teardown command (``ip link del``, ``tc``:
#: milliseconds on an idle machine, well under a second on a saturated one)
PATIENCE = 15.0


def _no_shell(*_args, **_kwargs) -> str:
    return ""


def _skip(node, why: str, said=None):
    node.cmd = _no_shell
    node.waiting = False
    line = f"{node.name}'s shell (pid {node.shell.pid}) {why}: its commands are skipped"
    lg.warning(f"*** {line}\n")
    if said is not None:
        said(line)


def _give_up(node, patience: float, said, silent: set):
    server = getattr(node, "server_key", None)
    if server is not None:  # the local ssh to it: the server stopped answering
        silent.add(server)
        state = f"{server} not answering"
    else:
        state = "stopped by a signal" if stopped(node.shell.pid) else "running"
    try:
        os.kill(node.shell.pid, signal.SIGKILL)
        node.shell.wait(5)  # reaped: Mininet's own stop sees it ended
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    _skip(node, f"did not finish `{node.lastCmd}` within {patience:g} s ({state}) "
                "and was killed", said)


def _bounded(node, patience: float, said, silent: set):
    """``node.cmd`` that waits at most ``patience`` seconds for the command's output;
    a shell that has not answered by then is killed and its commands skipped. (Mininet's
    own ``monitor(timeoutms)`` cannot bound it: its poll also reports the terminal
    writable, and then it blocks in the read.)"""
    def cmd(*args, **kwargs) -> str:
        server = getattr(node, "server_key", None)
        if server in silent:
            _skip(node, f"is on {server}, which stopped answering", said)
            return ""
        node.sendCmd(*args, **kwargs)
        readable = select.poll()
        readable.register(node.stdout.fileno(), select.POLLIN)
        out, end = "", time.monotonic() + patience
        while node.waiting:
            left = end - time.monotonic()
            events = readable.poll(left * 1000) if left > 0 else []
            if not events:
                _give_up(node, patience, said, silent)
            elif not events[0][1] & select.POLLIN:  # hung up: the shell ended meanwhile
                _skip(node, f"ended during the teardown (at `{node.lastCmd}`)", said)
            else:
                out += node.monitor()
        return out
    return cmd


def bound_shell_commands(net, said=None, patience: float = PATIENCE) -> list[str]:
    """Before ``net`` stops: make the commands of its nodes whose shell has ended
    no-ops, and give every other node's commands ``patience`` seconds each; returns the
    names of the nodes whose shell had ended. A node on a cluster server has the local
    ssh to it as its shell: once one of a server's shells is given up on, the commands
    of its other nodes are skipped too. ``said(line)``: a shell given up on during the
    teardown (ended meanwhile, or killed for not answering)."""
    ended, silent = [], set()  # the servers whose nodes' shells stopped answering
    for node in net.values():
        shell = getattr(node, "shell", None)
        if shell is None:
            continue
        if shell.poll() is not None:
            _skip(node, f"ended before the teardown (status {shell.returncode})")
            ended.append(node.name)
        else:
            node.cmd = _bounded(node, patience, said, silent)
    return ended
