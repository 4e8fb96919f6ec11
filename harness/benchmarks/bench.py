"""Benchmarks that print figures (never timed tests).

``switch``: aggregation packets per second through one switch process (embedded or
BMv2) on one core. Four worker ports on veth pairs; a sender on the other core
replays precomputed contributions of a 4-worker job (every slot of a window used
with alternating copies, as agents do) at a fixed offered rate, in bursts of 32 per
worker; the switch's own P4Runtime counters say how many it aggregated. Both
targets get the same frames and the same pacing. After the sweep it offers twice
the peak (overload). The sender reads no results and never retransmits: a use the
switch drops is lost, and the sender's next use of that slot then looks to the
switch like retransmissions of the use before (which an overloaded embedded switch
sheds too). Run as root::

    python -m qaina_bench.harness.benchmarks.bench switch --target embedded --target bmv2

``testbed`` (``testbedbench.py``): whole runs (transport, repeatability, elements/s,
in-network / ring, the CPU cost table).
``control`` (``controlbench.py``): P4Runtime reads between the harness and a switch.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ...hosts.lanes import LaneFormat
from ...p4 import program
from ...p4.constants import Drop
from ...p4.embedded.ports import Port
from ...p4.header import QAINA_WORDS
from ..switches.control import SwitchConnection
from ..switches.jobs import (Job, Worker, aggregator_ip, aggregator_mac, ip_to_int, program_aggregator,
                   program_guard, program_job, program_route)
from ..running.record import RunRecord
from ..switches.targets import make_target
from .testbedbench import (COST_MODES, COST_WORKERS, coalescing_table, sampling_table,
                           comparison_table, cost_table, headline_table, ratio_table,
                           repeat_table, transport_table, write_csv)

AGG_IP = ip_to_int(aggregator_ip(1))
AGG_MAC = bytes.fromhex(aggregator_mac(1).replace(":", ""))
WORKERS = 4
BENCH_SLOTS = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frames(job: Job, slots: int, words: int = QAINA_WORDS) -> list[tuple[int, bytes]]:
    """(worker, frame) for two uses of every slot, in arrival order."""
    from ...p4.header import IP_CSUM, QAINA_STRUCT, QAINA_UDP_PORT, ipv4_checksum, wire
    lengths = wire(words)
    rng = np.random.default_rng(0)
    out = []
    for use in range(2):
        for slot in range(slots):
            for w in job.workers:
                values = job.fmt.pack(rng.integers(-job.fmt.levels, job.fmt.levels + 1,
                                                   words * job.fmt.lanes))
                f = bytearray(AGG_MAC + w.mac.to_bytes(6, "big") + b"\x08\x00")
                f += struct.pack("!BBHHHBBH", 0x45, 0, lengths.ipv4_len, 0, 0, 64, 17, 0)
                f += w.ip.to_bytes(4, "big") + AGG_IP.to_bytes(4, "big")
                f += struct.pack("!HHHH", QAINA_UDP_PORT, QAINA_UDP_PORT, lengths.udp_len, 0)
                f += QAINA_STRUCT.pack(job.job_id, w.index, 0, slot, use, 0, use * slots + slot)
                f += values.astype(">u4").tobytes()
                struct.pack_into("!H", f, IP_CSUM, ipv4_checksum(f))
                out.append((w.index, bytes(f)))
    return out


class VethPorts:
    """Veth pairs for the benchmark; removes exactly the ones it made (each listed in
    ``record`` before it is made, so that `clean` removes it after a kill -9)."""

    def __init__(self, n: int, record: RunRecord):
        self.prefix = f"qb{os.getpid() % 10000}x"
        self.names = []
        try:
            for i in range(1, n + 1):
                sw, host = f"{self.prefix}{i}s", f"{self.prefix}{i}h"
                record.add_interface(sw)
                record.add_interface(host)
                record.save()
                self.names.append((sw, host))  # before it exists: an interrupt removes it
                subprocess.run(["ip", "link", "add", sw, "type", "veth", "peer", "name",
                                host], check=True)
                for ifname in (sw, host):
                    subprocess.run(["sysctl", "-qw",
                                    f"net.ipv6.conf.{ifname}.disable_ipv6=1"],
                                   capture_output=True)
                    subprocess.run(["ip", "link", "set", ifname, "up"], check=True)
        except BaseException:
            self.remove()
            raise

    def remove(self):
        for sw, _ in self.names:
            subprocess.run(["ip", "link", "del", sw], capture_output=True)


class SwitchCpu:
    """A cgroup (v1 ``cpu`` controller) that gives the benchmark's switch ``share`` of
    one core by CFS bandwidth: at most 1 ms of CPU time per period of ``1 / share``
    ms, so that it is never stopped longer than that. A switch slowed so is what
    lets a sender that cannot outrun a whole core offer it twice its peak. Listed in
    ``record`` before it is made, removed by ``remove``."""

    ROOT = Path("/sys/fs/cgroup/cpu")
    QUOTA_US = 1000  # the least quota CFS takes

    def __init__(self, share: float, record: RunRecord):
        self.path = self.ROOT / f"qaina-bench-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.period_us = round(self.QUOTA_US / share)
        record.add_cgroups([str(self.path)])
        record.save()
        self.path.mkdir()
        try:
            (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.QUOTA_US))
            got = int((self.path / "cpu.cfs_quota_us").read_text())
            if got != self.QUOTA_US:
                raise OSError(f"{self.path}: cpu.cfs_quota_us reads {got}, not "
                              f"{self.QUOTA_US}")
        except BaseException:
            self.remove()
            raise

    @staticmethod
    def problem() -> str | None:
        """Why a switch cannot be CPU-limited here, in one line; None when it can."""
        root = SwitchCpu.ROOT
        if not (root / "cpu.cfs_quota_us").exists():
            return (f"--switch-cpu needs the cgroup v1 cpu controller with CFS bandwidth "
                    f"({root}/cpu.cfs_quota_us is missing); run without --switch-cpu")
        if not os.access(root, os.W_OK):
            return f"--switch-cpu makes a cgroup in {root}, which is read-only here"
        return None

    def add(self, pid: int):
        """Put process ``pid``, every thread of it, into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled(self) -> int:
        """Periods in which the cgroup used up its quota and was stopped."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "nr_throttled":
                return int(value)
        return 0

    def remove(self) -> bool:
        """Remove the cgroup (once its processes are gone: tried for up to 3 s); False
        if it is still busy."""
        deadline = time.monotonic() + 3.0
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)


BURST = 128  # frames the sender offers at once (a window of 32 from each worker)


def _bursts(frames: list[tuple[int, bytes]], size: int) -> list[list[tuple[int, np.ndarray]]]:
    """``frames`` cut into bursts of ``size``, each as (worker, its frames as rows)."""
    out = []
    for b in range(0, len(frames) - size + 1, size):
        burst = frames[b:b + size]
        out.append([(w, np.array([np.frombuffer(f, np.uint8) for k, f in burst if k == w]))
                    for w in sorted({k for k, _ in burst})])
    return out


#: offered contributions/s of the default sweep, per target (then twice its peak)
DEFAULT_RATES = {"embedded": [100_000, 200_000, 300_000, 400_000, 500_000],
                 "bmv2": [1_000, 2_000, 3_000, 4_000, 8_000, 12_000]}


def switch_bench(kind: str, bits: int, rate: float, seconds: float, workdir: Path,
                 words: int = QAINA_WORDS, cpu_share: float | None = None) -> dict:
    """Offer ``rate`` contributions/s for ``seconds`` to a switch of target ``kind``
    (given ``cpu_share`` of its core, ``SwitchCpu``, if set); return what the switch
    did."""
    # What the benchmark starts is recorded like a run's: `clean` (or the next `up`)
    # removes it if the benchmark is killed outright.
    record = RunRecord(f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    veths = target = conn = cpu = None
    socks = []
    try:
        veths = VethPorts(WORKERS, record)
        if cpu_share is not None:
            cpu = SwitchCpu(cpu_share, record)
        extra = {"thrift_port": _free_port()} if kind == "bmv2" else {}
        target = make_target(kind, "bench", {i + 1: sw for i, (sw, _) in
                                             enumerate(veths.names)},
                             _free_port(), 1,
                             workdir / f"{kind}-b{bits}-w{words}-{rate:.0f}.log",
                             cpu=0, words=words, **extra)
        if kind == "bmv2":
            record.add_nft_table(target.guard.family, target.guard.table)
            record.save()
        target.start()
        record.add_process(target.pid, "benchmark switch")
        if cpu is not None:
            cpu.add(target.pid)
        conn = SwitchConnection("bench", target.grpc_addr, 1, p4info=program.p4info(words))
        target.wait_ready(conn)
        conn.arbitrate()
        conn.set_pipeline(target.device_config())
        job = Job(1, 0, LaneFormat(bits, WORKERS), 0, BENCH_SLOTS,
                  [Worker(k, 0x0A000001 + k, 0x020000000001 + k, k + 1) for k in range(WORKERS)])
        program_aggregator(conn, AGG_IP)
        program_job(conn, job)
        for w in job.workers:  # routed and guarded as in a run: each port admits its host
            program_route(conn, w.ip, 32, w.port)
            program_guard(conn, w.port, [w.ip])
        frames = _frames(job, BENCH_SLOTS, words)
        senders = [Port(k + 1, host, receive=False) for k, (_, host) in enumerate(veths.names)]
        socks.extend(senders)
        os.sched_setaffinity(0, {1})
        sent, elapsed = _offer(senders, _bursts(frames, BURST), rate, seconds)
        time.sleep(0.5 if kind == "embedded" else 2.0)  # let the switch finish its queue
        counters = conn.read_counters()
        aggregated = counters["MyIngress.agg_packets"][0][0]
        closed = counters["MyIngress.slots_closed"][0][0]
        drops = counters["MyIngress.drops"]
        fmt = job.fmt
        elems = closed * words * fmt.lanes
        out = {"target": kind, "bits": bits, "words": words, "lanes": fmt.lanes,
               "offered_pps": sent / elapsed,
               "aggregated_pps": aggregated / elapsed,
               "aggregated_fraction": aggregated / max(sent, 1),
               "completions_per_s": closed / elapsed,
               "completed_pps": closed * WORKERS / elapsed,
               "fp32_gbps": elems * 32 / elapsed / 1e9,
               "sent": sent, "aggregated": aggregated, "closed": closed,
               "duplicates": drops.get(Drop.DUPLICATE, (0, 0))[0],
               "retx_answered": counters["MyIngress.retx_answered"].get(0, (0, 0))[0],
               "cpu_share": cpu_share, "throttled": cpu.throttled() if cpu else 0}
    finally:
        for s in socks:
            s.close()
        if conn is not None:
            conn.close()
        if target is not None:
            target.stop()
        busy = cpu is not None and not cpu.remove()
        if veths is not None:
            veths.remove()
        if not busy:  # else the record keeps the cgroup for `clean`
            record.close()
    out.update(_switch_stats(target.log_path))
    return out


def _offer(senders: list, blocks: list, rate: float, seconds: float) -> tuple[int, float]:
    """Send ``blocks`` (bursts of ``BURST`` frames, round and round) at ``rate`` frames/s
    for ``seconds``; (frames sent, seconds taken)."""
    interval = BURST / rate
    sent = 0
    start = time.perf_counter()
    next_t = start
    end = start + seconds
    i, n = 0, len(blocks)
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now < next_t:
            time.sleep(max(0.0, next_t - now - 50e-6))
            continue
        for w, rows in blocks[i]:  # each worker's frames of the burst, in one go
            senders[w].send_block(rows)
            senders[w].flush()
        i = i + 1 if i + 1 < n else 0
        sent += BURST
        next_t += interval
    elapsed = time.perf_counter() - start
    return sent - sum(p.tx_errors for p in senders), elapsed  # less what found no room


def _switch_stats(log_path: Path) -> dict:
    """What the embedded switch's log says it did at its ports when it stopped: frames
    the kernel dropped from its receive rings, and frames it shed itself (0 where the
    log does not say, e.g. BMv2's)."""
    totals = {"kernel_drops": 0, "shed": 0}
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return totals
    found = re.findall(r"port stats (\{.*\})", text)
    if found:
        for port in ast.literal_eval(found[-1]).values():
            totals["kernel_drops"] += port.get("rx_dropped", 0)
            totals["shed"] += port.get("shed", 0)
    return totals


@contextlib.contextmanager
def recorded_workdir():
    """A temporary directory for a benchmark's runs, listed in a record of its own so
    that ``clean`` removes it after a kill -9 (the runs' records list the rest)."""
    with tempfile.TemporaryDirectory(prefix="qaina-bench-") as tmp:
        record = RunRecord(f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}")
        record.add_temp_directory(tmp)
        record.save()
        try:
            yield Path(tmp)
        finally:
            record.close()


def testbed_tables(tables, opts: dict, csv_path=None):
    """``bench testbed``: the chosen tables, in order, with ``opts`` (the command's
    options by parameter name); with ``csv_path``, the one table's rows written there."""
    iterations, repeat = opts["iterations"], opts["repeat"]
    with recorded_workdir() as work:
        if "transport" in tables:
            transport_table(work, iterations)
        if "repeat" in tables:
            repeat_table(work, iterations, opts["bw"], repeat)
        if "comparison" in tables:
            comparison_table(work, iterations, opts["bw"])
        rows = None
        if "ratio" in tables:
            rows = ratio_table(work, iterations, opts["ratio_bw"], repeat,
                               trace=opts["ratio_trace"])
        if "headline" in tables:
            rows = headline_table(work, iterations, repeat, trace=opts["headline_trace"],
                                  slots=opts["slots"] or (32,))
        if "coalescing" in tables:
            rows = coalescing_table(work, iterations, repeat, trace=opts["variants_trace"])
        if "sampling" in tables:
            rows = sampling_table(work, iterations, repeat, trace=opts["variants_trace"])
        if "cost" in tables:
            rows = cost_table(work, iterations, repeat, modes=opts["modes"] or COST_MODES,
                              workers=[int(n) for n in opts["workers"]] or COST_WORKERS)
    if csv_path and rows:
        write_csv(csv_path, rows)


def switch_table(kinds: list[str], bits_list: list[int], rates, seconds: float,
                 repeat: int = 1, words_list=(QAINA_WORDS,), csv_path=None,
                 cpu_share: float | None = None) -> int:
    """Print offered and aggregated pps per target, bit width, payload size and rate
    (mean, and the range over ``repeat`` runs); with two targets, the ratio of their
    best means. Without ``rates``: a sweep, then twice its peak (the most aggregated,
    mean of the runs), and how much of the peak the switch keeps there (overload).
    ``csv_path`` gets a row per point (``point_row``), written once all are measured.
    ``cpu_share``: the switch gets that share of its core (``SwitchCpu``), and the
    default sweep's rates are scaled by it."""
    from ..switches.targets import bmv2_missing, toolchain
    if "bmv2" in kinds and bmv2_missing():
        print(f"bmv2: {bmv2_missing()}")
        return 2
    if "bmv2" in kinds:
        print(f"bmv2: {toolchain()['simple_switch_grpc']}")
    if cpu_share is not None:
        print(f"the switch gets {cpu_share:g} of its core (CFS bandwidth: 1 ms of CPU "
              f"time per {1 / cpu_share:g} ms)")
    print(f"{'target':>8} {'bits':>4} {'m':>2} {'words':>5} {'offered pps':>12} "
          f"{'aggregated pps':>15} {'range':>17} {'agg %':>6} {'done %':>6} {'kdrop %':>7} "
          f"{'shed %':>6} {'fp32 Gbit/s':>11}")
    best: dict[tuple[str, int, int], float] = {}
    overload = []
    rows: list[dict] = []
    with recorded_workdir() as tmp:
        def point(kind, bits, words, rate):
            runs = [switch_bench(kind, bits, rate, seconds, tmp, words, cpu_share)
                    for _ in range(repeat)]
            _print_point(kind, bits, words, runs)
            rows.append(point_row(kind, bits, words, runs))
            return runs

        for kind in kinds:
            for bits in bits_list:
                for words in words_list:
                    key = kind, bits, words
                    for rate in rates or [r * (cpu_share or 1) for r in DEFAULT_RATES[kind]]:
                        runs = point(kind, bits, words, rate)
                        mean = float(np.mean([r["aggregated_pps"] for r in runs]))
                        best[key] = max(best.get(key, 0.0), mean)
                    if not rates and best[key] > 0:  # (none aggregated: no overload)
                        runs = point(kind, bits, words, 2 * best[key])
                        overload.append((key, best[key], runs))
                        rows[-1]["peak_pps"] = round(best[key])
    for (kind, bits, words), peak, runs in overload:
        agg = [r["aggregated_pps"] for r in runs]
        offered = float(np.mean([r["offered_pps"] for r in runs]))
        print(f"{kind} b={bits}, {words} words: peak {peak:,.0f} pps; offered "
              f"{offered:,.0f} ({offered / peak:.2f}x the peak) it aggregated "
              f"{np.mean(agg):,.0f} ({min(agg):,.0f}-{max(agg):,.0f}): "
              f"{100 * np.mean(agg) / peak:.0f}% of the peak "
              f"({100 * min(agg) / peak:.0f}-{100 * max(agg) / peak:.0f}%, {len(agg)} runs)")
    if csv_path and rows:
        write_csv(csv_path, [r | {"peak_pps": r.get("peak_pps")} for r in rows])
    if len(kinds) == 2:
        a, b = kinds
        for bits in bits_list:
            for words in words_list:
                print(f"b={bits}, {words} words: {a} aggregated at most "
                      f"{best[a, bits, words]:,.0f} pps, {b} {best[b, bits, words]:,.0f} pps: "
                      f"ratio {best[a, bits, words] / max(best[b, bits, words], 1):.1f}")
    return 0


def point_row(kind: str, bits: int, words: int, runs: list[dict]) -> dict:
    """One point of the table as a CSV row: target, width, build, offered and aggregated
    pps (mean, min, max over the runs), the switch's share of its core (``--switch-cpu``,
    empty if whole) and the CFS periods in which that limit stopped it (summed over the
    runs); ``peak_pps`` is set on the overload point (twice the peak offered) only."""
    agg = [r["aggregated_pps"] for r in runs]
    return {"target": "BMv2" if kind == "bmv2" else kind, "bits": bits, "words": words,
            "runs": len(runs),
            "offered_pps": round(float(np.mean([r["offered_pps"] for r in runs]))),
            "aggregated_pps": round(float(np.mean(agg))), "aggregated_min": round(min(agg)),
            "aggregated_max": round(max(agg)), "switch_cpu": runs[0].get("cpu_share"),
            "throttled": sum(r.get("throttled", 0) for r in runs)}


def _print_point(kind: str, bits: int, words: int, runs: list[dict]):
    """One row: means over the runs, and the range of the aggregated pps. ``done``:
    contributions in completed slot uses; ``kdrop``: frames the kernel dropped from
    the switch's full receive rings; ``shed``: frames the switch shed (whole slot
    uses), each a share of what was offered."""
    agg = [r["aggregated_pps"] for r in runs]
    offered = float(np.mean([r["offered_pps"] for r in runs]))
    mean = float(np.mean(agg))
    sent = sum(r["sent"] for r in runs)
    share = {k: 100 * sum(r[k] for r in runs) / sent for k in ("kernel_drops", "shed")}
    print(f"{kind:>8} {bits:>4} {runs[0]['lanes']:>2} {words:>5} "
          f"{offered:>12,.0f} {mean:>15,.0f} "
          f"{min(agg):>8,.0f}-{max(agg):<8,.0f} "
          f"{100 * mean / offered:>5.1f}% "
          f"{100 * np.mean([r['completed_pps'] for r in runs]) / offered:>5.1f}% "
          f"{share['kernel_drops']:>6.1f}% {share['shed']:>5.1f}% "
          f"{np.mean([r['fp32_gbps'] for r in runs]):>11.3f}", flush=True)


if __name__ == "__main__":  # the same commands as `qaina-bench bench`
    from .benchcli import bench as _commands
    _commands(prog_name="python -m qaina_bench.harness.benchmarks.bench")
