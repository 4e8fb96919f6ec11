"""The configuration of a run: what ``up`` options and ``run CONFIG.yaml`` set.

The tree itself (its sections, fields, defaults and types) is ``settings.py``, which
the agents read too; ``RunConfig`` adds the checks that need the harness. Its
``check`` turns every bad input into one ``ConfigError`` line saying what is wrong and
how to fix it; the resolved configuration is saved with the results (nested).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import yaml

from ..hosts.compression import COMPRESSORS, QUANTIZERS
from ..hosts.lanes import BIT_WIDTHS, LaneError, LaneFormat
from ..hosts.traces import TraceError, find_trace, TraceSet
from ..topologies import TopologyError, TopoSpec, parse_topo
from ..topologies.base import MAX_BW, MIN_BW
from ..p4.constants import MAX_JOBS, POOL_SLOTS
from ..p4.header import PAYLOAD_WORDS
from ..plugins import PluginError
from ..settings import ConfigError, Settings
from .modes import MODES, mode_of
from .switches.targets import TARGETS, bmv2_missing, toolchain


ALLOCATIONS = ("static", "shared")
#: a link delay as tc's netem takes it (Mininet writes it into a shell command)
DELAY = re.compile(r"\d+(\.\d+)?(us|ms|s)")
#: the shortest time between two slot reads (s): below it the sampler only spins
MIN_SAMPLE_INTERVAL = 0.001
#: the agents' seeds: numpy's generators take non-negative ones, scikit-learn 32-bit ones
MAX_SEED = 2 ** 32 - 1


def _run_mode(cfg):
    """The run's collective mode (hosts/collective.py); one ConfigError line if unknown."""
    try:
        return mode_of(cfg)
    except PluginError as exc:
        raise ConfigError(f"--mode: {exc}") from None


def _in_switch_modes() -> str:
    return " or ".join(name for name in MODES.names() if MODES.get(name).in_switch)


def tcp_congestion_controls() -> list[str]:
    """The TCP congestion controls this kernel offers (none known: empty)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return []


class PoolError(ConfigError):
    """The jobs ask for more aggregator slots than the run's pool holds."""


class TraceMissing(ConfigError):
    """The trace set cannot be found or opened (every other option checked out)."""


