"""The ``qaina-bench`` command line."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from .config import ConfigError, RunConfig, check_system
from .results.tables import columns_help, print_summary
from .plugincli import QUANTIZERS, plugins
from .options import IntList, Positive, SectionedCommand, config_from, tree_options
from .running.mncli import DEFAULT as CLI_DEFAULT, WHEN as CLI_WHEN
from ..hosts.traces import MAX_WORKERS as MAX_TRACE_WORKERS

DEFAULTS = RunConfig()
TRAINING = DEFAULTS.training  # the one default of every training option


#: ``--trace-dir`` of the trace commands: a folder that exists (a mistyped one is named)
TRACE_DIR = click.Path(exists=True, file_okay=False)


def _fail(exc: Exception | str):
    raise click.ClickException(str(exc)) from None


def BitsType():
    """``4`` or ``4,32``: one width for every job, or one per job."""
    return IntList()


class Main(click.Group):
    """The command group: a Ctrl-C that no command handles itself ends with one line
    and exit 130, as a shell expects of SIGINT (click would say "Aborted!", exit 1)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qaina-bench")
def main():
    """Testbed for quantization-aware in-network aggregation (QAINA) of gradients."""
    # A shell starts background jobs with SIGINT ignored; a run must still end on
    # one, as on Ctrl-C (torn down, results kept).
    signal.signal(signal.SIGINT, signal.default_int_handler)


def record_on_first_use(cfg: RunConfig) -> None:
    """Record ``--trace NAME`` of a recipe (``hosts/recorder.RECIPES``) on first use, with
    progress, as ``sweep`` and ``bench`` do; as root only (else ``up`` says it needs root)."""
    from ..hosts.recorder import RECIPES, ensure
    from ..hosts.traces import TraceError
    t = cfg.training
    if t.train or t.trace not in RECIPES or os.geteuid() != 0:
        return
    try:
        ensure(t.trace, t.trace_dirs or None, log=click.echo)
    except (TraceError, ImportError, ValueError) as exc:
        _fail(ValueError(f"recording trace set {t.trace} failed: {exc}"))


def execute(cfg: RunConfig, hold: bool = False, cli: str | None = None) -> dict:
    from .results.resultset import results_problem
    from .running.processes import terminal_echo
    from .running.run import Run, RunError
    from .switches.control import ControlError
    from .switches.targets import TargetError
    record_on_first_use(cfg)
    try:
        run = Run(cfg, echo=terminal_echo(click.echo), hold=hold, cli=cli)
    except ConfigError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        click.echo("interrupted before the run started", err=True)
        sys.exit(130)
    try:
        summary = run.execute()
        print_summary(summary, run.dir)
    except (RunError, ControlError, TargetError, OSError) as exc:
        click.echo(f"results so far: {run.dir}", err=True)
        _fail(results_problem(exc, run.dir) or exc)
    except KeyboardInterrupt:  # one more while the first was handled, or while printing
        click.echo(f"interrupted; results in {run.dir}", err=True)
        sys.exit(130)
    if run.signalled:  # a Ctrl-C or SIGTERM is never lost, whenever it came
        if summary["status"] != "interrupted":
            click.echo(f"interrupted while the run was torn down: its jobs had ended "
                       f"({summary['status']}), the results are whole: {run.dir}")
        sys.exit(130)
    if not summary["complete"]:
        sys.exit(1)
    return summary


@main.command(cls=SectionedCommand)
@tree_options
@click.option("--config", "config_path", type=click.Path(), metavar="CONFIG.yaml",
              help="start from this configuration (nested or flat); options given here "
              "override it")
@click.option("--hold", is_flag=True,
              help="keep the network and switches up after the jobs until Ctrl-C (then "
              "tear down and summarise as usual), to look at them with `qaina-bench shell`")
@click.option("--cli", "cli", type=click.Choice(CLI_WHEN), is_flag=False,
              flag_value=CLI_DEFAULT, default=None, metavar="[before|after]",
              help="Mininet's own CLI on the live network: `before` the jobs (plain --cli; "
              "leaving it starts them) or `after` them (leaving it tears down); README, "
              "\"Mininet's CLI\"")
