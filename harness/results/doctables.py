"""The tables and quoted values of the docs, made from the CSVs in ``docs/data/``.

``BLOCKS`` maps a marked block's name to the function that writes it, ``VALUES`` a
marked value's (``harness/results/report.py`` has the markers). A sweep's points combine their
repeats as the figures do: the mean, with the range of the repeats where it shows at
the table's precision. ``docs/data/README.md`` says where each CSV comes from.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np

from .docformat import (DocData, f2, f3, mbytes, seconds, sig2, sig3, span, spread, table,
                        values, verdicts, wait)
from .metrics import glossary
from .perftables import (_headline_before, _headline_melem, cost, headline, history,
                         overload, overload_kept, scale, variants)


def qaina_jobs(d: DocData) -> str:
    """Per scheme: the most jobs the pool served (and where it refused), one job's
    completion time and the aggregate Melem/s of one job and at best."""
    body = []
    for scheme, by_jobs in _qaina(d).items():
        served = max(n for n, rs in by_jobs.items() if rs)
        refused = [n for n, rs in by_jobs.items() if not rs]
        slots = int(d.points("qaina-jobs", ("scheme",))[(scheme,)][0]["slots"])
        pool = int(d.rows("qaina-jobs")[0]["pool_slots"])
        fits = (f"{served} of {served} (the pool holds {pool // slots})" if not refused
                else f"{served} (refused at {min(refused)})")
        rate = {n: np.mean(values(rs, "elements_per_s")) / 1e6 for n, rs in by_jobs.items()
                if rs}
        best = max(rate, key=rate.get)
        body.append([scheme, fits, spread(values(by_jobs[1], "job_completion_s"), seconds, " s"),
                     f"{sig2(rate[1])} / {sig2(rate[best])} at {best} jobs",
                     verdicts([r for rs in by_jobs.values() for r in rs])])
    return table(["scheme", "jobs the pool served (refused at)", "job completion, 1 job",
                  "aggregate Melem/s, 1 job / best", "verdicts"], body)


def _qaina(d: DocData) -> dict[str, dict[int, list[dict]]]:
    """The qaina-jobs sweep's completed runs by scheme and number of jobs ([] where the
    pool refused the point)."""
    out: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for r in d.rows("qaina-jobs"):
        runs = out[r["scheme"]].setdefault(int(r["jobs"]), [])
        if r["status"] == "complete":
            runs.append(r)
    return out


def qaina_completion(scheme: str, jobs: int) -> Callable[[DocData], str]:
    return lambda d: seconds(np.mean(values(_qaina(d)[scheme][jobs], "job_completion_s"))) + " s"


def qaina_best(scheme: str) -> Callable[[DocData], str]:
    """The most aggregate Melem/s of ``scheme``'s points, and at how many jobs."""
    def make(d: DocData) -> str:
        rate = {n: np.mean(values(rs, "elements_per_s")) / 1e6
                for n, rs in _qaina(d)[scheme].items() if rs}
        best = max(rate, key=rate.get)
        return f"{sig2(rate[best])} Melem/s at {best} jobs"
    return make


def gradiveq(d: DocData) -> str:
    pts = d.points("gradiveq", ("scheme",))
    base = np.mean(values(pts[("fp32 ring",)], "steady_iteration_s"))
    body = []
    for (scheme,), rs in pts.items():
        t = values(rs, "steady_iteration_s")
        body.append([scheme, spread(t, seconds, " s"), f"{base / np.mean(t):.3g}x",
                     f"{np.mean(values(rs, 'steady_bytes_per_iteration')) / 1e6:.3g} MB",
                     verdicts(rs)])
    return table(["scheme", "aggregation time per iteration", "speed-up over fp32 ring",
                  "bytes a worker sends per iteration", "verdicts"], body)


def gradiveq_time(scheme: str) -> Callable[[DocData], str]:
    return lambda d: seconds(np.mean(values(d.points("gradiveq", ("scheme",))[(scheme,)],
                                            "steady_iteration_s"))) + " s"


def gradiveq_gain(scheme: str, column: str) -> Callable[[DocData], str]:
    """fp32 ring's mean ``column`` over ``scheme``'s."""
    def make(d: DocData) -> str:
        pts = d.points("gradiveq", ("scheme",))
        return "{:.3g}".format(np.mean(values(pts[("fp32 ring",)], column))
                               / np.mean(values(pts[(scheme,)], column)))
    return make