class RunConfig(Settings):
    """The configuration tree of a run (``settings.py``) with the checks that need the
    harness: targets, trace sets, the machine."""

    @classmethod
    def from_yaml(cls, path) -> "RunConfig":
        from .results.resultset import read_text
        try:
            text = read_text(Path(path), MAX_YAML)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not text (a results/<run>/config.yaml "
                              "is)") from None
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except ValueError as exc:  # a device, a pipe, too large
            raise ConfigError(f"config file {path}: {exc}") from None
        try:
            data = parse_yaml(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML{yaml_problem(exc)}"
                              ) from None
        except (RecursionError, ValueError) as exc:  # nested too deeply; a huge integer
            raise ConfigError(f"config file {path}: {yaml_limit(exc)}") from None
        if data is None:
            raise ConfigError(f"config file {path} is empty; give at least one option "
                              "(e.g. topo: star), or use `qaina-bench up` for the defaults")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of option: value")
        cfg = cls.from_dict(data, str(path))
        cfg.check_run_id()
        return cfg

    # -- checks ------------------------------------------------------------------------
    def check_run_id(self):
        run_id = self.output.run_id
        if run_id is not None and not RUN_ID.fullmatch(run_id):
            raise ConfigError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and "
                              "'-' (a name, not a path), at most 100 characters")

    def check(self, opened: dict | None = None) -> TraceSet | None:
        """Raise ConfigError for anything that cannot work; returns the trace set (None
        when the run trains instead of replaying one). ``opened`` keeps the trace sets
        checked so far, for checking many configurations (a sweep's)."""
        self.check_types()
        self.check_run_id()
        self.check_network()
        self.check_workload()
        self.check_compression()
        out = self.output
        if out.sample_interval <= 0 or out.timeout <= 0:
            raise ConfigError("--sample-interval and --timeout must be positive")
        if out.sample_interval < MIN_SAMPLE_INTERVAL:
            raise ConfigError(f"--sample-interval {out.sample_interval:g}: at least "
                              f"{MIN_SAMPLE_INTERVAL:g} s (each read is a P4Runtime call)")
        if not str(out.results_dir).strip():
            raise ConfigError("--results-dir is empty: name a directory")
        if not 1 <= out.pcap_size <= MAX_PCAP_MB:
            raise ConfigError(f"--pcap-size {out.pcap_size}: megabytes per interface, from 1 "
                              f"to {MAX_PCAP_MB:,} (dumpcap's limit)")
        if self.training.train_script:
            from .trainscript import check_train_script
            check_train_script(self)
            return None  # the script's gradients: no trace set
        if self.training.train_args:
            raise ConfigError(f"--train-args {self.training.train_args!r}: arguments of a "
                              "--train-script, and none is given")
        if self.training.train:
            self.check_training()
            return None
        return self.check_trace(opened)

    def check_network(self):
        net, work = self.network, self.workload
        self.resolve_topology()
        if net.target not in TARGETS:
            raise ConfigError(f"unknown target {net.target!r}: use one of {', '.join(TARGETS)}")
        if net.target == "bmv2" and not net.cluster and bmv2_missing():
            # with --cluster, `up` asks this only when a switch is placed here
            raise ConfigError(f"--target bmv2: {bmv2_missing()}")
        if not 1 <= net.pool_slots <= POOL_SLOTS:
            raise ConfigError(f"--pool-slots {net.pool_slots}: the switch's pool has 1.."
                              f"{POOL_SLOTS} slots")
        if net.loss is not None and not (net.loss == 0 or 0.01 <= net.loss <= 99.99):
            raise ConfigError(f"--loss {net.loss}: a percentage, 0 or from 0.01 to 99.99 "
                              "(nftables' loss rules lose in steps of 0.01%)")
        if net.bw is not None and not MIN_BW <= net.bw <= MAX_BW:
            raise ConfigError(f"--bw {net.bw}: link bandwidth in Mbit/s, from {MIN_BW} to "
                              f"{MAX_BW} (what Mininet's links shape; leave --bw out for "
                              "unshaped links)")
        if net.delay is not None and not DELAY.fullmatch(str(net.delay)):
            raise ConfigError(f"--delay {net.delay}: a time as tc takes it, e.g. 0.5ms, "
                              "200us or 1s")
        cores = os.cpu_count() or 1
        if net.host_cpu is not None and not 0.01 <= net.host_cpu <= cores:
            raise ConfigError(f"--host-cpu {net.host_cpu}: cores of CPU time per second, "
                              f"from 0.01 to the machine's {cores}")
        offered = tcp_congestion_controls()
        if net.tcp_cc != "system" and (not re.fullmatch(r"[a-z0-9_]{1,15}", net.tcp_cc)
                                       or offered and net.tcp_cc not in offered):
            raise ConfigError(f"--tcp-cc {net.tcp_cc}: this kernel offers "
                              f"{', '.join(offered)} (or system: the machine's default)")
        if net.levels not in (1, 2):
            raise ConfigError(f"--levels {net.levels}: 1 (one aggregating switch per job) "
                              "or 2 (the workers' own switches aggregate below it)")
        if net.levels == 2 and not _run_mode(self).in_switch:
            raise ConfigError(f"--levels 2 aggregates in the switches: it needs --mode "
                              f"{_in_switch_modes()}, not --mode {work.mode}")
        if net.payload_words not in PAYLOAD_WORDS:
            raise ConfigError(f"--payload-words {net.payload_words}: qaina.p4 is built for "
                              f"{', '.join(map(str, PAYLOAD_WORDS))} words per packet")

    def check_workload(self):
        work, net = self.workload, self.network
        if not 1 <= work.jobs <= MAX_JOBS:
            raise ConfigError(f"--jobs {work.jobs}: the switch holds 1..{MAX_JOBS} jobs")
        if not 0 <= work.seed <= MAX_SEED:
            raise ConfigError(f"--seed {work.seed}: a whole number from 0 to {MAX_SEED}")
        if len(work.bits) not in (1, work.jobs):
            raise ConfigError(f"--bits gives {len(work.bits)} widths for {work.jobs} jobs: "
                              "give one for all jobs or one per job (e.g. --bits 4,32)")
        for b in work.bits:
            if b not in BIT_WIDTHS:
                raise ConfigError(f"--bits {b} is not supported: use 1..8 or 32")
            try:
                LaneFormat(b, work.workers)
            except LaneError as exc:
                raise ConfigError(f"--bits {b} --workers {work.workers}: {exc}") from None
        if work.iterations < 1:
            raise ConfigError("--iterations must be at least 1")
        if work.slots < 1:
            raise ConfigError(f"--slots {work.slots}: a job needs at least one slot")
        if work.arrivals is not None:
            from .running.arrivals import arrival_offsets
            arrival_offsets(work.arrivals, work.jobs, work.seed)
        mode = _run_mode(self)
        if work.allocation not in ALLOCATIONS:
            raise ConfigError(f"--allocation {work.allocation!r}: static (each job its own "
                              "slots) or shared (one pool, collisions go to a fallback host)")
        if work.allocation == "shared" and not mode.in_switch:
            raise ConfigError(f"--allocation shared shares the switch's pool: it needs "
                              f"--mode {_in_switch_modes()}, not --mode {work.mode}")
        if work.allocation == "shared" and net.levels != 1:
            raise ConfigError("--allocation shared aggregates on one switch per job: use "
                              "--levels 1 with it")
        static = mode.in_switch and work.allocation == "static"
        if static and work.slots > net.pool_slots:
            raise PoolError(f"--slots {work.slots}: a job needs more slots than the pool of "
                            f"{net.pool_slots} holds; use fewer slots or a larger --pool-slots")
        if static and work.arrivals is None and work.slots * work.jobs > net.pool_slots:
            raise PoolError(f"--slots {work.slots} x {work.jobs} jobs do not fit a pool of "
                            f"{net.pool_slots} slots: use fewer jobs or slots, a larger "
                            "--pool-slots, or --arrivals (jobs then wait for free slots)")

    def check_trace(self, opened: dict | None = None) -> TraceSet:
        tr, work = self.training, self.workload
        for folder in tr.trace_dirs or ():  # a mistyped one would be passed over
            if not Path(folder).is_dir():
                raise ConfigError(f"--trace-dir {folder}: no such directory (trace sets are "
                                  "searched there first)")
        # config.yaml records them as absolute paths: `run` works from any directory
        tr.trace_dirs = [os.path.abspath(folder) for folder in tr.trace_dirs or ()]
        if isinstance(tr.trace, str) and os.sep in tr.trace and Path(tr.trace).is_dir():
            tr.trace = os.path.abspath(tr.trace)
        key = (tr.trace, tuple(tr.trace_dirs or ()))
        opened = {} if opened is None else opened
        if key not in opened:
            try:
                opened[key] = TraceSet.open(find_trace(tr.trace, tr.trace_dirs or None))
            except TraceError as exc:
                opened[key] = TraceMissing(f"trace {tr.trace!r}: {exc} "
                                           "(see `qaina-bench traces list`)")
        trace = opened[key]
        if isinstance(trace, TraceMissing):
            raise TraceMissing(str(trace))
        if work.workers > trace.workers:
            raise ConfigError(f"trace {trace.name} has {trace.workers} workers, "
                              f"--workers {work.workers} needs as many; record a larger set "
                              "with `qaina-bench traces record`")
        if work.iterations > trace.iterations:
            raise ConfigError(f"trace {trace.name} has {trace.iterations} iterations, "
                              f"--iterations {work.iterations} asks for more")
        return trace

    def topology(self) -> TopoSpec:
        """The topology ``topo`` names with all its parameters; ``spines`` and ``leaves``
        fill the parameters of those names that the spec leaves out (aliases)."""
        net = self.network
        try:
            return parse_topo(net.topo, {"spines": net.spines, "leaves": net.leaves})
        except TopologyError as exc:
            raise ConfigError(str(exc)) from None

    def resolve_topology(self):
        """Write the full spec into ``topo`` (what config.yaml and the summary record)
        and the values it resolved into the aliases."""
        net = self.network
        spec = self.topology()
        net.topo = spec.text()
        net.spines = spec.params.get("spines", net.spines)
        net.leaves = spec.params.get("leaves", net.leaves)

    @staticmethod
    def check_plugin(option: str, name: str, registry):
        """``name`` is ``none`` or one of ``registry``'s (ConfigError naming the choices)."""
        try:
            known = name == "none" or name in registry
        except ValueError as exc:  # PluginError: a plugin of the kind does not load
            raise ConfigError(f"{option} {name}: {exc}") from None
        if not known:
            raise ConfigError(f"{option} {name!r}: use one of "
                              f"{', '.join(registry.names())} or none")

    def check_compression(self):
        c, work = self.compression, self.workload
        self.check_plugin("--quantizer", c.quantizer, QUANTIZERS)
        floats = [name for name in MODES.names() if MODES.get(name).float_sums]
        if c.quantizer == "none" and (work.mode not in floats or set(self.job_bits()) != {32}):
            raise ConfigError(f"--quantizer none sums float32 values on the hosts: use it with "
                              f"--mode {' or '.join(floats)} and --bits 32 (the switch sums "
                              "integers)")
        if c.bucket < 1:
            raise ConfigError(f"--bucket {c.bucket}: QSGD buckets hold at least one element")
        if c.headroom is not None and not 0 <= c.headroom <= MAX_HEADROOM:
            raise ConfigError(f"--headroom {c.headroom}: code steps added to the predicted "
                              f"scales, from 0 to {MAX_HEADROOM} (the span of a scale code); "
                              "leave it out for the adaptive default")
        if c.quantizer == "qsgd" and c.error_feedback and 2 in self.job_bits():
            raise ConfigError("--quantizer qsgd --error-feedback at b = 2 would send nothing: "
                              "values are a small share of their bucket's norm, and error "
                              "feedback's nearest rounding takes them all to level 0; use "
                              "maxpow2 or maxfine, or b >= 4")
        self.check_plugin("--compress", c.compress, COMPRESSORS)
        if not 1 <= c.gvq_k <= c.gvq_d:
            raise ConfigError(f"GradiVeQ needs 1 <= k <= d, got --gvq-k {c.gvq_k} "
                              f"--gvq-d {c.gvq_d}")
        if c.gvq_fit < 1 or c.gvq_refresh < 0:
            raise ConfigError("--gvq-fit must be at least 1 and --gvq-refresh at least 0")
        if c.compress == "gradiveq" and work.iterations <= c.gvq_fit:
            raise ConfigError(f"--compress gradiveq fits its bases on the first {c.gvq_fit} "
                              f"iteration(s) and compresses after them: use --iterations "
                              f"{c.gvq_fit + 1} or more")

    def check_training(self):
        from ..hosts.models import MODELS
        t = self.training
        if t.model not in MODELS:
            raise ConfigError(f"--model {t.model!r}: use one of {', '.join(MODELS)}")
        if t.model != "mlp" and importlib.util.find_spec("torch") is None:
            from ..hosts.models import TORCH_HINT
            raise ConfigError(f"--model {t.model} needs PyTorch: {TORCH_HINT}")
        if t.lr <= 0 or t.batch_size < 1 or t.eval_every < 1 or t.width < 1:
            raise ConfigError("--lr, --batch-size, --eval-every and --width must be positive")
        if not t.hidden or min(t.hidden) < 1:
            raise ConfigError(f"--hidden {t.hidden}: positive layer sizes")
        from ..hosts.models import check_shape
        from ..hosts.traces import TraceError
        try:
            check_shape(t.model, t.hidden, t.width)
        except TraceError as exc:
            raise ConfigError(str(exc)) from None
        if not 0 < t.target_accuracy <= 1:
            raise ConfigError(f"--target-accuracy {t.target_accuracy}: a share in (0, 1]")


