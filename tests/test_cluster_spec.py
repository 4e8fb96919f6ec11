"""``--cluster``'s text: a comma list of servers or a YAML file, refused in one line
when ssh could not take a server as given or the file is not of the documented shape
(``Cluster.parse``)."""

from __future__ import annotations

import re

import pytest

from qaina_bench.harness.running.cluster import Cluster
from qaina_bench.settings import ConfigError


@pytest.mark.parametrize("text, fragment", [
    ("servers: [localhost, n2]\npin: 5\n", "pin is a mapping of node names to servers"),
    ("servers: [localhost, n2]\npin: [a]\n", "pin is a mapping of node names to servers"),
    ("servers: [null, n2]\n", "server None is not a host name"),
    ("servers: [{a: 1}]\n", "server {'a': 1} is not a host name"),
    ("servers: [a]\nfoo: 1\n", "unknown key(s) foo"),
    ("servers: [a]\nuser: [x]\n", "user ['x'] is not a user name"),
    ("servers: [root@n2]\n", "'root@n2' is not a host name"),
    (b"\xff\xfe", "not a YAML file: not UTF-8 text"),
    ("servers: [a\n", "not a YAML file (line 2, column 1)"),
    ("servers: " + "[" * 3000 + "]" * 3000 + "\n", "nest"),
    ("servers: [a]\npin: {s1: " + "9" * 5000 + "}\n", "more digits than Python reads"),
    ("servers: [a]\n" + "# padding\n" * 120_000, "larger than 1 MB"),
])
def test_a_cluster_file_of_the_wrong_shape_is_one_line(tmp_path, text, fragment):
    spec = tmp_path / "cluster.yaml"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Cluster.parse(str(spec))


@pytest.mark.parametrize("text, fragment", [
    ("root@10.0.0.2:22", "'root@10.0.0.2:22' is not a host name"),
    ("localhost,n2 n3", "'n2 n3' is not a host name"),
    ("localhost,127.0.0.1", "localhost and 127.0.0.1 both name this machine"),
    ("n2,n3,n2", "a server is listed twice"),
])
def test_a_server_list_that_ssh_cannot_take_is_one_line(text, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Cluster.parse(text)


def test_a_cluster_path_that_is_a_directory_is_said_to_be_one(tmp_path):
    with pytest.raises(ConfigError, match="a directory, not a YAML file"):
        Cluster.parse(str(tmp_path))
    assert Cluster.parse("fe80::1,localhost,node-2.lab").names() == \
        ["fe80::1", "localhost", "node-2.lab"]


@pytest.mark.parametrize("answer, pid", [("817\r\n", 817), ("echo $$\r\n817\r\r\n", 817)])
def test_a_remote_shell_pid_is_read_past_an_echo_of_the_command(answer, pid):
    """Mininet took ``int()`` of the whole answer to ``echo $$``; a pty that was not raw
    yet sent the command back first (it failed a cluster run's build once)."""
    from types import SimpleNamespace
    from qaina_bench.harness.running.cluster import ClusterError, ClusterNode
    node = SimpleNamespace(waitOutput=lambda: answer, name="h2", server="qb-b", pid=None)
    ClusterNode.finishInit(node)
    assert node.pid == pid
    with pytest.raises(ClusterError, match="h2 on qb-b: no shell PID"):
        ClusterNode.finishInit(SimpleNamespace(waitOutput=lambda: "echo $$\r\n", name="h2",
                                               server="qb-b"))
