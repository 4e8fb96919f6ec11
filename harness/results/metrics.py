"""Every metric of the testbed, declared once: ``METRICS``.

A ``Metric`` says what a number is (name, unit, one-line definition), which function
computes it, how it combines over the jobs of a run and over the repeats of a sweep
point, and where it appears: per job in ``summary.json`` (``scope="job"``) or once per
run, as columns of ``sweep.csv`` and of the CLI's job table. ``harness/results/summary.py``
fills a job's metrics from ``job_values``, ``harness/sweeping/sweepcsv.py`` takes its columns
and a run's row from ``sweep_columns`` and ``sweep_values``, ``harness/results/tables.py`` the
CLI's columns from ``table_metrics``, and ``qaina-bench report`` writes README's
glossary from ``glossary``.

Out-of-tree metrics register through the entry point group ``qaina_bench.metrics``
(the entry point names a ``Metric``); a job metric adds a field to every job of
``summary.json`` and, with ``sweep``, a column to ``sweep.csv``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...p4.header import QAINA_WORDS
from ...plugins import Registry
from .resultset import read_csv

#: how a job metric becomes one number of a run in sweep.csv
COMBINE = ("sum", "mean", "max")
#: how the figures and docs combine a sweep point's repeats
REPEATS = "mean, with the range (min-max) of the repeats"


def _mean(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return float(np.max(values)) if values else None


def _sum(values):
    values = [v for v in values if v is not None]
    return float(np.sum(values)) if values else None


COMBINERS = {"sum": _sum, "mean": _mean, "max": _max}


def over_repeats(values) -> dict:
    """How the figures and the docs combine a sweep point's repeats (``REPEATS``): the
    mean, with the range of the repeats."""
    values = np.asarray(values, dtype=float)
    return {"mean": float(values.mean()), "min": float(values.min()),
            "max": float(values.max()), "repeats": len(values)}


@dataclass(frozen=True)
class Column:
    """A column of the CLI's job table: header, width, format, and a scale applied
    first (e.g. 1e3 for seconds shown in ms)."""
    head: str
    width: int
    fmt: str
    scale: float = 1.0

    def cell(self, value) -> str:
        if value is None:
            return f"{'n/a':>{self.width}}"
        value = value * self.scale if self.scale != 1 else value
        return f"{value:>{self.width}{self.fmt}}"


@dataclass(frozen=True)
class Metric:
    """One number the testbed reports.

    ``scope`` "job": ``compute(JobData)`` gives the value of a job's field ``name`` in
    ``summary.json`` (left out where ``applies(job)`` is false), and each ``(column,
    how)`` of ``sweep`` is a sweep.csv column combining the jobs' values by ``how``
    (sum, mean, max). ``scope`` "run": ``compute(summary, directory)`` gives the
    sweep.csv column ``name`` of a run from its summary (and its tables). ``source``
    says where the raw values come from when another module measures them."""
    name: str
    unit: str
    definition: str
    compute: Callable
    scope: str = "job"
    sweep: tuple[tuple[str, str], ...] = ()
    table: Column | None = None
    applies: Callable[[dict], bool] | None = None
    source: str = ""
    repeats: str = REPEATS

    def __post_init__(self):
        if self.scope not in ("job", "run"):
            raise ValueError(f"metric {self.name}: scope is job or run, not {self.scope!r}")
        for _, how in self.sweep:
            if how not in COMBINE:
                raise ValueError(f"metric {self.name}: combine by {'/'.join(COMBINE)}")

    @property
    def computed_in(self) -> str:
        """The module and function that compute it, e.g. ``harness/results/metrics.py:slots_peak``."""
        module = inspect.getmodule(self.compute)
        name = module.__name__ if module else "?"
        parts = name.split(".")
        path = "/".join(parts[1:] if parts[0] == "qaina_bench" else parts) + ".py"
        return f"{path}:{self.compute.__qualname__}"

    def columns(self) -> list[str]:
        """Its sweep.csv columns."""
        return [self.name] if self.scope == "run" else [c for c, _ in self.sweep]


METRICS: Registry[Metric] = Registry("metric", "qaina_bench.metrics")


@dataclass
class JobData:
    """What a job's metrics are computed from: its iteration rows (``rows``, every
    worker's, from ``iterations.csv``), its slot samples on its aggregator during its
    run, its warm-up records, and the ``job`` entry the run recorded."""
    job: dict
    rows: list[dict]
    slots: list[dict]
    warmups: list[dict]
    in_network: bool
    complete: list[int] = field(default_factory=list)

    def __post_init__(self):
        iterations = sorted({r["iteration"] for r in self.rows})
        self.complete = [i for i in iterations
                         if sum(1 for r in self.rows if r["iteration"] == i)
                         == self.job["workers"]]

    @property
    def start(self) -> float:
        return min(r["start"] for r in self.rows)

    @property
    def end(self) -> float:
        return max(r["end"] for r in self.rows)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def completion(self) -> np.ndarray:
        return np.array([r["completion_s"] for r in self.rows], dtype=float)

    def in_use(self) -> np.ndarray | None:
        """Slots in use at each sample (None: not in-network, or no sample)."""
        if not self.in_network or not self.slots:
            return None
        return np.array([float(s["slots_in_use"]) for s in self.slots])

    def total(self, key: str) -> int:
        return int(sum(r[key] or 0 for r in self.rows))


def add(metric: Metric) -> Metric:
    return METRICS.add(metric.name, metric)


def job_metric(name, unit, definition, **kw):
    """Decorator: register the function as the job metric ``name``."""
    def decorate(fn):
        add(Metric(name, unit, definition, fn, **kw))
        return fn
    return decorate


def run_metric(name, unit, definition, **kw):
    """Decorator: register the function as the run metric (sweep.csv column) ``name``."""
    def decorate(fn):
        add(Metric(name, unit, definition, fn, scope="run", **kw))
        return fn
    return decorate


def job_metrics() -> list[Metric]:
    return [METRICS.get(n) for n in METRICS.names() if METRICS.get(n).scope == "job"]


def job_values(data: JobData) -> dict:
    """Every job metric of one job, by name (``summary.json``'s fields)."""
    return {m.name: m.compute(data) for m in job_metrics()
            if m.applies is None or m.applies(data.job)}


def sweep_columns() -> list[str]:
    """sweep.csv's metric columns, in registration order."""
    return [c for n in METRICS.names() for c in METRICS.get(n).columns()]


def sweep_values(summary: dict, directory: Path) -> dict:
    """A run's sweep.csv metrics from its summary: job metrics combined over jobs,
    run metrics computed."""
    jobs = summary.get("jobs") or []
    out = {}
    for name in METRICS.names():
        m = METRICS.get(name)
        if m.scope == "run":
            out[m.name] = m.compute(summary, directory)
            continue
        for column, how in m.sweep:
            out[column] = COMBINERS[how]([j.get(m.name) for j in jobs])
    return out


def table_metrics() -> list[Metric]:
    """The job metrics of the CLI's job table, in registration order."""
    return [m for m in job_metrics() if m.table is not None]


def glossary() -> str:
    """README's glossary of metrics, a Markdown table made from the registry."""
    lines = ["| metric | unit | what it is | summary.json | sweep.csv | CLI | computed in |",
             "|---|---|---|---|---|---|---|"]
    for name in METRICS.names():
        m = METRICS.get(name)
        if m.scope == "job":
            where = "per job"
            sweep = ", ".join(f"`{c}` ({how} over jobs)" for c, how in m.sweep) or "-"
        else:
            where, sweep = "-", f"`{m.name}` (per run)"
        cli = f"`{m.table.head}`" if m.table else "-"
        source = f"; from {m.source}" if m.source else ""
        lines.append(f"| `{m.name}` | {m.unit} | {m.definition} | {where} | {sweep} | "
                     f"{cli} | `{m.computed_in}`{source} |")
    return "\n".join(lines) + "\n"


def steady(directory: Path, compressed: bool) -> tuple[float | None, float | None]:
    """Mean completion time and bytes a worker sent, over the iterations that ran the
    scheme (per job, then over jobs): the compressed ones with GradiVeQ, all otherwise."""
    try:
        rows = read_csv(directory / "iterations.csv")
    except OSError:
        return None, None
    times: dict[str, list[float]] = {}
    sent: dict[str, list[float]] = {}
    for r in rows:
        if compressed and str(r.get("compressed")) not in ("True", "1", "true"):
            continue
        if r.get("completion_s") not in (None, ""):
            times.setdefault(r["job"], []).append(float(r["completion_s"]))
            sent.setdefault(r["job"], []).append(float(r.get("bytes_sent") or 0))
    return (_mean([float(np.mean(v)) for v in times.values()]),
            _mean([float(np.mean(v)) for v in sent.values()]))


# -- the built-in metrics, in the order of sweep.csv's columns ----------------------------
SLOTS_SOURCE = ("slots_in_use = slots_opened - slots_closed per sample: "
                "`harness/running/sampling.py:Sampler._sample_slots`")
ERROR_SOURCE = "per worker and iteration against the exact fp32 sum: `hosts/agent.py`"


def _in_network(fn):
    """A job metric that is None where the switches only route (ring, ps)."""
    def wrapped(d: JobData):
        return fn(d) if d.in_network else None
    wrapped.__qualname__, wrapped.__module__ = fn.__qualname__, fn.__module__
    return wrapped


@job_metric("iterations_done", "iterations", "iterations every worker of the job completed",
            table=Column("iters", 5, "d"))
def iterations_done(d: JobData):
    return len(d.complete)


@job_metric("workers_reporting", "workers", "workers that recorded at least one iteration")
def workers_reporting(d: JobData):
    return len({r["worker"] for r in d.rows})


@job_metric("iteration_completion_mean_s", "s",
            "iteration completion time: a worker's first send of an iteration's gradient "
            "to its last aggregated chunk received and dequantized, mean over workers and "
            "iterations", sweep=(("iteration_s", "mean"),), table=Column("iter ms", 8, ".1f", 1e3))
def iteration_completion_mean_s(d: JobData):
    return float(d.completion().mean())


@run_metric("steady_iteration_s", "s",
            "iteration completion time over the iterations that ran the run's scheme (with "
            "GradiVeQ the compressed ones only), mean per job, then over jobs",
            source="`iterations.csv`")
def steady_iteration_s(summary: dict, directory: Path):
    return steady(directory, summary.get("compress") == "gradiveq")[0]


@job_metric("iteration_completion_p99_s", "s", "99th percentile of the iteration completion "
            "time", sweep=(("iteration_p99_s", "max"),), table=Column("p99 ms", 8, ".1f", 1e3))
def iteration_completion_p99_s(d: JobData):
    return float(np.percentile(d.completion(), 99))


@job_metric("job_completion_s", "s", "job completion: first send of iteration 0 to the "
            "last iteration done", sweep=(("job_completion_s", "mean"),
                                          ("job_completion_max_s", "max")),
            table=Column("job s", 6, ".2f"))
def job_completion_s(d: JobData):
    return d.duration


@job_metric("warmup_s", "s", "the one-time scale warm-up before iteration 0, the slowest "
            "worker's")
def warmup_s(d: JobData):
    return max((w["end"] - w["start"] for w in d.warmups), default=None)


@job_metric("elements_per_iteration", "elements", "gradient elements of one iteration")
def elements_per_iteration(d: JobData):
    return d.rows[0]["elements"]


@job_metric("elements_aggregated", "elements", "elements per iteration x iterations every "
            "worker completed: the numerator of `elements_per_s`")
def elements_aggregated(d: JobData):
    return d.rows[0]["elements"] * len(d.complete)


@job_metric("elements_per_s", "elements/s", "throughput: gradient elements aggregated per "
            "second of job completion", sweep=(("elements_per_s", "sum"),),
            table=Column("Melem/s", 8, ".3f", 1e-6))
def elements_per_s(d: JobData):
    return elements_aggregated(d) / d.duration if d.duration > 0 else None


@job_metric("fp32_equivalent_gbps", "Gbit/s", "throughput as 32-bit values: elements x 32 "
            "bit / s", sweep=(("fp32_gbps", "sum"),), table=Column("fp32 Gb/s", 9, ".4f"))
def fp32_equivalent_gbps(d: JobData):
    return elements_aggregated(d) * 32 / d.duration / 1e9 if d.duration > 0 else None


@job_metric("slots_peak", "slots", "most aggregator slots the job held at once, from the "
            "switch counters sampled every 10 ms (n/a where the switches only route)",
            sweep=(("slots_peak", "sum"),), table=Column("slots pk", 8, ".0f"),
            source=SLOTS_SOURCE)
@_in_network
def slots_peak(d: JobData):
    in_use = d.in_use()
    return None if in_use is None else float(in_use.max())


@job_metric("slots_mean", "slots", "aggregator slots the job held, mean over the samples "
            "of its run", table=Column("mean", 5, ".1f"), source=SLOTS_SOURCE)
@_in_network
def slots_mean(d: JobData):
    in_use = d.in_use()
    return None if in_use is None else float(in_use.mean())


@job_metric("slot_samples", "samples", "slot samples that fell into the job's run")
@_in_network
def slot_samples(d: JobData):
    return len(d.slots)


@job_metric("elements_per_register", "elements", "gradient elements one 32-bit register "
            "holds (m, the lanes)")
@_in_network
def elements_per_register(d: JobData):
    return d.job["lanes"]


@job_metric("register_bit_efficiency", "share", "register-bit efficiency: value bits "
            "(elements x b) / register bits the chunks occupy (payload words x 32), tail "
            "padding included", sweep=(("register_bit_efficiency", "mean"),),
            table=Column("eff", 5, ".2f"))
@_in_network
def register_bit_efficiency(d: JobData):
    words = d.job.get("payload_words", QAINA_WORDS)
    per_word, bits = words * d.job["lanes"], d.job["bits"]
    return float(np.mean([r["values"] * bits / (-(-r["values"] // per_word) * words * 32)
                          for r in d.rows]))


@job_metric("values_per_iteration_mean", "values", "values a worker sends per iteration "
            "(GradiVeQ: coefficients), mean")
def values_per_iteration_mean(d: JobData):
    return float(np.mean([r["values"] for r in d.rows]))


@job_metric("rel_error_mean", "ratio", "aggregation error: the L2 norm of (aggregate - "
            "exact fp32 sum of the same traces) / that of the exact sum, mean over workers "
            "and iterations",
            sweep=(("rel_error", "mean"),), table=Column("rel err", 8, ".4f"),
            source=ERROR_SOURCE)
def rel_error_mean(d: JobData):
    return _mean([r["rel_error"] for r in d.rows])


@job_metric("rel_error_max", "ratio", "the largest aggregation error of a worker and "
            "iteration", source=ERROR_SOURCE)
def rel_error_max(d: JobData):
    return _max([r["rel_error"] for r in d.rows])


@job_metric("retransmissions", "packets", "in-network: chunks sent again; ring and ps: TCP "
            "segments the kernel retransmitted", sweep=(("retransmissions", "sum"),),
            table=Column("retx", 5, "d"))
def retransmissions(d: JobData):
    return d.total("retransmissions")


@job_metric("timeouts", "events", "retransmission timers that fired")
def timeouts(d: JobData):
    return d.total("timeouts")


@job_metric("refused", "datagrams", "datagrams the agents refused as not their "
            "aggregator's results, warm-up included")
def refused(d: JobData):
    return d.total("refused") + sum(w.get("refused", 0) for w in d.warmups)


@job_metric("clipped_elements", "elements", "values clipped to a predicted scale")
def clipped_elements(d: JobData):
    return d.total("clipped")


@job_metric("bytes_sent", "bytes", "bytes the job's workers sent",
            sweep=(("bytes_sent", "sum"),))
def bytes_sent(d: JobData):
    return d.total("bytes_sent")


@job_metric("bytes_received", "bytes", "bytes the job's workers received")
def bytes_received(d: JobData):
    return d.total("bytes_received")


@run_metric("bytes_per_iteration", "bytes", "bytes a worker sent per iteration, mean per "
            "job, then over jobs")
def bytes_per_iteration(summary: dict, directory: Path):
    return _mean([j["bytes_sent"] / (j["workers"] * j["iterations_done"])
                  for j in summary.get("jobs") or [] if j.get("iterations_done")])


@run_metric("steady_bytes_per_iteration", "bytes", "`bytes_per_iteration` over the "
            "iterations of `steady_iteration_s`", source="`iterations.csv`")
def steady_bytes_per_iteration(summary: dict, directory: Path):
    return steady(directory, summary.get("compress") == "gradiveq")[1]


@run_metric("span_s", "s", "the first packet of any agent (warm-up included) to the last "
            "iteration done", source="`harness/results/summary.py:summarise`")
def span_s(summary: dict, directory: Path):
    return summary.get("span_s")


@run_metric("cpu_saturated", "0/1", "1 if the sampler found the CPU saturated (all cores or "
            "a process over 90% busy; niced work left out, as in the verdict): the rule of "
            "runs without a fidelity verdict",
            source="`harness/running/sampling.py:Sampler.cpu`")
def cpu_saturated(summary: dict, directory: Path):
    return 1 if ((summary.get("validity") or {}).get("cpu") or {}).get("saturated") else 0


@run_metric("fidelity", "verdict", "what bound the run's jobs: network-bound, cpu-bound, "
            "mixed or n/a (empty before the verdict existed)",
            source="`harness/results/fidelity.py:job_fidelity`, `overall`")
def fidelity(summary: dict, directory: Path):
    return (summary.get("fidelity") or {}).get("verdict")


@run_metric("cpu_s_per_melem", "CPU s/Melem", "CPU seconds of the run's processes per "
            "million aggregated elements", source="`harness/results/fidelity.py:cpu_cost`")
def cpu_s_per_melem(summary: dict, directory: Path):
    return (summary.get("cpu_cost") or {}).get("s_per_melem")


@run_metric("cpu_busy", "share", "the cores' busy share, mean over the run (niced work "
            "left out since 2026-12-07, as in the verdict; counted before)",
            source="`harness/running/sampling.py:Sampler.cpu`")
def cpu_busy(summary: dict, directory: Path):
    return ((summary.get("validity") or {}).get("cpu") or {}).get("cores_busy_mean")


@run_metric("warnings", "warnings", "how many validity warnings the run has",
            source="`harness/results/summary.py:validity`")
def warnings(summary: dict, directory: Path):
    return len((summary.get("validity") or {}).get("warnings") or [])


@run_metric("jobs_fit", "0/1", "1 for a point that ran; 0 for a point whose jobs the pool "
            "refused", source="`harness/sweeping/sweeprun.py` (the refused points)")
def jobs_fit(summary: dict, directory: Path):
    return 1


@run_metric("switch_link_bytes", "bytes", "bytes that crossed switch-to-switch links",
            source="`harness/results/summary.py:tier_bytes`")
def switch_link_bytes(summary: dict, directory: Path):
    return (summary.get("tier_bytes") or {}).get("switch_links")


def _arrived(job: dict) -> bool:
    return job.get("admitted_s") is not None


@job_metric("turnaround_s", "s", "with `--arrivals`: the job's arrival to its last "
            "iteration done", sweep=(("turnaround_s", "mean"), ("turnaround_max_s", "max")),
            applies=_arrived)
def turnaround_s(d: JobData):
    return d.end - d.job["arrived_at"]


@job_metric("wait_s", "s", "with `--arrivals`: the job's admission minus its arrival",
            sweep=(("wait_s", "mean"),), applies=_arrived)
def wait_s(d: JobData):
    return d.job["admitted_s"] - d.job["arrival_s"]


@job_metric("switch_share", "share", "with `--allocation shared`: the share of the job's "
            "chunks the switch summed whole", sweep=(("switch_share", "mean"),),
            applies=lambda job: job.get("fallback") is not None)
def switch_share(d: JobData):
    fb = d.job["fallback"]
    done = fb["chunks_switch"] + fb["chunks_hosts"]
    return fb["chunks_switch"] / done if done else None
