"""``summary.json`` of a result set: every figure, computed from its tables.

``summarise`` writes ``iterations.csv`` from the agents' records and computes every
number of ``summary.json`` from the rows of ``iterations.csv`` and
``timeseries.csv`` (``job_summary``: every job metric of the registry in
``harness/results/metrics.py``, completion times, throughput, slot usage, register-bit
efficiency, aggregation error and what a plugin adds; ``validity``: what may make the figures
untrustworthy; ``fidelity``: what bound each job, links or CPU, and ``cpu_cost``: the
CPU seconds of each component, both defined in ``harness/results/fidelity.py``);
``tests/test_summary.py`` checks the figures on tables worked out by hand,
``tests/test_summary_run.py`` a real run's against sources of their own.
``load_summary``, ``describe_run`` and ``list_runs`` read result sets back.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import time
from pathlib import Path


from .fidelity import SAMPLE_GAP, cpu_cost, job_fidelity, overall
from .metrics import JobData, _mean, job_values  # noqa: F401  (_mean: for older imports)
from ..modes import in_switch
from .plots import plot
from .resultset import ITERATION_COLUMNS, ResultWriter, read_csv, read_text


def iteration_rows(agents: list[dict]) -> list[dict]:
    rows = []
    for a in agents:
        for r in a["records"]:
            if r.get("type") == "iteration":
                rows.append({"job": a["job"], "worker": a["worker"],
                             **{k: r.get(k) for k in ITERATION_COLUMNS[2:]}})
    rows.sort(key=lambda r: (r["job"], r["iteration"], r["worker"]))
    return rows


def software_versions() -> dict:
    """Versions of what ran the run; ``protobuf_implementation`` is the runtime the
    control plane parsed P4Runtime with (upb, cpp or python)."""
    from importlib import metadata

    from ...p4.proto import PROVIDER, implementation
    out = {"python": platform.python_version(), "kernel": platform.release()}
    for dist in ("qaina-bench", "numpy", "grpcio", "protobuf", PROVIDER, "mininet", "scapy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["protobuf_implementation"] = implementation()
    return out


def machine_description() -> dict:
    """The machine the harness ran on: its CPU model, cores (and those the run could
    use), memory and architecture. The same run moves about twice the elements a second
    on one x86 server as on another: figures from two machines compare only with it."""
    import os

    import psutil
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "architecture": platform.machine()}


def learning(rows: list[dict], start: float, target: float) -> dict:
    """What a closed-loop run (``--train``) learned: the test accuracy over time (from
    worker 0, which measures it), the last, and when ``target`` was first reached."""
    points = sorted((r["iteration"], r["end"] - start, r["test_accuracy"]) for r in rows
                    if r.get("test_accuracy") is not None)
    if not points:
        return {}
    reached = next((p for p in points if p[2] >= target), None)
    return {"accuracy_curve": [{"iteration": i + 1, "time_s": t, "test_accuracy": a}
                               for i, t, a in points],
            "final_test_accuracy": points[-1][2],
            "target_accuracy": target,
            "time_to_target_s": reached[1] if reached else None,
            "iterations_to_target": reached[0] + 1 if reached else None}


def job_summary(job: dict, rows: list[dict], samples: list[dict], aggregator: str | None,
                warmups: list[dict], target_accuracy: float = 0.9) -> dict:
    """The summary of one job from its iteration rows and switch samples: every job
    metric of ``harness/results/metrics.py`` (``METRICS``), and what it learned (``--train``)."""
    mine = [r for r in rows if r["job"] == job["job_id"]]
    out = dict(job)
    if not mine:
        out.update(iterations_done=0)
        return out
    start = min(r["start"] for r in mine)
    end = max(r["end"] for r in mine)
    slots = [s for s in samples if int(s["job"]) == job["job_id"]
             and (aggregator is None or s["switch"] == aggregator)
             and start <= float(s["time"]) <= end]
    # in_network False: a mode that does not aggregate in the switch (they only route)
    data = JobData(job, mine, slots, warmups, in_network=aggregator is not None)
    out.update(job_values(data))
    out.update(learning(mine, start, target_accuracy))
    return out


MIN_SLOT_SAMPLES = 20


#: drop reasons that mean a host sent what it may not: source validation
FORGERY_DROPS = ("spoofed_source", "forged_result")


def drop_summary(samples: list[dict]) -> dict[str, dict[str, int]]:
    """Per switch, its packets dropped by reason over the run (the last sample)."""
    out: dict[str, dict[str, int]] = {}
    for s in samples:
        out.setdefault(s["switch"], {})[s["reason"]] = int(s["drops"])
    return {sw: dict(sorted(reasons.items())) for sw, reasons in sorted(out.items())}


def validity(rows: list[dict], jobs: list[dict], cpu: dict | None,
             drops: dict[str, dict[str, int]] | None = None,
             ports: dict[str, dict] | None = None) -> dict:
    """What may make the run's figures untrustworthy, with a warning for each that
    applies: packets the agents refused, packets the switches' source validation
    dropped (``drops``: ``drop_summary``), retransmissions, clipped values, and jobs
    that were not network-bound (their ``fidelity``; ``cpu``: busy shares the
    sampler kept, whose saturation is the warning of runs without a verdict), and
    frames an embedded switch could not take (``ports``: its port counters)."""
    sent = sum(r["packets_sent"] or 0 for r in rows)
    retx = sum(r["retransmissions"] or 0 for r in rows)
    values = sum(r["values"] or 0 for r in rows)
    clipped = sum(r["clipped"] or 0 for r in rows)
    out = {
        "refused_packets": sum(j.get("refused", 0) for j in jobs),
        "forged_packets": {reason: sum(d.get(reason, 0) for d in (drops or {}).values())
                           for reason in FORGERY_DROPS},
        "retransmission_share": retx / sent if sent else 0.0,
        "clipped_share": clipped / values if values else 0.0,
        "cpu": cpu,
        "switch_overload": {sw: {k: sum(p.get(k, 0) for p in by_port.values())
                                 for k in ("shed", "rx_dropped")}
                            for sw, by_port in (ports or {}).items()},
        "warnings": [],
    }
    warn = out["warnings"]
    for sw, o in out["switch_overload"].items():
        if o["shed"] or o["rx_dropped"]:
            warn.append(f"switch {sw} could not keep up at times: it shed {o['shed']} frames "
                        f"and the kernel dropped {o['rx_dropped']} from its full receive "
                        "rings (the switch, not the links, limited the run then)")
    for sw, by_port in (ports or {}).items():
        long = sum(p.get("rx_oversize", 0) for p in by_port.values())
        if long:
            warn.append(f"switch {sw} dropped {long} frames longer than its ports take: a "
                        "link's MTU is above what the embedded switch forwards (its log "
                        "says how long)")
    if out["refused_packets"]:
        warn.append(f"agents refused {out['refused_packets']} datagrams that were not results "
                    "of their aggregator: something else sent to the workers' port")
    for reason, n in out["forged_packets"].items():
        if n:
            where = ", ".join(sw for sw, d in drops.items() if d.get(reason))
            warn.append(f"the switches dropped {n} packets as {reason} ({where}): a host "
                        "sent with an address or as an aggregator it is not")
    if out["retransmission_share"] > 0.01:
        warn.append(f"{100 * out['retransmission_share']:.1f}% of the packets were "
                    "retransmissions: timings include loss recovery")
    if out["clipped_share"] > 0.001:
        warn.append(f"{100 * out['clipped_share']:.2f}% of the values were clipped to a "
                    "predicted scale: the error includes clipping")
    few = [j["job_id"] for j in jobs if j.get("slot_samples") is not None
           and j.get("iterations_done") and j["slot_samples"] < MIN_SLOT_SAMPLES]
    if few:
        warn.append(f"job(s) {', '.join(map(str, few))} ran for fewer than "
                    f"{MIN_SLOT_SAMPLES} slot samples: their slot figures are coarse")
    judged = [j for j in jobs if (j.get("fidelity") or {}).get("verdict", "n/a") != "n/a"]
    for j in judged:
        f = j["fidelity"]
        if f["verdict"] != "network-bound":
            warn.append(f"job {j['job_id']} was {f['verdict']}, not network-bound "
                        f"({f['reason']}): its timings measure the machine as much as "
                        "the network")
    if not judged and cpu and cpu.get("saturated"):
        warn.append(f"CPU saturated during the run ({cpu['saturated']}): timings measure "
                    "the machine, not the network")
    return out


def tier_bytes(links: dict, peers: dict) -> dict:
    """Bytes that crossed the links between hosts and switches and the links between
    switches, both directions, from ``link_summary`` and the interfaces' far ends."""
    switches = {name.rsplit("-", 1)[0] for name in peers}
    out = {"host_links": 0, "switch_links": 0}
    for name, b in links.items():
        if peers.get(name) in switches:  # both ends are counted: take what each sent
            out["switch_links"] += b["bytes_sent"]
        elif name in peers:
            out["host_links"] += b["bytes_sent"] + b["bytes_recv"]
    return out


