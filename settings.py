"""The configuration tree of a run: five sections of plain data, and their type checks.

Every option is declared once here, with its default, type, help text and command-line
flag; ``qaina-bench up``'s options, the keys of a config.yaml and of a sweep spec, and
the agents' JSON all come from this tree. ``harness/config.py`` adds the checks that
need the harness (targets, trace sets, the machine); ``hosts/`` reads the tree as is.

A mapping may give the tree nested (``network: {topo: star}``) or flat (``topo: star``,
as result sets and sweep specs written before the tree do); both give the same tree.
"""

from __future__ import annotations

import copy
import functools
import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from types import UnionType

import yaml

from .p4.constants import POOL_SLOTS
from .p4.header import PAYLOAD_WORDS, QAINA_WORDS


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says how to fix it."""


def option(default, help: str = "", *, flag: str | None = None, choices=None,
           metavar: str | None = None):
    """A field of a section with its one default and its command-line metadata.

    ``flag`` is the option's name (default ``--`` + the field name with dashes);
    ``choices`` a tuple of allowed values, or a function returning them (a registry's
    names), read when an option is checked or its help shown.
    """
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _registry(module: str, name: str) -> tuple:
    """The names of registry ``name`` of ``module`` (imported when choices are read)."""
    import importlib
    return importlib.import_module(f"{__package__}.{module}").__dict__[name].names()


def choices_of(f) -> tuple | None:
    """The allowed values of field ``f`` (None: any value of its type)."""
    found = f.metadata.get("choices")
    return tuple(found() if callable(found) else found) if found is not None else None


def flag_of(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def names_text(names: list[str], most: int = 6) -> str:
    """``names`` for an error line: at most ``most`` of them, each cut to 40
    characters, then how many more (a file that is not a config stays one short line)."""
    shown = [n if len(n) <= 40 else n[:37] + "..." for n in names[:most]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def default_of(f):
    return f.default_factory() if f.default is MISSING else f.default


class Section:
    """Shared by the sections: typed construction from a mapping."""

    TITLE = ""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "Section":
        unknown = sorted(str(k) for k in set(data) - set(cls.names()))
        if unknown:
            raise ConfigError(f"{where}: unknown option(s) {names_text(unknown)}; "
                              f"known: {', '.join(sorted(cls.names()))}")
        return cls(**{k: typed(cls, k, v, where) for k, v in data.items()})

    def check_types(self, where: str):
        for name in self.names():
            setattr(self, name, typed(type(self), name, getattr(self, name), where))


@dataclass
class Network(Section):
    """The fabric and its switches."""

    TITLE = "network"
    topo: str = option("leafspine", "topology[,parameters]: leafspine,2,4 or "
                       "leafspine,leaves=4 (`qaina-bench plugins` lists them)",
                       metavar="NAME[,V|,P=V]..")
    spines: int = option(2, "alias of --topo leafspine,spines=N (kept for old configs)")
    leaves: int = option(2, "alias of --topo leafspine,leaves=N (kept for old configs)")
    target: str = option("embedded", "switch program", choices=("embedded", "bmv2"))
    bw: float | None = option(None, "link bandwidth, Mbit/s (every link)")
    delay: str | None = option(None, "link delay, e.g. 0.5ms (every link)")
    loss: float | None = option(None, "link loss, percent (every link)")
    payload_words: int = option(QAINA_WORDS, "32-bit words per aggregation packet: which "
                                "qaina.p4 build runs", choices=PAYLOAD_WORDS)
    pool_slots: int = option(POOL_SLOTS, "slots of the switch's pool the jobs share (a "
                             "smaller switch)")
    levels: int = option(1, "2: every worker's own switch (a leaf) sums the workers below "
                         "it and sends one partial sum per chunk to the aggregator",
                         choices=(1, 2))
    host_cpu: float | None = option(None, "CPU isolation: every host (its agent, its "
                                    "parameter server) gets at most CORES of CPU time per "
                                    "second, e.g. 0.5 (Mininet's CPULimitedHost, a cgroup CFS "
                                    "quota)", metavar="CORES")
    tcp_cc: str = option("cubic", "TCP congestion control of the ring's and the parameter "
                         "server's connections (and of a DDP script's where the kernel "
                         "allows): a name the kernel offers, or system to keep the "
                         "machine's default", metavar="NAME")
    cluster: str | None = option(None, "spread the network over servers with Mininet's "
                                 "cluster edition: a comma list (localhost,node2,node3) or "
                                 "a YAML file (servers, user, pinned nodes); see README "
                                 "\"Running on a cluster\"", metavar="SERVERS")


@dataclass
class Workload(Section):
    """The jobs: how many, how large, how they aggregate and when they arrive."""

    TITLE = "workload"
    jobs: int = option(2, "concurrent jobs")
    workers: int = option(4, "workers per job")
    bits: list[int] = option([4], "quantization bits (1..8 or 32), one for all jobs or one "
                             "per job")
    iterations: int = option(12, "iterations every worker runs (12: all of the bundled "
                             "digits-mlp trace)")
    slots: int = option(32, "aggregator slots per job (the window)")
    mode: str = option("ina", "ina: aggregate in the switch; ring (host ring all-reduce), "
                       "ps (a parameter server host per job sums): baselines over the same "
                       "fabric; or a registered plugin (hosts/collective.py)",
                       choices=lambda: _registry("hosts.collective", "MODES"))
    allocation: str = option("static", "static: each job holds its own --slots of the pool; "
                             "shared: every job hashes its chunks onto the whole "
                             "--pool-slots, and a chunk whose slot another job holds is "
                             "summed on the job's fallback host (ATP)",
                             choices=("static", "shared"))
    arrivals: str | None = option(None, "jobs arrive over time and leave when done: seconds "
                                  "after the start, one per job (0,0.5,1), or poisson:GAP "
                                  "(mean gap in s, from --seed); a job waits until its slots "
                                  "are free", metavar="TIMES|poisson:GAP")
    seed: int = option(0, "seed of the agents' random streams (and of poisson arrivals)")


@dataclass
class Compression(Section):
    """How gradients are quantized and compressed."""

    TITLE = "compression"
    quantizer: str = option("maxpow2", "scale rule: power of two at the chunk maximum, the "
                            "same in quarter octaves, or QSGD's L2 norm per bucket (b = 1: "
                            "scaled signs); none: float32 sums (--mode ring or ps, --bits 32)",
                            choices=lambda: ("none",) + _registry("hosts.quantize", "QUANTIZERS"))
    bucket: int = option(512, "qsgd: elements sharing one norm")
    error_feedback: bool = option(False, "add what quantization dropped to the next "
                                  "iteration (always on at b = 1; rounds to nearest)")
    headroom: int | None = option(None, "code steps added to predicted scales (default: "
                                  "adaptive, from 1 for b <= 8 and 8 for b = 32)")
    pack: bool = option(True, "--no-pack: one value per register word (the baseline that "
                        "isolates packing; b < 32)")
    compress: str = option("none", "GradiVeQ: aggregate per-layer PCA coefficients after "
                           "--gvq-fit exact iterations",
                           choices=lambda: ("none",) + _registry("hosts.compression", "COMPRESSORS"))
    gvq_d: int = option(64, "GradiVeQ slice length")
    gvq_k: int = option(8, "GradiVeQ coefficients per slice")
    gvq_fit: int = option(1, "GradiVeQ: exact iterations the per-layer bases are fitted on")
    gvq_refresh: int = option(0, "GradiVeQ: refresh the bases with an exact iteration after "
                              "every R compressed ones (0: never)")


@dataclass
class Training(Section):
    """Where the gradients come from: a recorded trace set, or training closed loop."""

    TITLE = "training"
    trace: str = option("digits-mlp", "gradient trace set (see `traces list`)")
    trace_dirs: list[str] = option([], "also look for trace sets here (before the bundled "
                                   "ones)", flag="--trace-dir")
    train: bool = option(False, "closed loop: the agents train --model on the digits from "
                         "the aggregates they receive (instead of replaying --trace)")
    model: str = option("mlp", "the trained model (cnn and resnet need PyTorch)",
                        choices=("mlp", "cnn", "resnet"))
    lr: float = option(0.3, "SGD learning rate")
    batch_size: int = option(32, "minibatch per worker")
    hidden: list[int] = option([64, 32], "mlp hidden layer sizes")
    width: int = option(24, "resnet: channels of its first stage (64: ResNet-18's 11 M "
                        "parameters)")
    eval_every: int = option(10, "--train: iterations between test accuracies")
    target_accuracy: float = option(0.9, "--train: the summary says when it was reached")
    train_script: str | None = option(None, "run this PyTorch DDP script once per worker "
                                      "instead of an agent; its gradients go through the "
                                      "testbed with qaina_bench.torch's hook (README, "
                                      "\"Training with PyTorch DDP\")", metavar="SCRIPT")
    train_args: str = option("", "--train-script's arguments, one quoted string "
                             "(split like a shell's)", metavar="'ARGS'")


@dataclass
class Output(Section):
    """Where the results go and what is recorded."""

    TITLE = "output"
    results_dir: str = option("results", "directory of the result sets")
    run_id: str | None = option(None, "name of the result set (default: time and setup)")
    sample_interval: float = option(0.01, "seconds between readings of the aggregators' "
                                    "slot counters")
    timeout: float = option(300.0, "seconds the agents may take to start, and then the jobs, "
                                    "before the run is stopped")
    record_levels: bool = option(False, "agents keep their levels and the received sums "
                                 "(for checks)")
    switch_log: bool = option(False, "BMv2 logs every packet to logs/<switch>.bmv2.txt "
                              "(slows BMv2 down several times: for debugging, not for "
                              "measurements)")
    pcap: str | None = option(None, "capture packets on these nodes (all their interfaces) "
                              "or interfaces, e.g. h1,s1-eth2: one pcapng per interface in "
                              "pcap/ of the result set, with the QAINA Wireshark dissector",
                              metavar="NODES_OR_INTERFACES")
    pcap_size: int = option(64, "--pcap: megabytes (10^6 bytes) per interface at most",
                            metavar="MB")


SECTIONS: dict[str, type[Section]] = {
    "network": Network, "workload": Workload, "compression": Compression,
    "training": Training, "output": Output}
#: option name -> the section it belongs to
SECTION_OF: dict[str, str] = {n: s for s, cls in SECTIONS.items() for n in cls.names()}


def option_fields() -> list[tuple[str, object]]:
    """(section name, field) of every option, in the tree's order."""
    return [(s, f) for s, cls in SECTIONS.items() for f in fields(cls)]


