"""The fidelity verdict and the CPU cost of a run: two parts of ``summary.json``.

An emulated run's timings are the network's only where the emulator kept up
(Handigol et al., "Reproducible network experiments using container-based
emulation", CoNEXT 2012). ``job_fidelity`` says, per job, what bound its iterations,
from the counters the sampler wrote to ``timeseries.csv``, over the job's **transfer
time**: the union of its iterations, each from its first worker's first send to its
last worker's last chunk dequantized.

* **Links**: every direction of every link the job's traffic may cross (the links of
  its own hosts, workers and parameter server, and every switch-to-switch link),
  measured at the switch's end. The bottleneck may move: a parameter server's link
  is busy towards the server while it gathers and from it while it scatters. So the
  transfer time is cut at every link sample (100 ms apart), the busiest direction of
  each piece is that piece's bottleneck, and the **link load** is the bytes the
  bottlenecks carried / (link rate x transfer time), a piece counting at most its
  rate x length (the shaper's burst lets a link that idled carry more for a moment,
  and a link is busy at most all the time). With one steady bottleneck it is that
  link's utilisation. Counters are interpolated linearly between samples; a
  verdict on fewer than 10 link samples (a transfer under a second) says it is coarse.
* **CPU**: the busy share of all cores (``/proc/stat``; niced work is left out, it
  yields to the run; on a cluster, each server's from its own sampler, and the
  busiest server's counts), and per process the job depends on (its agents, its parameter
  server, every switch) its *demand*: the CPU seconds per second it ran or was
  runnable but waiting for a CPU, summed over its threads (``/proc/<pid>/task/*/
  schedstat``; above 1 when threads run at once). The CPU is **saturated** when the
  cores were at least 90% busy or a process demanded at least 0.9 cores (it hardly
  ever waited for the network or its peers).

The verdict (``verdict``; the thresholds are ``NETWORK_BOUND``, ``WELL_BELOW`` and
``CPU_SATURATED``):

* ``n/a``: no iteration completed, or (shaped links) no link sample fell into the
  transfer time, or the samples left a gap of ``SAMPLE_GAP`` or more around a start
  or end of it (a stopped or starved harness: the bytes of either side are unknown;
  also before the first sample or after the last);
* ``cpu-bound`` when the links are unshaped (no ``--bw``): without a link rate there
  is nothing for the job to be network-bound by, packets cross the links as fast as
  the CPUs move them;
* ``network-bound``: the link load was at least 90% of the link rate;
* ``cpu-bound``: the CPU was saturated and the link load was below 75%;
* ``mixed`` otherwise: a link between 75% and 90% with a saturated CPU, or links
  below 90% with an unsaturated CPU (latency, window, loss recovery).

``cpu_cost`` turns the ``CpuLedger``'s readings (``harness/running/cpustat.py``) into CPU
seconds per component and per million aggregated elements, and their share of the
cores of every server the run used (``machine_cores``).
"""

from __future__ import annotations

import numpy as np

NETWORK_BOUND = 0.9  # share of its rate a link must carry to bind a job
WELL_BELOW = 0.75  # below this share, a link does not explain a job's time
CPU_SATURATED = 0.9  # share of the cores busy, or of the time a process demanded a CPU
FEW_SAMPLES = 10  # a verdict on fewer link samples says it is coarse
#: a gap between link samples this long (s), with a start or end of the job's transfer
#: inside it, leaves the bytes of either side unknown: the verdict is not judged
SAMPLE_GAP = 1.0
BUSY_STATES = ("user", "system", "irq", "softirq", "steal")  # of /proc/stat; nice yields
ALL_STATES = BUSY_STATES + ("nice", "idle", "iowait")


def verdict(utilisation: float | None, cpu_saturated: bool) -> str:
    """What bound a job: ``utilisation``, its link load (None: links unshaped)."""
    if utilisation is None:
        return "cpu-bound"
    if utilisation >= NETWORK_BOUND:
        return "network-bound"
    if cpu_saturated and utilisation < WELL_BELOW:
        return "cpu-bound"
    return "mixed"


def overall(verdicts: list[str]) -> str:
    """The run's verdict: the jobs' common one, ``mixed`` when they differ."""
    known = sorted(set(v for v in verdicts if v != "n/a"))
    if not known:
        return "n/a"
    return known[0] if len(known) == 1 else "mixed"


