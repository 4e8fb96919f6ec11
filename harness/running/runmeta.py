"""What a run writes when it ends: the facts only the run knows (events, jobs' slots
and arrivals, processes, switch ports, fallback hosts' counts) handed with the
agents' records to ``harness/results/summary.py``, which computes every figure; and
the run's id (``new_run_id``), which names its result set."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ...p4.header import QAINA_WORDS

from ..results.summary import summarise
from ..switches.jobs import Job
from .remotesampling import merge_samples


def fallback_stats(run, job: Job) -> dict | None:
    """--allocation shared: what the job's fallback host counted (None: no file)."""
    path = run.writer.dir / "agents" / f"fallback{job.job_id}-stats.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def arrival(run, index: int) -> dict:
    """--arrivals: when job ``index`` arrived, was admitted and left, in seconds
    after the start signal (None: it was not); {} without --arrivals."""
    if run.offsets is None:
        return {}
    a = run.admission.arrivals[index] if run.admission else None
    go = run.events.get("agents_go", 0.0)
    since = (lambda t: None if t is None else t - go)
    return {"arrival_s": run.offsets[index], "arrived_at": go + run.offsets[index],
            "admitted_s": since(a.admitted) if a else None,
            "left_s": since(a.left) if a else None}


def switch_ports(run) -> dict | None:
    """The embedded switches' port counters as they wrote them on stopping (None
    for BMv2)."""
    out = {}
    for name, path in getattr(run, "port_stats", {}).items():
        try:
            out[name] = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            pass
    return out or None


def write_results(run) -> dict:
    """The run's summary.json, and the summary, from what ``run`` (a ``Run``) knows."""
    agents = [{"job": a.job, "worker": a.worker, "host": a.host, "records": a.records()}
              for a in run.agents]
    work = run.cfg.workload
    readings = run.ledger.readings()  # remote processes' CPU folded in by merge_samples
    clocks = merge_samples(run.writer, run.sampler.remote if run.sampler is not None else [],
                           readings)
    allocation = work.allocation if run.mode.in_switch else None
    meta = {"run_id": run.cfg.output.run_id, "status": run.status, "events": run.events,
            "aggregator": getattr(run, "aggregator", None),
            "switch_program": run.switch_program,
            **(run.sampler.summary() if run.sampler is not None else {}),
            "interfaces": run.interfaces, "cpu_time": readings,
            "switch_ports": switch_ports(run), "clock_offsets": clocks or None,
            "warnings": list(run.files.problems), "link_loss": applied_loss(run),
            "link_outages": getattr(run, "links", None) and run.links.outages or [],
            "processes": [{"name": p.name, "component": p.component, "job": p.job}
                          for p in run.ledger.tracked.values()],
            "jobs": [{"job_id": j.job_id, "index": j.index, "bits": j.fmt.bits,
                      "workers": j.fmt.workers, "lane_width": j.fmt.width,
                      "lanes": j.fmt.lanes, "packed": j.fmt.packed,
                      "payload_words": run.cfg.network.payload_words,
                      "slot_base": j.slot_base, "slots": j.slot_count,
                      **arrival(run, j.index), "allocation": allocation,
                      **({"fallback": fallback_stats(run, j)} if run.shared else {}),
                      "hosts": [w.host for w in j.workers]
                      + ([run.servers[j.index]] if run.servers else [])}
                     for j in run.jobs]}
    return summarise(run.writer, run.cfg, meta, agents)


def applied_loss(run) -> dict | None:
    """How the run's link loss was made and, for nftables rules, what they lost."""
    if not run.cfg.network.loss:
        return None
    if run.netem:
        return {"by": "netem"}
    seen = run.testbed.link_loss if run.testbed is not None else None
    return {"by": "nftables", **(seen or {"error": "the network did not come up"})}


def new_run_id(cfg) -> str:
    """Time and what was run: topology, mode, jobs x workers, bits, compression,
    trace and link settings, e.g. ``20261130-101500-leafspine-ina-j2w4b4-digits-mlp-bw1``."""
    net, work, comp, tr = cfg.network, cfg.workload, cfg.compression, cfg.training
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    parts = [stamp, cfg.topology().short(), work.mode,
             f"j{work.jobs}w{work.workers}b{'-'.join(str(b) for b in work.bits)}"]
    if not comp.pack:
        parts.append("unpacked")
    if net.payload_words != QAINA_WORDS:
        parts.append(f"pw{net.payload_words}")
    if comp.quantizer != "maxpow2":
        parts.append(comp.quantizer)
    if comp.error_feedback:
        parts.append("ef")
    if comp.compress != "none":
        parts.append(comp.compress)
    parts.append(f"train-{tr.model}" if tr.train else
                 f"script-{Path(tr.train_script).stem}" if tr.train_script else tr.trace)
    for name, value in (("bw", net.bw), ("delay", net.delay), ("loss", net.loss),
                        ("cpu", net.host_cpu)):
        if value:
            parts.append(f"{name}{value:g}" if isinstance(value, float) else f"{name}{value}")
    if net.target != "embedded":
        parts.append(net.target)
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100]
