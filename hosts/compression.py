"""What a worker does to a vector before and after it is summed: scalar quantization
to the job's lanes (by a named scale rule), error feedback, and the scales it predicts.

``WorkerCodec`` is shared by the agent (through the switch or the ring) and by the
offline evaluation (``hosts/evaluate.py``), so both measure the same compression.

* **Quantizers** (``--quantizer``, hosts/QUANTIZERS.md; the registry ``QUANTIZERS``
  of hosts/quantize.py): ``maxpow2`` (the default,
  SwitchML-compatible: a chunk's scale is the power of two at or above its largest
  value, the maximum over the workers), ``maxfine`` (the same in quarter octaves),
  ``qsgd`` (QSGD: the L2 norm of a bucket of ``bucket`` elements, shared as the
  maximum over the workers so the switch can sum). Stochastic rounding for b <= 8,
  nearest for b = 32.
* **b = 1** sends the signs of gradient plus residual, scaled by the mean magnitude
  of the chunk (EF-signSGD): plain stochastic signs scaled to the maximum do not
  train, so error feedback is always on at b = 1.
* **Error feedback** (``--error-feedback``): the part of a vector its quantization
  dropped is added to the next one; rounding is then to nearest, since stochastic
  rounding with error feedback diverges at b = 2.
* **Predicted scales**: the first P chunks of an iteration use the previous
  iteration's maxima plus a headroom, in steps of the rule's code, starting at
  ``start_headroom``; it adapts: one step up after an iteration where more than
  ``short_target`` of the predicted scales fell short of their chunk's true maximum,
  one step down where fewer than half that share did. Every worker learns the true
  maxima from the same results, so all workers adapt alike and keep using the same
  scales.
* **Compressors** (``--compress``): the interface ``Compressor`` and the registry
  ``COMPRESSORS`` (GradiVeQ, hosts/gradiveq.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plugins import Registry
from .gradiveq import GradiVeQCompressor
from .lanes import LaneFormat
from .quantize import QUANTIZERS, SIGN_MEAN, Quantizer, ScaleRule, scale_rule


class Compressor:
    """The interface of a gradient compressor (``--compress NAME``), which runs before
    quantization and after dequantization. It must be linear: the switch sums the
    workers' compressed vectors, and that sum must be the compressed sum.

    A compressor class is built per worker as ``cls(layers, d=, k=, fit=, refresh=)``
    (``layers``: ``(name, size)`` of the gradient in order; the other options are the
    ``--gvq-*`` values, which a compressor may ignore: accept ``**_``). Every worker of
    a job must make the same choices from the same data, with no communication.
    """

    #: whether ``learn`` has had what it needs, so ``compress`` works
    fitted: bool = False

    def exact(self, i: int) -> bool:
        """Whether iteration ``i`` is aggregated uncompressed at 32 bits (to fit)."""
        raise NotImplementedError

    def compress(self, gradient: np.ndarray) -> np.ndarray:
        """The float32 values a worker quantizes and sends instead of ``gradient``."""
        raise NotImplementedError

    def decompress(self, values: np.ndarray) -> np.ndarray:
        """The summed gradient from the summed compressed ``values``."""
        raise NotImplementedError

    def learn(self, aggregate: np.ndarray, i: int) -> None:
        """The exact aggregate of iteration ``i`` (one that ``exact`` chose)."""
        raise NotImplementedError

    def metrics(self, exact_sum: np.ndarray | None) -> dict:
        """Fields of this iteration's record (``exact_sum``: the exact fp32 sum, if known)."""
        return {}


#: Compressors by name: the choices of ``--compress`` besides ``none``.
COMPRESSORS: Registry = Registry("compressor", "qaina_bench.compressors")
COMPRESSORS.add("gradiveq", GradiVeQCompressor)



def start_headroom(bits: int) -> int:
    """Octaves added to predicted scales at first: none at b <= 4, where clipping a
    few values costs less than a coarser scale for all; one at b = 5..8; eight for
    the 32-bit fixed point, which has bits to spare (docs/compression.md measures)."""
    return 0 if bits <= 4 else 1 if bits <= 8 else 8


def short_target(bits: int) -> float:
    """The share of predicted scales allowed to fall short of their chunk's maximum."""
    return 0.5 if bits <= 4 else 0.1


@dataclass(frozen=True)
class CodecConfig:
    """How a job compresses: the same for all its workers."""

    bits: int
    workers: int
    quantizer: str = "maxpow2"
    bucket: int = 512  # qsgd: elements per norm
    error_feedback: bool = False
    headroom: int | None = None  # code steps on predicted scales (None: adaptive)
    packed: bool = True  # False: one value per word (see LaneFormat)


