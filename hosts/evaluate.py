"""Compression measured without the network: what the switch would sum, simulated.

The switch adds the workers' integer levels exactly, so what a compression scheme
does to a gradient does not depend on the network, except for the first ``P``
chunks of an iteration, whose scales are predicted (the switch returns the true
maxima later). ``Aggregation`` reproduces that: every worker's ``Pipeline`` (the
agents' own, hosts/pipeline.py: codecs, error feedback, GradiVeQ's exact and compressed
iterations, headroom), and in place of the network an in-process sum with scales agreed
as the maximum over the workers, predicted for the first ``P = min(window, chunks)``
chunks (``window`` 0: every scale exact, as the ring and the parameter server agree them).

* ``open_loop``: replay a trace set; the relative error of every iteration's
  aggregate against the exact sum (with predicted scales, and with every scale
  exact), and the values clipped.
* ``closed_loop``: train the digits job from the aggregates, as ``up --train``
  does; test accuracy along the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..p4.header import QAINA_WORDS
from .compression import CodecConfig
from .pipeline import Aggregated, Encoded, Pipeline, compressor
from .transport import ExchangeStats


@dataclass
class Scheme:
    """A compression scheme as ``up`` takes it."""

    bits: int
    quantizer: str = "maxpow2"
    error_feedback: bool = False
    gradiveq: bool = False
    gvq_d: int = 64
    gvq_k: int = 8
    gvq_fit: int = 1
    gvq_refresh: int = 0
    bucket: int = 512
    headroom: int | None = None  # code steps on predicted scales (None: adaptive)

    def label(self) -> str:
        name = "signmean" if self.bits == 1 else self.quantizer
        parts = [f"b={self.bits}", name] + (["EF"] if self.error_feedback else [])
        if self.gradiveq:
            parts.append(f"GradiVeQ d={self.gvq_d} k={self.gvq_k} R={self.gvq_refresh}")
        return " ".join(parts)


@dataclass
class Step:
    """One iteration's aggregate and what it cost."""

    total: np.ndarray  # the aggregate (float32), decompressed
    exact_scales_total: np.ndarray | None  # the same with every scale agreed exactly
    clipped: int = 0
    values: int = 0  # values each worker sent
    bits: int = 0  # the format they were sent in
    projection_error: float | None = None


class Aggregation:
    """A job's workers aggregating through a simulated switch (module docstring): one
    ``Pipeline`` per worker, as every agent has, and their sum taken in process."""

    def __init__(self, scheme: Scheme, workers: int, layers, window: int = 32, seed: int = 0,
                 counterfactual: bool = True):
        self.scheme, self.workers, self.window = scheme, workers, window
        self.counterfactual = counterfactual and not scheme.error_feedback and scheme.bits > 1
        cfg = CodecConfig(scheme.bits, workers, scheme.quantizer, scheme.bucket,
                          scheme.error_feedback, scheme.headroom)
        self.pipelines = [
            Pipeline(cfg, [seed, k], QAINA_WORDS, compressor(
                "gradiveq" if scheme.gradiveq else "none", layers, scheme.gvq_d, scheme.gvq_k,
                scheme.gvq_fit, scheme.gvq_refresh)) for k in range(workers)]
        self.iteration = 0

    @property
    def gvq(self):
        return self.pipelines[0].gvq

    def step(self, gradients: list[np.ndarray]) -> Step:
        """Aggregate one iteration's gradients (one per worker)."""
        i = self.iteration
        self.iteration += 1
        encoded = [p.encode(i, g) for p, g in zip(self.pipelines, gradients)]
        aggregated, exact_scales_total = self.sum_in_process(encoded)
        totals = [p.decode(e, a) for p, e, a in zip(self.pipelines, encoded, aggregated)]
        for p, e, a, total in zip(self.pipelines, encoded, aggregated, totals):
            p.adapt(e, a, total)
        step = Step(totals[0], None, sum(a.clipped for a in aggregated),
                    len(encoded[0].values), encoded[0].codec.fmt.bits)
        if exact_scales_total is not None:
            step.exact_scales_total = (self.gvq.decompress(exact_scales_total)
                                       if encoded[0].compressed else exact_scales_total)
        if self.gvq is not None and self.gvq.fitted:
            step.projection_error = self.gvq.metrics(
                np.sum(gradients, axis=0))["gvq_projection_error"]
        return step

    def sum_in_process(self, encoded: list[Encoded]):
        """Step 4 for every worker at once, as the switch would: scales agreed as the
        maximum over the workers, predicted for the first P chunks; one ``Aggregated``
        per worker, and the sum with every scale exact (None unless counterfactual)."""
        codecs = [e.codec for e in encoded]
        values = [e.values for e in encoded]
        true = np.maximum.reduce([c.codes(v) for c, v in zip(codecs, values)])
        P = min(self.window, len(true))
        scale = true.copy()
        predicted = self.pipelines[0].predicted
        if predicted is not None and len(predicted) == P:
            scale[:P] = predicted
        levels = [c.quantize(v, scale) for c, v in zip(codecs, values)]
        total = self._dequantized_sum(codecs, levels, scale)
        exact_scales_total = None
        if self.counterfactual:  # an exact iteration is exact with any scales
            exact_scales_total = (total if self.pipelines[0].exact(encoded[0].iteration) else
                                  self._dequantized_sum(codecs, [c.quantize(v, true) for c, v
                                                                 in zip(codecs, values)], true))
        short = int(np.count_nonzero(true[:P] > scale[:P]))
        none = np.zeros(0, dtype=np.int64)
        aggregated = [Aggregated(total, lv, none, scale, true[:P], int(true.max()),
                                 ExchangeStats(), 0.0, c.clipped(v, scale), short)
                      for c, v, lv in zip(codecs, values, levels)]
        return aggregated, exact_scales_total

    @staticmethod
    def _dequantized_sum(codecs, levels, scale) -> np.ndarray:
        """The workers' levels summed as the switch sums them, dequantized."""
        sign = codecs[0].sign
        total = sum((2 * lv - 1 if sign else lv).astype(np.int64) for lv in levels)
        return codecs[0].dequantize_sum(total, scale)