def link_summary(samples: list[dict]) -> dict:
    """Wire bytes per switch interface over the run (first to last sample)."""
    first, last = {}, {}
    for s in samples:
        first.setdefault(s["interface"], s)
        last[s["interface"]] = s
    return {name: {"bytes_sent": int(last[name]["bytes_sent"]) - int(first[name]["bytes_sent"]),
                   "bytes_recv": int(last[name]["bytes_recv"]) - int(first[name]["bytes_recv"])}
            for name in sorted(first)}


def sampling_warnings(slots: dict | None) -> list[str]:
    """A warning when slot usage went unsampled for a long spell (the harness held up:
    stopped, or starved of CPU)."""
    longest = (slots or {}).get("interval_max_s")
    if longest is None or longest < SAMPLE_GAP:
        return []
    return [f"slot usage went unsampled for {longest:.1f} s at a time (the harness's "
            f"sampler was held up; the target is {slots['interval_target_s']:g} s): the "
            "slot figures miss that time"]


def loss_summary(applied: dict | None, percent: float | None) -> dict | None:
    """The link loss the run asked for and, where nftables made it, the frames its
    rules saw and lost over all links (``harness/running/linkloss.py``)."""
    if applied is None:
        return None
    out = {"percent": percent, **applied}
    ends = applied.get("interfaces")
    if ends:
        for key in ("frames", "bytes", "lost", "lost_bytes"):
            out[key] = sum(c.get(key, 0) for c in ends.values())
        # bytes: a host's TCP bursts pass the rules whole (``parse_counts``)
        out["lost_share"] = out["lost_bytes"] / out["bytes"] if out["bytes"] else None
    return out


