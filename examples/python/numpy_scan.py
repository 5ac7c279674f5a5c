"""NumPy impls of causal linear attention for lattnbench (docs/plugins.md, "Python kernels").

    lattnbench --suite kernel --plugin examples/python/numpy_scan.py --impl np:scan,scan,chunked --seq 2048

np:scan is the recurrent form of docs/spec.md sections 1 and 1b, one token at a time over every batch and
head at once: every decay (none, retnet, scalar and vector gates) and both rules (additive, delta),
with a backward for the additive rule. np:chunked is the chunkwise form for the additive rule with
no decay or retnet's, as matrix products per chunk.

np:dplr and np:rwkv6 take rules only the plugin interface's version 2 describes (the bridge hands
them its tensors by name: a, b, da, db; u, du), forward and backward: np:dplr is section 1f's
diagonal-plus-low-rank rule (RWKV-7's) for every decay, np:rwkv6 section 1g's bonus form of GLA.

    lattnbench --suite kernel --plugin examples/python/numpy_scan.py --impl np:dplr,scan \
        --rule dplr --decay vector --mode fwd,fwd_bwd --seq 256
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


def _einsum_read(state, x):
    """S^T x per batch and head: [B, H, Dk, Dv] and [B, H, Dk] to [B, H, Dv]."""
    return np.einsum("bhkv,bhk->bhv", state, x)


def _dplr_forward(case, t):
    """docs/spec.md section 1f: u_t = S_{t-1}^T b_t, S_t = A_t S_{t-1} + a_t u_t^T + k_t v_t^T,
    o_t = s S_t^T q_t. Returns the states before each token, and the last, for the backward."""
    log_gamma = np.log(t.gamma.astype(np.float64)).astype(np.float32) if t.gamma is not None else None
    state = np.array(t.h0, dtype=np.float32)
    states = [state] if case.mode == "fwd_bwd" else None
    for i in range(case.seq):
        decay = _state_decay(case, t, i, log_gamma)
        read = _einsum_read(state, t.b[:, :, i])
        state = (decay * state if decay is not None else state.copy()) + \
            t.a[:, :, i, :, None] * read[:, :, None, :] + t.k[:, :, i, :, None] * t.v[:, :, i, None, :]
        t.o[:, :, i] = case.scale * _einsum_read(state, t.q[:, :, i])
        if states is not None:
            states.append(state)
    t.hT[...] = state
    return states


@plugin.impl("dplr", rules=["dplr"], decays=["none", "retnet", "scalar", "vector"])
def dplr(case, t):
    return _dplr_forward(case, t)


@dplr.backward
def dplr_backward(case, t, states):
    """Section 1f's backward: G_t = s q_t do_t^T + A_{t+1} G_{t+1} + b_{t+1} z_{t+1}^T with
    z_t = G_t^T a_t; dk, dv, da, db, dq and dg from G and the saved states."""
    log_gamma = np.log(t.gamma.astype(np.float64)).astype(np.float32) if t.gamma is not None else None
    s = np.float32(case.scale)
    grad = np.array(t.dhT, dtype=np.float32)
    for i in range(case.seq - 1, -1, -1):
        before, after = states[i], states[i + 1]
        grad = grad + s * t.q[:, :, i, :, None] * t.dO[:, :, i, None, :]
        z = _einsum_read(grad, t.a[:, :, i])
        t.dq[:, :, i] = s * np.einsum("bhkv,bhv->bhk", after, t.dO[:, :, i])
        t.dk[:, :, i] = np.einsum("bhkv,bhv->bhk", grad, t.v[:, :, i])
        t.dv[:, :, i] = _einsum_read(grad, t.k[:, :, i])
        t.da[:, :, i] = np.einsum("bhkv,bhv->bhk", grad, _einsum_read(before, t.b[:, :, i]))
        t.db[:, :, i] = np.einsum("bhkv,bhv->bhk", before, z)
        decay = _state_decay(case, t, i, log_gamma)
        if t.dg is not None:
            per_channel = decay[..., 0] * (grad * before).sum(-1)   # [B, H, Dk] (scalar gates: Dk of 1)
            t.dg[:, :, i] = per_channel if case.decay == "vector" else per_channel.sum(-1)
        # G_{t-1}'s share from token t: M_t^T G_t = A_t G_t + b_t z_t^T
        grad = (decay * grad if decay is not None else grad) + t.b[:, :, i, :, None] * z[:, :, None, :]
    t.dh0[...] = grad


@plugin.impl("rwkv6", rules=["additive"], decays=["vector"], bonus=True,
             unsupported=lambda case: None if case.bonus else "the bonus form only (bonus: true)")
def rwkv6(case, t):
    """docs/spec.md section 1g: o_t = s (S_{t-1} + diag(u) k_t v_t^T)^T q_t,
    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T."""
    s = np.float32(case.scale)
    state = np.array(t.h0, dtype=np.float32)
    states = [state] if case.mode == "fwd_bwd" else None
    for i in range(case.seq):
        q, k, v = t.q[:, :, i], t.k[:, :, i], t.v[:, :, i]
        bonus = (q * t.u[None] * k).sum(-1)                       # q_t . (u * k_t)
        t.o[:, :, i] = s * (_einsum_read(state, q) + bonus[..., None] * v)
        state = np.exp(t.g[:, :, i])[..., None] * state + k[..., :, None] * v[..., None, :]
        if states is not None:
            states.append(state)
    t.hT[...] = state
    return states


@rwkv6.backward
def rwkv6_backward(case, t, states):
    """Section 1g's gradients: G_{T-1} = dhT, G_{t-1} = diag(exp(g_t)) G_t + s q_t do_t^T,
    c_t = s (do_t . v_t)."""
    s = np.float32(case.scale)
    grad = np.array(t.dhT, dtype=np.float32)
    du = np.zeros(t.u.shape, dtype=np.float32)
    for i in range(case.seq - 1, -1, -1):
        q, k, v, do = t.q[:, :, i], t.k[:, :, i], t.v[:, :, i], t.dO[:, :, i]
        before = states[i]
        c = s * (do * v).sum(-1)[..., None]                       # [B, H, 1]
        t.dq[:, :, i] = s * np.einsum("bhkv,bhv->bhk", before, do) + c * (t.u[None] * k)
        t.dk[:, :, i] = np.einsum("bhkv,bhv->bhk", grad, v) + c * (t.u[None] * q)
        t.dv[:, :, i] = _einsum_read(grad, k) + s * (q * t.u[None] * k).sum(-1)[..., None] * do
        decay = np.exp(t.g[:, :, i])
        t.dg[:, :, i] = decay * (grad * before).sum(-1)
        du += (c * q * k).sum(0)
        grad = decay[..., None] * grad + s * q[..., :, None] * do[..., None, :]
    t.dh0[...] = grad
    t.du[...] = du