def relative_error(total: np.ndarray, exact: np.ndarray) -> float:
    exact = np.asarray(exact, dtype=np.float64)
    return float(np.linalg.norm(np.asarray(total, np.float64) - exact)
                 / max(np.linalg.norm(exact), 1e-30))


@dataclass
class OpenLoop:
    """Per iteration: relative error with predicted scales and with exact ones."""

    errors: list = field(default_factory=list)
    exact_scale_errors: list = field(default_factory=list)
    cumulative_error: float = 0.0  # of the sum over all iterations (what SGD integrates)
    clipped: int = 0
    values_sent: int = 0
    projection_errors: list = field(default_factory=list)


def open_loop(trace, scheme: Scheme, workers: int | None = None, iterations: int | None = None,
              window: int = 32, seed: int = 0) -> OpenLoop:
    """Replay ``trace``'s gradients through ``scheme``."""
    workers = workers or trace.workers
    iterations = iterations or trace.iterations
    agg = Aggregation(scheme, workers, [(x.name, x.size) for x in trace.layers], window, seed)
    out = OpenLoop()
    total_sum = exact_sum = 0.0
    for i in range(iterations):
        grads = [trace.gradient(k, i) for k in range(workers)]
        exact = np.sum(np.asarray(grads, dtype=np.float64), axis=0)
        step = agg.step(grads)
        out.errors.append(relative_error(step.total, exact))
        total_sum = total_sum + step.total.astype(np.float64)
        exact_sum = exact_sum + exact
        if step.exact_scales_total is not None:
            out.exact_scale_errors.append(relative_error(step.exact_scales_total, exact))
        if step.projection_error is not None:
            out.projection_errors.append(step.projection_error)
        out.clipped += step.clipped
        out.values_sent += step.values
    out.cumulative_error = relative_error(total_sum, exact_sum)
    return out


def closed_loop(job, scheme: Scheme | None, iterations: int, eval_every: int = 10,
                window: int = 32, seed: int = 0) -> list[tuple[int, float, float]]:
    """Train ``job`` (a ``training.DataParallelJob``) from ``scheme``'s aggregates (the
    exact fp32 sum for None); ``(iteration, test loss, test accuracy)`` at the start,
    every ``eval_every`` iterations and at the end."""
    agg = (None if scheme is None else
           Aggregation(scheme, job.workers, [(x.name, x.size) for x in job.net.layers],
                       window, seed, counterfactual=False))
    curve = [(0, *job.test())]
    for i in range(1, iterations + 1):
        grads = [job.gradient(k)[1] for k in range(job.workers)]
        if not all(np.isfinite(g).all() for g in grads):  # diverged: no model left
            curve.append((i, float("inf"), 0.0))
            return curve
        job.step(np.sum(grads, axis=0) if agg is None else agg.step(grads).total)
        if i % eval_every == 0 or i == iterations:
            curve.append((i, *job.test()))
    return curve


