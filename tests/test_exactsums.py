"""What a run refuses while it sums a trace's exact aggregates, before any node: a
gradient beyond every scale of a job's quantizer (``check_scales``), and only where
the agents would certainly have failed on it."""

from __future__ import annotations

import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.exactsums import ScaleRangeError, check_scales

#: per iteration, each worker's largest |g|: 1e10 at worker 2 of iteration 1
PEAKS = [{0: 1.0, 1: 2.0, 2: 0.5}, {0: 1.0, 1: 3.0, 2: 1e10}]


def config(quantizer="maxfine", bits=(4,), **compression) -> RunConfig:
    cfg = RunConfig()
    cfg.compression.quantizer = quantizer
    cfg.workload.bits = list(bits)
    cfg.workload.jobs = len(bits)
    for key, value in compression.items():
        setattr(cfg.compression, key, value)
    return cfg


def test_a_value_beyond_the_largest_scale_is_named_with_its_worker_and_iteration():
    with pytest.raises(ScaleRangeError, match=r"^trace set t: worker 2's gradient at "
                       r"iteration 1 reaches \|g\| = 1e\+10, beyond the largest scale of "
                       r"--quantizer maxfine \(2\*\*31.75 = 3.61e\+09\)"):
        check_scales("t", PEAKS, config())
    with pytest.raises(ScaleRangeError, match="--quantizer qsgd"):  # 2**127: a float32 max
        check_scales("t", [{0: 3e38}], config("qsgd"))


@pytest.mark.parametrize("cfg", [
    config("maxpow2"),  # scales up to 2**127
    config(bits=(1,)),  # signs, scaled by their mean
    config("none", bits=(32,)),  # float32 sums
    config(error_feedback=True),  # iteration 1 sends the gradient plus a residual
    config(compress="gradiveq"),  # iteration 1 sends PCA coefficients
    config(compress="gradiveq"),  # ... and iteration 0 goes at 32 bits under maxpow2
], ids=["maxpow2", "b1", "floats", "error-feedback", "gradiveq", "gradiveq-exact"])
def test_only_what_would_certainly_fail_is_refused(cfg, request):
    peaks = PEAKS[::-1] if request.node.callspec.id == "gradiveq-exact" else PEAKS
    check_scales("t", peaks, cfg)


def test_with_error_feedback_the_first_iteration_is_checked():
    with pytest.raises(ScaleRangeError, match="iteration 0"):
        check_scales("t", PEAKS[::-1], config(error_feedback=True))
