"""What a testbed (``network.Testbed``) does on the other servers of a cluster.

``ClusterParts`` is the part of ``Testbed`` for ``--cluster``: the network built by
Mininet's cluster edition (``harness/running/cluster.py``), link loss on the other
servers, and the PIDs there of the processes started through ``remote launch``.
"""

from __future__ import annotations

from functools import partial


class ClusterParts:
    """Mixed into ``Testbed``, whose attributes (``cluster``, ``record``, ``net``, ...)
    it uses."""

    def _loss_servers(self) -> list:
        """The other servers of the cluster: each gets the loss table for its ends."""
        return list(self.cluster.remote) if self.cluster is not None else []

    def _remove_remote_loss(self):
        from .cluster import remote_resources
        entry = {"nft_tables": [{"family": "netdev", "name": self.loss_table}]}
        for server in self._loss_servers():
            remote_resources(server, "remove", entry)

    def _cluster_net(self):
        """Mininet's cluster edition over ``self.cluster``'s servers, placed by
        ``LeafPlacer`` (each leaf with its hosts, the spines on the last server)."""
        from mininet.examples.cluster import MininetCluster
        from .cluster import ClusterHost, LeafPlacer, RemoteTCLink
        from .clusterswitch import ClusterSwitch
        user = self.cluster.servers[0].user
        switch = partial(ClusterSwitch, target=self.target, log_dir=self.log_dir,
                         record=self.record, log_packets=self.log_packets, words=self.words,
                         user=user)
        placer = type("Placer", (LeafPlacer,), {"cluster": self.cluster})
        host = partial(ClusterHost, user=user)
        if self.host_cpu:  # each host limited on its server
            from .clustercpu import ClusterLimitedHost
            host = partial(ClusterLimitedHost, user=user, cores=self.host_cpu,
                           record=self.record)
        return MininetCluster(topo=self.topo, switch=switch, host=host,
                              link=RemoteTCLink, controller=None, build=False,
                              autoSetMacs=False, servers=self.cluster.names(), user=user,
                              placement=placer, precheck=False)

    def started(self):
        """Wait for the remote processes ``start_process`` began and record each by
        its PID on its server; raises the first failure once every one is known."""
        from .cluster import each_then_first_failure
        starting, self._starting = self._starting, []
        each_then_first_failure(partial(self._started, *entry) for entry in starting)

    def _started(self, node, popen, what: str):
        """Read one remote process's PID there and record it."""
        pid, started = node.launch_end(popen, what)
        self.remote_procs.append((node, pid))
        self.remote_pids[popen.pid] = (node.server_key, pid)
        self.record.add_remote_process(node.server_key, node.user, pid, started, what)
