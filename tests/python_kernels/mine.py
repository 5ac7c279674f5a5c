"""A user's own kernel file as test_python_kernels.py runs it: `parallel`, the quadratic form of
causal linear attention with no decay (right); `wrong`, the same with every output 1% off (it must
fail its check and take no part in the summary's ranking); `allocates`, right, and holding a
scratch array of ALLOCATED_BYTES while it runs (its record's tracemalloc figure is at least that)."""
import numpy as np

import lattn

plugin = lattn.Plugin("mine")

ALLOCATED_BYTES = 8 << 20


def _quadratic(case, t):
    mask = np.tril(np.ones((case.seq, case.seq), dtype=np.float32))
    scores = (t.q @ t.k.transpose(0, 1, 3, 2)) * mask
    return case.scale * (t.q @ t.h0 + scores @ t.v), t.h0 + t.k.transpose(0, 1, 3, 2) @ t.v


@plugin.impl("parallel", modes=["fwd"])
def parallel(case, t):
    t.o[...], t.hT[...] = _quadratic(case, t)


@plugin.impl("wrong", modes=["fwd"])
def wrong(case, t):
    o, h = _quadratic(case, t)
    t.o[...], t.hT[...] = o * np.float32(1.01), h * np.float32(1.01)


@plugin.impl("allocates", modes=["fwd"])
def allocates(case, t):
    scratch = np.ones(ALLOCATED_BYTES // 4, dtype=np.float32)  # written, so that its pages are real
    t.o[...], t.hT[...] = _quadratic(case, t)
    t.o[...] += scratch[0] - 1  # used: no optimiser takes it away
