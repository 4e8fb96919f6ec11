"""Scaled stochastic quantization of gradients into switch lanes.

A flattened gradient is cut into chunks of ``chunk_elems`` consecutive elements. Every
chunk ``c`` has a scale ``2**e[c]`` with ``|g| <= 2**e[c]`` for all its elements; the
workers of a job must use the same ``e[c]`` (the maximum of their own exponents, see
:func:`agree_exponents`), or the integer sums the switch makes mean nothing.

With ``x = g / 2**e`` in ``[-1, 1]`` and the job's :class:`~.lanes.LaneFormat`:

* b = 2..8 (QSGD): level ``q`` is ``x * L`` rounded stochastically to one of its two
  neighbouring integers, up with probability equal to the fractional part, so
  ``E[q] * 2**e / L == g`` and ``|q * 2**e / L - g| < 2**e / L``;
* b = 1 (stochastic sign): ``u`` in {0, 1} with ``P(u = 1) = (1 + x) / 2``, so
  ``E[2u - 1] * 2**e == g``;
* b = 32 (fixed point, the SwitchML-style baseline): the same rule as b = 2..8 with
  ``L = fmt.levels = (2**31 - 1) // n``, computed in float64; rounding to nearest is
  the usual choice there (``stochastic=False``).

The receiver turns the sum of the workers' levels back into the summed gradient:
``sum * 2**e / L`` (b = 1: ``(2s - n) * 2**e``, the level sum that
:meth:`LaneFormat.unpack_sum` already returns).

Chunks line up with words: ``chunk_elems`` must be a multiple of the format's lanes
per word ``m``, and chunk ``c`` then occupies words ``c * chunk_elems // m`` up to the
next chunk's first word (the last chunk may be short; its final word is padded with
the encoding of level 0, which :meth:`Quantizer.decode` drops again).

Rounding happens in float32 for b <= 8 (float64 for b = 32). The stochastic rounding
is exact up to that arithmetic: the rounding-up probability is off by less than
``2**-15`` of a level, far below the quantization noise itself.
"""

from __future__ import annotations

import numpy as np

from ..plugins import Registry
from .lanes import WORD_BITS, LaneFormat

_NO_LEVELS = np.zeros(0, dtype=np.int32)
_NO_SUMS = np.zeros(0, dtype=np.int64)

#: Smallest exponent a chunk scale may have. An all-zero chunk gets it. It keeps
#: ``L / 2**e`` and ``2**e / L`` normal float32 numbers for every ``L <= 127``.
EXP_MIN = -100
#: Largest exponent: the int8 range, enough for every finite float32 below 2**127.
EXP_MAX = 127


