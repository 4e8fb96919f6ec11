"""Mininet nodes whose shell has ended before the run's teardown (killed by hand, or
by the OOM killer): Mininet would write each command to that shell and wait for its
output forever (deleting a link asks both ends' shells). Their commands become no-ops;
a link of such a node goes when its other end is deleted (a veth pair goes whole),
or with the node's namespace once nothing holds it."""

from __future__ import annotations

from mininet.log import lg


def _no_shell(*_args, **_kwargs) -> str:
    return ""


def silence_ended_shells(net) -> list[str]:
    """Make the commands of ``net``'s nodes on this machine whose shell has ended
    no-ops; returns their names."""
    ended = []
    for node in net.values():
        shell = getattr(node, "shell", None)
        if getattr(node, "server_key", None) is None and shell is not None \
                and shell.poll() is not None:
            node.cmd = _no_shell
            node.waiting = False
            ended.append(node.name)
            lg.warning(f"*** {node.name}'s shell (pid {shell.pid}) ended before the "
                       f"teardown (status {shell.returncode}): its commands are skipped\n")
    return ended
