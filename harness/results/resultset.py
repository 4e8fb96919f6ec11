"""One result set, ``results/<run-id>/``, written while its run goes.

A result set holds ``config.yaml`` (the resolved configuration), ``iterations.csv``
(one row per job, worker and iteration: ``ITERATION_COLUMNS``), ``timeseries.csv``
(switch samples, link counters, drops by reason, CPU time counters of the run's
processes and of the machine: ``TIMESERIES_COLUMNS``),
``summary.json`` (``harness/results/summary.py``), plots (``harness/results/plots.py``), ``logs/``
and ``agents/``. The writer appends as the run goes, so an interrupted run keeps
what it measured.
"""

from __future__ import annotations

import csv
import errno
import os
import stat
from pathlib import Path

from ...p4.constants import DROP_NAMES


ITERATION_COLUMNS = ["job", "worker", "iteration", "start", "end", "completion_s", "elements",
                     "values", "compressed", "packets_sent", "packets_received", "bytes_sent",
                     "bytes_received", "retransmissions", "timeouts", "fast_retransmits",
                     "duplicates", "refused", "send_errors", "clipped", "headroom", "bits",
                     "gvq_projection_error", "gvq_energy", "train_loss", "test_loss",
                     "test_accuracy", "rel_error",
                     "encode_s", "decode_s", "cpu_s", "rtt_median_s", "window_mean",
                     "wakeups", "lingered_s"]
TIMESERIES_COLUMNS = ["time", "kind", "switch", "job", "interface", "slots_opened",
                      "slots_closed", "slots_in_use", "agg_packets", "retx_answered",
                      "results_sent", "fallback_packets", "bytes_sent", "bytes_recv", "packets_sent",
                      "packets_recv", "reason", "drops", "process", "user_s", "system_s",
                      "wait_s", "nice_s", "idle_s", "iowait_s", "irq_s", "softirq_s",
                      "steal_s", "server"]  # server: another one of a cluster, else empty


class ResultWriter:
    """Writes one result set as the run goes, so an interrupted run keeps its data."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.log_dir = self.dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=False)
        self._ts = open(self.dir / "timeseries.csv", "w", newline="", buffering=1)
        self._ts_writer = csv.DictWriter(self._ts, TIMESERIES_COLUMNS)
        self._ts_writer.writeheader()
        self.errors: list[str] = []

    def write_config(self, text: str):
        (self.dir / "config.yaml").write_text(text)

    def note_error(self, message: str):
        self.errors.append(message)

    def add_sample(self, row: dict):
        self._ts_writer.writerow({"kind": "slots", **row})

    def add_link_sample(self, row: dict):
        self._ts_writer.writerow({"kind": "link", **row})

    def add_process_sample(self, row: dict):
        self._ts_writer.writerow({"kind": "proc", **row})

    def add_cpu_sample(self, row: dict):
        self._ts_writer.writerow({"kind": "cpu", **row})

    def add_row(self, row: dict):
        """A row as it is (its ``kind`` in it): another server's sample."""
        self._ts_writer.writerow(row)

    def add_drops(self, t: float, switch: str, drops: dict[int, int]):
        for reason, count in sorted(drops.items()):
            if count:
                self._ts_writer.writerow({"time": t, "kind": "drops", "switch": switch,
                                          "reason": DROP_NAMES.get(reason, str(reason)),
                                          "drops": count})

    def close(self):
        if not self._ts.closed:
            self._ts.close()


#: the largest result or docs file read whole (a summary, a config, a docs CSV)
MAX_READ = 256 << 20


def regular_file(path: Path) -> Path:
    """``path`` if it is a regular file (a link to one is one); OSError (ENOENT) if it is
    missing, ValueError if it is a directory, a device or a pipe (which would hang or
    never end a read)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise ValueError("not a regular file (a device, a pipe or a directory)")
    return Path(path)


def read_text(path: Path, limit: int = MAX_READ) -> str:
    """A regular file's text (UTF-8), at most ``limit`` bytes; ValueError beyond
    (UnicodeDecodeError is one), OSError if it cannot be read."""
    with open(regular_file(path), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 20} MB")
    return data.decode("utf-8")


def writable(path: Path):
    """OSError unless ``path`` could be written (its folder exists and takes files, and
    it is not a folder), without touching it: checked before a long computation whose
    output goes there."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory", str(path))
    if path.exists() and not path.is_file():  # a device or pipe is never replaced
        raise OSError(f"{path}: not a regular file (a device or pipe): name a file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(2, "no such directory", str(folder))
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists()
                                                    and not os.access(path, os.W_OK)):
        raise PermissionError(13, "not writable", str(path))


def unwritable(path) -> str | None:
    """Why ``path`` cannot take an output file, as one line naming it; None if it can
    (``writable``)."""
    try:
        writable(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}" if exc.strerror else str(exc)
    return None


def write_csv_whole(path: Path, rows: list[dict], columns: dict | None = None):
    """``rows`` as ``path``'s CSV, written whole (``write_whole``): a column per key of
    ``columns`` (headed by its value) or of the first row; None as empty."""
    import io
    keys = list(columns or rows[0])
    text = io.StringIO(newline="")
    out = csv.writer(text)
    out.writerow(columns.values() if columns else keys)
    out.writerows(["" if r.get(k) is None else r[k] for k in keys] for r in rows)
    write_whole(path, text.getvalue())


class OutputError(OSError):
    """An output file that could not be written (a full disk, say); the message names
    the file."""


def write_whole(path: Path, text: str):
    """``text`` as ``path``'s whole content, replacing what was there only once all of
    it is written (an error or a Ctrl-C leaves the old file as it was)."""
    import tempfile
    path = Path(os.path.realpath(path))  # a link's target is replaced, not the link
    if path.exists() and not path.is_file():
        raise OutputError(f"{path}: not a regular file (a device or pipe): name a file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def results_problem(exc: Exception, where: Path) -> str | None:
    """The line for a result set that could not be written: no space (or a read-only
    file system), or its folder removed during the run; None for any other error."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return (f"cannot write the results in {where}: {exc.strerror} (free space there or "
                "choose another --results-dir)")
    if exc.errno == errno.ENOENT and not Path(where).is_dir():
        return f"the result set {where} was removed while the run went ({exc.filename} is gone)"
    if exc.errno == errno.ENOTDIR and not Path(where).is_dir():
        return (f"the result set {where} was replaced by something that is no folder while "
                "the run went (what it had written is lost)")
    return None