def outage_warnings(outages: list[dict]) -> list[str]:
    """A warning for each link that went down while the jobs ran (``LinkWatch``): the
    iterations it held up measure the outage, not the network."""
    return [f"link {o['link']} was {o['state']} from {o['down_s']:.1f} s "
            + (f"to {o['up_s']:.1f} s" if o["up_s"] is not None else "until the jobs ended")
            + " after the jobs started: the iterations it held up measure the outage"
            for o in outages]


def loss_warnings(loss: dict | None, links: dict) -> list[str]:
    """Warnings for loss asked for but not made: rules' counters unread, frames a
    switch interface sent that its rule never saw, or far fewer losses than the rate
    gives."""
    if not loss or loss.get("by") != "nftables":
        return []
    out = [f"{loss['error']}: the loss those links had is not known"] if "error" in loss else []
    ends = loss.get("interfaces") or {}
    unseen = [name for name, b in sorted(links.items())
              if b["bytes_sent"] and name in ends and not ends[name]["frames"]]
    if unseen:
        out.append(f"the links carried frames that the nftables loss rules never saw "
                   f"({', '.join(unseen[:4])}{', ...' if len(unseen) > 4 else ''}): the "
                   "kernel did not run their egress hook, so those links were lossless")
    expected = (loss.get("frames") or 0) * loss["percent"] / 100
    if expected >= 25 and loss["lost"] < expected - 5 * expected ** 0.5:
        out.append(f"the loss rules lost {loss['lost']} of {loss['frames']} frames, far "
                   f"below the {expected:.0f} that {loss['percent']:g}% gives: the links "
                   "lost less than asked")
    return out


def fidelity(job: dict, rows: list[dict], series: dict, cfg, meta: dict) -> dict:
    """The job's fidelity verdict (``harness/results/fidelity.py``) from the run's tables: the
    links of its hosts and the processes it depends on, as the run recorded them."""
    processes = [p["name"] for p in meta.get("processes", [])
                 if p.get("job") in (None, job["job_id"])]
    return job_fidelity(job["job_id"], set(job.get("hosts", [])), rows, series,
                        meta.get("interfaces", {}), cfg.network.bw, processes)


def congestion_reported(agents: list[dict], job_id: int) -> str | None:
    """The TCP congestion control a job's agents found on their connections (the ring,
    the parameter server; None where they have none), comma-separated where it differs."""
    said = {r["tcp_congestion"] for a in agents if a["job"] == job_id for r in a["records"]
            if r.get("type") == "start" and r.get("tcp_congestion")}
    return ",".join(sorted(said)) or None


