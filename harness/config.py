"""The configuration of a run: what ``up`` options and ``run CONFIG.yaml`` set.

``RunConfig.check`` turns every bad input into one ``ConfigError`` line saying what is
wrong and how to fix it; the resolved configuration is saved with the results.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from types import UnionType as _UnionType

from ..hosts.compression import QUANTIZERS
from ..hosts.lanes import BIT_WIDTHS, LaneError, LaneFormat
from ..hosts.traces import TraceError, find_trace, TraceSet
from ..topologies import TOPOLOGIES
from ..p4.constants import MAX_JOBS, POOL_SLOTS
from ..p4.header import PAYLOAD_WORDS, QAINA_WORDS
from ..plugins import PluginError
from .modes import MODES, mode_of
from .targets import TARGETS, bmv2_missing, toolchain


ALLOCATIONS = ("static", "shared")


def _run_mode(cfg):
    """The run's collective mode (hosts/collective.py); one ConfigError line if unknown."""
    try:
        return mode_of(cfg)
    except PluginError as exc:
        raise ConfigError(f"--mode: {exc}") from None


def _in_switch_modes() -> str:
    return " or ".join(name for name in MODES.names() if MODES.get(name).in_switch)


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says how to fix it."""


class PoolError(ConfigError):
    """The jobs ask for more aggregator slots than the run's pool holds."""


class TraceMissing(ConfigError):
    """The trace set cannot be found or opened (every other option checked out)."""


