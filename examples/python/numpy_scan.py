"""NumPy impls of causal linear attention for lattnbench (docs/plugins.md, "Python kernels").

    lattnbench --suite kernel --plugin examples/python/numpy_scan.py --impl np:scan,scan,chunked --seq 2048

np:scan is the recurrent form of docs/spec.md sections 1 and 1b, one token at a time over every batch and
head at once: every decay (none, retnet, scalar and vector gates) and both rules (additive, delta),
with a backward for the additive rule. np:chunked is the chunkwise form for the additive rule with
no decay or retnet's, as matrix products per chunk.
"""
import numpy as np

import lattn

plugin = lattn.Plugin("np")


def _state_decay(case, t, i, log_gamma):
    """A_t of token i as a factor broadcast over the state [B, H, D, D] (scaling its key rows)."""
    if case.decay == "retnet":
        return np.exp(log_gamma)[None, :, None, None]
    if case.decay == "scalar":
        return np.exp(t.g[:, :, i])[:, :, None, None]
    if case.decay == "vector":
        return np.exp(t.g[:, :, i, :])[:, :, :, None]
    return None


def _forward_states(case, t):
    """Runs the recurrence, writing o and hT."""
    log_gamma = np.log(t.gamma.astype(np.float64)).astype(np.float32) if t.gamma is not None else None
    state = np.array(t.h0, dtype=np.float32)
    for i in range(case.seq):
        decay = _state_decay(case, t, i, log_gamma)
        if decay is not None:
            state *= decay
        k_i = t.k[:, :, i, :]
        v_i = t.v[:, :, i, :]
        if case.rule == "delta":
            predicted = np.matmul(k_i[:, :, None, :], state)[:, :, 0, :]  # S'^T k
            v_i = t.beta[:, :, i, None] * (v_i - predicted)
        state += k_i[:, :, :, None] * v_i[:, :, None, :]
        t.o[:, :, i, :] = case.scale * np.matmul(t.q[:, :, i, None, :], state)[:, :, 0, :]
    t.hT[...] = state


def _no_gated_backward(case):
    if case.mode == "fwd_bwd" and (case.rule != "additive" or case.decay not in ("none", "retnet")):
        return "the backward covers the additive rule with decay none or retnet"
    return None


@plugin.impl("scan", rules=["additive", "delta"], decays=["none", "retnet", "scalar", "vector"],
             unsupported=_no_gated_backward)
def scan(case, t):
    _forward_states(case, t)


@scan.backward
def scan_backward(case, t, saved):
    """docs/spec.md section 1's reverse recurrence; the forward's states are recomputed for dq."""
    gamma = t.gamma[None, :, None, None] if t.gamma is not None else np.float32(1)
    s = np.float32(case.scale)
    state = np.array(t.h0, dtype=np.float32)
    for i in range(case.seq):
        state = gamma * state + t.k[:, :, i, :, None] * t.v[:, :, i, None, :]
        t.dq[:, :, i, :] = s * np.matmul(state, t.dO[:, :, i, :, None])[:, :, :, 0]
    grad = np.array(t.dhT, dtype=np.float32)
    for i in range(case.seq - 1, -1, -1):
        if i < case.seq - 1:
            grad *= gamma
        grad += s * t.q[:, :, i, :, None] * t.dO[:, :, i, None, :]
        t.dk[:, :, i, :] = np.matmul(grad, t.v[:, :, i, :, None])[:, :, :, 0]
        t.dv[:, :, i, :] = np.matmul(t.k[:, :, i, None, :], grad)[:, :, 0, :]
    t.dh0[...] = gamma * grad


@plugin.impl("chunked", modes=["fwd"], decays=["none", "retnet"])
def chunked(case, t):
    """docs/spec.md section 1's chunked form: per chunk, (Q K^T . M) V plus the entering state's share."""
    B, H, T, D = case.batch, case.heads, case.seq, case.dim
    gamma = t.gamma.astype(np.float64) if t.gamma is not None else np.ones(H)
    state = np.array(t.h0, dtype=np.float32)
    for start in range(0, T, case.chunk):
        n = min(case.chunk, T - start)
        rows = np.arange(n)
        power = (rows[:, None] - rows[None, :]).clip(min=0)
        mask = np.where(rows[:, None] >= rows[None, :], gamma[:, None, None] ** power, 0).astype(np.float32)
        lam = (gamma[:, None] ** (rows + 1)).astype(np.float32)        # [H, n]
        gam = (gamma[:, None] ** (n - 1 - rows)).astype(np.float32)    # [H, n]
        q, k, v = (x[:, :, start:start + n, :] for x in (t.q, t.k, t.v))
        scores = np.matmul(q, k.transpose(0, 1, 3, 2)) * mask
        t.o[:, :, start:start + n, :] = case.scale * (np.matmul(scores, v) + lam[None, :, :, None] * np.matmul(q, state))
        state = (gamma ** n).astype(np.float32)[None, :, None, None] * state + np.matmul(
            (gam[None, :, :, None] * k).transpose(0, 1, 3, 2), v)
    t.hT[...] = state
