"""A NumPy impl that takes its tensors as [B, T, H, D] (layout="BTHD", docs/plugins.md), for
test_python_kernels.py: the recurrence of docs/spec.md sections 1 and 1b indexed in that layout
(every decay, both rules), with the additive rule's backward for decay none and retnet, so that
gradients come back through the conversion too. It raises when a tensor is not in the shape the
layout promises; its outputs pass the float64 check only if lattnbench permuted the inputs in and
the outputs back.
"""
import numpy as np

import lattn

plugin = lattn.Plugin("bthd")


def _check_shapes(case, t):
    B, H, T, D = case.batch, case.heads, case.seq, case.dim
    want = {"q": (B, T, H, D), "k": (B, T, H, D), "v": (B, T, H, D), "o": (B, T, H, D), "h0": (B, H, D, D),
            "hT": (B, H, D, D), "beta": (B, T, H), "g": (B, T, H, D) if case.decay == "vector" else (B, T, H),
            "dO": (B, T, H, D), "dq": (B, T, H, D), "dk": (B, T, H, D), "dv": (B, T, H, D), "dh0": (B, H, D, D)}
    for name, shape in want.items():
        array = getattr(t, name)
        if array is not None and tuple(array.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(array.shape)}, not {shape}")


def _decay(case, t, i):
    """A_t of token i, broadcast over the state [B, H, D, D] (scaling its key rows)."""
    if case.decay == "retnet":
        return t.gamma.astype(np.float32)[None, :, None, None]
    if case.decay == "scalar":
        return np.exp(t.g[:, i, :])[:, :, None, None]
    if case.decay == "vector":
        return np.exp(t.g[:, i, :, :])[:, :, :, None]
    return None


def _states(case, t):
    """The recurrence; writes o and hT, returns the state after every token."""
    state = np.array(t.h0, dtype=np.float32)
    states = []
    for i in range(case.seq):
        decay = _decay(case, t, i)
        if decay is not None:
            state = state * decay
        k_i, v_i = t.k[:, i], t.v[:, i]  # [B, H, D]
        if case.rule == "delta":
            predicted = np.matmul(k_i[:, :, None, :], state)[:, :, 0, :]
            v_i = t.beta[:, i, :, None] * (v_i - predicted)
        state = state + k_i[:, :, :, None] * v_i[:, :, None, :]
        t.o[:, i] = case.scale * np.matmul(t.q[:, i, :, None, :], state)[:, :, 0, :]
        states.append(state)
    t.hT[...] = state
    return states


def _backward_for(case):
    if case.mode == "fwd_bwd" and (case.rule != "additive" or case.decay not in ("none", "retnet")):
        return "the backward covers the additive rule with decay none or retnet"
    return None


@plugin.impl("scan", rules=["additive", "delta"], decays=["none", "retnet", "scalar", "vector"], layout="BTHD",
             unsupported=_backward_for)
def scan(case, t):
    _check_shapes(case, t)
    _states(case, t)


@scan.backward
def scan_backward(case, t, saved):
    """docs/spec.md section 1's reverse recurrence, in [B, T, H, D]."""
    _check_shapes(case, t)
    states = _states(case, t)
    gamma = t.gamma.astype(np.float32)[None, :, None, None] if case.decay == "retnet" else np.float32(1)
    grad = np.array(t.dhT, dtype=np.float32)
    for i in reversed(range(case.seq)):
        if i < case.seq - 1:
            grad = gamma * grad
        grad = grad + case.scale * t.q[:, i, :, :, None] * t.dO[:, i, :, None, :]
        t.dq[:, i] = case.scale * np.matmul(states[i], t.dO[:, i, :, :, None])[..., 0]
        t.dk[:, i] = np.matmul(grad, t.v[:, i, :, :, None])[..., 0]
        t.dv[:, i] = np.matmul(t.k[:, i, :, None, :], grad)[:, :, 0, :]
    t.dh0[...] = gamma * grad