@dataclass
class RunConfig:
    topo: str = "leafspine"
    target: str = "embedded"
    jobs: int = 2
    workers: int = 4
    bits: list[int] = field(default_factory=lambda: [4])  # one per job, or one for all
    iterations: int = 12  # all of the bundled digits-mlp trace
    slots: int = 32  # window per job: slots of the pool each job holds
    trace: str = "digits-mlp"
    trace_dirs: list[str] = field(default_factory=list)
    bw: float | None = None  # Mbit/s, every link
    delay: str | None = None  # e.g. "0.5ms", every link
    loss: float | None = None  # percent, every link
    spines: int = 2
    leaves: int = 2
    headroom: int | None = None  # predicted-scale headroom (None: 1 for b <= 8, 8 for b = 32)
    seed: int = 0
    results_dir: str = "results"
    run_id: str | None = None
    sample_interval: float = 0.01  # slot usage: aggregator counters read this often
    timeout: float = 300.0
    record_levels: bool = False
    switch_log: bool = False  # BMv2: log every packet (slows it down several times)
    mode: str = "ina"  # a collective mode (hosts/collective.py): ina, ring, ps, or a plugin
    compress: str = "none"  # or "gradiveq"
    gvq_d: int = 64
    gvq_k: int = 8
    gvq_fit: int = 1  # GradiVeQ: exact iterations the bases are fitted on
    gvq_refresh: int = 0  # GradiVeQ: R > 0 refreshes the bases every R + 1 iterations
    train: bool = False  # closed loop: train the digits job from the aggregates
    model: str = "mlp"  # the trained model: mlp, cnn or resnet (PyTorch)
    lr: float = 0.3
    batch_size: int = 32  # per worker
    hidden: list[int] = field(default_factory=lambda: [64, 32])  # mlp hidden layers
    width: int = 24  # resnet width
    eval_every: int = 10  # iterations between test-accuracy measurements
    target_accuracy: float = 0.9  # time to reach it goes into the summary
    quantizer: str = "maxpow2"  # maxpow2, maxfine or qsgd (hosts/compression.py)
    bucket: int = 512  # qsgd: elements per norm
    error_feedback: bool = False  # always on at b = 1
    payload_words: int = QAINA_WORDS  # words per packet: which qaina.p4 build the switches run
    pack: bool = True  # False: one value per register (isolates packing; b < 32)
    pool_slots: int = POOL_SLOTS  # slots of the switch's pool the jobs may share
    host_cpu: float | None = None  # cores of CPU time per second each host may use
    arrivals: str | None = None  # "0,0.5,1" (s) or "poisson:GAP": jobs arrive, leave when done
    levels: int = 1  # 2: the switch each worker hangs off aggregates below the aggregator
    allocation: str = "static"  # or "shared": chunks hashed onto one shared pool (ATP)

    # -- io ----------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path) -> "RunConfig":
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not text (a results/<run>/config.yaml "
                              "is)") from None
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: "
                              f"{str(exc).splitlines()[0]}") from None
        if data is None:
            raise ConfigError(f"config file {path} is empty; give at least one option "
                              "(e.g. topo: star), or use `qaina-bench up` for the defaults")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of option: value")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown option(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        cfg = cls(**{k: _typed(k, v, path) for k, v in data.items()})
        cfg.check_run_id()
        return cfg

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)

    def job_bits(self) -> list[int]:
        return self.bits * self.jobs if len(self.bits) == 1 else list(self.bits)

    # -- checks ------------------------------------------------------------------------
    def check_run_id(self):
        if self.run_id is not None and not RUN_ID.fullmatch(self.run_id):
            raise ConfigError(f"--run-id {self.run_id!r}: use letters, digits, '.', '_' and "
                              "'-' (a name, not a path), at most 100 characters")

    def check(self) -> TraceSet | None:
        """Raise ConfigError for anything that cannot work; returns the trace set (None
        when the run trains instead of replaying one)."""
        for f in fields(self):
            _typed(f.name, getattr(self, f.name), "the configuration")
        self.check_run_id()
        if self.topo not in TOPOLOGIES:
            raise ConfigError(f"unknown topology {self.topo!r}: use one of "
                              f"{', '.join(TOPOLOGIES)}")
        if self.target not in TARGETS:
            raise ConfigError(f"unknown target {self.target!r}: use one of {', '.join(TARGETS)}")
        if self.target == "bmv2" and bmv2_missing():
            raise ConfigError(f"--target bmv2: {bmv2_missing()}")
        if not 1 <= self.jobs <= MAX_JOBS:
            raise ConfigError(f"--jobs {self.jobs}: the switch holds 1..{MAX_JOBS} jobs")
        if len(self.bits) not in (1, self.jobs):
            raise ConfigError(f"--bits gives {len(self.bits)} widths for {self.jobs} jobs: "
                              "give one for all jobs or one per job (e.g. --bits 4,32)")
        for b in self.bits:
            if b not in BIT_WIDTHS:
                raise ConfigError(f"--bits {b} is not supported: use 1..8 or 32")
            try:
                LaneFormat(b, self.workers)
            except LaneError as exc:
                raise ConfigError(f"--bits {b} --workers {self.workers}: {exc}") from None
        if self.iterations < 1:
            raise ConfigError("--iterations must be at least 1")
        if not 1 <= self.pool_slots <= POOL_SLOTS:
            raise ConfigError(f"--pool-slots {self.pool_slots}: the switch's pool has 1.."
                              f"{POOL_SLOTS} slots")
        if self.slots < 1:
            raise ConfigError(f"--slots {self.slots}: a job needs at least one slot")
        if self.arrivals is not None:
            from .arrivals import arrival_offsets
            arrival_offsets(self.arrivals, self.jobs, self.seed)
        mode = _run_mode(self)
        if mode.in_switch and self.allocation == "static" and self.slots > self.pool_slots:
            raise PoolError(f"--slots {self.slots}: a job needs more slots than the pool of "
                            f"{self.pool_slots} holds; use fewer slots or a larger --pool-slots")
        if (mode.in_switch and self.arrivals is None and self.allocation == "static"
                and self.slots * self.jobs > self.pool_slots):
            raise PoolError(f"--slots {self.slots} x {self.jobs} jobs do not fit a pool of "
                            f"{self.pool_slots} slots: use fewer jobs or slots, a larger "
                            "--pool-slots, or --arrivals (jobs then wait for free slots)")
        if self.loss is not None and not 0 <= self.loss < 100:
            raise ConfigError(f"--loss {self.loss}: a percentage in [0, 100)")
        if self.bw is not None and self.bw <= 0:
            raise ConfigError(f"--bw {self.bw}: link bandwidth in Mbit/s must be positive")
        cores = os.cpu_count() or 1
        if self.host_cpu is not None and not 0.01 <= self.host_cpu <= cores:
            raise ConfigError(f"--host-cpu {self.host_cpu}: cores of CPU time per second, "
                              f"from 0.01 to the machine's {cores}")
        if self.levels not in (1, 2):
            raise ConfigError(f"--levels {self.levels}: 1 (one aggregating switch per job) "
                              "or 2 (the workers' own switches aggregate below it)")
        if self.levels == 2 and not mode.in_switch:
            raise ConfigError(f"--levels 2 aggregates in the switches: it needs --mode "
                              f"{_in_switch_modes()}, not --mode {self.mode}")
        if self.allocation not in ALLOCATIONS:
            raise ConfigError(f"--allocation {self.allocation!r}: static (each job its own "
                              "slots) or shared (one pool, collisions go to a fallback host)")
        if self.allocation == "shared" and not mode.in_switch:
            raise ConfigError(f"--allocation shared shares the switch's pool: it needs "
                              f"--mode {_in_switch_modes()}, not --mode {self.mode}")
        if self.allocation == "shared" and self.levels != 1:
            raise ConfigError("--allocation shared aggregates on one switch per job: use "
                              "--levels 1 with it")
        if self.topo == "leafspine" and (self.spines < 1 or self.leaves < 1):
            raise ConfigError("a leaf-spine needs --spines >= 1 and --leaves >= 1")
        if self.payload_words not in PAYLOAD_WORDS:
            raise ConfigError(f"--payload-words {self.payload_words}: qaina.p4 is built for "
                              f"{', '.join(map(str, PAYLOAD_WORDS))} words per packet")
        self.check_compression()
        if self.sample_interval <= 0 or self.timeout <= 0:
            raise ConfigError("--sample-interval and --timeout must be positive")
        if self.train:
            self.check_training()
            return None
        try:
            trace = TraceSet.open(find_trace(self.trace, self.trace_dirs or None))
        except TraceError as exc:
            raise TraceMissing(f"trace {self.trace!r}: {exc} "
                              "(see `qaina-bench traces list`)") from None
        if self.workers > trace.workers:
            raise ConfigError(f"trace {trace.name} has {trace.workers} workers, "
                              f"--workers {self.workers} needs as many; record a larger set "
                              "with `qaina-bench traces record`")
        if self.iterations > trace.iterations:
            raise ConfigError(f"trace {trace.name} has {trace.iterations} iterations, "
                              f"--iterations {self.iterations} asks for more")
        return trace


    def check_compression(self):
        if self.quantizer not in QUANTIZERS + ("none",):
            raise ConfigError(f"--quantizer {self.quantizer!r}: use one of "
                              f"{', '.join(QUANTIZERS)} or none")
        floats = [name for name in MODES.names() if MODES.get(name).float_sums]
        if self.quantizer == "none" and (self.mode not in floats or set(self.job_bits()) != {32}):
            raise ConfigError(f"--quantizer none sums float32 values on the hosts: use it with "
                              f"--mode {' or '.join(floats)} and --bits 32 (the switch sums "
                              "integers)")
        if self.bucket < 1:
            raise ConfigError(f"--bucket {self.bucket}: QSGD buckets hold at least one element")
        if self.quantizer == "qsgd" and self.error_feedback and 2 in self.job_bits():
            raise ConfigError("--quantizer qsgd --error-feedback at b = 2 would send nothing: "
                              "values are a small share of their bucket's norm, and error "
                              "feedback's nearest rounding takes them all to level 0; use "
                              "maxpow2 or maxfine, or b >= 4")
        if self.compress not in ("none", "gradiveq"):
            raise ConfigError(f"--compress {self.compress!r}: use none or gradiveq")
        if not 1 <= self.gvq_k <= self.gvq_d:
            raise ConfigError(f"GradiVeQ needs 1 <= k <= d, got --gvq-k {self.gvq_k} "
                              f"--gvq-d {self.gvq_d}")
        if self.gvq_fit < 1 or self.gvq_refresh < 0:
            raise ConfigError("--gvq-fit must be at least 1 and --gvq-refresh at least 0")
        if self.compress == "gradiveq" and self.iterations <= self.gvq_fit:
            raise ConfigError(f"--compress gradiveq fits its bases on the first {self.gvq_fit} "
                              f"iteration(s) and compresses after them: use --iterations "
                              f"{self.gvq_fit + 1} or more")

    def check_training(self):
        from ..hosts.models import MODELS
        if self.model not in MODELS:
            raise ConfigError(f"--model {self.model!r}: use one of {', '.join(MODELS)}")
        if self.model != "mlp" and importlib.util.find_spec("torch") is None:
            from ..hosts.models import TORCH_HINT
            raise ConfigError(f"--model {self.model} needs PyTorch: {TORCH_HINT}")
        if self.lr <= 0 or self.batch_size < 1 or self.eval_every < 1 or self.width < 1:
            raise ConfigError("--lr, --batch-size, --eval-every and --width must be positive")
        if not self.hidden or min(self.hidden) < 1:
            raise ConfigError(f"--hidden {self.hidden}: positive layer sizes")
        if not 0 < self.target_accuracy <= 1:
            raise ConfigError(f"--target-accuracy {self.target_accuracy}: a share in (0, 1]")


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_HINTS = typing.get_type_hints(RunConfig)