def transfer_intervals(rows: list[dict], job_id: int) -> list[tuple[float, float]]:
    """The job's iterations as disjoint (start, end) spans, merged where they overlap."""
    spans: dict[int, list[float]] = {}
    for r in rows:
        if int(r["job"]) == job_id:
            s = spans.setdefault(int(r["iteration"]), [float(r["start"]), float(r["end"])])
            s[0], s[1] = min(s[0], float(r["start"])), max(s[1], float(r["end"]))
    merged: list[list[float]] = []
    for a, b in sorted(spans.values()):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


class Counter:
    """A cumulative counter sampled over time; ``over`` interpolates its growth
    within intervals (before the first sample and after the last it stays flat)."""

    def __init__(self, samples: list[tuple[float, float]]):
        samples = sorted(samples)
        self.t = np.array([s[0] for s in samples], dtype=float)
        self.v = np.array([s[1] for s in samples], dtype=float)

    def over(self, intervals: list[tuple[float, float]]) -> float:
        if len(self.t) == 0:
            return 0.0
        return float(sum(np.interp(b, self.t, self.v) - np.interp(a, self.t, self.v)
                         for a, b in intervals))

    def samples_within(self, intervals) -> int:
        return int(sum(((self.t >= a) & (self.t <= b)).sum() for a, b in intervals))


def _counters(rows: list[dict], key: str, columns) -> dict[str, dict[str, Counter]]:
    """Per value of ``key`` (an interface, a process), a Counter per column."""
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        grouped.setdefault(r[key], []).append(r)
    return {name: {c: Counter([(float(r["time"]), float(r[c])) for r in rs
                               if r.get(c) not in (None, "")]) for c in columns}
            for name, rs in grouped.items()}


def _pieces(counters: dict, intervals) -> list[tuple[float, float]]:
    """The transfer time cut at every sample time of the counters."""
    cuts = sorted({round(float(t), 4) for c in counters.values() for t in c.t}
                  | {x for iv in intervals for x in iv})
    return [(a, b) for a, b in zip(cuts, cuts[1:])
            if any(lo <= a and b <= hi for lo, hi in intervals)]


def link_load(link_rows: list[dict], interfaces: dict[str, str], hosts: set[str],
              intervals, rate_mbit: float | None) -> dict:
    """The job's links over its transfer time: every direction (busiest first), the
    link load (the piece-by-piece bottleneck's bytes over rate x time; None when
    unshaped), which directions were the bottleneck for what share of the time, and
    how many link samples fell into the transfer time."""
    span = sum(b - a for a, b in intervals)
    switches = {name.split("-eth")[0] for name in interfaces}
    mine = {n: p for n, p in interfaces.items() if p in hosts or p in switches}
    grouped = _counters([r for r in link_rows if r["interface"] in mine], "interface",
                        ("bytes_sent", "bytes_recv"))
    counters = {(name, f"{way} {mine[name]}"): c[column] for name, c in grouped.items()
                for column, way in (("bytes_sent", "to"), ("bytes_recv", "from"))}
    directions = []
    for (name, direction), c in counters.items():
        carried = c.over(intervals)
        directions.append({"interface": name, "direction": direction, "bytes": int(carried),
                           "mbit_s": carried * 8 / span / 1e6,
                           "utilisation": carried * 8 / span / 1e6 / rate_mbit
                           if rate_mbit else None})
    directions.sort(key=lambda d: -d["bytes"])
    busy, held = 0.0, {}
    for piece in (_pieces(counters, intervals) if counters else []):
        carried = {key: c.over([piece]) for key, c in counters.items()}
        top = max(carried, key=carried.get)
        # a direction is at most busy all of a piece: bytes past the rate are the
        # shaper's burst, spent after an idle spell (HTB lets 15 kB through at once)
        busy += min(carried[top], rate_mbit * 1e6 / 8 * (piece[1] - piece[0])) \
            if rate_mbit else carried[top]
        label = f"{top[0]} {top[1]}"
        held[label] = held.get(label, 0.0) + (piece[1] - piece[0]) / span
    samples = max((c.samples_within(intervals) for c in counters.values()), default=0)
    times = sorted({float(t) for c in counters.values() for t in c.t})
    blind = blind_gap(times, [x for iv in intervals for x in iv]) if times else 0.0
    return {"directions": directions, "blind_gap_s": blind,
            "load": busy * 8 / span / 1e6 / rate_mbit if rate_mbit else None,
            "load_mbit_s": busy * 8 / span / 1e6,
            "bottleneck_time": dict(sorted(held.items(), key=lambda kv: -kv[1])[:4]),
            "samples": samples}


