"""``qaina-bench bench``: the benchmarks, each printing its figures (never timed tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...p4.header import PAYLOAD_WORDS, QAINA_WORDS
from ...hosts.lanes import BIT_WIDTHS
from ...hosts.collective import MODES
from ...p4.constants import POOL_SLOTS
from ..plugincli import RegistryChoice
from .benchchecks import (BANDWIDTH, REPEATS, Within, benchmark_errors, check_burst, check_csv,
                          check_results_dir, check_table_options, check_table_traces, fail,
                          need_root)
from .scalebench import RECIPE as SCALE_RECIPE
from .testbedbench import HEADLINE_JOBS

#: what a benchmark stopped by Ctrl-C or SIGTERM leaves (it removes what it started)
NOTHING_KEPT = "what it had started is removed; no table or CSV written"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench():
    """Benchmarks that print figures."""


@bench.command("switch")
@click.option("--target", "targets", type=click.Choice(["embedded", "bmv2"]), multiple=True,
              default=["embedded"], show_default=True,
              help="repeat to compare targets (prints the ratio)")
@click.option("--bits", type=click.Choice([str(b) for b in BIT_WIDTHS]), multiple=True,
              default=["4", "32"], show_default=True)
@click.option("--rate", type=Within(100, 10_000_000), multiple=True,
              help="offered contributions/s (default: a sweep per target)")
@click.option("--seconds", type=Within(0.1, 3600), default=4.0, show_default=True,
              help="of offered load at each rate")
@click.option("--repeat", type=REPEATS, default=1, show_default=True,
              help="runs per rate: mean and range")
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              multiple=True, default=[str(QAINA_WORDS)], show_default=True,
              help="the qaina.p4 build (repeat to compare)")
@click.option("--switch-cpu", "cpu_share", type=Within(0.05, 1.0),
              help="give the switch this share of its core (cgroup CPU bandwidth) and "
                   "scale the default sweep by it, so that a sender that cannot outrun "
                   "a whole core still offers twice the peak")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write a row per point to this CSV file too")
def bench_switch(targets, bits, rate, seconds, repeat, words, cpu_share, csv_path):
    """Aggregation packets/s through one switch on one core, same frames and pacing
    for every target (root)."""
    from . import bench as b
    from ..switches.targets import bmv2_missing
    check_burst(rate, seconds, b.BURST)
    need_root("switch")
    if "bmv2" in targets and bmv2_missing():
        fail(f"--target bmv2: {bmv2_missing()}")
    problem = b.SwitchCpu.problem() if cpu_share is not None else None
    if problem:
        fail(problem)
    check_csv(csv_path)
    with benchmark_errors(NOTHING_KEPT):
        b.switch_table(list(targets), [int(x) for x in bits], list(rate), seconds, repeat,
                       [int(w) for w in words], csv_path, cpu_share)


@bench.command("testbed")
@click.option("--bw", type=BANDWIDTH, default=1.0, show_default=True,
              help="link Mbit/s (of the repeat and comparison tables)")
@click.option("--iterations", type=click.IntRange(1), default=6, show_default=True,
              help="of every run (at most its trace set's)")
@click.option("--repeat", type=REPEATS, default=3, show_default=True,
              help="runs of each configuration (mean and range; the repeat table's CV)")
@click.option("--table", "tables", multiple=True,
              type=click.Choice(["transport", "repeat", "comparison", "ratio", "cost",
                                 "headline", "coalescing", "sampling"]),
              help="only these tables (default all)")
@click.option("--ratio-bw", type=BANDWIDTH, default=3.0, show_default=True,
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
@click.option("--slots", type=click.IntRange(1, POOL_SLOTS // HEADLINE_JOBS), multiple=True,
              help="the headline's in-network runs with these slots per job (the "
                   f"window; repeatable; default 32, up's default; its {HEADLINE_JOBS} "
                   f"jobs share the pool of {POOL_SLOTS})")
@click.pass_context
def bench_testbed(ctx, tables, csv_path, **opts):
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
    from .testbedbench import CSV_TABLES, TABLE_OPTIONS, TABLE_TRACES, TESTBED_TABLES
    tables = tables or TESTBED_TABLES
    check_table_options(ctx, tables, TABLE_OPTIONS)
    if csv_path and (len(tables) != 1 or tables[0] not in CSV_TABLES):
        raise click.UsageError("--csv writes one table: add exactly one --table of "
                               + ", ".join(CSV_TABLES), ctx)
    check_table_traces(tables, opts, TABLE_TRACES)
    need_root("testbed")
    check_csv(csv_path)
    with benchmark_errors(NOTHING_KEPT):
        b.testbed_tables(tables, opts, csv_path)


@bench.command("control")
@click.option("--repeat", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="reads of each kind")
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              default=str(QAINA_WORDS), show_default=True,
              help="the qaina.p4 build (its agg_sum has 2048 x words cells)")
def bench_control(repeat, words):
    """P4Runtime reads of an embedded switch: one Read of every entity (the whole
    agg_sum included) and the sampler's slot-counter Read, mean and range (root)."""
    need_root("control")
    from .controlbench import control_table
    with benchmark_errors(NOTHING_KEPT):
        control_table(repeat, int(words))


