"""Throughput of the worker codec: quantize + pack (encode), unpack + dequantize (decode).

Prints, per bit width, fp32 megabytes (10**6 bytes of the float32 gradient) per second
on one core, best of several runs, for a job of ``n`` workers and chunks of 32 words:

    python -m qaina_bench.hosts.codec_bench [--bits 4 32] [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from .lanes import LaneFormat
from ..p4.header import QAINA_WORDS
from .quantize import Quantizer, agree_exponents, chunk_exponents



def best_time(run, repeats: int) -> float:
    """The shortest of ``repeats`` wall-clock timings of ``run()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(bits: int, workers: int, elements: int, repeats: int, seed: int = 0) -> dict:
    """Encode, decode and exponent throughput (fp32 MB/s) for one lane format."""
    fmt = LaneFormat(bits, workers)
    chunk = QAINA_WORDS * fmt.lanes
    rng = np.random.default_rng(seed)
    grads = [(rng.standard_normal(elements) * 1e-3).astype(np.float32) for _ in range(workers)]
    exps = agree_exponents(*[chunk_exponents(g, chunk) for g in grads])
    quantizer = Quantizer(fmt, np.random.default_rng(seed + 1))
    aggregate = np.zeros(fmt.words_for(elements), dtype=np.uint32)
    for g in grads:
        aggregate += quantizer.encode(g, exps, chunk)
    mb = elements * 4 / 1e6
    return {
        "format": fmt.describe(),
        "encode": mb / best_time(lambda: quantizer.encode(grads[0], exps, chunk), repeats),
        "decode": mb / best_time(lambda: quantizer.decode(aggregate, exps, elements, chunk),
                                 repeats),
        "exponents": mb / best_time(lambda: chunk_exponents(grads[0], chunk), repeats),
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
    args = parser.parse_args(argv)
    where = pin_to_one_core()
    print(f"codec throughput, {args.elements} float32 elements, {args.workers} workers, "
          f"chunks of {QAINA_WORDS} words, best of {args.repeats}, {where}")
    print(f"{'format':<24} {'encode MB/s':>12} {'decode MB/s':>12} {'exponents MB/s':>15}")
    for bits in args.bits:
        r = measure(bits, args.workers, args.elements, args.repeats)
        print(f"{r['format']:<24} {r['encode']:>12.0f} {r['decode']:>12.0f} "
              f"{r['exponents']:>15.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
