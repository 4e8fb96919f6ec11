"""Jobs as the control plane installs them on their aggregating switch.

A job owns a contiguous range of the switch's shared slot pool (a static partition
sized by the control plane), one multicast group and one ``result_rewrite`` entry per
worker. A job of the shared allocation (``Job.shared``, ATP-style) places its chunks on
copies of one shared region instead, and sends what does not fit to its fallback host,
its ``upstream`` (``p4/README.md``, "Shared allocation"). ``program_job`` writes all of it over P4Runtime; ``program_aggregator`` makes a
switch answer for an aggregator address.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...hosts.lanes import LaneFormat
from ...p4.constants import MAX_JOBS, MAX_WORKERS, POOL_SLOTS
from ...p4.header import FALLBACK_WORKER


@dataclass(frozen=True)
class Worker:
    index: int
    ip: int  # IPv4 address as int
    mac: int  # 48-bit MAC as int
    port: int  # the aggregating switch's port towards this worker (both ways)
    host: str = ""  # the Mininet host it runs on


@dataclass(frozen=True)
class Upstream:
    """Two levels: where a lower aggregator sends its sum (``upstream_table``); the
    shared allocation: the job's fallback host, with ``worker`` ``FALLBACK_WORKER``."""
    port: int  # this switch's port towards the upper aggregator
    ip: int  # the upper aggregator's address
    mac: int
    worker: int  # this switch's worker index in the upper aggregator's job


@dataclass
class Job:
    """A job as one aggregating switch holds it: ``workers`` are what sends to it (the
    workers below it; at an upper aggregator of two levels, the lower aggregators);
    ``fmt`` is sized for all of the job's workers."""
    job_id: int
    index: int  # job_table's job_index: which counters the job's packets count in
    fmt: LaneFormat
    slot_base: int
    slot_count: int
    workers: list[Worker] = field(default_factory=list)
    upstream: Upstream | None = None  # two levels: this switch's sum goes up there
    #: the shared allocation: ``slot_base``/``slot_count`` are the shared region, and
    #: ``upstream`` is the job's fallback host
    shared: bool = False

    @property
    def mcast_grp(self) -> int:
        return self.index + 1

    def rid(self, worker: int) -> int:
        """PRE instance of the copy for ``worker`` (unique on the switch, never 0)."""
        return self.index * 64 + worker + 1


def partition_slots(slot_counts: list[int], pool: int = POOL_SLOTS) -> list[int]:
    """Slot bases of consecutive ranges of the given sizes; refuses to overfill the pool."""
    total = sum(slot_counts)
    if total > pool:
        raise ValueError(f"the jobs ask for {total} slots, the switch pool has {pool}")
    bases, base = [], 0
    for count in slot_counts:
        bases.append(base)
        base += count
    return bases


def aggregator_ip(device_id: int) -> str:
    """The address a switch aggregates for (one per switch, outside the hosts' subnet)."""
    return f"10.255.0.{device_id}"


def aggregator_mac(device_id: int) -> str:
    return f"02:00:00:00:ff:{device_id:02x}"


def ip_to_int(ip: str) -> int:
    a, b, c, d = (int(x) for x in ip.split("."))
    return a << 24 | b << 16 | c << 8 | d


def int_to_ip(value: int) -> str:
    return ".".join(str(value >> s & 0xFF) for s in (24, 16, 8, 0))


def mac_to_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def program_aggregator(conn, address: int):
    """``conn``'s switch aggregates for packets sent to ``address``."""
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": address},
                "MyIngress.accept_qaina")


def program_job(conn, job: Job):
    """Install ``job`` on its aggregating switch: job table, members (each bound to the
    port its packets arrive on), PRE, rewrites."""
    if job.index >= MAX_JOBS:
        raise ValueError(f"job index {job.index}: the switch holds {MAX_JOBS} jobs")
    if len(job.workers) > MAX_WORKERS:
        raise ValueError(f"job {job.job_id} has {len(job.workers)} workers; the switch "
                         f"aggregates at most {MAX_WORKERS} per job")
    if len(job.workers) > job.fmt.workers:
        raise ValueError(f"job {job.job_id} has {len(job.workers)} workers here, its "
                         f"format is sized for {job.fmt.workers}")
    if job.shared and (job.upstream is None or job.upstream.worker != FALLBACK_WORKER):
        raise ValueError(f"job {job.job_id} is shared: its upstream must be its fallback "
                         f"host, as worker {FALLBACK_WORKER}")
    conn.insert_many(job_entries(job))
    conn.set_multicast_group(job.mcast_grp, [(w.port, job.rid(w.index)) for w in job.workers])


