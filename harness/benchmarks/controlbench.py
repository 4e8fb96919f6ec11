"""Benchmark of the control plane (never a timed test): how long P4Runtime reads take
between the harness and an embedded switch.

An embedded switch on veth pairs runs a job of 4 workers over the whole slot pool;
every slot has been used by both copies, so the registers hold real sums. Then, N
times each:

* **every entity**: one Read of every table entry, multicast group, counter cell and
  register cell (the whole ``agg_sum`` included), as a client that dumps a switch does;
* **slot counters**: the Read the sampler makes every 10 ms during a run (the
  per-job counters of ``sampling.COUNTERS``, the job's cells only).

Run as root::

    qaina-bench bench control --repeat 10
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np

from ...hosts.lanes import LaneFormat
from ...p4 import program
from ...p4.constants import POOL_SLOTS
from ...p4.header import QAINA_WORDS
from ...p4.proto import PROTOBUF_VERSION, implementation, p4runtime_pb2
from .bench import AGG_IP, WORKERS, VethPorts, _frames, _free_port, recorded_workdir
from ..switches.control import SwitchConnection
from ..switches.jobs import Job, Worker, program_aggregator, program_job, program_route
from ..running.record import RunRecord
from ..running.sampling import COUNTERS
from ..switches.targets import make_target


def read_everything(conn: SwitchConnection) -> tuple[int, int]:
    """One Read of every entity the switch holds; (entities, response bytes)."""
    req = p4runtime_pb2.ReadRequest(device_id=conn.device_id)
    req.entities.add().table_entry.table_id = 0
    req.entities.add().packet_replication_engine_entry.multicast_group_entry.\
        multicast_group_id = 0
    req.entities.add().counter_entry.counter_id = 0
    req.entities.add().register_entry.register_id = 0
    entities = size = 0
    for resp in conn.stub.Read(req, timeout=300):
        entities += len(resp.entities)
        size += resp.ByteSize()
    return entities, size


class ControlLab:
    """An embedded switch on veth pairs with one job over the whole pool, its slots
    used twice (both copies) by every worker."""

    def __init__(self, workdir: Path, words: int = QAINA_WORDS):
        # recorded like a run: `clean` removes what a killed benchmark left
        self.record = RunRecord(f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}")
        self.veths = self.target = self.conn = None
        try:
            self.veths = VethPorts(WORKERS, self.record)
            self.target = make_target("embedded", "bench", {i + 1: sw for i, (sw, _) in
                                                             enumerate(self.veths.names)},
                                      _free_port(), 1, workdir / "control.log", words=words)
            self.target.start()
            self.record.add_process(self.target.pid, "benchmark switch")
            self.conn = SwitchConnection("bench", self.target.grpc_addr, 1,
                                         p4info=program.p4info(words))
            self.target.wait_ready(self.conn)
            self.conn.arbitrate()
            self.conn.set_pipeline(self.target.device_config())
            self.job = Job(1, 0, LaneFormat(4, WORKERS), 0, POOL_SLOTS,
                           [Worker(k, 0x0A000001 + k, 0x020000000001 + k, k + 1)
                            for k in range(WORKERS)])
            program_aggregator(self.conn, AGG_IP)
            program_job(self.conn, self.job)
            for w in self.job.workers:
                program_route(self.conn, w.ip, 32, w.port)
            self.applied = self._fill(words)
        except BaseException:  # Ctrl-C or SIGTERM too: nothing is left
            self.close()
            raise

    def _fill(self, words: int) -> int:
        """Send two uses of every slot; returns the contributions the switch applied."""
        frames = _frames(self.job, POOL_SLOTS, words)
        socks = []
        try:
            for _, host in self.veths.names:
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                s.bind((host, 0))
                socks.append(s)
            for k, (w, f) in enumerate(frames):
                socks[w].send(f)
                if k % 64 == 63:
                    time.sleep(0.002)  # well below the switch's rate: nothing is dropped
        finally:
            for s in socks:
                s.close()
        applied, deadline = -1, time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.conn.read_counter("MyIngress.agg_packets")[0][0]
            if now == applied or now == len(frames):
                return now
            applied = now
        return applied

    def close(self):
        if self.conn is not None:
            self.conn.close()
        if self.target is not None:
            self.target.stop()
        if self.veths is not None:
            self.veths.remove()
        self.record.close()


def _timed(fn, repeat: int) -> list[float]:
    fn()  # a first call warms the channel and the switch's code paths
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def control_table(repeat: int = 10, words: int = QAINA_WORDS) -> int:
    """Print the mean and range of both reads over ``repeat`` runs each."""
    with recorded_workdir() as tmp:
        lab = ControlLab(tmp, words)
        try:
            entities, size = read_everything(lab.conn)
            print(f"control plane: embedded switch, {words}-word qaina.p4, protobuf "
                  f"{PROTOBUF_VERSION} ({implementation()}) in client and switch; one job "
                  f"of {WORKERS} workers over {POOL_SLOTS} slots, {lab.applied} "
                  f"contributions applied; {repeat} reads each")
            print(f"{'read':<22} {'entities':>8} {'bytes':>10} {'mean ms':>9} "
                  f"{'range ms':>17}")
            indexes = [lab.job.index]
            rows = [("every entity", entities, size, lambda: read_everything(lab.conn)),
                    ("slot counters", len(COUNTERS) * len(indexes), None,
                     lambda: lab.conn.read_counter_cells(COUNTERS, indexes))]
            for name, count, nbytes, fn in rows:
                ms = 1e3 * np.array(_timed(fn, repeat))
                shown = f"{nbytes:>10,}" if nbytes is not None else f"{'':>10}"
                print(f"{name:<22} {count:>8,} {shown} {ms.mean():>9.1f} "
                      f"{ms.min():>8.1f}-{ms.max():<8.1f}", flush=True)
        finally:
            lab.close()
    return 0
