"""``qaina-bench bench``: the benchmarks, each printing its figures (never timed tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...p4.header import PAYLOAD_WORDS, QAINA_WORDS
from ...hosts.lanes import BIT_WIDTHS
from ...hosts.collective import MODES
from ..options import Positive
from ..plugincli import RegistryChoice

POSITIVE = Positive()  # rates, durations, Mbit/s
PROG = "qaina-bench bench"  # what the benchmarks' own errors call the command


@click.group()
def bench():
    """Benchmarks that print figures."""


@bench.command("switch")
@click.option("--target", "targets", type=click.Choice(["embedded", "bmv2"]), multiple=True,
              default=["embedded"], show_default=True,
              help="repeat to compare targets (prints the ratio)")
@click.option("--bits", type=click.Choice([str(b) for b in BIT_WIDTHS]), multiple=True,
              default=["4", "32"], show_default=True)
@click.option("--rate", type=POSITIVE, multiple=True,
              help="offered contributions/s (default: a sweep per target)")
@click.option("--seconds", type=POSITIVE, default=4.0, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="runs per rate: mean and range")
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              multiple=True, default=[str(QAINA_WORDS)], show_default=True,
              help="the qaina.p4 build (repeat to compare)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write a row per point to this CSV file too")
def bench_switch(targets, bits, rate, seconds, repeat, words, csv_path):
    """Aggregation packets/s through one switch on one core, same frames and pacing
    for every target (root)."""
    from . import bench as b
    args = ["switch", "--seconds", str(seconds), "--repeat", str(repeat)]
    for x in targets:
        args += ["--target", x]
    for x in bits:
        args += ["--bits", str(x)]
    for x in rate:
        args += ["--rate", str(x)]
    for x in words:
        args += ["--payload-words", x]
    if csv_path:
        args += ["--csv", csv_path]
    sys.exit(b.main(args, prog=PROG))


@bench.command("testbed")
@click.option("--bw", type=POSITIVE, default=1.0, show_default=True, help="link Mbit/s")
@click.option("--iterations", type=click.IntRange(1), default=6, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True,
              help="runs of each configuration (mean and range; the repeat table's CV)")
@click.option("--table", "tables", multiple=True,
              type=click.Choice(["transport", "repeat", "comparison", "ratio", "cost",
                                 "headline", "coalescing", "sampling"]),
              help="only these tables (default all)")
@click.option("--ratio-bw", type=POSITIVE, default=3.0, show_default=True,
              help="link Mbit/s of the in-network / ring ratio (n=8, b=4, 256 words)")
@click.option("--ratio-trace", default="digits-mlp-wide", show_default=True,
              help="trace set of the ratio (digits-mlp-wide is recorded on first use)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write the table to this CSV file too (one --table of ratio, cost, "
                   "headline, coalescing, sampling)")
@click.option("--mode", "modes", type=RegistryChoice(MODES), multiple=True,
              help="the cost table for these schemes only (default all)")
@click.option("--workers", type=click.Choice(["4", "8"]), multiple=True,
              help="the cost table for these worker counts only (default both)")
@click.option("--headline-trace", default="digits-mlp-wide", show_default=True,
              help="trace set of the headline")
@click.option("--variants-trace", default="digits-mlp-wide", show_default=True,
              help="trace set of the coalescing and sampling tables")
@click.option("--slots", type=click.IntRange(1), multiple=True,
              help="the headline's in-network runs with these slots per job (the "
                   "window; repeatable; default 32, up's default)")
def bench_testbed(bw, iterations, repeat, tables, ratio_bw, ratio_trace, csv_path, modes,
                  workers, headline_trace, variants_trace, slots):
    """Transport (retransmissions, time against the link rate, repeatability),
    elements/s of b=4 against b=32 and a ring, on star and leaf-spine, the
    in-network / ring iteration-time ratio at n=8, (--table cost) the CPU seconds per
    million aggregated elements of every component with the fidelity verdicts,
    in-network, ring and parameter server at n=4 and 8, unshaped and at 16 Mbit/s, and
    (--table headline) 2 jobs x 8 workers unshaped, in-network and ring, and (--table
    coalescing) in-network n=8 at 16, 64 Mbit/s and unshaped with receive coalescing
    off, in the agents, and in the agents and the switch, and (--table sampling) the
    same at 16 Mbit/s and unshaped with the sampler's slot reads every 10 and 100 ms
    (root)."""
    from . import bench as b
    args = ["testbed", "--bw", str(bw), "--iterations", str(iterations), "--repeat",
            str(repeat), "--ratio-bw", str(ratio_bw), "--ratio-trace", ratio_trace]
    if csv_path:
        args += ["--csv", csv_path]
    for t in tables:
        args += ["--table", t]
    for m in modes:
        args += ["--mode", m]
    for n in workers:
        args += ["--workers", n]
    args += ["--headline-trace", headline_trace, "--variants-trace", variants_trace]
    for n in slots:
        args += ["--slots", str(n)]
    sys.exit(b.main(args, prog=PROG))


@bench.command("control")
@click.option("--repeat", type=click.IntRange(1), default=10, show_default=True,
              help="reads of each kind")
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              default=str(QAINA_WORDS), show_default=True,
              help="the qaina.p4 build (its agg_sum has 2048 x words cells)")
def bench_control(repeat, words):
    """P4Runtime reads of an embedded switch: one Read of every entity (the whole
    agg_sum included) and the sampler's slot-counter Read, mean and range (root)."""
    from . import bench as b
    sys.exit(b.main(["control", "--repeat", str(repeat), "--payload-words", words], prog=PROG))