@click.option("--dry-run", is_flag=True,
              help="check the configuration, print it (YAML, as the run would save it) and "
              "stop")
@click.pass_context
def up(ctx, config_path, hold, cli, dry_run, **opts):
    """Build the network, run the jobs, measure, tear down, summarise."""
    base = _load(config_path) if config_path else RunConfig()
    cfg = config_from(ctx, opts, base)
    if dry_run:
        return show(cfg)
    execute(cfg, hold=hold, cli=cli)


@main.command(cls=SectionedCommand)
@click.argument("config", type=click.Path())
@tree_options
@click.option("--dry-run", is_flag=True,
              help="check the configuration, print it (YAML) and stop")
@click.pass_context
def run(ctx, config, dry_run, **opts):
    """Run the configuration in CONFIG.yaml (e.g. a saved results/<run>/config.yaml);
    options given here override it (a new --run-id unless given)."""
    cfg = _load(config)
    cfg.output.run_id = None
    cfg = config_from(ctx, opts, cfg)
    if dry_run:
        return show(cfg)
    execute(cfg)


def show(cfg: RunConfig):
    """Check ``cfg`` (one line if it cannot work) and print it as YAML. Also what ``up``
    checks of the options before it asks anything of the machine: ``--cluster``'s
    servers as written (not whether they answer) and ``--pcap``'s names."""
    try:
        cfg.check()
        if cfg.network.cluster:
            from .running.cluster import Cluster
            Cluster.parse(cfg.network.cluster)
        if cfg.output.pcap:
            from .running.capture import CapturePlan
            from .running.run import build_topology
            CapturePlan.resolve(cfg.output.pcap, build_topology(cfg), cfg.output.pcap_size)
        out = cfg.output
        if out.run_id and (Path(out.results_dir) / out.run_id).exists():  # as up refuses it
            raise ConfigError(f"results directory {Path(out.results_dir) / out.run_id} "
                              "exists; choose another --run-id")
    except ConfigError as exc:
        _fail(exc)
    click.echo(cfg.to_yaml().rstrip("\n"))


def _load(path) -> RunConfig:
    try:
        return RunConfig.from_yaml(path)
    except (ConfigError, TypeError) as exc:
        _fail(exc)


@main.command()
@click.option("--cluster", metavar="SERVERS",
              help="also check each server of this cluster (as `up --cluster` takes it): "
              "ssh, root, Mininet, tunnels, the same qaina-bench")
@click.option("--target", type=click.Choice(["embedded", "bmv2"]), default="embedded",
              help="the switch target to check for (bmv2: BMv2 and p4c here, and on every "
              "server of --cluster)")
def doctor(cluster, target):
    """Check the prerequisites and say what to install."""
    servers = []
    if cluster:
        from .running.cluster import Cluster
        try:
            servers = Cluster.parse(cluster).servers
        except ConfigError as exc:
            _fail(exc)
    checks = check_system(bmv2_needed=_local_bmv2(target, servers))
    if servers:
        from .running.clustercheck import check_server
        checks = checks + [c for s in servers for c in check_server(s, target)]
    bad = 0
    for what, ok, fix in checks:
        optional = "optional" in what
        mark = "ok " if ok else ("-- " if optional else "NO ")
        click.echo(f"{mark} {what}" + ("" if ok else f": {fix}"))
        bad += 0 if ok or optional else 1
    sys.exit(1 if bad else 0)


def _local_bmv2(target: str, servers: list) -> str | None:
    """Why ``doctor --target bmv2`` needs BMv2 and p4c on this machine, or None."""
    if target != "bmv2":
        return None
    if not servers:
        return "--target bmv2"
    if any(s.local for s in servers):
        return "--target bmv2: a switch may run here, a server of the cluster"
    return "optional: this machine is not a server of the cluster, which compiles with p4c there"


