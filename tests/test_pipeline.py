"""The iteration pipeline is one: the offline evaluation (hosts/evaluate.py) and workers
running the agent's pipeline with a real collective give bit-identical sums.

The workers here are threads, each with its own ``Pipeline`` (as every agent has) and a
ring all-reduce over TCP on loopback (``hosts/collective.py``'s ``HostCollective`` over
``hosts/ring.py``'s ``Ring``, the ring mode's collective): packed words summed with
wrapping addition, scales agreed exactly. The evaluation with ``window=0`` agrees every
scale exactly too and sums levels as integers, in process. Any drift between the two
(error feedback, GradiVeQ's exact and compressed iterations, the fit window, the codecs'
seeds) shows as a differing bit."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from qaina_bench.hosts import kernels
from qaina_bench.hosts.collective import MODES, HostCollective
from qaina_bench.hosts.compression import CodecConfig
from qaina_bench.hosts.evaluate import Aggregation, Scheme
from qaina_bench.hosts.pipeline import Pipeline, compressor
from qaina_bench.hosts.ring import Ring
from qaina_bench.hosts.traces import TraceSet, find_trace
from qaina_bench.p4.header import QAINA_WORDS

WORKERS = 3
SEED = 5


@pytest.fixture(scope="module")
def trace():
    return TraceSet.open(find_trace("digits-mlp"))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ring_sums(trace, scheme: Scheme, iterations: int) -> list[list[np.ndarray]]:
    """Every worker's aggregate of every iteration: the agent's pipeline, the ring."""
    layers = [(x.name, x.size) for x in trace.layers]
    cfg = CodecConfig(scheme.bits, WORKERS, scheme.quantizer, scheme.bucket,
                      scheme.error_feedback, scheme.headroom)
    name = "gradiveq" if scheme.gradiveq else "none"
    peers = [("127.0.0.1", p) for p in free_ports(WORKERS)]
    out: list[list[np.ndarray]] = [[] for _ in range(WORKERS)]
    errors = []

    def worker(k: int):
        pipe = Pipeline(cfg, [SEED, k], QAINA_WORDS, compressor(
            name, layers, scheme.gvq_d, scheme.gvq_k, scheme.gvq_fit, scheme.gvq_refresh))
        collective = HostCollective(Ring(k, peers))
        try:
            collective.connect(10.0)
            for i in range(iterations):
                enc = pipe.encode(i, trace.gradient(k, i))
                a = collective.all_reduce(enc.values, enc.codec, pipe.predicted)
                aggregate = pipe.decode(enc, a)
                pipe.adapt(enc, a, aggregate)
                out[k].append(aggregate)
        except Exception as exc:  # the test thread reports it
            errors.append(exc)
        finally:
            collective.close()

    # Compiled here first: numba parses a function's source as it compiles it, and on
    # Python 3.11 ASTs made in several threads at once can fail with "AST constructor
    # recursion depth mismatch" (CPython gh-106905); agents compile in processes of
    # their own.
    kernels.warm()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


SCHEMES = [Scheme(4), Scheme(2, "maxfine", error_feedback=True), Scheme(8, "qsgd", bucket=64),
           Scheme(1), Scheme(32),
           Scheme(4, gradiveq=True, gvq_fit=2, gvq_refresh=2, error_feedback=True)]


@pytest.mark.parametrize("scheme", SCHEMES, ids=[s.label() for s in SCHEMES])
def test_the_evaluation_and_the_agents_pipeline_give_the_same_bits(trace, scheme):
    iterations = 7
    ring = ring_sums(trace, scheme, iterations)
    # counterfactual: the evaluation's second quantization, with every scale exact,
    # draws from the same random numbers; the agents have none
    evaluation = Aggregation(scheme, WORKERS, [(x.name, x.size) for x in trace.layers],
                             window=0, seed=SEED, counterfactual=False)
    for i in range(iterations):
        step = evaluation.step([trace.gradient(k, i) for k in range(WORKERS)])
        assert np.any(step.total)  # something was summed
        for k in range(WORKERS):
            assert ring[k][i].dtype == step.total.dtype
            assert np.array_equal(ring[k][i], step.total), (i, k)


def test_a_changed_seed_changes_the_bits(trace):
    """The comparison above can fail: stochastic rounding under another seed differs."""
    scheme = Scheme(4)
    ring = ring_sums(trace, scheme, 1)
    other = Aggregation(scheme, WORKERS, [(x.name, x.size) for x in trace.layers],
                        window=0, seed=SEED + 1, counterfactual=False)
    assert not np.array_equal(ring[0][0], other.step(
        [trace.gradient(k, 0) for k in range(WORKERS)]).total)


def test_the_built_in_modes_are_registered_with_their_harness_data():
    assert MODES.names()[:3] == ("ina", "ring", "ps")
    ina, ring, ps = (MODES.get(m) for m in ("ina", "ring", "ps"))
    assert ina.in_switch and not ring.in_switch and not ps.in_switch
    assert ps.server is not None and ring.server is None and ina.server is None
    assert ps.server.argv(4, None)[-2:] == [str(ps.server.port), "4"]
    assert ps.server.argv(4, "cubic")[-3:] == [str(ps.server.port), "4", "cubic"]
    assert not ina.float_sums and ring.float_sums and ps.float_sums
