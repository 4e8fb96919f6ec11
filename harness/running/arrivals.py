"""Jobs that arrive over time and leave when done, on one switch's slot pool.

``--arrivals`` gives each job an arrival time after the run's start signal: fixed
offsets (``0,0.5,1``: seconds, one per job) or a seeded Poisson process
(``poisson:GAP``: exponential gaps of mean GAP seconds, the first job at 0, drawn
from ``--seed``). ``Admission`` admits arrived jobs in arrival order while their
slots fit the pool (first fit, contiguous ranges: the static partition of
``harness/switches/jobs.py``, made at admission instead of at start) and frees a job's range
when it leaves; a job that does not fit waits for one that leaves. Jobs behind a
waiting job wait too (first come, first served: no job overtakes another).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..config import ConfigError

#: the latest a job may arrive, and the longest mean gap, in seconds after the start
MAX_ARRIVAL = 86400.0


def arrival_offsets(spec: str | None, jobs: int, seed: int = 0) -> list[float] | None:
    """Arrival offsets (s) of ``jobs`` jobs from ``spec``; None if ``spec`` is None."""
    if spec is None:
        return None
    text = spec.strip()
    if text.startswith("poisson:"):
        try:
            gap = float(text[len("poisson:"):])
        except ValueError:
            gap = math.nan
        if not math.isfinite(gap) or gap <= 0 or gap > MAX_ARRIVAL:
            raise ConfigError(f"--arrivals {spec!r}: poisson:GAP needs a mean gap in "
                              f"seconds above 0 and at most {MAX_ARRIVAL:g} (e.g. poisson:0.5)")
        rng = random.Random(seed)
        offsets, t = [0.0], 0.0
        for _ in range(jobs - 1):
            t += rng.expovariate(1.0 / gap)
            offsets.append(round(t, 6))
        return offsets
    try:
        offsets = [float(x) for x in text.split(",")]
    except ValueError:
        offsets = []
    if not offsets or not all(math.isfinite(x) and 0 <= x <= MAX_ARRIVAL for x in offsets):
        raise ConfigError(f"--arrivals {spec!r}: give seconds after the start, 0 to "
                          f"{MAX_ARRIVAL:g}, one per job (e.g. 0,0.5,1), or poisson:GAP "
                          "(mean gap in seconds)")
    if len(offsets) != jobs:
        raise ConfigError(f"--arrivals gives {len(offsets)} times for {jobs} jobs: give one "
                          "per job")
    return offsets


class SlotPool:
    """Contiguous ranges of a pool of slots, given first fit and taken back."""

    def __init__(self, size: int):
        self.size = size
        self.used: dict[int, int] = {}  # base -> count

    def claim(self, count: int) -> int | None:
        """The base of a free range of ``count`` slots (now used), or None."""
        base = 0
        for start, n in sorted(self.used.items()):
            if start - base >= count:
                break
            base = max(base, start + n)
        if base + count > self.size:
            return None
        self.used[base] = count
        return base

    def release(self, base: int):
        del self.used[base]

    @property
    def in_use(self) -> int:
        return sum(self.used.values())


@dataclass
class Arrival:
    """What happened to one job: times are seconds since the epoch."""
    job: int  # index into the run's jobs
    due: float  # when it arrives
    admitted: float | None = None
    slot_base: int | None = None
    left: float | None = None


class Admission:
    """Admits arrived jobs onto the pool in arrival order; frees them when they leave.

    ``admit(job, base)`` and ``release(job)`` are the control plane's (install, remove);
    ``step(now)`` runs them for what is due and returns the jobs admitted.
    """

    def __init__(self, pool: SlotPool, slots: list[int], offsets: list[float], start: float,
                 admit, release):
        self.pool = pool
        self.slots = slots  # slots each job holds
        self.arrivals = [Arrival(j, start + off) for j, off in enumerate(offsets)]
        self.queue = sorted(self.arrivals, key=lambda a: (a.due, a.job))
        self._admit, self._release = admit, release

    def step(self, now: float) -> list[Arrival]:
        admitted = []
        while self.queue and self.queue[0].due <= now:
            head = self.queue[0]
            need = self.slots[head.job]
            base = self.pool.claim(need) if need else 0  # the baselines hold no slots
            if base is None:
                break
            self._admit(head.job, base)
            head.admitted, head.slot_base = now, base
            admitted.append(self.queue.pop(0))
        return admitted

    def leave(self, job: int, now: float):
        """Job ``job`` is done: its entries go and its slots are free for the next."""
        a = self.arrivals[job]
        if a.admitted is None or a.left is not None:
            return
        self._release(job)
        if self.slots[job]:
            self.pool.release(a.slot_base)
        a.left = now

    @property
    def waiting(self) -> int:
        return len(self.queue)
