"""The exact aggregates a replaying job's agents compare theirs with, summed once per run.

An agent reports the relative error of every aggregate it receives against the exact
sum of the job's gradients. Summed in each agent, that read every worker's whole
trace in every agent: n times the trace set for a job of n workers, before the first
packet (on this 2-core machine 3.7 s of CPU per agent for the 8-worker ResNet trace).
The run sums them here once, into a temporary directory its record lists (``clean``
removes it after a kill -9), copied to the servers of remote agents like the trace
set; the agents map the file (``hosts/traces.py``, ``load_exact_sums``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from ...hosts.quantize import scale_rule
from ...hosts.traces import TraceError, TraceSet
from .processes import RunError
from .record import RunRecord
from .rundir import RunFiles


class ExactSums:
    """The run's file of exact sums (``write``) and its removal (``remove``)."""

    def __init__(self, record: RunRecord):
        self.record = record
        self.directory: Path | None = None
        self.path: Path | None = None
        self.copies: dict[str, str] = {}  # server -> the directory's copy there

    def write(self, trace: TraceSet | None, cfg, echo=print) -> Path | None:
        """The exact sums of the run's (``cfg``) workers and iterations of ``trace``
        (None: the run trains, no file); OSError (one line) if the trace has no finite
        ones, ScaleRangeError if a job's quantizer cannot scale a gradient of it."""
        if trace is None:
            return None
        workers, iterations = cfg.workload.workers, cfg.workload.iterations
        peaks: list[dict] = []
        self.directory = Path(tempfile.mkdtemp(prefix="qaina-bench-sums-"))
        self.record.add_temp_directory(self.directory)
        self.record.save()
        began = time.monotonic()
        try:
            self.path = trace.write_exact_sums(
                self.directory / f"exact-w{workers}-i{iterations}.npy", workers, iterations,
                peaks)
        except TraceError as exc:  # a worker file that cannot be read: one line, as a disk's
            raise OSError(f"summing the exact aggregates: {exc}") from None
        check_scales(trace.name, peaks, cfg)
        echo(f"  exact sums of {workers} workers x {iterations} iterations: "
             f"{time.monotonic() - began:.1f} s")
        return self.path

    def send(self, files: RunFiles, servers):
        """Copy the file to ``servers`` (names) that do not share this disk."""
        if self.directory is not None:
            self.copies = files.send_inputs(self.directory, servers)

    def there(self, server: str | None) -> str:
        """The file's path for an agent on ``server`` ("" when there is none)."""
        if self.path is None:
            return ""
        copy = self.copies.get(server)
        return f"{copy}/{self.path.name}" if copy else str(self.path)

    def remove(self):
        """The directory and its file, gone (before the run checks what is left)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


class ScaleRangeError(RunError):
    """A gradient of the trace beyond the largest scale of a job's quantizer."""


def check_scales(trace: str, peaks: list[dict], cfg):
    """ScaleRangeError (one line) if some job's quantizer would meet a gradient value
    beyond its largest scale: found here, before any node, instead of by the agents.
    ``peaks``: per iteration, each worker's largest ``|g|``. Only what is certain is
    refused: rules whose scale bounds the chunk (its statistic is at least the
    chunk's largest ``|g|``), on iterations whose values are the trace's own (all of
    them; only the first with error feedback, which adds residuals to the later ones).
    A compressor (GradiVeQ) is not looked at: it sends other values, and its exact
    iterations go at 32 bits under ``maxpow2`` whatever ``--quantizer`` says."""
    comp = cfg.compression
    if comp.quantizer == "none" or comp.compress != "none" or not peaks:
        return
    rule = scale_rule(comp.quantizer, 1, comp.bucket)
    if not rule.bounds or set(cfg.job_bits()) == {1}:  # b = 1 scales signs by their mean
        return
    limit = 2.0 ** (rule.code_max / rule.steps)
    for i, seen in enumerate(peaks[:1] if comp.error_feedback else peaks):
        k, top = max(seen.items(), key=lambda item: item[1])
        if top > limit:
            raise ScaleRangeError(
                f"trace set {trace}: worker {k}'s gradient at iteration {i} reaches "
                f"|g| = {top:.3g}, beyond the largest scale of --quantizer {comp.quantizer} "
                f"(2**{rule.code_max / rule.steps:g} = {limit:.3g}): rescale the trace"
                + ("" if comp.quantizer == "maxpow2" else " or use --quantizer maxpow2"))