def _election_id(ctx, param, text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    high, sep, low = text.partition(",")
    if not sep or not high.strip().isdigit() or not low.strip().isdigit() \
            or max(int(high), int(low)) >> 64:
        raise click.BadParameter(f"{text!r}: expected HIGH,LOW (64-bit each), e.g. 0,1")
    return int(high), int(low)


@main.command()
@click.argument("switch")
@click.option("--run", "run_id", help="the live run (default: the only one up)")
@click.option("--election-id", "election", metavar="HIGH,LOW", callback=_election_id,
              help="p4runtime-shell's election id (default 0,<pid>: a backup below the "
              "harness's 1,0, which reads; above 1,0 the shell becomes primary and the "
              "harness's writes fail from then on)")
def shell(switch, run_id, election):
    """Attach p4runtime-shell to SWITCH (e.g. s1) of a live run (`up --hold` keeps one
    up); it runs from its own venv (`make shell-tool`)."""
    import os
    from .shelltool import ShellError, backup_election_id, find_switch, shell_command, \
        shell_python
    try:
        address = find_switch(switch, run_id)
        python = shell_python()
    except ShellError as exc:
        _fail(exc)
    eid = election or backup_election_id()
    click.echo(f"p4runtime-shell on {address.name} of {address.run_id} ({address.target}, "
               f"device {address.device_id}, {address.grpc_addr}), election id "
               f"{eid[0]},{eid[1]}", err=True)
    cmd = shell_command(python, address, eid)
    os.execv(cmd[0], cmd)


@main.command()
def clean():
    """Remove what crashed runs left behind (only what their records list)."""
    import time
    from .running.record import leftover_temp_files, stale_records, unreadable_records
    if os.geteuid() != 0:  # the records and what they list are root's
        _fail("qaina-bench clean needs root (the runs' records, their links and "
              "processes are root's): run it with sudo")
    recs = stale_records()
    for rec in recs:
        for line in rec.remove() or ["nothing left"]:
            click.echo(f"{rec.run_id}: {line}")
    temps = [p for p in leftover_temp_files() if time.time() - p.stat().st_mtime > 60]
    for path in temps:
        path.unlink(missing_ok=True)
        click.echo(f"removed the half-written record {path}")
    odd = unreadable_records()
    for path, why in odd:  # a damaged record would hide what its run left
        why = why.replace(str(path), "").strip(" :") or "unreadable"
        click.echo(f"{path}: no run record this can read ({why[:120]}); left as it is: "
                   "if it was a run's, remove what it lists by hand, then the file")
    if not recs and not temps and not odd:
        click.echo("nothing to clean")


@main.command()
@click.option("--out", "out", type=click.Path(dir_okay=False), metavar="FILE",
              help="write it here (default: print it)")
def dissector(out):
    """Write the Wireshark dissector of the QAINA header (Lua, from p4/header.py); use it
    with `tshark -X lua_script:FILE` or put it in Wireshark's plugin folder."""
    from ..p4.wireshark import dissector_lua
    if out is None:
        click.echo(dissector_lua(), nl=False)
        return
    from .results.resultset import write_whole
    try:
        write_whole(out, dissector_lua())  # whole or not at all
    except OSError as exc:
        _fail(exc)
    click.echo(f"wrote {out}")


# -- traces --------------------------------------------------------------------------
@main.group()
def traces():
    """List, show and record gradient trace sets."""


@traces.command("list")
@click.option("--trace-dir", "dirs", multiple=True, type=TRACE_DIR)
def traces_list(dirs):
    """Trace sets found in the search path (--trace-dir first, then the bundled sets),
    then the recipes not recorded yet (`up`, `sweep` and `bench` record them on first use)."""
    from ..hosts.recorder import RECIPES, describe
    from ..hosts.traces import list_traces
    found = list_traces(list(dirs) or None)
    for t in found:
        if t.problem:
            click.echo(f"{t.name}  UNUSABLE: {t.problem}")
        else:
            click.echo(f"{t.name}  {t.model}  {t.workers} workers x {t.iterations} iterations x "
                       f"{t.elements} elements  {t.path}")
    for name in [n for n in RECIPES if n not in {t.name for t in found}]:
        click.echo(f"{name}  not recorded yet: recorded on first use ({describe(RECIPES[name])})")


@traces.command("show")
@click.argument("name")
@click.option("--trace-dir", "dirs", multiple=True, type=TRACE_DIR)
def traces_show(name, dirs):
    """Where trace set NAME (a name or a path) is, and its manifest."""
    from ..hosts.traces import TraceError, find_trace, read_manifest
    try:
        path = find_trace(name, list(dirs) or None)
        manifest = read_manifest(path)  # the path is printed only with its manifest
        click.echo(path)
        click.echo(json.dumps(manifest, indent=1))
    except TraceError as exc:
        _fail(exc)


@traces.command("record")
@click.argument("name")
@click.option("--out", "out_dir", type=click.Path(),
              help="directory that receives NAME/ (default: the user's trace directory, "
              "which `up` searches)")
@click.option("--model", type=click.Choice(["mlp", "cnn", "resnet"]), default=TRAINING.model,
              show_default=True, help="cnn and resnet need PyTorch (its CPU build)")
@click.option("--workers", type=click.IntRange(1, MAX_TRACE_WORKERS), default=8,
              show_default=True, help="workers recorded (a run may use up to as many)")
@click.option("--iterations", type=click.IntRange(1), default=DEFAULTS.workload.iterations,
              show_default=True)
@click.option("--seed", type=int, default=DEFAULTS.workload.seed, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=TRAINING.batch_size,
              show_default=True, help="per worker")
@click.option("--lr", type=Positive(), default=TRAINING.lr,
              show_default=True, help="SGD learning rate")
@click.option("--hidden", type=IntList("layer size", "SIZES"),
              default=",".join(map(str, TRAINING.hidden)), show_default=True,
              help="mlp hidden layer sizes")
@click.option("--width", type=click.IntRange(1), default=TRAINING.width, show_default=True,
              help="resnet: channels of its first stage (64: ResNet-18's 11 M parameters)")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32",
              show_default=True, help="how gradients are stored (float16: half the size)")