@dataclass
class Settings:
    """A run's whole configuration: one section per concern."""

    network: Network = field(default_factory=Network)
    workload: Workload = field(default_factory=Workload)
    compression: Compression = field(default_factory=Compression)
    training: Training = field(default_factory=Training)
    output: Output = field(default_factory=Output)

    # -- building ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data, where: str):
        """The tree of a nested or flat mapping (or a mix); ConfigError if a key is
        unknown, given twice, or a value is not of its option's type."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must hold a mapping of option: value")
        return cls().with_overrides(data, where)

    @classmethod
    def flat(cls, **options):
        """The tree with the given options (flat names) changed from the defaults."""
        return cls.from_dict(options, "the options")

    def with_overrides(self, data: dict, where: str):
        """A copy with the options of ``data`` (nested or flat) replacing these."""
        grouped = split(data, where)
        out = copy.deepcopy(self)
        for section, values in grouped.items():
            given = SECTIONS[section].from_dict(values, f"{where}: {section}"
                                                if _nested(data, section) else where)
            setattr(out, section, replace(getattr(out, section),
                                          **{k: getattr(given, k) for k in values}))
        return out

    # -- reading -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat_dict(self) -> dict:
        """Every option by its name, without the sections."""
        return {k: v for section in self.to_dict().values() for k, v in section.items()}

    def job_bits(self) -> list[int]:
        w = self.workload
        return w.bits * w.jobs if len(w.bits) == 1 else list(w.bits)

    def check_types(self, where: str = "the configuration"):
        for section in SECTIONS:
            getattr(self, section).check_types(where)


def _nested(data: dict, section: str) -> bool:
    return isinstance(data.get(section), dict)


def split(data: dict, where: str) -> dict[str, dict]:
    """``data``'s options grouped by section: a section's mapping as it is, a flat
    option under its section; ConfigError for an unknown key or one given twice."""
    grouped: dict[str, dict] = {}
    for section in SECTIONS:
        if section in data and not isinstance(data[section], dict):
            raise ConfigError(f"{where}: {section} is a section: a mapping of its options "
                              f"(e.g. {section}: {{...}}), not {data[section]!r}")
    flat = {k: v for k, v in data.items() if not (k in SECTIONS and isinstance(v, dict))}
    unknown = sorted(str(k) for k in flat if k not in SECTION_OF)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {names_text(unknown)}; known: "
                          f"{', '.join(sorted(SECTION_OF))} (or nested under "
                          f"{', '.join(SECTIONS)})")
    for section in SECTIONS:
        if _nested(data, section):
            grouped[section] = dict(data[section])
    for key, value in flat.items():
        section = SECTION_OF[key]
        if key in grouped.get(section, {}):
            raise ConfigError(f"{where}: {key} is given twice (flat and under {section})")
        grouped.setdefault(section, {})[key] = value
    return grouped


_WHAT = {int: "a whole number", float: "a finite number", bool: "true or false", str: "text",
         list[int]: "a whole number or a list of them (4, [4, 32] or \"4,32\")",
         list[str]: "a path or a list of paths"}
_OK = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
       float: lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)
                         and math.isfinite(v)),
       bool: lambda v: isinstance(v, bool),
       str: lambda v: isinstance(v, str),
       list[int]: lambda v: isinstance(v, list) and bool(v) and all(
           isinstance(x, int) and not isinstance(x, bool) for x in v),
       list[str]: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}


@functools.lru_cache(maxsize=None)
def kind_of(section: type, name: str) -> tuple[type, bool]:
    """(the type of option ``name``, whether it may be None)."""
    hint = typing.get_type_hints(section)[name]
    kinds = (typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, UnionType)
             else (hint,))
    return next(k for k in kinds if k is not type(None)), type(None) in kinds


def _number(text: str) -> float | None:
    """The finite number ``text`` spells (1e3), else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def typed(section: type, name: str, value, where: str):
    """``value`` of option ``name`` as its declared type; ConfigError if it is not one.

    Whole numbers must be whole (8.5 slots is an error, not 8); a bit list may be
    given as 4, [4, 32] or "4,32"; a list of paths as one path or a list.
    """
    kind, optional = kind_of(section, name)
    if value is None and optional:
        return None
    if kind == list[int] and isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",")]
        except ValueError:
            pass
    if isinstance(value, tuple):
        value = list(value)
    if kind == list[int] and isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if kind == list[str] and isinstance(value, str):
        value = [value]
    if not _OK[kind](value):
        hint = ""
        number = _number(value) if isinstance(value, str) else None
        if kind is float and number is not None:
            hint = (f" (YAML reads {value} as text: without a dot, or quoted; write "
                    f"{number!r})")
        elif kind is int and number is not None and number.is_integer():
            hint = f" (text, not a number: write {int(number)}, unquoted ASCII digits)"
        raise ConfigError(f"{where}: {name} is {value!r}, which is not {_WHAT[kind]}{hint}")
    return float(value) if kind is float else value