def links(d: DocData) -> str:
    pts = d.points("links", ("workers", "bw", "mode"))
    body = []
    for workers, bw in dict.fromkeys((w, b) for w, b, _ in pts):
        row = [workers, f"{float(bw):g}"]
        for mode in ("ina", "ring", "ps"):
            rs = pts[(workers, bw, mode)]
            row.append(f"{seconds(np.mean(values(rs, 'iteration_s')))} s, {verdicts(rs)}")
        ratio = (np.mean(values(pts[(workers, bw, "ina")], "iteration_s"))
                 / np.mean(values(pts[(workers, bw, "ring")], "iteration_s")))
        body.append(row + [f"{ratio:.2f}"])
    return table(["workers", "Mbit/s", "in-network", "ring", "parameter server",
                  "in-network / ring"], body)


def levels(d: DocData) -> str:
    pts = d.points("levels", ("leaves", "scheme"))
    schemes = list(dict.fromkeys(s for _, s in pts))
    body = []
    for leaves in dict.fromkeys(n for n, _ in pts):
        body.append([f"{leaves}: iteration time"] + [
            spread(values(pts[(leaves, s)], "iteration_s"), f3, " s") for s in schemes])
        body.append([f"{leaves}: leaf-spine bytes"] + [
            spread(values(pts[(leaves, s)], "switch_link_bytes"), mbytes, " MB")
            for s in schemes])
    return table(["leaves"] + [s.replace("in-network ", "in-network, ") for s in schemes],
                 body)


def levels_gain(leaves: str, column: str = "iteration_s", over: str = "in-network 1 level",
                under: str = "in-network 2 levels") -> Callable[[DocData], str]:
    """``over``'s mean ``column`` over ``under``'s at ``leaves`` leaves."""
    def make(d: DocData) -> str:
        pts = d.points("levels", ("leaves", "scheme"))
        return "{:.1f}".format(np.mean(values(pts[(leaves, over)], column))
                               / np.mean(values(pts[(leaves, under)], column)))
    return make


def loss(d: DocData) -> str:
    pts = d.points("loss", ("workers", "loss", "mode"))
    body = []
    for workers, pct in dict.fromkeys((w, p) for w, p, _ in pts):
        body.append([workers, f"{float(pct):g}%"] + [
            spread(values(pts[(workers, pct, mode)], "iteration_s"), seconds, " s")
            for mode in ("ina", "ring", "ps")])
    return table(["workers", "loss", "in-network", "ring", "parameter server"], body)


def loss_lead(d: DocData, workers: str, pct: str) -> float:
    """The ring's iteration time over in-network's, at ``workers`` and ``pct`` loss."""
    pts = d.points("loss", ("workers", "loss", "mode"))
    key = next(k for k in pts if k[0] == workers and float(k[1]) == float(pct))
    return (np.mean(values(pts[key[:2] + ("ring",)], "iteration_s"))
            / np.mean(values(pts[key[:2] + ("ina",)], "iteration_s")))


def loss_cell(workers: str, pct: str, mode: str) -> Callable[[DocData], str]:
    """The loss table's cell at ``workers``, ``pct`` loss and ``mode``, as a value."""
    def make(d: DocData) -> str:
        pts = d.points("loss", ("workers", "loss", "mode"))
        key = next(k for k in pts if k[0] == workers and float(k[1]) == float(pct)
                   and k[2] == mode)
        return spread(values(pts[key], "iteration_s"), seconds, " s")
    return make


def arrivals(d: DocData) -> str:
    pts = d.points("arrivals", ("arrivals", "scheme"))
    schemes = list(dict.fromkeys(s for _, s in pts))
    body = []
    for gap in dict.fromkeys(a for a, _ in pts):
        row = [f"{gap.split(':')[1]} s"]
        for scheme in schemes:
            rs = pts[(gap, scheme)]
            row.append(f"{spread(values(rs, 'turnaround_s'), f2, ' s')}, "
                       f"{wait(np.mean(values(rs, 'wait_s')))} s")
        body.append(row)
    head = [f"{schemes[0]}: turnaround, wait"] + schemes[1:]
    return table(["mean gap"] + head, body)


def sharing(d: DocData) -> str:
    pts = d.points("sharing", ("scheme", "allocation"))
    body = []
    for scheme in dict.fromkeys(s for s, _ in pts):
        row = [f"{scheme} ({pts[(scheme, 'static')][0]['slots']} slots per job)"]
        for allocation in ("static", "shared"):
            rs = pts[(scheme, allocation)]
            row.append(f"{spread(values(rs, 'turnaround_s'), sig3, ' s')}, "
                       f"{wait(np.mean(values(rs, 'wait_s')))} s")
        row.append(spread(values(pts[(scheme, "shared")], "switch_share"),
                          lambda x: f"{100 * x:.0f}", "%").replace(")", "%)"))
        body.append(row)
    return table(["scheme", "static: turnaround, wait", "shared: turnaround, wait",
                  "shared: chunks summed in the switch"], body)