@click.option("--overwrite", is_flag=True)
def traces_record(name, out_dir, model, workers, iterations, seed, batch_size, lr, hidden,
                  width, dtype, overwrite):
    """Train MODEL on scikit-learn's digits across WORKERS workers and record gradients."""
    from ..hosts.recorder import record
    from ..hosts.traces import TraceError
    try:
        ts = record(name, out_dir, model=model, workers=workers, iterations=iterations,
                    seed=seed, batch_size=batch_size, learning_rate=lr, hidden=tuple(hidden),
                    width=width, dtype=dtype, overwrite=overwrite, log=click.echo)
    except (TraceError, ImportError, ValueError) as exc:
        _fail(exc)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: trace set {name} not recorded (nothing of it written)",
                   err=True)
        sys.exit(130)
    click.echo(f"recorded {ts.path}: {ts.workers} workers x {ts.iterations} iterations x "
               f"{ts.elements} elements ({ts.dtype})")


# -- results -------------------------------------------------------------------------
@main.group()
def results():
    """List and show result sets."""


@results.command("list")
@click.option("--results-dir", type=click.Path(), default="results", show_default=True)
def results_list(results_dir):
    """Result sets, newest last: status and what was run."""
    from .results.summary import describe_run, list_runs
    from .results.tables import printable
    if Path(results_dir).exists() and not Path(results_dir).is_dir():
        _fail(f"--results-dir {results_dir} is not a directory")
    if not Path(results_dir).is_dir():
        _fail(f"--results-dir {results_dir}: no such directory (no run has written there)")
    runs = list_runs(Path(results_dir))
    for p in runs:
        click.echo(printable(f"{p.name:48} {describe_run(p)}"))
    if not runs:
        click.echo(f"no result sets in {results_dir} (a result set is a folder with a "
                   "config.yaml: `qaina-bench up --results-dir` names where runs go)")


@results.command("show")
@click.argument("run_dir", type=click.Path())
def results_show(run_dir):
    """The summary table of a result set, with what its columns mean."""
    from .results.summary import SummaryError, load_summary
    try:
        summary = load_summary(Path(run_dir))
    except SummaryError as exc:
        _fail(exc)
    try:
        print_summary(summary, Path(run_dir))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        _fail(f"{Path(run_dir) / 'summary.json'} is not a summary this qaina-bench can "
              f"read ({type(exc).__name__}: {exc})")
    click.echo(columns_help())


# -- evaluation ----------------------------------------------------------------------
@main.group("eval")
def evaluate():
    """Measurements of the compression itself, without the network."""