def run_setup(cfg, meta: dict) -> dict:
    """What was run: the summary's fields taken from the configuration."""
    net, work, comp, tr = cfg.network, cfg.workload, cfg.compression, cfg.training
    return {
        "target": net.target,
        "switch_program": meta.get("switch_program", {"target": net.target}),
        "topology": net.topo,
        "aggregator": meta.get("aggregator"),
        "jobs_count": work.jobs,
        "workers": work.workers,
        "bits": cfg.job_bits(),
        "iterations": work.iterations,
        "trace": None if tr.train or tr.train_script else tr.trace,
        "train_script": ({"script": tr.train_script, "args": tr.train_args}
                         if tr.train_script else None),
        "train": {"model": tr.model, "lr": tr.lr, "batch_size": tr.batch_size}
        if tr.train else None,
        "compress": comp.compress,
        "quantizer": "signmean" if cfg.job_bits() == [1] * work.jobs else comp.quantizer,
        "error_feedback": comp.error_feedback,
        "mode": work.mode,
        "levels": net.levels,
        "allocation": work.allocation if in_switch(work.mode) else None,
        "payload_words": net.payload_words,
        "packed": comp.pack,
        "links": {"bw_mbit": net.bw, "delay": net.delay, "loss_percent": net.loss},
        "host_cpu": net.host_cpu,
    }


