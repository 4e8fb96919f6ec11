"""Run one embedded QAINA switch, the way ``simple_switch_grpc --no-p4`` runs:

    python -m qaina_bench.p4.embedded --device-id 1 --grpc-addr 127.0.0.1:9559 \\
        --interface 1@s1-eth1 --interface 2@s1-eth2 --log /tmp/s1.log

The switch starts without a program; the control plane sends the P4Info of
``qaina.p4`` with SetForwardingPipelineConfig, then programs the tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time

from . import EmbeddedSwitch
from .loop import COALESCE_S
from .ports import PortError


def _digits(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (``isdigit`` takes others)."""
    return text.isascii() and text.isdigit()


def parse_interface(text: str) -> tuple[int, str]:
    port, sep, ifname = text.partition("@")
    if not sep or not _digits(port) or not ifname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT@IFNAME, e.g. 1@veth0")
    if not 0 <= int(port) < 511:
        raise argparse.ArgumentTypeError(f"{text!r}: port numbers are 0..510 (bit<9>, 511 drops)")
    if any(c in ifname for c in ":/") or any(c.isspace() for c in ifname):
        # the kernel reads "eth0:x" as eth0 (an address label): two ports on one device
        raise argparse.ArgumentTypeError(f"{text!r}: {ifname!r} is not an interface name "
                                         "(Linux names have no ':', '/' or spaces)")
    return int(port), ifname


def device_id(text: str) -> int:
    if not _digits(text) or int(text) >> 64:
        raise argparse.ArgumentTypeError(f"{text!r}: a device id is a whole number "
                                         "0..2**64-1 (P4Runtime's uint64)")
    return int(text)


def grpc_addr(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not _digits(port) or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT with a port "
                                         "0..65535, e.g. 127.0.0.1:9559")
    return text


def microseconds(text: str) -> int:
    if not _digits(text) or int(text) > 100_000:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of microseconds "
                                         "0..100000")
    return int(text)


def writable(text: str) -> str:
    """A file the switch can create or append to (its directory exists)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a directory, not a file")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: its directory {folder} does not exist "
                                         "or cannot be written")
    return text


def replaceable(text: str) -> str:
    """A file the switch may replace when it stops: a regular file or none yet (not
    a link, a device or a pipe, which replacing would destroy)."""
    text = writable(text)
    if os.path.lexists(text) and (os.path.islink(text) or not os.path.isfile(text)):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a regular file: "
                                         "name a new file or a regular one to replace")
    return text


def write_stats(path: str, stats: dict):
    """``stats`` as JSON in ``path``, whole or not at all (a new file beside it, then
    renamed over it)."""
    fd, partial = tempfile.mkstemp(prefix=".stats-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(stats, f)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def version_text() -> str:
    """What ``--version`` prints: the package's version and the P4Runtime API it serves."""
    from importlib.metadata import PackageNotFoundError, version
    from .runtime import API_VERSION
    try:
        package = version("qaina-bench")
    except PackageNotFoundError:  # a source tree that is not installed
        package = "not installed"
    return f"qaina embedded switch, qaina-bench {package}, P4Runtime API {API_VERSION}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qaina_bench.p4.embedded",
                                 description="Embedded QAINA switch (qaina.p4 in software, "
                                             "programmed over P4Runtime).")
    ap.add_argument("--version", action="version", version=version_text())
    ap.add_argument("-i", "--interface", action="append", type=parse_interface, default=[],
                    metavar="PORT@IFNAME", help="attach interface IFNAME as port PORT")
    ap.add_argument("--device-id", type=device_id, default=1)
    ap.add_argument("--grpc-addr", type=grpc_addr, default="127.0.0.1:9559",
                    help="P4Runtime address")
    ap.add_argument("--log", type=writable, help="log file (default: stderr)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    ap.add_argument("--cpu", type=int, help="pin the switch to this CPU")
    ap.add_argument("--stats", metavar="PATH", type=replaceable, help="write the ports' counters (frames "
                    "received, dropped by the kernel, shed under overload, sent) here as "
                    "JSON when the switch stops")
    ap.add_argument("--coalesce-us", type=microseconds, metavar="US",
                    help="after a round of short reads (frames trickling in), wait this "
                         "long before reading again, so that reads are bursts; a frame "
                         f"waits at most this long; 0: never (default {COALESCE_S * 1e6:.0f})")
    args = ap.parse_args(argv)

    logging.basicConfig(filename=args.log, level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("qaina.switch")
    ports = dict(args.interface)
    if len(ports) != len(args.interface):
        ap.error("a port number is given twice")
    if len(set(ports.values())) != len(ports):
        ap.error("an interface is given as two ports (each frame would go through twice)")
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, ValueError, OverflowError):
            ap.error(f"--cpu {args.cpu}: not a CPU this process may run on "
                     f"({', '.join(map(str, sorted(os.sched_getaffinity(0))))})")
    try:
        switch = EmbeddedSwitch(ports, device_id=args.device_id, grpc_addr=args.grpc_addr,
                                coalesce_s=None if args.coalesce_us is None
                                else args.coalesce_us / 1e6)
    except (PortError, OSError) as exc:
        if args.log:  # (without --log the log is this standard error)
            log.error("%s", exc)
        print(f"qaina switch: {exc}", file=sys.stderr)
        return 2

    def stop(signum, frame):
        switch.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("device %d: P4Runtime on %s, ports %s", args.device_id, switch.grpc_addr,
             ", ".join(f"{n}@{i}" for n, i in sorted(ports.items())))
    started = time.monotonic()
    try:
        switch.run()
    finally:
        switch.close()
        stats = switch.ports.stats()
        log.info("stopped after %.1f s; %d coalescing waits; port stats %s",
                 time.monotonic() - started, switch.ports.coalesced, stats)
        if args.stats:
            write_stats(args.stats, stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