def _typed(name: str, value, where):
    """``value`` of option ``name`` as its declared type; ConfigError if it is not one.

    Whole numbers must be whole (8.5 slots is an error, not 8); a bit list may be
    given as 4, [4, 32] or "4,32"; a list of paths as one path or a list.
    """
    hint = _HINTS[name]
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) \
        else (hint,)
    if value is None and type(None) in kinds:
        return None
    kind = next(k for k in kinds if k is not type(None))
    what = {int: "a whole number", float: "a number", bool: "true or false", str: "text",
            list[int]: "a whole number or a list of them (4, [4, 32] or \"4,32\")",
            list[str]: "a path or a list of paths"}[kind]
    if kind is float:
        what = "a finite number"
    if kind == list[int] and isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",")]
        except ValueError:
            pass
    if kind == list[int] and isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if kind == list[str] and isinstance(value, str):
        value = [value]
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                            and math.isfinite(v)),
          bool: lambda v: isinstance(v, bool),
          str: lambda v: isinstance(v, str),
          list[int]: lambda v: isinstance(v, list) and v and all(
              isinstance(x, int) and not isinstance(x, bool) for x in v),
          list[str]: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
          }[kind](value)
    if not ok:
        raise ConfigError(f"{where}: {name} is {value!r}, which is not {what}")
    return float(value) if kind is float else value


def check_system() -> list[tuple[str, bool, str]]:
    """(what, ok, how to fix) for every prerequisite of a run."""
    from importlib import metadata

    from .linkloss import netem_available, nft_available
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
    from .cpulimit import limit_problem
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
    for tool, found in toolchain().items():
        what = f"{tool} (optional, --target bmv2)"
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
