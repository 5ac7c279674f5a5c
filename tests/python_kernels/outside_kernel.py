"""A kernel written from docs/plugins.md ("Python kernels") alone, as someone outside would: the
quadratic (attention-like) form of causal linear attention with no decay, in NumPy, with its
backward. test_python_kernels.py runs it and holds it to lattnbench's float64 check."""
import numpy as np

import lattn

plugin = lattn.Plugin("outside")


@plugin.impl("quadratic", rules=["additive"], decays=["none"])
def quadratic(case, t):
    # O = s (Q h0 + ((Q K^T) . M) V), hT = h0 + K^T V, M the causal mask (token t sees itself).
    mask = np.tril(np.ones((case.seq, case.seq), dtype=np.float32))
    scores = (t.q @ t.k.transpose(0, 1, 3, 2)) * mask
    t.o[...] = case.scale * (t.q @ t.h0 + scores @ t.v)
    t.hT[...] = t.h0 + t.k.transpose(0, 1, 3, 2) @ t.v
    return scores  # the backward's `saved`


@quadratic.backward
def quadratic_backward(case, t, scores):
    s = np.float32(case.scale)
    mask = np.tril(np.ones((case.seq, case.seq), dtype=np.float32))
    d_scores = (t.dO @ t.v.transpose(0, 1, 3, 2)) * mask
    t.dq[...] = s * (t.dO @ t.h0.transpose(0, 1, 3, 2) + d_scores @ t.k)
    t.dk[...] = s * d_scores.transpose(0, 1, 3, 2) @ t.q + t.v @ t.dhT.transpose(0, 1, 3, 2)
    t.dv[...] = s * scores.transpose(0, 1, 3, 2) @ t.dO + t.k @ t.dhT
    t.dh0[...] = s * t.q.transpose(0, 1, 3, 2) @ t.dO + t.dhT


@plugin.impl("declines", decays=["retnet"], unsupported=lambda case: "only odd seq" if case.seq % 2 == 0 else None)
def declines(case, t):
    raise AssertionError("never called: every planned case is declined")