def blind_gap(times: list[float], edges: list[float]) -> float:
    """The longest span without a sample (``times``, sorted) around any of ``edges``
    that is at least ``SAMPLE_GAP`` long, 0.0 if none; an edge before the first sample
    or after the last counts from it."""
    times_arr = np.array(times)
    longest = 0.0
    for x in edges:
        i = int(np.searchsorted(times_arr, x))  # times[i - 1] < x <= times[i]
        before = times_arr[i - 1] if i > 0 else x
        after = times_arr[i] if i < len(times_arr) else x
        if after == x and i < len(times_arr):  # a sample at the edge itself
            continue
        if after - before >= SAMPLE_GAP:
            longest = max(longest, float(after - before))
    return longest


def cpu_load(cpu_rows: list[dict], proc_rows: list[dict], processes: list[str],
             intervals) -> dict:
    """Busy share of the cores, and each process's busy and demand shares."""
    span = sum(b - a for a, b in intervals)
    machines = _counters([{**r, "m": r.get("server") or ""} for r in cpu_rows], "m",
                         [f"{s}_s" for s in ALL_STATES])
    by_server = {}
    for server, machine in machines.items():
        spent = {s: machine[f"{s}_s"].over(intervals) for s in ALL_STATES}
        total = sum(spent.values())
        if total > 0:
            by_server[server] = sum(spent[s] for s in BUSY_STATES) / total
    cores_busy = max(by_server.values(), default=None)  # the busiest server's
    procs = _counters([r for r in proc_rows if r["process"] in processes], "process",
                      ("user_s", "system_s", "wait_s"))
    shares = {}
    for name, c in sorted(procs.items()):
        run = c["user_s"].over(intervals) + c["system_s"].over(intervals)
        shares[name] = {"busy": run / span, "demand": (run + c["wait_s"].over(intervals)) / span}
    out = {"cores_busy": cores_busy, "processes": shares}
    if len(machines) > 1:  # a cluster: each server's ("": this machine)
        out["cores_busy_by_server"] = by_server
    return out


def _cpu_saturation(cpu: dict) -> tuple[bool, str]:
    """Whether the CPU was saturated, and the figure that says so (or the highest)."""
    busiest = max(cpu["processes"].items(), key=lambda kv: kv[1]["demand"], default=None)
    cores = cpu["cores_busy"]
    said = []
    if cores is not None:
        servers = cpu.get("cores_busy_by_server") or {}
        top = max(servers, key=servers.get) if servers else None
        said.append(f"cores {100 * cores:.0f}% busy"
                    + (f" on {top or 'this machine'}" if servers else ""))
    if busiest:
        said.append(f"{busiest[0]} demanded {busiest[1]['demand']:.2f} cores, running or "
                    "waiting to run")
    saturated = ((cores or 0) >= CPU_SATURATED
                 or bool(busiest and busiest[1]["demand"] >= CPU_SATURATED))
    return saturated, ", ".join(said) or "no CPU samples"