class WorkerCodec:
    """One worker's quantizer, residual and headroom (see the module docstring)."""

    def __init__(self, cfg: CodecConfig, rng: np.random.Generator, chunk_words: int):
        self.cfg = cfg
        self.fmt = LaneFormat(cfg.bits, cfg.workers, cfg.packed)
        self.chunk_elems = chunk_words * self.fmt.lanes
        self.sign = cfg.bits == 1
        self.rule: ScaleRule = (SIGN_MEAN if self.sign
                                else scale_rule(cfg.quantizer, self.chunk_elems, cfg.bucket))
        self.error_feedback = cfg.error_feedback or self.sign
        stochastic = cfg.bits != 32 and not self.error_feedback
        self.quantizer = Quantizer(self.fmt, rng, stochastic=stochastic, rule=self.rule)
        octaves = 0 if self.sign else start_headroom(cfg.bits)  # a sign's scale bounds nothing
        self.adaptive = cfg.headroom is None and not self.sign
        self.headroom = octaves * self.rule.steps if cfg.headroom is None else cfg.headroom
        self.residual: np.ndarray | None = None

    # -- before the exchange --------------------------------------------------------
    def values(self, vector: np.ndarray) -> np.ndarray:
        """What this worker sends for ``vector``: with error feedback, plus the residual
        (a residual of another length, after GradiVeQ changed the vector, is dropped)."""
        vector = np.asarray(vector, dtype=np.float32)
        if self.error_feedback and self.residual is not None and \
                len(self.residual) == len(vector):
            return vector + self.residual
        return vector

    def codes(self, values: np.ndarray) -> np.ndarray:
        """This worker's scale code of every chunk."""
        return self.rule.codes(values, self.chunk_elems)

    def quantize(self, values: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Levels of ``values`` (one or more whole chunks) under ``codes``."""
        return self.quantizer.quantize(values, codes, self.chunk_elems)

    def quantize_into(self, values: np.ndarray, codes: np.ndarray, payload: np.ndarray,
                      levels: np.ndarray | None = None):
        """Quantize ``values`` (whole chunks) under ``codes`` and pack chunk ``r`` into
        row ``r`` of ``payload`` (big-endian words of packets); ``levels`` gets the
        levels if given."""
        self.quantizer.quantize_into(values, codes, self.chunk_elems, payload, levels)

    # -- after the exchange ---------------------------------------------------------
    def dequantize_sum(self, level_sums: np.ndarray, codes: np.ndarray) -> np.ndarray:
        return self.quantizer.dequantize_sum(level_sums, codes, self.chunk_elems)

    def dequantize_words(self, payload: np.ndarray, codes: np.ndarray, count: int,
                         sums: np.ndarray | None = None) -> np.ndarray:
        """The summed vector (``count`` values) from aggregated payload rows; ``sums``
        gets the level sums if given."""
        return self.quantizer.dequantize_words(payload, codes, count, self.chunk_elems, sums)

    def book(self, values: np.ndarray, levels: np.ndarray, codes: np.ndarray):
        """Error feedback: keep what this worker's quantization of ``values`` dropped."""
        if self.error_feedback:
            own = 2 * levels - 1 if self.sign else levels
            self.residual = values - self.quantizer.dequantize_sum(own, codes, self.chunk_elems)

    def clipped(self, values: np.ndarray, codes: np.ndarray) -> int:
        """How many of ``values`` (whole chunks from the first) lay beyond their chunk's
        scale ``codes``: clipped to it. Signs are scaled below the values by design."""
        if not self.rule.bounds:
            return 0
        limit = np.repeat(self.rule.factors(codes), self.chunk_elems)[:len(values)]
        return int(np.count_nonzero(np.abs(values) > limit))

    def predict(self, agreed: np.ndarray, top: int, short: int) -> np.ndarray:
        """Scale codes of the next iteration's first chunks from this iteration's
        maxima ``agreed``: a chunk that was all zeros takes the largest code ``top``;
        every prediction gets the headroom, which first adapts to ``short`` (how many
        of this iteration's predicted scales fell below their chunk's true maximum,
        which every worker of the job knows alike)."""
        if self.adaptive and len(agreed):
            share, target = short / len(agreed), short_target(self.cfg.bits)
            if share > target:
                self.headroom += 1
            elif share < target / 2 and self.headroom > 0:
                self.headroom -= 1
        base = np.where(agreed <= self.rule.code_min, top, agreed.astype(np.int16))
        return np.clip(base + self.headroom, self.rule.code_min,
                       self.rule.code_max).astype(np.int8)
