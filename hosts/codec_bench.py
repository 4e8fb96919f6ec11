"""Throughput of the worker codec: quantize + pack (encode), unpack + dequantize (decode).

Prints, per bit width, fp32 megabytes (10**6 bytes of the float32 gradient) per second
on one core, best of several runs, for a job of ``n`` workers and chunks of one
packet's words: the numpy reference (``encode``/``decode``) and the compiled one-pass
kernels the agents run (``quantize_into`` into whole datagrams, ``dequantize_words``),
the chunk exponents, and the random numbers stochastic rounding draws (part of either
encode), also as nanoseconds per element:

    qaina-bench bench codec [--bits 4 32] [--workers 4] [--words 256]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from .lanes import LaneFormat
from ..p4.header import PAYLOAD_WORDS, QAINA_WORDS
from .quantize import Quantizer, agree_exponents, chunk_exponents



def best_time(run, repeats: int) -> float:
    """The shortest of ``repeats`` wall-clock timings of ``run()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(bits: int, workers: int, elements: int, repeats: int, seed: int = 0,
            words: int = QAINA_WORDS) -> dict:
    """Encode, decode and exponent throughput (fp32 MB/s) for one lane format: the
    numpy reference and the kernels."""
    from . import kernels
    from ..p4.header import wire
    fmt = LaneFormat(bits, workers)
    chunk = words * fmt.lanes
    rng = np.random.default_rng(seed)
    grads = [(rng.standard_normal(elements) * 1e-3).astype(np.float32) for _ in range(workers)]
    exps = agree_exponents(*[chunk_exponents(g, chunk) for g in grads])
    quantizer = Quantizer(fmt, np.random.default_rng(seed + 1))
    aggregate = np.zeros(fmt.words_for(elements), dtype=np.uint32)
    for g in grads:
        aggregate += quantizer.encode(g, exps, chunk)
    mb = elements * 4 / 1e6
    kernels.warm()
    noise = np.empty(elements, dtype=quantizer.dtype)  # stochastic rounding's draws
    datagrams = np.zeros(-(-elements // chunk), dtype=wire(words).dtype)
    results = np.zeros((len(datagrams), words), dtype=">u4")
    results.reshape(-1)[:len(aggregate)] = aggregate
    return {
        "format": fmt.describe(),
        "kernel_encode": mb / best_time(lambda: quantizer.quantize_into(
            grads[0], exps, chunk, datagrams["words"]), repeats),
        "kernel_decode": mb / best_time(lambda: quantizer.dequantize_words(
            results, exps, elements, chunk), repeats),
        "encode": mb / best_time(lambda: quantizer.encode(grads[0], exps, chunk), repeats),
        "decode": mb / best_time(lambda: quantizer.decode(aggregate, exps, elements, chunk),
                                 repeats),
        "exponents": mb / best_time(lambda: chunk_exponents(grads[0], chunk), repeats),
        "random": mb / best_time(lambda: quantizer.rng.random(
            dtype=quantizer.dtype, out=noise), repeats),
    }


def pin_to_one_core() -> str:
    """Run on a single CPU where the platform allows it; say which."""
    if not hasattr(os, "sched_setaffinity"):
        return "any core (affinity not settable here)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"cpu {cpu}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qaina_bench.hosts.codec_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--elements", type=int, default=2**20)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--words", type=int, default=QAINA_WORDS, choices=PAYLOAD_WORDS,
                        help="payload words per packet (chunks of words x lanes elements)")
    args = parser.parse_args(argv)
    where = pin_to_one_core()
    print(f"codec throughput, {args.elements} float32 elements, {args.workers} workers, "
          f"chunks of {args.words} words, best of {args.repeats}, {where}; fp32 MB/s "
          "(ns per element)")
    print(f"{'format':<24} {'encode':>14} {'decode':>14} {'kernel encode':>14} "
          f"{'kernel decode':>14} {'exponents':>14} {'random':>14}")
    for bits in args.bits:
        r = measure(bits, args.workers, args.elements, args.repeats, words=args.words)
        cells = [f"{r[k]:.0f} ({4e3 / r[k]:.1f})" for k in
                 ("encode", "decode", "kernel_encode", "kernel_decode", "exponents",
                  "random")]
        print(f"{r['format']:<24} " + " ".join(f"{c:>14}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