def chunk_count(elements: int, chunk_elems: int) -> int:
    """Number of chunks (the last may be short) of ``elements`` values."""
    if chunk_elems <= 0:
        raise ValueError(f"chunk_elems must be positive, not {chunk_elems}")
    return -(-elements // chunk_elems)


def chunk_exponents(grad: np.ndarray, chunk_elems: int) -> np.ndarray:
    """Per chunk, the smallest integer ``e`` with ``max|g| <= 2**e``, as int8.

    Chunks are ``chunk_elems`` consecutive elements of the flattened ``grad``; the last
    chunk may be short. An all-zero chunk, and any chunk below ``2**EXP_MIN``, gets
    ``EXP_MIN``. A non-finite value, or one beyond ``2**EXP_MAX``, is a ValueError.
    These are the codes of the ``maxpow2`` rule.
    """
    return MAXPOW2.codes(grad, chunk_elems)


def per_chunk(values: np.ndarray, chunk_elems: int, reduce, dtype) -> np.ndarray:
    """``reduce(rows, axis=1)`` of the chunks of ``values`` (the last may be short)."""
    chunks = chunk_count(len(values), chunk_elems)
    out = np.empty(chunks, dtype=dtype)
    full = len(values) // chunk_elems
    if full:
        out[:full] = reduce(values[:full * chunk_elems].reshape(full, chunk_elems), axis=1)
    if full < chunks:
        out[full] = reduce(values[full * chunk_elems:][None, :], axis=1)[0]
    return out


class ScaleRule:
    """A quantizer: how a chunk's scale is chosen and coded in the packet's 8-bit
    ``exp`` field. This is the whole interface a new quantizer implements
    (docs/extending.md); the rest (levels, lanes, packing) is the job's lane format.

    * ``measure(g, chunk_elems)``: one non-negative statistic per chunk of the
      flattened ``g`` (the last chunk may be short), e.g. max|g|;
    * ``steps``: code steps per octave; a chunk's code ``c`` is the smallest with
      ``statistic <= 2**(c / steps)``, its scale ``2**(c / steps)``;
    * ``bounds``: whether the scale bounds every value of the chunk (values beyond a
      scale are clipped and counted; False for a rule that scales below them by design);
    * ``for_chunks(chunk_elems, bucket)``: the rule for a job's chunk size (a rule whose
      statistic spans several chunks, like QSGD's bucket norm, sizes itself here).

    How workers agree: codes are monotone in the scale, the switch keeps the maximum
    of the codes the workers send for a slot, and every worker then uses that, the
    largest scale. ``steps`` = 1 gives powers of two; 4 quarter octaves, at most 19%
    above the statistic instead of 100%, for scales 2**-32 .. 2**31.75. Register an
    instance in ``QUANTIZERS`` (or through the ``qaina_bench.quantizers`` entry points).
    """

    bounds = True

    def __init__(self, name: str, steps: int = 1):
        self.name, self.steps = name, int(steps)
        if self.steps < 1:
            raise ValueError(f"quantizer {name}: steps must be at least 1, not {steps}")
        # An all-zero chunk gets the smallest code: EXP_MIN octaves, or the int8 range.
        self.code_min = max(-128, EXP_MIN * self.steps)
        self.code_max = min(127, EXP_MAX * self.steps)

    def __repr__(self):
        return f"{type(self).__name__}({self.name})"

    def measure(self, g: np.ndarray, chunk_elems: int) -> np.ndarray:
        """The statistic of every chunk of the flattened ``g``; subclasses say which."""
        raise NotImplementedError

    def for_chunks(self, chunk_elems: int, bucket: int = 512) -> "ScaleRule":
        """This rule for chunks of ``chunk_elems`` values (``bucket``: ``--bucket``)."""
        return self

    def statistics(self, values: np.ndarray, chunk_elems: int) -> np.ndarray:
        """The statistic of every chunk (ValueError for a non-finite one)."""
        g = np.asarray(values).reshape(-1)
        if chunk_elems <= 0:
            raise ValueError(f"chunk_elems must be positive, not {chunk_elems}")
        stat = self.measure(g, chunk_elems)
        if not np.isfinite(stat).all():
            raise ValueError("gradient holds a non-finite value (inf or nan)")
        return stat

    def codes(self, values: np.ndarray, chunk_elems: int) -> np.ndarray:
        """Per chunk the smallest code whose scale is at least the statistic (int8)."""
        stat = self.statistics(values, chunk_elems)
        if self.steps == 1:  # exact: frexp gives the power of two
            mantissa, exponent = np.frexp(stat)
            code = exponent.astype(np.int64) - (mantissa == 0.5)
        else:
            with np.errstate(divide="ignore"):
                code = np.ceil(np.log2(stat) * self.steps - 1e-9)
            code = np.where(stat > 0, code, self.code_min)
            # float rounding of log2 may leave the scale a hair below the statistic
            code = code + (self.factors(np.clip(code, -1e9, 1e9)) < stat)
        code = np.where(stat > 0, code, self.code_min)
        if len(code) and code.max() > self.code_max:
            raise ValueError(f"gradient magnitude beyond 2**{self.code_max / self.steps:g}")
        return np.maximum(code, self.code_min).astype(np.int8)

    def factors(self, codes) -> np.ndarray:
        """The scale ``2**(code / steps)`` of each code (float64)."""
        codes = np.asarray(codes, dtype=np.float64)
        return np.exp2(codes / self.steps)


class MaxRule(ScaleRule):
    """max|g| of the chunk: its scale bounds every value (``maxpow2``, ``maxfine``)."""

    def measure(self, g, chunk_elems):
        return per_chunk(np.abs(g), chunk_elems, np.max,
                         g.dtype if g.dtype.kind == "f" else np.float64)


class BucketNormRule(ScaleRule):
    """QSGD: the L2 norm of a bucket of ``bucket_chunks`` chunks, which every chunk of
    the bucket gets."""

    def __init__(self, name: str, bucket_chunks: int = 1, steps: int = 1):
        super().__init__(name, steps)
        self.bucket_chunks = int(bucket_chunks)

    def for_chunks(self, chunk_elems, bucket=512):
        return BucketNormRule(self.name, max(1, round(bucket / chunk_elems)), self.steps)

    def measure(self, g, chunk_elems):
        squares = per_chunk(g.astype(np.float64) ** 2, chunk_elems, np.sum, np.float64)
        chunks = len(squares)
        per = max(1, min(self.bucket_chunks, chunks))  # a bucket past the end is one bucket
        padded = np.zeros(-(-chunks // per) * per)
        padded[:chunks] = squares
        return np.repeat(np.sqrt(padded.reshape(-1, per).sum(axis=1)), per)[:chunks]


class MeanAbsRule(ScaleRule):
    """mean|g|: the scale of b = 1's signs, below most values by design."""

    bounds = False

    def measure(self, g, chunk_elems):
        return per_chunk(np.abs(g), chunk_elems, np.mean, np.float64)


#: The built-in rules (``--quantizer``); see hosts/QUANTIZERS.md.
MAXPOW2 = MaxRule("maxpow2")
MAXFINE = MaxRule("maxfine", steps=4)
QSGD = BucketNormRule("qsgd")
#: b = 1 always scales its signs by this rule, whatever ``--quantizer`` says, so it is
#: not one of the choices.
SIGN_MEAN = MeanAbsRule("signmean")

#: Every quantizer by name: the choices of ``--quantizer``.
QUANTIZERS: Registry = Registry("quantizer", "qaina_bench.quantizers")
for _rule in (MAXPOW2, MAXFINE, QSGD):
    QUANTIZERS.add(_rule.name, _rule)


def scale_rule(name: str, chunk_elems: int, bucket: int = 512) -> ScaleRule:
    """The rule ``name`` registers, for chunks of ``chunk_elems`` values (``qsgd`` groups
    ``bucket`` elements, rounded to whole chunks, under one L2 norm). ValueError (one
    line, naming the choices) for an unknown name or a plugin that is not a rule."""
    rule = QUANTIZERS.get(name)
    if not isinstance(rule, ScaleRule):
        raise ValueError(f"quantizer {name!r} ({QUANTIZERS.origin(name)}) is a "
                         f"{type(rule).__name__}, not a ScaleRule instance")
    return rule.for_chunks(chunk_elems, bucket)


def agree_exponents(*worker_exps: np.ndarray) -> np.ndarray:
    """The exponents a job uses: per chunk the maximum over the workers' own."""
    if not worker_exps:
        raise ValueError("no exponents to agree on")
    return np.maximum.reduce([np.asarray(e, dtype=np.int8) for e in worker_exps])


class Quantizer:
    """Quantizes gradients to a job's lane format and dequantizes aggregated sums.

    ``rng`` drives the stochastic rounding (a fresh generator if None). With
    ``stochastic=False`` values round to the nearest level instead (b = 1: the sign),
    which is biased for b <= 8 but the usual choice for the b = 32 baseline.

    One instance keeps scratch buffers between calls: use one per thread.
    """

    def __init__(self, fmt: LaneFormat, rng: np.random.Generator | None = None,
                 stochastic: bool = True, rule: ScaleRule | None = None):
        self.fmt = fmt
        self.rule = rule or MAXPOW2
        self.rng = np.random.default_rng() if rng is None else rng
        self.stochastic = stochastic
        self.dtype = np.dtype(np.float64 if fmt.bits == WORD_BITS else np.float32)
        # u = floor(g * (gain / 2**e) + centre + r), clipped to 0..2*centre, r in [0, 1)
        if fmt.bits == 1:
            self._gain, self._centre = 0.5, 0.5  # u = 1 with probability (1 + x) / 2
        else:
            self._gain, self._centre = float(fmt.levels), float(fmt.levels)
        self._scaled = np.empty(0, dtype=self.dtype)
        self._noise = np.empty(0, dtype=self.dtype)

    def __repr__(self):
        rounding = "stochastic" if self.stochastic else "nearest"
        return f"Quantizer({self.fmt.describe()}, {rounding})"

    # -- layout -------------------------------------------------------------------------
    def check_chunk(self, chunk_elems: int) -> None:
        """Raise ValueError unless chunks of ``chunk_elems`` start on word boundaries."""
        if chunk_elems <= 0 or chunk_elems % self.fmt.lanes:
            raise ValueError(f"chunk_elems={chunk_elems} is not a positive multiple of "
                             f"the {self.fmt.lanes} lanes per word of {self.fmt.describe()}")

    def chunk_words(self, chunk_elems: int) -> int:
        """Words one full chunk of ``chunk_elems`` elements occupies."""
        self.check_chunk(chunk_elems)
        return chunk_elems // self.fmt.lanes

    # -- quantization -------------------------------------------------------------------
    def quantize(self, grad: np.ndarray, exps: np.ndarray, chunk_elems: int) -> np.ndarray:
        """Levels (int32) of the flattened ``grad`` under per-chunk exponents ``exps``.

        b >= 2: levels in -L..L; b = 1: values in {0, 1} (1 meaning +1).
        """
        return self.levels(self.encodings(grad, exps, chunk_elems))

    def levels(self, u: np.ndarray) -> np.ndarray:
        """Levels (int32) of lane values ``u`` from :meth:`encodings` (reused in place)."""
        if self.fmt.bits == WORD_BITS:
            return (u.astype(np.int64) - self.fmt.offset).astype(np.int32)
        levels = u.view(np.int32)  # u <= 2L < 2**31: the same bits
        levels -= self.fmt.offset
        return levels

    def dequantize_sum(self, level_sums: np.ndarray, exps: np.ndarray,
                       chunk_elems: int) -> np.ndarray:
        """float32 gradient sum from the workers' summed levels (b = 1: ``2s - n``)."""
        sums = np.asarray(level_sums)
        out = sums.astype(self.dtype)
        factors = self.rule.factors(self._exponents(exps, len(sums), chunk_elems))
        factors /= self._gain_for_sum()
        _scale_chunks(out, factors.astype(self.dtype), chunk_elems, out)
        return out if out.dtype == np.float32 else out.astype(np.float32)

    def encode(self, grad: np.ndarray, exps: np.ndarray, chunk_elems: int) -> np.ndarray:
        """Quantize and pack a flattened gradient into uint32 words, chunk after chunk."""
        self.check_chunk(chunk_elems)
        return self.fmt.pack_lanes(self.encodings(grad, exps, chunk_elems))

    def decode(self, words: np.ndarray, exps: np.ndarray, count: int,
               chunk_elems: int) -> np.ndarray:
        """float32 sum of ``count`` elements from aggregated words."""
        self.check_chunk(chunk_elems)
        if len(words) < self.fmt.words_for(count):
            raise ValueError(f"{len(words)} words cannot hold {count} elements "
                             f"({self.fmt.describe()})")
        return self.dequantize_sum(self.fmt.unpack_sum(words, count), exps, chunk_elems)

    # -- one pass per element (hosts/kernels.py) ---------------------------------
    def quantize_into(self, grad: np.ndarray, exps: np.ndarray, chunk_elems: int,
                      payload: np.ndarray, levels: np.ndarray | None = None) -> None:
        """Quantize and pack ``grad`` into ``payload``, chunk ``r`` into row ``r`` (the
        payload words of one packet, big-endian ``>u4``); what ``encode`` gives, in one
        pass. ``levels``, if given, gets the levels as :meth:`quantize` returns them."""
        from . import kernels
        g = np.asarray(grad).reshape(-1)
        e = self._exponents(exps, len(g), chunk_elems)
        gains = (self._gain / self.rule.factors(e)).astype(self.dtype)
        n = len(g)
        if self.stochastic:
            noise = self.rng.random(dtype=self.dtype, out=self._buffer("_noise", n))
            add = self.dtype.type(self._centre)
        else:
            noise = self._buffer("_noise", 0)
            add = self.dtype.type(self._centre + 0.5)
        kernels.quantize_pack(g, gains, noise, add, self.dtype.type(2.0 * self._centre),
                              chunk_elems, self.fmt.lanes, self.fmt.width, self.fmt.offset,
                              payload.view(np.uint32),
                              _NO_LEVELS if levels is None else levels)

    def dequantize_words(self, payload: np.ndarray, exps: np.ndarray, count: int,
                         chunk_elems: int, sums: np.ndarray | None = None) -> np.ndarray:
        """float32 sum of ``count`` elements from aggregated payload rows (big-endian
        ``>u4``, one packet's words per row): what ``decode`` gives, in one pass.
        ``sums`` (int64), if given, gets the level sums as ``unpack_sum`` returns them."""
        from . import kernels
        fmt = self.fmt
        factors = self.rule.factors(self._exponents(exps, count, chunk_elems))
        factors = (factors / self._gain_for_sum()).astype(self.dtype)
        out = np.empty(count, dtype=np.float32)
        kernels.unpack_scale(payload.view(np.uint32), count, fmt.lanes, fmt.width,
                             (fmt.workers * fmt.offset) & 0xFFFFFFFF if fmt.bits == WORD_BITS
                             else fmt.workers * fmt.offset,
                             fmt.workers if fmt.bits == 1 else 0, factors, chunk_elems, out,
                             _NO_SUMS if sums is None else sums, np.zeros(1, self.dtype))
        return out

    # -- internals ----------------------------------------------------------------------
    def _gain_for_sum(self) -> float:
        # b = 1 level sums are 2s - n, already in units of 2**e; otherwise units of 2**e/L
        return 1.0 if self.fmt.bits == 1 else self._gain

    def _exponents(self, exps, elements: int, chunk_elems: int) -> np.ndarray:
        exps = np.asarray(exps)
        if exps.dtype.kind not in "iu":
            raise TypeError(f"exponents must be integers, not {exps.dtype}")
        chunks = chunk_count(elements, chunk_elems)
        if exps.shape != (chunks,):
            raise ValueError(f"{elements} elements in chunks of {chunk_elems} need "
                             f"{chunks} exponents, got shape {exps.shape}")
        return np.clip(exps.astype(np.int32), self.rule.code_min, self.rule.code_max)

    def _buffer(self, name: str, size: int) -> np.ndarray:
        buf = getattr(self, name)
        if len(buf) < size:
            buf = np.empty(size, dtype=self.dtype)
            setattr(self, name, buf)
        return buf[:size]

    def encodings(self, grad, exps, chunk_elems: int) -> np.ndarray:
        """Offset-binary lane values u (uint32, 0..2*centre) of the flattened gradient."""
        g = np.asarray(grad).reshape(-1)
        if g.dtype.kind != "f":
            raise TypeError(f"gradient must be floating point, not {g.dtype}")
        n = len(g)
        e = self._exponents(exps, n, chunk_elems)
        gains = (self._gain / self.rule.factors(e)).astype(self.dtype)  # gain / scale
        y = self._buffer("_scaled", n)
        _scale_chunks(g, gains, chunk_elems, y)
        if self.stochastic:
            y += self.rng.random(dtype=self.dtype, out=self._buffer("_noise", n))
            y += self._centre
        else:
            y += self._centre + 0.5
        # |x| <= 1 keeps y within 0..2*centre+1; the clip removes the top value that
        # float rounding of (2*centre + r) can produce, and keeps wrong exponents from
        # spilling into a neighbour lane. For y >= 0 the cast truncates, i.e. floors.
        np.clip(y, 0.0, 2.0 * self._centre, out=y)
        return y.astype(np.uint32)


def _scale_chunks(values: np.ndarray, factors: np.ndarray, chunk_elems: int,
                  out: np.ndarray) -> None:
    """out[i] = values[i] * factors[i // chunk_elems], without a per-element factor array."""
    n = len(values)
    full = n // chunk_elems
    cut = full * chunk_elems
    if full:
        np.multiply(values[:cut].reshape(full, chunk_elems), factors[:full, None],
                    out=out[:cut].reshape(full, chunk_elems))
    if cut < n:
        np.multiply(values[cut:], factors[full], out=out[cut:])