@bench.command("scale")
@click.option("--workers", "sizes", type=click.IntRange(1), multiple=True,
              default=[4, 8, 16, 32],
              show_default=True, help="workers of the one job (repeat)")
@click.option("--cluster", "clusters", multiple=True, metavar="SERVERS",
              help="also run on this cluster (as up --cluster; repeat); this machine "
              "alone always runs first")
@click.option("--iterations", type=click.IntRange(1), default=2, show_default=True)
@click.option("--bw", type=POSITIVE, default=None, help="link Mbit/s (default unshaped)")
@click.option("--results-dir", type=click.Path(), default="results/scale", show_default=True,
              help="where the runs go (on a cluster: a directory every server shares)")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="runs of each point (interleaved; mean and range)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write a row per run to this CSV file too")
def bench_scale(sizes, clusters, iterations, bw, results_dir, repeat, csv_path):
    """Bring-up, completion, CPU per aggregated element and fidelity verdict at each
    number of workers, on this machine and on clusters (root)."""
    from ..config import ConfigError
    from .scalebench import scale, write_csv
    from ..results.resultset import unwritable
    if csv_path and unwritable(csv_path):  # checked now, written after the runs
        raise click.BadParameter(unwritable(csv_path), param_hint="--csv")
    try:
        rows = scale(sizes, [None, *clusters], iterations, bw, Path(results_dir),
                     echo=click.echo, repeat=repeat)
        if csv_path:
            write_csv(Path(csv_path), rows)
    except (ConfigError, OSError) as exc:  # OSError: the --csv file, after the runs
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("\ninterrupted: the benchmark stopped (the runs so far are in "
                   f"{results_dir})", err=True)
        sys.exit(130)


@bench.command("codec")
@click.option("--bits", type=int, multiple=True, help="bit widths (default 4 and 32)")
@click.option("--workers", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              default=str(QAINA_WORDS), show_default=True,
              help="payload words per packet (a chunk is words x lanes elements)")
@click.option("--repeats", type=click.IntRange(1), default=20, show_default=True,
              help="timings of each (the best is printed)")
def bench_codec(bits, workers, words, repeats):
    """Agent encode/decode throughput, numpy reference and the agents' kernels (fp32
    MB/s and ns per element, one core)."""
    from ...hosts import codec_bench
    from ...hosts.lanes import LaneError, LaneFormat
    for b in bits or (4, 32):  # every width, at this many workers, before any timing
        try:
            LaneFormat(b, workers)
        except LaneError as exc:
            raise click.ClickException(f"--bits {b} with --workers {workers}: {exc}") from None
    args = ["--workers", str(workers), "--words", words, "--repeats", str(repeats)]
    if bits:
        args += ["--bits", *map(str, bits)]
    sys.exit(codec_bench.main(args))