@evaluate.command("compression")
@click.option("--trace", default="digits-mlp", show_default=True,
              help="trace set for the relative error (open loop)")
@click.option("--trace-dir", "dirs", multiple=True, type=TRACE_DIR)
@click.option("--workers", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--bits", type=BitsType(), default="2,4,8,32", show_default=True)
@click.option("--quantizers", help="comma-separated (default: every registered one)")
@click.option("--gvq-k", type=click.IntRange(1, 64), default=8, show_default=True,
              help="GradiVeQ coefficients per slice of 64")
@click.option("--gvq-refresh", type=click.IntRange(0), default=4, show_default=True)
@click.option("--seeds", type=click.IntRange(1), default=2, show_default=True,
              help="repeats of each")
@click.option("--train-iterations", type=click.IntRange(0), default=0, show_default=True,
              help="train the model closed loop this long for a final accuracy (0: no)")
@click.option("--model", type=click.Choice(["mlp", "cnn", "resnet"]), default=TRAINING.model,
              show_default=True, help="the model trained closed loop")
@click.option("--lr", type=Positive(), default=TRAINING.lr,
              show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=TRAINING.batch_size,
              show_default=True)
@click.option("--hidden", type=IntList("layer size", "SIZES"),
              default=",".join(map(str, TRAINING.hidden)), show_default=True,
              help="mlp hidden layer sizes")
@click.option("--width", type=click.IntRange(1), default=TRAINING.width, show_default=True,
              help="resnet width")
@click.option("--error-feedback", "ef", type=click.Choice(["both", "off", "on"]),
              default="both", show_default=True)
@click.option("--extras/--no-extras", default=True, show_default=True,
              help="also the b = 1 signs and GradiVeQ")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="write the table to this CSV file too (docs/data's columns)")
def eval_compression(trace, dirs, workers, bits, quantizers, gvq_k, gvq_refresh, seeds,
                     train_iterations, model, lr, batch_size, hidden, width, ef, extras,
                     csv_path):
    """Relative error of every quantizer at every bit width, with and without error
    feedback, the b = 1 signs and GradiVeQ, on a trace set; with --train-iterations,
    the final test accuracy of training the digits job from those aggregates."""
    from ..hosts import evaluate as ev
    from ..hosts.traces import TraceError, open_trace
    from ..hosts.training import DataParallelJob
    try:
        ts = open_trace(trace, list(dirs) or None)
        names = tuple(q.strip() for q in (quantizers or ",".join(QUANTIZERS)).split(","))
        scheme_list = ev.schemes(tuple(bits), names, gvq_k, gvq_refresh, extras,
                                 {"both": (False, True), "off": (False,), "on": (True,)}[ef])
        sizes = tuple(hidden)
        if train_iterations:
            from ..hosts.models import check_shape
            check_shape(model, sizes, width)
    except (TraceError, ValueError) as exc:
        _fail(exc)
    if workers > ts.workers:
        _fail(ValueError(f"trace {ts.name} has {ts.workers} workers, --workers {workers}"))
    _check_schemes(bits, names, workers)
    from .results.resultset import unwritable, write_csv_whole
    if csv_path and unwritable(csv_path):  # now, not after the table's minutes
        _fail(unwritable(csv_path))

    def job(seed):
        return DataParallelJob(model, workers, seed, batch_size=batch_size, learning_rate=lr,
                               hidden=sizes, width=width)

    click.echo(f"trace {ts.name}: {ts.elements} elements, {workers} workers, "
               f"{ts.iterations} iterations; {seeds} repeats (mean, range)"
               + (f"; accuracy after {train_iterations} iterations of {model}, lr {lr}, "
                  f"batch {batch_size} per worker" if train_iterations else ""))
    click.echo(ev.TABLE_HEAD)
    try:
        rows = ev.compression_table(ts, job if train_iterations else None, scheme_list,
                                    workers, seeds, train_iterations, log=click.echo)
        if csv_path and rows:
            write_csv_whole(csv_path, [ev.csv_row(r) for r in rows])
    except (TraceError, ImportError, ValueError, OSError) as exc:
        _fail(exc)


