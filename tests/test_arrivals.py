"""Arrival times and the admission of jobs onto a slot pool (no network needed)."""

from __future__ import annotations

import pytest

from qaina_bench.harness.running.arrivals import Admission, SlotPool, arrival_offsets
from qaina_bench.harness.config import ConfigError, RunConfig


def test_fixed_offsets_one_per_job():
    assert arrival_offsets("0, 0.5,1", 3) == [0.0, 0.5, 1.0]
    assert arrival_offsets(None, 3) is None


@pytest.mark.parametrize("spec,message", [
    ("0,1", "2 times for 3 jobs"), ("0,-1,2", "seconds after the start"),
    ("0,x,1", "seconds after the start"), ("0,nan,1", "seconds after the start"),
    ("poisson:0", "mean gap"), ("poisson:", "mean gap"), ("poisson:inf", "mean gap")])
def test_bad_arrivals_are_refused_with_the_reason(spec, message):
    with pytest.raises(ConfigError, match=message):
        arrival_offsets(spec, 3)


def test_poisson_arrivals_are_seeded_and_start_at_zero():
    a = arrival_offsets("poisson:0.5", 200, seed=3)
    assert a == arrival_offsets("poisson:0.5", 200, seed=3)
    assert a != arrival_offsets("poisson:0.5", 200, seed=4)
    assert a[0] == 0 and all(x < y for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert 0.4 < sum(gaps) / len(gaps) < 0.6  # mean gap 0.5 s (199 draws)


def test_run_config_checks_arrivals_and_lets_jobs_queue_for_the_pool():
    with pytest.raises(ConfigError, match="one per job"):
        RunConfig.flat(jobs=2, arrivals="0", trace="digits-mlp").check()
    with pytest.raises(ConfigError, match="--arrivals"):  # the hint names the option
        RunConfig.flat(jobs=3, slots=32, pool_slots=64, trace="digits-mlp").check()
    RunConfig.flat(jobs=3, slots=32, pool_slots=64, arrivals="0,0,0", trace="digits-mlp").check()
    with pytest.raises(ConfigError, match="more slots than the pool"):
        RunConfig.flat(jobs=1, slots=65, pool_slots=64, arrivals="0", trace="digits-mlp").check()


def test_slot_pool_gives_first_fit_contiguous_ranges():
    pool = SlotPool(10)
    assert [pool.claim(4), pool.claim(4), pool.claim(4)] == [0, 4, None]
    pool.release(0)
    assert pool.claim(5) is None  # 0..3 free and 8..9 free: no 5 in a row
    assert pool.claim(3) == 0 and pool.claim(2) == 8 and pool.in_use == 9


def test_admission_in_arrival_order_and_waiting_for_slots():
    log = []
    adm = Admission(SlotPool(8), [4, 4, 4, 2], [0.0, 0.1, 0.1, 0.2], start=100.0,
                    admit=lambda j, base: log.append(("admit", j, base)),
                    release=lambda j: log.append(("release", j)))
    assert [a.job for a in adm.step(100.0)] == [0]
    assert [a.job for a in adm.step(100.15)] == [1] and adm.waiting == 2
    assert adm.step(100.3) == []  # job 2 does not fit; job 3 would, but comes later
    adm.leave(0, 100.4)
    assert [a.job for a in adm.step(100.4)] == [2]  # the pool is full again: 3 waits
    assert log == [("admit", 0, 0), ("admit", 1, 4), ("release", 0), ("admit", 2, 0)]
    assert (adm.arrivals[2].slot_base, adm.arrivals[2].admitted) == (0, 100.4)
    assert adm.arrivals[3].admitted is None and adm.waiting == 1
    adm.leave(1, 100.5)
    assert [a.job for a in adm.step(100.5)] == [3]
    assert adm.arrivals[3].slot_base == 4 and adm.waiting == 0
    adm.leave(1, 100.6)  # leaving twice changes nothing
    assert log[-2:] == [("release", 1), ("admit", 3, 4)]