#: the largest --pcap-size, MB: dumpcap stops a file at up to 2^32 - 1 kB
MAX_PCAP_MB = 4_000_000

#: the most code steps ``--headroom`` adds: a scale code is one signed byte
MAX_HEADROOM = 255

#: the largest config file or sweep spec read (a run's config.yaml is a few kB; libyaml
#: takes a few seconds for 1 MB, the pure-Python parser many times that)
MAX_YAML = 1 << 20

class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader (libyaml's parser where PyYAML was built with it) that
    refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                again = key in seen
            except TypeError:  # unhashable: the base class says so
                continue
            if again:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"{key!r} is given twice: keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str):
    """``text`` as YAML, plain data only (no tags that build Python objects), no key
    given twice in a mapping."""
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a safe loader


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what the YAML error is: ' (line L, column C): problem'."""
    mark = getattr(exc, "problem_mark", None)
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    return f"{at}: {getattr(exc, 'problem', None) or str(exc).splitlines()[0]}"


def yaml_limit(exc: Exception) -> str:
    """One line on a YAML file that could not be read whole: nested past Python's
    recursion, an integer past its digit limit, a device or pipe, too large."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc).splitlines()[0]
    if "limit" in text and "digits" in text:
        return "an integer of more digits than Python reads (4300)"
    return text


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_system(bmv2_needed: str | None = None) -> list[tuple[str, bool, str]]:
    """(what, ok, how to fix) for every prerequisite of a run. ``bmv2_needed``: why
    this machine needs BMv2 and p4c (required then), or None (optional)."""
    from importlib import metadata

    from .running.linkloss import netem_available, nft_available
    apt = "apt-get install"
    checks = [
        ("running as root", os.geteuid() == 0, "run as root, or with sudo (Mininet needs root)"),
        ("mnexec (Mininet)", shutil.which("mnexec") is not None, f"{apt} mininet"),
        ("ip (iproute2)", shutil.which("ip") is not None, f"{apt} iproute2"),
        ("tc (iproute2)", shutil.which("tc") is not None, f"{apt} iproute2"),
        ("sysctl (procps)", shutil.which("sysctl") is not None, f"{apt} procps"),
        ("ethtool", shutil.which("ethtool") is not None, f"{apt} ethtool"),
        ("ping", shutil.which("ping") is not None, f"{apt} iputils-ping"),
    ]
    from .running.cpulimit import limit_problem
    problem = limit_problem()
    checks.append(("cgroup v1 cpu controller and cgroup-tools (optional: --host-cpu)",
                   problem is None, problem or ""))
    netem = netem_available()
    checks.append(("netem qdisc (optional: --delay; --loss without nftables)", netem,
                   "this kernel lacks CONFIG_NET_SCH_NETEM (--loss then uses nftables)"))
    bmv2 = bmv2_missing() is None
    needs = ["--target bmv2: loopback-only Thrift port"] if bmv2 else []
    needs += [] if netem else ["--loss without netem"]
    checks.append((f"nft (nftables{': ' + '; '.join(needs) if needs else ', optional'})",
                   nft_available() or not needs, f"{apt} nftables"))
    for dist in ("numpy", "click", "psutil", "PyYAML", "scapy", "grpcio", "protobuf",
                 "finsy", "mininet", "matplotlib"):
        try:
            checks.append((f"Python package {dist} {metadata.version(dist)}", True, ""))
        except metadata.PackageNotFoundError:
            checks.append((f"Python package {dist}", False, "make venv (pip install -e .)"))
    checks += [protobuf_check(), shell_tool_check()]
    for optional in ("scikit-learn", "torch"):
        try:
            version = metadata.version(optional)
            checks.append((f"Python package {optional} {version} (optional)", True, ""))
        except metadata.PackageNotFoundError:
            checks.append((f"Python package {optional} (optional: traces record)", False,
                           "pip install -e '.[record]'" if optional == "scikit-learn" else
                           "see README, 'Recording traces' (CPU build of torch)"))
    capture = shutil.which("dumpcap") or shutil.which("tcpdump")
    checks.append(("dumpcap or tcpdump (optional: --pcap)", capture is not None,
                   f"{apt} tshark (or tcpdump)"))
    checks.append(("tshark (optional: reading captures with the dissector)",
                   shutil.which("tshark") is not None, f"{apt} tshark"))
    for tool, found in toolchain().items():
        what = f"{tool} ({bmv2_needed or 'optional, --target bmv2'})"
        if found["path"]:
            what += f": {found['version'] or 'version unknown'} at {found['path']}"
        checks.append((what, found["path"] is not None,
                       "not on PATH: vagrant up gives a VM with BMv2 and p4c; see README"))
    return checks


def protobuf_check() -> tuple[str, bool, str]:
    """Which protobuf runtime the control plane runs on: upb (or cpp) is fast; the
    pure-Python one takes many seconds for a large Read."""
    try:
        from ..p4.proto import implementation
        kind = implementation()
    except ImportError as exc:
        return (f"P4Runtime protobufs ({exc})", False, "make venv (pip install -e .)")
    return (f"protobuf runtime: {kind}", kind in ("upb", "cpp"),
            "the pure-Python runtime reads large switch state 25 times slower: unset "
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION, pip install 'protobuf>=6.33.6,<7'")


def shell_tool_check() -> tuple[str, bool, str]:
    """p4runtime-shell in its own venv, for ``qaina-bench shell``."""
    from .shelltool import ShellError, shell_python
    try:
        python = shell_python()
    except ShellError:
        return ("p4runtime-shell (optional: qaina-bench shell)", False,
                "make shell-tool (a venv of its own: it pins protobuf < 3.21)")
    return (f"p4runtime-shell (optional: qaina-bench shell) in {python.parent.parent}",
            True, "")