def _check_schemes(bits, quantizers, workers):
    """One line, before any table, for a bit width or quantizer ``eval`` cannot run."""
    from ..hosts.lanes import LaneError, LaneFormat
    for b in bits:
        try:
            LaneFormat(b, workers)
        except LaneError as exc:
            _fail(f"--bits {b} with --workers {workers}: {exc}")
    unknown = [q for q in quantizers if q not in QUANTIZERS]
    if unknown:
        _fail(f"--quantizers {','.join(unknown)}: use {', '.join(QUANTIZERS)}")


# -- sweeps ---------------------------------------------------------------------------
@main.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path())
@click.option("--out", "out_dir", type=click.Path(),
              help="sweep directory (default: results/sweeps/<spec name>[-quick])")
@click.option("--quick", is_flag=True, help="the spec's small variant (for CI and a first look)")
@click.option("--no-retry", is_flag=True, help="leave failed runs as they are when resuming")
@click.option("--dry-run", is_flag=True, help="list the runs and stop")
def sweep(spec_path, out_dir, quick, no_retry, dry_run):
    """Run the cross product of SPEC.yaml's options, one result set per point and
    repeat, and join their summaries in sweep.csv; run it again to resume (root)."""
    import os
    from .sweeping.sweep import Spec, SweepError, plan
    from .sweeping.sweeprun import SweepInterrupted, run_sweep
    try:
        spec = Spec.load(spec_path, quick=quick)
        target = Path(out_dir or Path("results") / "sweeps"
                      / (spec.name + ("-quick" if quick else "")))
        if dry_run:
            for t in plan(spec, target):
                click.echo(f"{t.cfg.output.run_id if t.cfg else '(refused)':>28}  "
                           f"{t.point.describe()}  r{t.repeat}"
                           + (f"  refused: {t.refused}" if t.refused else ""))
            return
        if os.geteuid() != 0:
            raise SweepError("qaina-bench sweep needs root (Mininet, veth, raw sockets): "
                             "run it as root or with sudo")
        counts = run_sweep(spec, target, click.echo, retry_failed=not no_retry)
    except SweepInterrupted:
        click.echo(f"interrupted: what finished is in {target}/sweep.csv; run the same "
                   "command again to resume", err=True)
        sys.exit(130)
    except (SweepError, ConfigError) as exc:
        _fail(exc)
    except OSError as exc:  # the sweep directory cannot be made or written
        _fail(OSError(f"{target}: {exc.strerror or exc}"))
    click.echo(f"sweep {spec.name}: {counts['complete']} runs done now, {counts['skipped']} "
               f"done before or refused by the pool, {counts['failed']} did not complete; "
               f"{target}/sweep.csv\nplot it: qaina-bench plot {target}")
    if counts["failed"]:
        sys.exit(1)


@main.command()
@click.argument("sweep_dir", type=click.Path())
def plot(sweep_dir):
    """Draw SWEEP_DIR's figure (its spec's plot section) from its sweep.csv."""
    from .sweeping.figures import plot_sweep
    from .sweeping.sweep import SweepError
    try:
        files = plot_sweep(Path(sweep_dir), click.echo)
    except SweepError as exc:
        _fail(exc)
    for f in files:
        click.echo(f"wrote {f}")


@main.command()
@click.option("--check", is_flag=True, help="change nothing; exit 1 naming the first "
              "table or value that differs from its data")
@click.option("--root", type=click.Path(file_okay=False), default=str(Path(__file__).parents[1]),
              show_default="the source tree", help="the repository whose docs to write")
def report(check, root):
    """Write README's metric glossary and the tables and quoted values of docs/*.md from
    the metric registry and the CSVs of docs/data/."""
    from .results.report import ReportError, check as differs, write
    try:
        if check:
            first = differs(Path(root))
            if first:
                _fail(ValueError(f"{first}: run `qaina-bench report`"))
            click.echo("every table and value matches its data")
            return
        for line in write(Path(root)) or ["nothing to change"]:
            click.echo(line)
    except (ReportError, ValueError) as exc:
        _fail(exc)


from .benchmarks.benchcli import bench  # noqa: E402  (the benchmarks' commands)
main.add_command(bench)
main.add_command(plugins)

if __name__ == "__main__":
    main()
