"""Pieces of a run that need no root: its default name, how it holds Ctrl-C and
SIGTERM around what must not be cut, and the routes the switches get
(``Testbed.next_hops`` on each topology's graph, with the ports Mininet gives its
links)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import datetime

import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running import network
from qaina_bench.harness.running.processes import deferred_signals, ignored_signals, nudged
from qaina_bench.harness.running.run import build_topology, new_run_id


# -- new_run_id -------------------------------------------------------------------------
def test_the_default_run_id_is_the_time_and_what_ran():
    before = datetime.now().replace(microsecond=0)
    run_id = new_run_id(RunConfig())
    stamp, rest = run_id[:15], run_id[16:]
    assert before <= datetime.strptime(stamp, "%Y%m%d-%H%M%S") <= datetime.now()
    assert rest == "leafspine-ina-j2w4b4-digits-mlp"


def test_every_setting_that_differs_from_the_default_is_in_the_name():
    cfg = RunConfig.flat(topo="star", jobs=1, workers=8, bits=[4, 32], pack=False,
                    payload_words=256, quantizer="qsgd", error_feedback=True, bw=1.5,
                    loss=1.0, host_cpu=0.5, target="bmv2")
    assert new_run_id(cfg)[16:] == ("star-ina-j1w8b4-32-unpacked-pw256-qsgd-ef-digits-mlp-"
                                    "bw1.5-loss1-cpu0.5-bmv2")
    cfg = RunConfig.flat(compress="gradiveq", delay="1ms")
    assert new_run_id(cfg)[16:] == "leafspine-ina-j2w4b4-gradiveq-digits-mlp-delay1ms"
    assert new_run_id(RunConfig.flat(mode="ring", train=True, model="cnn"))[16:] == \
        "leafspine-ring-j2w4b4-train-cnn"


def test_the_run_id_is_a_safe_name_of_at_most_100_characters():
    run_id = new_run_id(RunConfig.flat(topo="star", delay="1 ms/../x"))
    assert run_id.endswith("-star-ina-j2w4b4-digits-mlp-delay1_ms_.._x")
    run_id = new_run_id(RunConfig.flat(trace="t" * 200))
    assert len(run_id) == 100 and re.fullmatch(r"[A-Za-z0-9._-]+", run_id)


# -- Ctrl-C and SIGTERM -----------------------------------------------------------------
def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_a_deferred_ctrl_c_interrupts_when_the_block_is_done():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_signals() as held:
            ctrl_c()
            done.append("the rest of the block")
    assert done and held.caught == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_ctrl_c_in_a_block_that_fails_is_held_not_lost():
    deferred_signals.held_last = None
    with pytest.raises(ValueError):
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the block's own error goes on")
    assert deferred_signals.held_last == signal.SIGTERM  # Run.signalled sees it


def test_an_ignored_ctrl_c_lets_the_block_finish_and_is_noted():
    deferred_signals.held_last = None
    with ignored_signals() as held:
        ctrl_c()
        ctrl_c()
    assert held.caught == signal.SIGINT and deferred_signals.held_last == signal.SIGINT


class Stop(BaseException):
    pass


def _stop(signum, frame):
    raise Stop


def _in_read(tid: int, timeout: float = 10.0) -> None:
    """Until thread ``tid`` of this process waits in read() (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        call = open(f"/proc/self/task/{tid}/syscall").read().split()[:1]
        if call and call[0] in ("0", "63"):  # read on x86_64, aarch64
            return
        time.sleep(0.01)


def test_a_signal_another_thread_took_still_ends_a_blocked_read_when_nudged():
    """The CLI's case: the main thread waits in read() and the SIGTERM went to another
    thread (here forced: the main thread blocks it), so nothing interrupts the read."""
    other_ready, other_end = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (other_ready.set(), other_end.wait(60)))
    other.start()  # SIGTERM unblocked there: the kernel gives it that thread
    other_ready.wait(10)
    r, w = os.pipe()
    wrote = []
    late = threading.Timer(30, lambda: (wrote.append(1), os.write(w, b"x")))
    main = threading.get_native_id()
    kill = threading.Thread(target=lambda: (_in_read(main), os.kill(os.getpid(),
                                                                    signal.SIGTERM)))
    previous = signal.signal(signal.SIGTERM, _stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with nudged(signal.SIGTERM) as nudging:
            late.start()  # without the nudge the read returns only when this writes
            kill.start()  # once the read below waits
            with pytest.raises(Stop):
                os.read(r, 1)
            assert not wrote
            assert nudging.owed <= 0  # the handler ran: no more nudges
        assert signal.getsignal(signal.SIGTERM) is _stop
    finally:
        late.cancel()
        kill.join()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, previous)
        other_end.set()
        other.join()
        os.close(r)
        os.close(w)
    assert signal.getsignal(signal.SIGURG) == signal.SIG_DFL  # restored
    assert signal.set_wakeup_fd(-1) == -1


# -- routes -------------------------------------------------------------------------------
class Graph:
    """A topology as ``Testbed.next_hops`` reads a network: every node's neighbours
    with its own port towards each (the ports Mininet takes from ``Topo.port``), and
    the switches (``conns``)."""

    def __init__(self, topo):
        self.conns = {sw: None for sw in topo.switches()}
        self.adj = {n: [] for n in topo.nodes()}
        for a, b in topo.links():
            pa, pb = topo.port(a, b)
            self.adj[a].append((b, pa))
            self.adj[b].append((a, pb))

    def _neighbours(self):
        return {n: sorted(v, key=lambda x: x[1]) for n, v in self.adj.items()}

    def walk(self, hops: dict, start: str, target: str) -> int:
        """Links crossed from ``start`` following the switches' ports to ``target``."""
        node, steps = start, 0
        while node != target:
            assert node in self.conns, f"{start} -> {target} ends at host {node}"
            node = next(n for n, p in self.adj[node] if p == hops[node])
            steps += 1
            assert steps < 10, f"{start} -> {target} loops"
        return steps


@pytest.mark.parametrize("topo, target, distances", [
    ("star", "h3", {"s1": 1}),
    ("dumbbell", "h1", {"s1": 1, "s2": 2}),  # h1 on s1, h2 on s2, ...
    ("dumbbell", "h2", {"s1": 2, "s2": 1}),
    ("leafspine", "h1", {"lf1": 1, "sp1": 2, "sp2": 2, "lf2": 3}),  # h1 on lf1
    ("leafspine", "h6", {"lf2": 1, "sp1": 2, "sp2": 2, "lf1": 3}),  # h6 on lf2
    ("leafspine", "sp1", {"lf1": 1, "lf2": 1, "sp2": 2}),  # the aggregator
])
def test_every_switch_routes_on_a_shortest_path(topo, target, distances):
    graph = Graph(build_topology(RunConfig.flat(topo=topo, jobs=2, workers=4)))
    hops = network.Testbed.next_hops(graph, target)
    assert set(hops) == set(distances) and target not in hops
    assert {sw: graph.walk(hops, sw, target) for sw in hops} == distances


def test_a_leaf_sends_its_own_hosts_down_their_link():
    topo = build_topology(RunConfig.flat(topo="leafspine", jobs=1, workers=4, spines=3, leaves=2))
    graph = Graph(topo)
    for h in ("h1", "h2", "h3", "h4"):
        leaf = "lf1" if h in ("h1", "h3") else "lf2"
        assert network.Testbed.next_hops(graph, h)[leaf] == topo.port(leaf, h)[0]