def summarise(writer: ResultWriter, cfg, meta: dict, agents: list[dict]) -> dict:
    """Write iterations.csv, summary.json and the plots; returns the summary."""
    writer.close()
    rows = iteration_rows(agents)
    with open(writer.dir / "iterations.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ITERATION_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    series = read_csv(writer.dir / "timeseries.csv")
    by_kind: dict[str, list[dict]] = {}
    for row in series:
        by_kind.setdefault(row["kind"], []).append(row)
    slot_samples = by_kind.get("slots", [])
    drops = drop_summary(by_kind.get("drops", []))
    link_samples = by_kind.get("link", [])
    first_send = min((r["start"] for a in agents for r in a["records"]
                      if r.get("type") in ("warmup", "iteration")), default=None)
    jobs = []
    for job in meta["jobs"]:
        warmups = [r for a in agents if a["job"] == job["job_id"] for r in a["records"]
                   if r.get("type") == "warmup"]
        aggregator = meta.get("aggregator") if in_switch(cfg.workload.mode) else None
        jobs.append(job_summary(job, rows, slot_samples, aggregator, warmups,
                                cfg.training.target_accuracy))
        jobs[-1]["fidelity"] = fidelity(jobs[-1], rows, by_kind, cfg, meta)
        jobs[-1]["tcp_congestion_control"] = congestion_reported(agents, job["job_id"])
    errors = [r.get("message") for a in agents for r in a["records"] if r.get("type") == "error"]
    summary = {
        "run_id": meta["run_id"],
        "status": meta["status"],
        "complete": meta["status"] == "complete",
        **run_setup(cfg, meta),
        "startup_to_first_send_s": (first_send - meta["events"]["invoked"]
                                    if first_send else None),
        # first packet of any agent (warm-up included) to the last iteration done
        "span_s": (max(r["end"] for r in rows) - first_send) if rows and first_send else None,
        "events": meta["events"],
        "jobs": jobs,
        "link_bytes": link_summary(link_samples),
        "link_loss": loss_summary(meta.get("link_loss"), cfg.network.loss),
        # links of this machine's switches that went down while the jobs ran
        "link_outages": meta.get("link_outages") or [],
        "tier_bytes": tier_bytes(link_summary(link_samples), meta.get("interfaces") or {}),
        "interfaces": meta.get("interfaces"),  # switch interface -> node at its far end
        "processes": meta.get("processes"),  # what the run started: component, job
        "slot_sampling": meta.get("slot_sampling"),
        "errors": writer.errors + [e for e in errors if e],
        "fidelity": {"verdict": overall([j["fidelity"]["verdict"] for j in jobs]),
                     "jobs": {str(j["job_id"]): j["fidelity"]["verdict"] for j in jobs}},
        "cpu_cost": cpu_cost(meta.get("cpu_time"),
                             sum(j.get("elements_aggregated", 0) for j in jobs)),
        "drops": drops,
        "switch_ports": meta.get("switch_ports"),
        # another server's clock minus this machine's, when its sampler started (s)
        "clock_offsets": meta.get("clock_offsets"),
        "validity": validity(rows, jobs, meta.get("cpu"), drops, meta.get("switch_ports")),
        "software": software_versions(),
        "machine": machine_description(),
        "config": cfg.to_dict(),
        "written": time.time(),
    }
    summary["validity"]["warnings"] += meta.get("warnings") or []  # e.g. a server's copy
    summary["validity"]["warnings"] += loss_warnings(summary["link_loss"],
                                                     summary["link_bytes"])
    summary["validity"]["warnings"] += sampling_warnings(summary["slot_sampling"])
    summary["validity"]["warnings"] += outage_warnings(summary["link_outages"])
    write_summary(writer.dir / "summary.json", summary)
    try:
        plot(writer.dir, rows, slot_samples, meta)
    except Exception as exc:  # plots are a convenience; the numbers are in the files
        summary["errors"].append(f"plotting failed: {exc}")
        try:  # no half-written figure (a full disk)
            (writer.dir / "iterations.png").unlink(missing_ok=True)
        except OSError:
            pass
        write_summary(writer.dir / "summary.json", summary)
    return summary


def finite_json(value):
    """``value`` with every number that is not finite (NaN, infinity) as None, n/a:
    JSON has no such numbers, and a file holding them is no JSON to other readers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def write_summary(path: Path, summary: dict):
    """``summary`` as ``path``'s JSON: valid JSON, each non-finite number as null."""
    path.write_text(json.dumps(finite_json(summary), indent=1, allow_nan=False))


class SummaryError(ValueError):
    """A result set's summary is missing or unreadable."""


def load_summary(directory: Path) -> dict:
    path = Path(directory) / "summary.json"
    try:
        summary = json.loads(read_text(path))
    except FileNotFoundError:
        raise SummaryError(f"{directory} has no summary.json (not a result set, or its run "
                           "is still going)") from None
    except (OSError, ValueError) as exc:
        raise SummaryError(f"{path} is unreadable: {exc}") from None
    except RecursionError:
        raise SummaryError(f"{path} is unreadable: nested too deeply") from None
    if not isinstance(summary, dict) or "jobs" not in summary:
        raise SummaryError(f"{path} is not a qaina-bench summary")
    return summary


def describe_run(directory: Path) -> str:
    """One line: status, mode, compression, trace, bits, links; never raises."""
    try:
        s = load_summary(directory)
        return _describe(s)
    except SummaryError as exc:
        return f"? ({exc})"
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:
        return f"? (summary.json is not a summary this qaina-bench can read: {exc})"


def _describe(s: dict) -> str:
    links = s.get("links") or {}
    link = ", ".join(f"{k} {v}" for k, v in (("bw", links.get("bw_mbit")),
                                              ("delay", links.get("delay")),
                                              ("loss%", links.get("loss_percent"))) if v)
    return (f"{s.get('status', '?'):11} {s.get('topology', '?')} {s.get('target', '?')} "
            f"{s.get('mode', 'ina')} b={','.join(map(str, s.get('bits', [])))} "
            f"{s.get('jobs_count', '?')}x{s.get('workers', '?')} {s.get('trace', '?')}"
            f"{' ' + s['compress'] if s.get('compress', 'none') != 'none' else ''}"
            f"{' (' + link + ')' if link else ''}")


def started(directory: Path) -> float:
    """When a result set's run started (seconds since the epoch): its summary's
    ``events.invoked``, else (no summary yet, or none that says) the folder's last
    change; 0 if neither can be read."""
    try:
        invoked = (load_summary(directory).get("events") or {}).get("invoked")
    except (SummaryError, AttributeError):
        invoked = None
    if isinstance(invoked, (int, float)) and not isinstance(invoked, bool):
        try:
            if math.isfinite(invoked):
                return float(invoked)
        except OverflowError:  # an integer past float's range
            pass
    try:
        return Path(directory).stat().st_mtime
    except OSError:
        return 0.0


def list_runs(results_dir: Path) -> list[Path]:
    """The result sets in ``results_dir`` (folders with a config.yaml), oldest first:
    by when their runs started (``started``), then by name."""
    runs = [p for p in Path(results_dir).glob("*") if (p / "config.yaml").exists()]
    return sorted(runs, key=lambda p: (started(p), p.name))