def job_fidelity(job_id: int, hosts: set[str], rows: list[dict], series: dict,
                 interfaces: dict[str, str], rate_mbit: float | None,
                 processes: list[str]) -> dict:
    """The verdict of one job and the figures behind it. ``series``: timeseries rows
    by kind (``link``, ``cpu``, ``proc``); ``processes``: the names of the processes
    the job depends on."""
    intervals = transfer_intervals(rows, job_id)
    span = sum(b - a for a, b in intervals)
    if span <= 0:
        return {"verdict": "n/a", "reason": "no iteration completed"}
    links = link_load(series.get("link", []), interfaces, hosts, intervals, rate_mbit)
    cpu = cpu_load(series.get("cpu", []), series.get("proc", []), processes, intervals)
    saturated, cpu_said = _cpu_saturation(cpu)
    top = links["directions"][0] if links["directions"] else None
    out = {"transfer_s": span, "link_rate_mbit": rate_mbit, "link_load": links["load"],
           "link_load_mbit_s": links["load_mbit_s"], "link_samples": links["samples"],
           "bottleneck_time": links["bottleneck_time"], "busiest_direction": top,
           "cores_busy": cpu["cores_busy"], "processes": cpu["processes"],
           "cpu_saturated": saturated}
    if rate_mbit and links["samples"] == 0:
        return {"verdict": "n/a", "reason": "no link sample fell into the transfer time",
                **out}
    if rate_mbit and links["blind_gap_s"]:  # the sampler was held up (stopped, starved)
        return {"verdict": "n/a", "reason": f"no link sample for {links['blind_gap_s']:.1f} "
                "s around a start or end of the transfer (the harness's sampler was held "
                "up): what the links carried then is not known", **out}
    v = verdict(links["load"], saturated)
    where = ", ".join(f"{k} {100 * share:.0f}% of the time"
                      for k, share in links["bottleneck_time"].items())
    if not rate_mbit:
        reason = (f"links unshaped: packets cross them as fast as the CPUs move them "
                  f"(the busiest carried {links['load_mbit_s']:.1f} Mbit/s: {where}; "
                  f"{cpu_said})")
    else:
        reason = (f"the bottleneck carried {100 * links['load']:.0f}% of {rate_mbit:g} "
                  f"Mbit/s over {span:.2f} s of transfer ({where}); CPU "
                  f"{'saturated' if saturated else 'not saturated'} ({cpu_said})")
        if links["samples"] < FEW_SAMPLES:
            reason += f"; only {links['samples']} link samples: coarse"
    return {"verdict": v, "reason": reason, **out}


def machine_cores(readings: dict) -> tuple[int, dict | None]:
    """The cores the run had: this machine's, or on a cluster the sum over every
    server's (``cores_by_server``, from each server's sampler; one that did not say,
    or that runs on the kernel of another, ``shared_kernel``, is left out of the sum),
    with that dict."""
    by_server = readings.get("cores_by_server")
    if not by_server:
        return readings["cores"], None
    shared = readings.get("shared_kernel") or {}
    return sum(c for name, c in by_server.items() if c and name not in shared), by_server


def cpu_cost(readings: dict | None, elements: int) -> dict | None:
    """CPU seconds per component over the run's window, and per million aggregated
    ``elements``; None for a run that never started its agents."""
    if not readings:
        return None
    per_melem = (lambda s: s / (elements / 1e6)) if elements else (lambda s: None)
    components: dict[str, dict] = {}
    unread = []
    for name, p in readings["processes"].items():
        if p["user_s"] is None:
            unread.append(name)
            continue
        c = components.setdefault(p["component"], {"user_s": 0.0, "system_s": 0.0,
                                                   "processes": 0})
        c["user_s"] += p["user_s"]
        c["system_s"] += p["system_s"]
        c["processes"] += 1
    components["harness"] = {**readings["harness"], "processes": 1}
    for c in components.values():
        c["total_s"] = c["user_s"] + c["system_s"]
        c["s_per_melem"] = per_melem(c["total_s"])
    machines = {"localhost": readings["machine"], **(readings.get("machine_by_server") or {})}
    apart = readings.get("irq_time_apart")
    softirq = sum(m["softirq"] for m in machines.values())
    irq = sum(m["irq"] for m in machines.values())
    kernel = {"softirq_s": softirq, "irq_s": irq, "total_s": softirq + irq,
              "scope": ("system-wide: every process of the machine, not only the run's"
                        if len(machines) == 1 else
                        f"system-wide on each of the run's {len(machines)} machines "
                        "(kernels): every process there, not only the run's"),
              "inside_process_system_time": None if apart is None else not apart}
    if len(machines) > 1:
        kernel["softirq_by_server"] = {name: m["softirq"] for name, m in machines.items()}
    kernel["s_per_melem"] = per_melem(kernel["total_s"])
    total = sum(c["total_s"] for c in components.values()) + (kernel["total_s"] if apart else 0)
    cores, by_server = machine_cores(readings)
    capacity = readings["window_s"] * cores
    return {"window_s": readings["window_s"], "cores": cores,
            **({"cores_by_server": by_server} if by_server else {}),
            **({"shared_kernel": readings["shared_kernel"]}
               if readings.get("shared_kernel") else {}),
            "elements_aggregated": elements, "components": components, "kernel": kernel,
            "total_s": total, "s_per_melem": per_melem(total),
            "share_of_machine": total / capacity if capacity else None,
            "processes": readings["processes"], "unread": unread}