def release_job(conn, job: Job, registers=None, free: bool = True):
    """Remove what ``program_job`` installed: the job's packets are dropped from then on,
    and its slots may be given to another job (whose first use of each starts afresh,
    ``agg_owner`` in qaina.p4). A shared job's copies are freed too (``free_copies``)
    unless ``free`` is false (the caller frees them): ``registers`` reads and writes
    the switch's registers (``conn`` by default, over P4Runtime;
    ``SwitchProcess.registers`` gives the one of each target)."""
    conn.delete_many(job_entries(job))
    conn.delete_multicast_group(job.mcast_grp)
    if job.shared and free:
        free_copies(registers or conn, job.job_id)


def free_copies(registers, job_id: int) -> int:
    """Free every slot copy whose use belongs to ``job_id`` (``agg_owner``):
    ``agg_count`` and ``agg_seen`` 0, so that a job that leaves mid-use cannot hold
    copies of the shared pool. Returns how many copies it freed."""
    owner = registers.read_register("MyIngress.agg_owner")
    held = {copy: 0 for copy, owner_id in owner.items() if owner_id == job_id}
    registers.write_registers("MyIngress.agg_count", held)
    registers.write_registers("MyIngress.agg_seen", held)
    return len(held)


def job_entries(job: Job) -> list[tuple]:
    """The job's table entries: ``(table, match, action, params)``."""
    fmt = job.fmt
    entries = [("MyIngress.job_table", {"hdr.qaina.job_id": job.job_id}, "MyIngress.set_job",
                {"job_index": job.index, "n_workers": len(job.workers),
                 "slot_base": job.slot_base,
                 "slot_count": job.slot_count, "mcast_grp": job.mcast_grp, "bits": fmt.bits,
                 "lane_width": fmt.width, "lanes": fmt.lanes, "shared": int(job.shared)})]
    for w in job.workers:
        entries.append(("MyIngress.member_table",
                        {"hdr.qaina.job_id": job.job_id, "hdr.ipv4.srcAddr": w.ip},
                        "MyIngress.set_member", {"worker": w.index, "port": w.port}))
        entries.append(("MyEgress.result_rewrite",
                        {"standard_metadata.egress_rid": job.rid(w.index)},
                        "MyEgress.to_worker", {"mac": w.mac, "ip": w.ip, "worker": w.index}))
    if job.upstream is not None:
        up = job.upstream
        entries.append(("MyIngress.upstream_table", {"hdr.qaina.job_id": job.job_id},
                        "MyIngress.set_upstream",
                        {"port": up.port, "addr": up.ip, "mac": up.mac, "worker": up.worker}))
    return entries


def guard_entries(port: int, sources) -> list[tuple]:
    """Entries that make ``port`` a guarded port admitting the addresses ``sources``
    only (``port_guard``, ``source_guard``); for ``SwitchConnection.insert_many``."""
    entries = [("MyIngress.port_guard", {"standard_metadata.ingress_port": port},
                "MyIngress.guard_port", {})]
    return entries + [source_entry(port, ip) for ip in sorted(set(sources))]


def source_entry(port: int, address: int) -> tuple:
    """The entry that admits packets from ``address`` on ``port``, but no results."""
    return ("MyIngress.source_guard",
            {"standard_metadata.ingress_port": port, "hdr.ipv4.srcAddr": address},
            "MyIngress.allow_source", {"results": 0})


def result_entry(port: int, aggregator: int) -> tuple:
    """The entry that admits results of the aggregator at address ``aggregator`` on
    ``port`` (a port with that aggregator upstream)."""
    return ("MyIngress.source_guard",
            {"standard_metadata.ingress_port": port, "hdr.ipv4.srcAddr": aggregator},
            "MyIngress.allow_source", {"results": 1})


def program_guard(conn, port: int, sources, results_from=()):
    """``conn``'s switch admits on ``port`` only packets from ``sources``, and results
    only from the aggregator addresses ``results_from``."""
    results_from = set(results_from)
    conn.insert_many(guard_entries(port, set(sources) - results_from)
                     + [result_entry(port, agg) for agg in sorted(results_from)])


def program_route(conn, prefix: int, prefix_len: int, port: int):
    conn.insert("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (prefix, prefix_len)},
                "MyIngress.forward", {"port": port})
