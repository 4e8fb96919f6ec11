"""The constants of ``qaina.p4`` beyond its header, for every part of the project.

``qaina.p4`` declares the same values (``#define`` and ``const``);
``tests/test_p4info.py`` fails if the two disagree. Nothing here depends on a target:
the harness, the results and both switch targets read them from this module.
"""

from __future__ import annotations

from enum import IntEnum

from .header import QAINA_WORDS

POOL_SLOTS = 1024  # slots in the shared aggregation pool (two copies each)
POOL_COPIES = 2 * POOL_SLOTS
POOL_WORDS = POOL_COPIES * QAINA_WORDS
MAX_JOBS = 16  # size of job_table and of the per-job counters
MAX_WORKERS = 32  # agg_seen holds one bit per worker
RESULT_TTL = 64  # IPv4 TTL of a result leaving the aggregator


class Drop(IntEnum):
    """Indexes of ``MyIngress.drops``: why a packet was dropped."""

    NOT_IPV4 = 0  # not IPv4 (a VLAN tag included), or cut short before the IPv4 end
    NO_ROUTE = 1  # no ipv4_lpm entry
    MALFORMED = 2  # for the aggregator, but not a whole unfragmented QAINA packet
    BAD_FLAGS = 3  # result flag on a contribution, or ver > 1
    UNKNOWN_JOB = 4  # job_id not in job_table
    NON_MEMBER = 5  # source address not a worker of the job
    BAD_WORKER = 6  # worker index not the member's, or >= n
    BAD_SLOT = 7  # slot outside the job's range or the pool
    DUPLICATE = 8  # contribution already counted, slot still pending
    BAD_JOB = 9  # job entry out of range: job_index >= MAX_JOBS or n_workers > MAX_WORKERS
    WRONG_PORT = 10  # a member's address on another ingress port than the member's
    SPOOFED_SOURCE = 11  # a source address the guarded ingress port does not admit
    FORGED_RESULT = 12  # a RESULT on a port where no aggregator lies upstream of its source
    STALE_RESULT = 13  # two levels: an upper aggregator's result no slot copy waits for
    TTL_EXPIRED = 14  # to be routed with a TTL of 0 or 1 (it would leave with 0, or 255)
    INTERNAL = 15  # embedded switch only: processing the packet failed (a bug; logged)


DROP_REASONS = 16  # cells of MyIngress.drops
#: drop counter index -> reason name as results report it
DROP_NAMES = {int(d): d.name.lower() for d in Drop}