def _error(d: DocData) -> dict[tuple[str, str], float]:
    """Mean relative error of the error sweep's points, by (bits, quantizer)."""
    return {k: float(np.mean(values(rs, "rel_error")))
            for k, rs in d.points("error", ("bits", "quantizer")).items()}


def error(d: DocData) -> str:
    err = _error(d)
    quantizers = list(dict.fromkeys(q for _, q in err))
    return table(["bits"] + quantizers,
                 [[b] + [sig3(err[(b, q)]) for q in quantizers]
                  for b in dict.fromkeys(b for b, _ in err)])


def error_ratios(d: DocData, num: str, den: str) -> list[float]:
    """Per bit width, the error of quantizer ``num`` over that of ``den``."""
    err = _error(d)
    return [err[(b, num)] / err[(b, den)] for b in dict.fromkeys(b for b, _ in err)]


def ratio_runs(d: DocData) -> str:
    return table(["run", "in-network", "ring"],
                 [[r["run"], f"{float(r['in_network_ms']):.1f} ms, {r['in_network_verdict']}",
                   f"{float(r['ring_ms']):.1f} ms, {r['ring_verdict']}"]
                  for r in d.rows("ratio")])


def _ratio(d: DocData) -> tuple[list[float], list[float]]:
    rows = d.rows("ratio")
    return values(rows, "in_network_ms"), values(rows, "ring_ms")


PAYLOAD_BUILDS = ("payload-builds-bmv2", "payload-builds-embedded")


def _builds(d: DocData) -> list[dict]:
    return [r for name in PAYLOAD_BUILDS for r in d.rows(name)]


def payload_builds(d: DocData) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in _builds(d):
        groups[(r["target"], r["words"])].append(r)
    body = []
    for (target, words), rs in groups.items():
        offered = " / ".join(f"{int(r['offered_pps']):,}" for r in rs)
        agg = " / ".join(f"{int(r['aggregated_pps']):,}" + (
            f" ({int(r['aggregated_min']):,}-{int(r['aggregated_max']):,})"
            if r["aggregated_min"] != r["aggregated_max"] else "") for r in rs)
        share = " / ".join(_percent(float(r["aggregated_pps"]) / float(r["offered_pps"]))
                           for r in rs)
        body.append([target, words, offered, agg, share])
    return table(["target", "words", "offered pps", "aggregated pps (range)", "aggregated"],
                 body)


def _percent(x: float) -> str:
    p = 100 * x
    return f"{p:.1f}%" if 99 < p < 99.95 else f"{p:.0f}%"


def bmv2_words_per_s(d: DocData) -> dict[int, float]:
    """BMv2's most words aggregated per second, per build (words x packets/s)."""
    best: dict[int, float] = {}
    for r in _builds(d):
        if r["target"] == "BMv2":
            w = int(r["words"])
            best[w] = max(best.get(w, 0.0), w * float(r["aggregated_pps"]))
    return best


def bmv2_peak_pps(d: DocData) -> str:
    best: dict[int, int] = {}
    for r in _builds(d):
        if r["target"] == "BMv2":
            best[int(r["words"])] = max(best.get(int(r["words"]), 0), int(r["aggregated_pps"]))
    return ", ".join(f"{v:,}" for _, v in sorted(best.items()))


# -- docs/compression.md -------------------------------------------------------------
GVQ = "b=8 maxpow2 GradiVeQ d=64 k=8 R=4"  # the GradiVeQ row of the compression tables

def _with_range(r: dict, key: str) -> str:
    if not r[key]:
        return "n/a"
    if not r[key + "_min"]:  # the exact sum: no range
        return f"{float(r[key]):g}"
    return f"{float(r[key]):.3f} ({float(r[key + '_min']):.3f}-{float(r[key + '_max']):.3f})"


