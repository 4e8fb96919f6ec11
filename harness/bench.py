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

    python -m qaina_bench.harness.bench switch --target embedded --target bmv2

``testbed``: whole runs (transport, repeatability, elements/s, in-network / ring).
``control`` (``controlbench.py``): P4Runtime reads between the harness and a switch.
"""

from __future__ import annotations

import argparse
import ast
import csv
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ..hosts.collective import MODES
from ..hosts.lanes import LaneFormat
from ..p4 import program
from ..p4.constants import Drop
from ..p4.embedded.ports import Port
from ..p4.header import PAYLOAD_WORDS, QAINA_WORDS
from .control import SwitchConnection
from .jobs import (Job, Worker, aggregator_ip, aggregator_mac, ip_to_int, program_aggregator,
                   program_guard, program_job, program_route)
from .record import RunRecord
from .targets import make_target

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
    from ..p4.header import IP_CSUM, QAINA_STRUCT, QAINA_UDP_PORT, ipv4_checksum, wire
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
        for i in range(1, n + 1):
            sw, host = f"{self.prefix}{i}s", f"{self.prefix}{i}h"
            record.add_interface(sw)
            record.add_interface(host)
            record.save()
            subprocess.run(["ip", "link", "add", sw, "type", "veth", "peer", "name", host],
                           check=True)
            self.names.append((sw, host))
            for ifname in (sw, host):
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"],
                               capture_output=True)
                subprocess.run(["ip", "link", "set", ifname, "up"], check=True)

    def remove(self):
        for sw, _ in self.names:
            subprocess.run(["ip", "link", "del", sw], capture_output=True)


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
                 words: int = QAINA_WORDS) -> dict:
    """Offer ``rate`` contributions/s for ``seconds`` to a switch of target ``kind``;
    return what the switch did."""
    # What the benchmark starts is recorded like a run's: `clean` (or the next `up`)
    # removes it if the benchmark is killed outright.
    record = RunRecord(f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    veths = VethPorts(WORKERS, record)
    extra = {"thrift_port": _free_port()} if kind == "bmv2" else {}
    target = make_target(kind, "bench", {i + 1: sw for i, (sw, _) in enumerate(veths.names)},
                         _free_port(), 1, workdir / f"{kind}-b{bits}-w{words}-{rate:.0f}.log",
                         cpu=0, words=words, **extra)
    if kind == "bmv2":
        record.add_nft_table(target.guard.family, target.guard.table)
        record.save()
    conn = None
    socks = []
    try:
        target.start()
        record.add_process(target.pid, "benchmark switch")
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
               "aggregated_pps": aggregated / elapsed, "aggregated_fraction": aggregated / sent,
               "completions_per_s": closed / elapsed,
               "completed_pps": closed * WORKERS / elapsed,
               "fp32_gbps": elems * 32 / elapsed / 1e9,
               "sent": sent, "aggregated": aggregated, "closed": closed,
               "duplicates": drops.get(Drop.DUPLICATE, (0, 0))[0],
               "retx_answered": counters["MyIngress.retx_answered"].get(0, (0, 0))[0]}
    finally:
        for s in socks:
            s.close()
        if conn is not None:
            conn.close()
        target.stop()
        veths.remove()
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


def testbed_bench(topo: str, bits: int, bw: float | None, iterations: int, workdir: Path,
                  jobs: int, mode: str = "ina", workers: int = 4, **options) -> dict:
    """One ``up`` run; returns its summary."""
    from .config import RunConfig
    from .run import Run
    cfg = RunConfig.flat(topo=topo, jobs=jobs, workers=workers, bits=[bits],
                         iterations=iterations, bw=bw, results_dir=str(workdir), mode=mode,
                         **options)
    return Run(cfg, echo=lambda *a, **k: None).execute()


def link_bound_time(summary: dict) -> float | None:
    """Seconds the busiest link direction needs for the bytes it carried in the run,
    at the configured link rate (None for unshaped links)."""
    bw = summary["links"]["bw_mbit"]
    if not bw or not summary["link_bytes"]:
        return None
    busiest = max(max(v["bytes_sent"], v["bytes_recv"]) for v in summary["link_bytes"].values())
    return busiest * 8 / (bw * 1e6)


def transport_table(workdir: Path, iterations: int, bandwidths=(0.3, 1.0, 10.0, None)):
    """Retransmissions, and time against what the links need, star, one job: per
    iteration (a worker's bytes of an iteration over its own link) and per run (the
    busiest link's bytes, warm-up and the gaps between iterations included)."""
    print(f"transport: star, 1 job x 4 workers, {iterations} iterations; 'link ms' is what "
          "a worker's link needs for the bytes of one iteration, 'link s' what the busiest "
          "link needs for all it carried")
    print(f"{'Mbit/s':>7} {'bits':>4} {'retx':>5} {'timeouts':>8} {'iter ms':>8} "
          f"{'link ms':>8} {'iter/link':>9} {'run s':>7} {'link s':>7} {'run/link':>8}")
    for bw in bandwidths:
        for bits in (4, 32):
            s = testbed_bench("star", bits, bw, iterations, workdir, 1)
            j = s["jobs"][0]
            bound = link_bound_time(s)
            it = j["iteration_completion_mean_s"]
            per_iteration = j["bytes_sent"] / (j["workers"] * j["iterations_done"])
            it_link = per_iteration * 8 / (bw * 1e6) if bw else None
            nan = float("nan")
            print(f"{bw or 'none':>7} {bits:>4} {j['retransmissions']:>5} {j['timeouts']:>8} "
                  f"{1e3 * it:>8.1f} {1e3 * it_link if it_link else nan:>8.1f} "
                  f"{it / it_link if it_link else nan:>9.2f} {s['span_s']:>7.2f} "
                  f"{bound if bound else nan:>7.2f} "
                  f"{s['span_s'] / bound if bound else nan:>8.2f}", flush=True)


def repeat_table(workdir: Path, iterations: int, bw: float, repeat: int):
    """The same run ``repeat`` times: mean iteration time per run and their spread."""
    means = []
    print(f"repeatability: leafspine, 2 jobs x 4 workers, b=4, {bw} Mbit/s, {iterations} "
          f"iterations, {repeat} runs")
    for k in range(repeat):
        s = testbed_bench("leafspine", 4, bw, iterations, workdir, 2)
        m = float(np.mean([j["iteration_completion_mean_s"] for j in s["jobs"]]))
        retx = sum(j["retransmissions"] for j in s["jobs"])
        means.append(m)
        print(f"  run {k + 1}: iteration {1e3 * m:.1f} ms, {retx} retransmissions", flush=True)
    mean, sd = float(np.mean(means)), float(np.std(means, ddof=1)) if repeat > 1 else 0.0
    print(f"  mean {1e3 * mean:.1f} ms, sd {1e3 * sd:.1f} ms, coefficient of variation "
          f"{100 * sd / mean:.1f}%")


def comparison_table(workdir: Path, iterations: int, bw: float):
    """Elements/s of b=4 against b=32 and against a b=4 ring all-reduce."""
    print(f"links {bw} Mbit/s, 4 workers per job, {iterations} iterations")
    print(f"{'topology':>10} {'jobs':>4} {'mode':>4} {'bits':>4} {'Melem/s':>9} "
          f"{'iter ms':>8} {'p99 ms':>7} {'up->first pkt s':>15}")
    for topo, jobs in (("star", 1), ("leafspine", 2)):
        rates = {}
        for mode, bits in (("ina", 4), ("ina", 32), ("ring", 4)):
            s = testbed_bench(topo, bits, bw, iterations, workdir, jobs, mode)
            for j in s["jobs"]:
                rates.setdefault((mode, bits), []).append(j["elements_per_s"])
                print(f"{topo:>10} {jobs:>4} {mode:>4} {bits:>4} "
                      f"{j['elements_per_s'] / 1e6:>9.4f} "
                      f"{1e3 * j['iteration_completion_mean_s']:>8.1f} "
                      f"{1e3 * j['iteration_completion_p99_s']:>7.1f} "
                      f"{s['startup_to_first_send_s']:>15.2f}", flush=True)
        total = {key: sum(v) for key, v in rates.items()}
        print(f"{topo:>10}: in the switch, b=4 moves "
              f"{total['ina', 4] / total['ina', 32]:.1f}x the elements/s of b=32 and "
              f"{total['ina', 4] / total['ring', 4]:.1f}x those of a b=4 ring all-reduce")


def ratio_table(workdir: Path, iterations: int, bw: float, repeat: int, workers: int = 8,
                words: int = 256, trace: str = "digits-mlp-wide") -> float:
    """In-network against ring all-reduce at b=4, n=``workers``, link-bound on the star:
    mean iteration time of each over ``repeat`` runs, and their ratio (in-network /
    ring; ring all-reduce moves 2(n-1)/n of the data per worker, so the ideal is
    n / (2(n-1)): 0.57 at n = 8)."""
    print(f"in-network against ring: star, 1 job x {workers} workers, b=4, {bw} Mbit/s, "
          f"{words}-word packets, trace {trace}, {iterations} iterations, {repeat} runs each")
    from ..hosts.recorder import ensure
    ensure(trace, log=print)
    times: dict[str, list[float]] = {"ina": [], "ring": []}
    for k in range(repeat):
        for mode in ("ina", "ring"):
            s = testbed_bench("star", 4, bw, iterations, workdir, 1, mode, workers,
                              payload_words=words, trace=trace)
            j = s["jobs"][0]
            times[mode].append(j["iteration_completion_mean_s"])
            cpu = (s["validity"].get("cpu") or {}).get("saturated")
            print(f"  run {k + 1} {mode:>4}: iteration {1e3 * times[mode][-1]:.1f} ms, "
                  f"{j['retransmissions']} retransmissions"
                  + (f" [CPU saturated: {cpu}]" if cpu else ""), flush=True)
    ina, ring = (float(np.mean(times[m])) for m in ("ina", "ring"))
    lo = min(times["ina"]) / max(times["ring"])
    hi = max(times["ina"]) / min(times["ring"])
    ideal = workers / (2 * (workers - 1))
    print(f"  in-network {1e3 * ina:.1f} ms, ring {1e3 * ring:.1f} ms: ratio {ina / ring:.2f} "
          f"(range {lo:.2f}-{hi:.2f}; ideal {ideal:.2f})")
    return ina / ring


COST_MODES = ("ina", "ring", "ps")  # by default; --mode takes any registered mode
COST_WORKERS = (4, 8)
COST_BANDWIDTHS = (None, 16.0)  # unshaped, and links of 16 Mbit/s
COST_PARTS = ("agents", "switches", "ps", "harness", "kernel")
COST_METRICS = ("melem_s",) + COST_PARTS + ("total",)


def cost_figures(summary: dict) -> dict:
    """Melem/s, CPU seconds per million aggregated elements by component (None where a
    component has no process, e.g. ``ps`` outside ``--mode ps``) and the verdict."""
    cost = summary.get("cpu_cost") or {}
    parts = cost.get("components", {})
    out = {"melem_s": sum(j.get("elements_per_s") or 0 for j in summary["jobs"]) / 1e6,
           "total": cost.get("s_per_melem"),
           "kernel": (cost.get("kernel") or {}).get("s_per_melem"),
           "verdict": (summary.get("fidelity") or {}).get("verdict", "n/a")}
    for name in COST_PARTS[:-1]:
        out[name] = (parts.get(name) or {}).get("s_per_melem")
    return out


def _spread(values: list) -> tuple:
    """(mean, min, max) of the values that exist, or three Nones."""
    v = [x for x in values if x is not None]
    return (float(np.mean(v)), min(v), max(v)) if v else (None, None, None)


def cost_table(workdir: Path, iterations: int, repeat: int, csv_file=None,
               trace: str = "digits-mlp-wide", words: int = 256, modes=COST_MODES,
               workers=COST_WORKERS) -> list[dict]:
    """End-to-end Melem/s and CPU seconds per million aggregated elements by component
    (agents, switches, parameter servers, the harness, softirq system-wide; total: the
    run's processes), in-network, ring and parameter server at n = 4 and 8 on the star,
    b=4, unshaped and at 16 Mbit/s: mean and range over ``repeat`` runs of each (the
    repeats interleaved), and the fidelity verdicts; written as CSV to ``csv_file``."""
    from ..hosts.recorder import ensure
    print(f"CPU cost: star, 1 job, b=4, {words}-word packets, trace {trace}, {iterations} "
          f"iterations, {repeat} runs each; CPU s per million aggregated elements")
    ensure(trace, log=print)
    points = [(bw, n, mode) for bw in COST_BANDWIDTHS for n in workers for mode in modes]
    runs: dict[tuple, list[dict]] = {pt: [] for pt in points}
    for k in range(repeat):
        for bw, n, mode in points:
            s = testbed_bench("star", 4, bw, iterations, workdir, 1, mode, n,
                              payload_words=words, trace=trace)
            f = cost_figures(s)
            runs[bw, n, mode].append(f)
            print(f"  run {k + 1}: {mode:>4} n={n} {bw or 'unshaped'} Mbit/s: "
                  f"{f['melem_s']:.3f} Melem/s, {f['total'] or float('nan'):.1f} CPU s/Melem, "
                  f"{f['verdict']}", flush=True)
    rows = [_cost_row(pt, runs[pt]) for pt in points]
    _print_cost(rows)
    if csv_file is not None:
        w = csv.DictWriter(csv_file, list(rows[0]))
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
        csv_file.flush()
    return rows


def _cost_row(point: tuple, runs: list[dict]) -> dict:
    bw, n, mode = point
    row = {"mode": mode, "workers": n, "bw_mbit": bw or "unshaped", "runs": len(runs)}
    for m in COST_METRICS:
        row[f"{m}_mean"], row[f"{m}_min"], row[f"{m}_max"] = _spread([r[m] for r in runs])
    verdicts = [r["verdict"] for r in runs]
    row["verdicts"] = "; ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts)))
    return row


def _print_cost(rows: list[dict]):
    def cell(r, m, width):
        mean, lo, hi = r[f"{m}_mean"], r[f"{m}_min"], r[f"{m}_max"]
        text = "n/a" if mean is None else (f"{mean:.3g}" if lo == hi else
                                           f"{mean:.3g} ({lo:.3g}-{hi:.3g})")
        return f"{text:>{width}}"
    print(f"{'Mbit/s':>8} {'n':>2} {'mode':>4} {'Melem/s':>20} "
          + " ".join(f"{p:>18}" for p in COST_PARTS + ("total",)) + "  verdicts")
    for r in rows:
        print(f"{r['bw_mbit']:>8} {r['workers']:>2} {r['mode']:>4} {cell(r, 'melem_s', 20)} "
              + " ".join(cell(r, m, 18) for m in COST_PARTS + ("total",))
              + f"  {r['verdicts']}")


def headline_table(workdir: Path, iterations: int, repeat: int,
                   trace: str = "digits-mlp-wide") -> dict:
    """``up --topo star --jobs 2 --workers 8 --bits 4 --payload-words 256 --trace
    digits-mlp-wide``, unshaped, in-network and ring: Melem/s per job and the agents'
    CPU seconds per million aggregated elements, mean and range over ``repeat`` runs
    (interleaved)."""
    from ..hosts.recorder import ensure
    print(f"headline: star, 2 jobs x 8 workers, b=4, 256-word packets, trace {trace}, "
          f"{iterations} iterations, unshaped, {repeat} runs each")
    ensure(trace, log=print)
    out: dict[str, dict[str, list]] = {m: {"rate": [], "agents": []} for m in ("ina", "ring")}
    for k in range(repeat):
        for mode in out:
            s = testbed_bench("star", 4, None, iterations, workdir, 2, mode, 8,
                              payload_words=256, trace=trace)
            rates = [j["elements_per_s"] / 1e6 for j in s["jobs"]]
            agents = cost_figures(s)["agents"]
            out[mode]["rate"].append(float(np.mean(rates)))
            out[mode]["agents"].append(agents)
            print(f"  run {k + 1} {mode:>4}: {np.mean(rates):.3f} Melem/s per job, agents "
                  f"{agents or float('nan'):.2f} CPU s/Melem", flush=True)
    for mode, v in out.items():
        (rm, rl, rh), (am, al, ah) = _spread(v["rate"]), _spread(v["agents"])
        print(f"  {mode:>4}: {rm:.3f} Melem/s per job ({rl:.3f}-{rh:.3f}); agents "
              f"{am:.2f} CPU s/Melem ({al:.2f}-{ah:.2f})")
    return out


TESTBED_TABLES = ("transport", "repeat", "comparison", "ratio", "cost", "headline")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qaina_bench.harness.bench")
    sub = ap.add_subparsers(dest="what", required=True)
    sw = sub.add_parser("switch", help="aggregation packets/s through one switch")
    sw.add_argument("--target", action="append", choices=["embedded", "bmv2"],
                    help="switch target (repeatable; default embedded)")
    sw.add_argument("--bits", type=int, action="append", help="bit width (repeatable)")
    sw.add_argument("--rate", type=float, action="append",
                    help="offered contributions/s (repeatable; default a sweep)")
    sw.add_argument("--seconds", type=float, default=4.0)
    sw.add_argument("--repeat", type=int, default=1, help="runs per rate (mean and range)")
    sw.add_argument("--payload-words", type=int, action="append", choices=PAYLOAD_WORDS,
                    help="the qaina.p4 build (repeatable; default 32)")
    tb = sub.add_parser("testbed", help="elements/s of b=4 against b=32 and against a ring "
                                        "all-reduce, on real topologies")
    tb.add_argument("--bw", type=float, default=1.0, help="link Mbit/s (links the bottleneck)")
    tb.add_argument("--iterations", type=int, default=6)
    tb.add_argument("--repeat", type=int, default=3, help="runs of one config, for the CV")
    tb.add_argument("--table", action="append", choices=TESTBED_TABLES,
                    help="only these tables (repeatable; default all)")
    tb.add_argument("--ratio-bw", type=float, default=3.0,
                    help="link Mbit/s of the in-network / ring ratio")
    tb.add_argument("--ratio-trace", default="digits-mlp-wide",
                    help="trace set of the in-network / ring ratio")
    tb.add_argument("--csv", help="the cost table also as CSV to this file")
    tb.add_argument("--mode", action="append", choices=MODES.names(),
                    help="the cost table for this scheme only (repeatable; default all)")
    tb.add_argument("--workers", type=int, action="append", choices=COST_WORKERS,
                    help="the cost table for this n only (repeatable; default all)")
    cp = sub.add_parser("control", help="P4Runtime reads of an embedded switch: every "
                                        "entity, and the sampler's slot counters")
    cp.add_argument("--repeat", type=int, default=10, help="reads of each kind")
    cp.add_argument("--payload-words", type=int, choices=PAYLOAD_WORDS, default=QAINA_WORDS,
                    help="the qaina.p4 build (its agg_sum has 2048 x words cells)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("the benchmarks need root (veth pairs, raw sockets, Mininet)")
    if args.what == "control":
        if args.repeat < 1:
            ap.error("--repeat must be at least 1")
        from .controlbench import control_table
        return control_table(args.repeat, args.payload_words)
    if args.what == "testbed":
        tables = args.table or TESTBED_TABLES
        try:
            csv_file = open(args.csv, "w", newline="") if args.csv else None
        except OSError as exc:
            ap.error(f"--csv {args.csv}: {exc.strerror or exc}")
        with tempfile.TemporaryDirectory(prefix="qaina-bench-") as tmp:
            if "transport" in tables:
                transport_table(Path(tmp), args.iterations)
            if "repeat" in tables:
                repeat_table(Path(tmp), args.iterations, args.bw, args.repeat)
            if "comparison" in tables:
                comparison_table(Path(tmp), args.iterations, args.bw)
            if "ratio" in tables:
                ratio_table(Path(tmp), args.iterations, args.ratio_bw, args.repeat,
                            trace=args.ratio_trace)
            if "headline" in tables:
                headline_table(Path(tmp), args.iterations, args.repeat)
            if "cost" in tables:
                cost_table(Path(tmp), args.iterations, args.repeat, csv_file,
                           modes=args.mode or COST_MODES, workers=args.workers or COST_WORKERS)
        if csv_file is not None:
            csv_file.close()
        return 0
    return switch_table(args.target or ["embedded"], args.bits or [4, 32], args.rate,
                        args.seconds, args.repeat, args.payload_words or [QAINA_WORDS])


def switch_table(kinds: list[str], bits_list: list[int], rates, seconds: float,
                 repeat: int = 1, words_list=(QAINA_WORDS,)) -> int:
    """Print offered and aggregated pps per target, bit width, payload size and rate
    (mean, and the range over ``repeat`` runs); with two targets, the ratio of their
    best means. Without ``rates``: a sweep, then twice its peak (the most aggregated,
    mean of the runs), and how much of the peak the switch keeps there (overload)."""
    from .targets import bmv2_missing, toolchain
    if "bmv2" in kinds and bmv2_missing():
        print(f"bmv2: {bmv2_missing()}")
        return 2
    if "bmv2" in kinds:
        print(f"bmv2: {toolchain()['simple_switch_grpc']}")
    print(f"{'target':>8} {'bits':>4} {'m':>2} {'words':>5} {'offered pps':>12} "
          f"{'aggregated pps':>15} {'range':>17} {'agg %':>6} {'done %':>6} {'kdrop %':>7} "
          f"{'shed %':>6} {'fp32 Gbit/s':>11}")
    best: dict[tuple[str, int, int], float] = {}
    overload = []
    with tempfile.TemporaryDirectory(prefix="qaina-bench-") as tmp:
        def point(kind, bits, words, rate):
            runs = [switch_bench(kind, bits, rate, seconds, Path(tmp), words)
                    for _ in range(repeat)]
            _print_point(kind, bits, words, runs)
            return runs

        for kind in kinds:
            for bits in bits_list:
                for words in words_list:
                    key = kind, bits, words
                    for rate in rates or DEFAULT_RATES[kind]:
                        runs = point(kind, bits, words, rate)
                        mean = float(np.mean([r["aggregated_pps"] for r in runs]))
                        best[key] = max(best.get(key, 0.0), mean)
                    if not rates:
                        runs = point(kind, bits, words, 2 * best[key])
                        overload.append((key, best[key], runs))
    for (kind, bits, words), peak, runs in overload:
        agg = [r["aggregated_pps"] for r in runs]
        offered = float(np.mean([r["offered_pps"] for r in runs]))
        print(f"{kind} b={bits}, {words} words: peak {peak:,.0f} pps; offered "
              f"{offered:,.0f} ({offered / peak:.2f}x the peak) it aggregated "
              f"{np.mean(agg):,.0f} ({min(agg):,.0f}-{max(agg):,.0f}): "
              f"{100 * np.mean(agg) / peak:.0f}% of the peak "
              f"({100 * min(agg) / peak:.0f}-{100 * max(agg) / peak:.0f}%, {len(agg)} runs)")
    if len(kinds) == 2:
        a, b = kinds
        for bits in bits_list:
            for words in words_list:
                print(f"b={bits}, {words} words: {a} aggregated at most "
                      f"{best[a, bits, words]:,.0f} pps, {b} {best[b, bits, words]:,.0f} pps: "
                      f"ratio {best[a, bits, words] / best[b, bits, words]:.1f}")
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
