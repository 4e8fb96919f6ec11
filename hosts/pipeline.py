"""One worker's iteration, step by step: the same for the agent and the offline evaluation.

An iteration of a worker goes through these steps, in this order:

1. **codec**: a compressor's exact iterations (``Compressor.exact``, GradiVeQ's fit and
   refresh iterations) use a 32-bit codec, every other iteration the job's
   (``WorkerCodec``);
2. **compress**: on compressed iterations, the compressor's coefficients of the gradient;
3. **values**: plus the error-feedback residual (``WorkerCodec.values``);
4. **aggregate**: scales (predicted for the first P chunks, the agreed maxima for the
   others), quantize and pack, sum over the job's workers, dequantize. This is the one
   step that differs: the agent hands it to its collective (``hosts/collective.py``:
   the switch, a ring, a parameter server), the evaluation sums every worker's levels in
   process (``hosts/evaluate.py``). Either returns an ``Aggregated``;
5. **decode**: book error feedback, decompress (``Pipeline.decode``);
6. **adapt**: exact aggregates go to the compressor (``Compressor.learn``: GradiVeQ's
   fit window refits its bases); the
   headroom adapts to the number of short predicted scales, which predicts the scales
   of the next iteration's first P chunks (``Pipeline.adapt``).

``Pipeline.encode`` runs steps 1-3. Every worker's pipeline sees the same aggregates,
so all of them fit the same bases and predict the same scales without talking.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .compression import COMPRESSORS, CodecConfig, Compressor, WorkerCodec
from .transport import ExchangeStats


@dataclass
class Aggregated:
    """What aggregating one vector over the job's workers gave this worker."""

    total: np.ndarray  # the dequantized sum
    levels: np.ndarray  # this worker's quantized levels (empty if not kept)
    sums: np.ndarray  # the integer level sums received (empty if not kept)
    scale: np.ndarray  # the scale code of every chunk
    next_scales: np.ndarray | None  # agreed maxima of the first P chunks (None: no prediction)
    top: int | None  # the largest code agreed
    stats: ExchangeStats
    encode_s: float
    clipped: int  # values beyond their chunk's scale (clipped to it)
    short: int  # predicted scales below their chunk's true maximum (the same for all)


@dataclass
class Encoded:
    """Steps 1-3 of one iteration: what this worker hands to the aggregation."""

    iteration: int
    codec: WorkerCodec
    compressed: bool  # GradiVeQ coefficients, not the gradient
    values: np.ndarray
    compress_s: float


def compressor(name: str, layers, d: int, k: int, fit: int, refresh: int
               ) -> Compressor | None:
    """The compressor ``name`` of ``COMPRESSORS`` for a gradient of ``layers`` (None for
    ``none``); ValueError if it cannot be built."""
    if name == "none":
        return None
    return COMPRESSORS.get(name)(layers, d=d, k=k, fit=fit, refresh=refresh)


class Pipeline:
    """One worker's steps of every iteration but the aggregation (module docstring).

    ``key`` seeds the codecs' random numbers (the exact codec's key gets 32 appended);
    ``compressor`` is the job's (``compressor()``; None: the gradient is sent as it is);
    ``float_sums``: the values are summed as float32 (quantizer none), nothing is
    quantized or booked.
    """

    def __init__(self, cfg: CodecConfig, key: list[int], chunk_words: int,
                 compressor: Compressor | None = None, float_sums: bool = False):
        self.codec = WorkerCodec(cfg, np.random.default_rng(key), chunk_words)
        self.float_sums = float_sums
        self.gvq = compressor
        self.exact_codec = None
        if compressor is not None:
            # Exact iterations: 32-bit fixed point, whatever the job's bits.
            self.exact_codec = WorkerCodec(CodecConfig(32, cfg.workers),
                                           np.random.default_rng(list(key) + [32]), chunk_words)
        #: scale codes of the next iteration's first P chunks (None: none predicted)
        self.predicted: np.ndarray | None = None

    def exact(self, i: int) -> bool:
        """Whether iteration ``i`` is one the compressor aggregates uncompressed at 32 bits."""
        return self.gvq is not None and self.gvq.exact(i)

    def codec_for(self, i: int) -> WorkerCodec:
        return self.exact_codec if self.exact(i) else self.codec

    def encode(self, i: int, gradient: np.ndarray) -> Encoded:
        """Steps 1-3: the codec of iteration ``i``, compression, error feedback."""
        codec = self.codec_for(i)
        t0 = time.perf_counter()
        compressed = self.gvq is not None and not self.exact(i)
        vector = self.gvq.compress(gradient) if compressed else gradient
        values = codec.values(vector)
        return Encoded(i, codec, compressed, values, time.perf_counter() - t0)

    def decode(self, enc: Encoded, a: Aggregated) -> np.ndarray:
        """Step 5: book what quantization dropped; the aggregate, decompressed."""
        if not self.float_sums:
            enc.codec.book(enc.values, a.levels, a.scale)
        return self.gvq.decompress(a.total) if enc.compressed else a.total

    def adapt(self, enc: Encoded, a: Aggregated, aggregate: np.ndarray):
        """Step 6: an exact aggregate to the compressor; adapt the headroom and predict
        the next iteration's first scales (only while the vector keeps its shape and
        format, and only where the aggregation returned the maxima to predict from)."""
        i = enc.iteration
        if self.gvq is not None and not enc.compressed:
            self.gvq.learn(aggregate, i)
        same = self.exact(i) == self.exact(i + 1)
        self.predicted = (enc.codec.predict(a.next_scales, a.top, a.short)
                          if same and a.next_scales is not None else None)