def compression(name: str) -> Callable[[DocData], str]:
    """A table of ``qaina-bench eval compression``, with final accuracy if it has one."""
    def make(d: DocData) -> str:
        rows = d.rows(name)
        keys = ["rel_error", "exact_scales", "sum_error"]
        accuracy = any(r.get("accuracy") for r in rows)  # trained closed loop
        body = [[r["scheme"]] + [_with_range(r, k) for k in keys]
                + [f"{float(r['clipped_percent']):.2f}%"
                   if r["clipped_percent"] and r["scheme"] != "fp32, exact sum" else "0",
                   f"{float(r['values_sent']):.2f}"]
                + ([_with_range(r, "accuracy")] if accuracy else []) for r in rows]
        return table(["scheme", "relative error", "with exact scales",
                      "of the sum over iterations", "clipped", "values sent"]
                     + (["final test accuracy"] if accuracy else []), body)
    return make


def cell(name: str, scheme: str, column: str, fmt: str = "{:.3f}") -> Callable[[DocData], str]:
    """One figure of a ``compression-*`` table: ``column`` of the row ``scheme``."""
    def make(d: DocData) -> str:
        row = next(r for r in d.rows(name) if r["scheme"] == scheme)
        return fmt.format(float(row[column]))
    return make


def feedback_gains(d: DocData) -> list[float]:
    """How many times error feedback cuts the error of the sum over iterations, for
    every scheme that has a row with and one without it."""
    rows = {r["scheme"]: r for r in d.rows("compression-resnet")}
    return [float(rows[s]["sum_error"]) / float(rows[s + " EF"]["sum_error"])
            for s in rows if s + " EF" in rows]


# -- docs/performance.md -------------------------------------------------------------
BLOCKS: dict[str, Callable[[DocData], str]] = {
    "metrics": lambda d: glossary(),
    "table:qaina-jobs": qaina_jobs,
    "table:gradiveq": gradiveq,
    "table:links": links,
    "table:levels": levels,
    "table:arrivals": arrivals,
    "table:error": error,
    "table:loss": loss,
    "table:sharing": sharing,
    "table:ratio": ratio_runs,
    "table:payload-builds": payload_builds,
    "table:compression-resnet": compression("compression-resnet"),
    "table:compression-mlp": compression("compression-mlp"),
    "table:compression-resnet-accuracy": compression("compression-resnet-accuracy"),
    "table:cost": cost("cost"),
    "table:coalescing": variants("coalescing", "coalescing"),
    "table:sampling": variants("sampling", "sampling"),
    "table:cost-faa9c33": cost("cost-faa9c33"),
    "table:cost-5fb3794": cost("cost-5fb3794"),
    "table:headline": headline,
    "table:headline-history": history("headline-history"),
    "table:fidelity-runs": history("fidelity-runs"),
    "table:overload-0ea4a5f": history("overload-0ea4a5f"),
    "table:overload-sittings": history("overload-sittings"),
    "table:scale": scale("scale"),
    "table:scale-containers": scale("scale-containers"),
    "table:scale-history": history("scale-history"),
    "table:cluster-bringup": history("cluster-bringup"),
    "table:agent-start": history("agent-start"),
    "table:agent-start-host-cpu": history("agent-start-host-cpu"),
    "table:scale-containers-8b8f6f0": scale("scale-containers-8b8f6f0"),
    "table:scale-containers-136e9fd": scale("scale-containers-136e9fd"),
    "table:scale-containers-87ce1ea": scale("scale-containers-87ce1ea"),
    "table:scale-containers-05a31ca": scale("scale-containers-05a31ca"),
    "table:overload": overload("overload"),
    "table:overload-faa9c33": overload("overload-faa9c33"),
}