@bench.command("scale")
@click.option("--workers", "sizes", type=click.IntRange(1, SCALE_RECIPE["workers"]),
              multiple=True, default=[4, 8, 16, 32], show_default=True,
              help="workers of the one job (repeat; at most the trace set's "
                   f"{SCALE_RECIPE['workers']})")
@click.option("--cluster", "clusters", multiple=True, metavar="SERVERS",
              help="also run on this cluster (as up --cluster; repeat); this machine "
              "alone always runs first")
@click.option("--iterations", type=click.IntRange(1, SCALE_RECIPE["iterations"]), default=2,
              show_default=True, help="of each run (at most the trace set's "
                                      f"{SCALE_RECIPE['iterations']})")
@click.option("--bw", type=BANDWIDTH, default=None, help="link Mbit/s (default unshaped)")
@click.option("--results-dir", type=click.Path(), default="results/scale", show_default=True,
              help="where the runs go (on a cluster: a directory every server shares)")
@click.option("--repeat", type=REPEATS, default=1, show_default=True,
              help="runs of each point (interleaved; mean and range)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write a row per run to this CSV file too")
def bench_scale(sizes, clusters, iterations, bw, results_dir, repeat, csv_path):
    """Bring-up, completion, CPU per aggregated element and fidelity verdict at each
    number of workers, on this machine and on clusters (root)."""
    from .scalebench import TRACE, scale, write_csv
    need_root("scale")
    check_results_dir(Path(results_dir), f"traces/{TRACE}")  # where its trace is recorded
    check_csv(csv_path)  # checked now, written after the runs
    with benchmark_errors(f"the runs so far are in {results_dir}"):
        rows = scale(sizes, [None, *clusters], iterations, bw, Path(results_dir),
                     echo=click.echo, repeat=repeat)
        if csv_path:
            write_csv(Path(csv_path), rows)


def check_formats(bits, workers):
    """One line, before any work, for a bit width and worker count that make no lane
    format."""
    from ...hosts.lanes import LaneError, LaneFormat
    for b in bits:
        for n in workers:
            try:
                LaneFormat(int(b), n)
            except LaneError as exc:
                raise click.ClickException(f"--bits {b} with --workers {n}: {exc}") from None


@bench.command("floor")
@click.option("--bits", type=click.Choice([str(b) for b in BIT_WIDTHS]), multiple=True,
              default=["4", "32"], show_default=True)
@click.option("--workers", type=click.IntRange(1, 256), multiple=True, default=[4, 8],
              show_default=True, help="workers of a job (repeat)")
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              default="256", show_default=True, help="the qaina.p4 build: a chunk's words")
@click.option("--count", type=click.IntRange(1000, 10_000_000), default=200_000,
              show_default=True, help="datagrams of each run")
@click.option("--window", type=click.IntRange(1, 4096), default=32, show_default=True,
              help="datagrams in flight (up's default window of slots)")
@click.option("--repeat", type=REPEATS, default=3, show_default=True,
              help="runs of the datagram measurement (mean and range)")
def bench_floor(bits, workers, words, count, window, repeat):
    """The least CPU the agents spend per aggregated element: a datagram sent and its
    answer received between two namespaces (through UDP sockets, as the agents, and
    through PACKET_MMAP rings, as the switch's ports), and the encode and decode
    kernels (root)."""
    check_formats(bits, workers)
    need_root("floor")
    from .floorbench import FloorError, floor_table
    with benchmark_errors(NOTHING_KEPT):
        try:
            floor_table(int(words), [int(b) for b in bits], list(workers), count, window,
                        repeat, echo=click.echo)
        except FloorError as exc:
            fail(f"bench floor: {exc}")


@bench.command("codec")
@click.option("--bits", type=int, multiple=True, help="bit widths (default 4 and 32)")
@click.option("--workers", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--payload-words", "words", type=click.Choice([str(w) for w in PAYLOAD_WORDS]),
              default=str(QAINA_WORDS), show_default=True,
              help="payload words per packet (a chunk is words x lanes elements)")
@click.option("--repeats", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="timings of each (the best is printed)")
def bench_codec(bits, workers, words, repeats):
    """Agent encode/decode throughput, numpy reference and the agents' kernels (fp32
    MB/s and ns per element, one core)."""
    from ...hosts import codec_bench
    check_formats(bits or (4, 32), [workers])  # before any timing
    args = ["--workers", str(workers), "--words", words, "--repeats", str(repeats)]
    if bits:
        args += ["--bits", *map(str, bits)]
    sys.exit(codec_bench.main(args))