def schemes(bits=(2, 4, 8, 32), quantizers=("maxpow2", "maxfine", "qsgd"), gvq_k: int = 8,
            gvq_refresh: int = 4, with_sign: bool = True, error_feedback=(False, True)
            ) -> list[Scheme]:
    """Every quantizer at every bit width with and without error feedback, the b = 1
    signs, and GradiVeQ at the widest low bit width below 32."""
    out = [Scheme(b, q, ef) for b in bits for q in quantizers for ef in error_feedback
           # the fixed point drops nothing worth feeding back; qsgd with error feedback
           # at b = 2 sends nothing (harness/config.py refuses it)
           if not (b == 32 and ef) and not (q == "qsgd" and ef and b == 2)]
    if with_sign:
        out.append(Scheme(1))
    low = [b for b in bits if b < 32]
    if low and with_sign:
        out.append(Scheme(max(low), gradiveq=True, gvq_k=gvq_k, gvq_refresh=gvq_refresh))
    return out


def _spread(values) -> str:
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def compression_table(trace, job_factory, scheme_list, workers: int, seeds: int = 2,
                      train_iterations: int = 60, log=print) -> list[dict]:
    """For every scheme: open-loop errors on ``trace`` and closed-loop accuracy of the
    job ``job_factory(seed)`` builds, over ``seeds`` repeats; one row per scheme, and
    a line to ``log`` as each is done (mean, and the range over the repeats)."""
    rows = []
    reference = [closed_loop(job_factory(seed), None, train_iterations, train_iterations)[-1]
                 for seed in range(seeds)] if job_factory else []
    if reference:
        rows.append({"scheme": "fp32, exact sum", "rel_error": [0.0],
                     "rel_error_exact_scales": [0.0], "cumulative_error": [0.0],
                     "clipped_share": [0.0], "values_share": 1.0,
                     "accuracy": [r[2] for r in reference], "diverged": 0})
        log(f"| fp32, exact sum | 0 | 0 | 0 | 0 | 1.00 | {_spread([r[2] for r in reference])} |")
    for scheme in scheme_list:
        runs = [open_loop(trace, scheme, workers, seed=seed) for seed in range(seeds)]
        trained = ([closed_loop(job_factory(seed), scheme, train_iterations, train_iterations,
                                seed=seed)[-1] for seed in range(seeds)] if job_factory else [])
        row = {"scheme": scheme.label(),
               "rel_error": [float(np.mean(r.errors)) for r in runs],
               "rel_error_exact_scales": [float(np.mean(r.exact_scale_errors))
                                          for r in runs if r.exact_scale_errors],
               "cumulative_error": [r.cumulative_error for r in runs],
               "clipped_share": [r.clipped / max(1, r.values_sent * workers) for r in runs],
               "values_share": runs[0].values_sent / (trace.elements * len(runs[0].errors)),
               "accuracy": [t[2] for t in trained], "diverged": sum(t[1] == float("inf")
                                                                    for t in trained)}
        rows.append(row)
        diverged = f" ({row['diverged']} of {seeds} diverged)" if row["diverged"] else ""
        log(f"| {row['scheme']} | {_spread(row['rel_error'])} | "
            f"{_spread(row['rel_error_exact_scales'])} | {_spread(row['cumulative_error'])} | "
            f"{100 * np.mean(row['clipped_share']):.2f}% | {row['values_share']:.2f} | "
            f"{_spread(row['accuracy'])}{diverged} |")
    return rows


def csv_row(row: dict) -> dict:
    """A row of ``compression_table`` as the columns of ``docs/data/compression-*.csv``:
    each figure's mean, min and max over the repeats (empty where it has none), the
    clipped values in percent, the share of values sent."""
    out: dict = {"scheme": row["scheme"]}
    for key, name in (("rel_error", "rel_error"), ("rel_error_exact_scales", "exact_scales"),
                      ("cumulative_error", "sum_error"), ("accuracy", "accuracy")):
        v = [x for x in row[key] if x is not None and np.isfinite(x)]
        exact = row["scheme"] == "fp32, exact sum" and key != "accuracy"
        out[name] = f"{np.mean(v):.3f}" if v and not exact else ("0" if exact else "")
        for end, f in (("_min", min), ("_max", max)):
            out[name + end] = f"{f(v):.3f}" if v and not exact else ""
    out["clipped_percent"] = ("" if row["scheme"] == "fp32, exact sum"
                              else f"{100 * np.mean(row['clipped_share']):.2f}")
    out["values_sent"] = f"{row['values_share']:.2f}"
    out["diverged"] = row["diverged"]
    return out


TABLE_HEAD = ("| scheme | relative error | with exact scales | of the sum over iterations "
              "| clipped | values sent | final test accuracy |\n"
              "|---|---|---|---|---|---|---|")