VALUES: dict[str, Callable[[DocData], str]] = {
    "headline_before": lambda d: f"{_headline_before(d):.2f}",
    "headline_ina_32": lambda d: f"{_headline_melem(d, 'ina', 32):.2f}",
    "headline_ina_128": lambda d: f"{_headline_melem(d, 'ina', 128):.2f}",
    "headline_ring": lambda d: f"{_headline_melem(d, 'ring'):.2f}",
    "headline_gain_32": lambda d: f"{_headline_melem(d, 'ina', 32) / _headline_before(d):.1f}x",
    "headline_gain_128": lambda d: f"{_headline_melem(d, 'ina', 128) / _headline_before(d):.1f}x",
    "ina_mean": lambda d: f"{np.mean(_ratio(d)[0]):.1f}",
    "ring_mean": lambda d: f"{np.mean(_ratio(d)[1]):.1f}",
    "ratio": lambda d: f"{np.mean(_ratio(d)[0]) / np.mean(_ratio(d)[1]):.2f}",
    "ratio_range": lambda d: span(
        f"{min(a / b for a in _ratio(d)[0] for b in _ratio(d)[1]):.2f}",
        f"{max(a / b for a in _ratio(d)[0] for b in _ratio(d)[1]):.2f}"),
    "bmv2_peak_pps": bmv2_peak_pps,
    "bmv2_words_32": lambda d: f"{bmv2_words_per_s(d)[32]:,.0f}",
    "bmv2_words_best": lambda d: f"{max(bmv2_words_per_s(d).values()):,.0f}",
    "bmv2_words_gain": lambda d: f"{max(bmv2_words_per_s(d).values()) / bmv2_words_per_s(d)[32]:.1f}",
    "error_4_to_8": lambda d: f"{_error(d)[('4', 'maxpow2')] / _error(d)[('8', 'maxpow2')]:.0f}",
    "maxfine_cut": lambda d: span(
        f"{100 * (1 - max(error_ratios(d, 'maxfine', 'maxpow2'))):.0f}",
        f"{100 * (1 - min(error_ratios(d, 'maxfine', 'maxpow2'))):.0f}"),
    "qsgd_cost": lambda d: span(f"{min(error_ratios(d, 'qsgd', 'maxpow2')):.0f}",
                                f"{max(error_ratios(d, 'qsgd', 'maxpow2')):.0f}"),
    "qaina_1job_b8": qaina_completion("b=8 unpacked", 1),
    "qaina_1job_32": qaina_completion("32-bit", 1),
    "qaina_best_b4": qaina_best("b=4 packed"),
    "qaina_3jobs_b4": qaina_completion("b=4 packed", 3),
    "qaina_3jobs_b8": qaina_completion("b=8 unpacked", 3),
    "qaina_3jobs_32": qaina_completion("32-bit", 3),
    "gvq_ring_time": gradiveq_time("GradiVeQ ring"),
    "gvq_ina_time": gradiveq_time("GradiVeQ in-network"),
    "gvq_ring_speedup": gradiveq_gain("GradiVeQ ring", "steady_iteration_s"),
    "gvq_ina_speedup": gradiveq_gain("GradiVeQ in-network", "steady_iteration_s"),
    "gvq_ring_bytes": gradiveq_gain("GradiVeQ ring", "steady_bytes_per_iteration"),
    "gvq_ina_bytes": gradiveq_gain("GradiVeQ in-network", "steady_bytes_per_iteration"),
    "qsgd_bytes": gradiveq_gain("QSGD ring", "steady_bytes_per_iteration"),
    "overload_kept_4": overload_kept("4"),
    "overload_kept_32": overload_kept("32"),
    "levels_gain_2": levels_gain("2"),
    "levels_gain_4": levels_gain("4"),
    "levels_ring_bytes": lambda d: span(
        levels_gain("2", "switch_link_bytes", "ring", "in-network 1 level")(d),
        levels_gain("4", "switch_link_bytes", "ring", "in-network 1 level")(d)),
    "loss_lead_8": lambda d: f"{loss_lead(d, '8', '0'):.1f}",
    "loss_lead_4": lambda d: f"{loss_lead(d, '4', '0'):.1f}",
    "loss_ina_8_2": loss_cell("8", "2", "ina"),
    "loss_ring_8_5": loss_cell("8", "5", "ring"),
    "resnet_maxfine_4": cell("compression-resnet", "b=4 maxfine", "rel_error"),
    "resnet_maxpow2_4": cell("compression-resnet", "b=4 maxpow2", "rel_error"),
    "resnet_qsgd_4": cell("compression-resnet", "b=4 qsgd", "rel_error"),
    "resnet_sum_4": cell("compression-resnet", "b=4 maxpow2", "sum_error"),
    "resnet_sum_4_ef": cell("compression-resnet", "b=4 maxpow2 EF", "sum_error"),
    "resnet_gvq_sent": cell("compression-resnet", GVQ, "values_sent", "{:.0%}"),
    "mlp_gvq_sent": cell("compression-mlp", GVQ, "values_sent", "{:.0%}"),
    "resnet_gvq_error": cell("compression-resnet", GVQ, "rel_error", "{:.2f}"),
    "mlp_gvq_error": cell("compression-mlp", GVQ, "rel_error", "{:.2f}"),
    "resnet_acc_fp32": cell("compression-resnet-accuracy", "fp32, exact sum", "accuracy"),
    "resnet_acc_2": cell("compression-resnet-accuracy", "b=2 maxpow2", "accuracy"),
    "resnet_acc_gvq": cell("compression-resnet-accuracy", GVQ, "accuracy"),
    "feedback_gain_min": lambda d: f"{min(feedback_gains(d)):.1f}",
    "feedback_gain_max": lambda d: f"{max(feedback_gains(d)):.1f}",
}
