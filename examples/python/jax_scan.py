"""The recurrent form in JAX for lattnbench (docs/plugins.md, "Python kernels"): jax.lax.scan over
the tokens, jit-compiled once per shape (the case's cold first call, compile_s, is the compile).

    lattnbench --suite kernel --plugin examples/python/jax_scan.py --impl jax:scan,scan --seq 2048

Every decay of docs/spec.md sections 1 and 1b, both rules, forward only. The inputs reach JAX through
DLPack without a copy; the outputs are written into lattnbench's buffers through their NumPy
views (DLArray.numpy()).
"""
import lattn

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except ImportError:  # the impl then declines every case, saying why
    jax = None

plugin = lattn.Plugin("jax")


def _missing(case):
    return "jax is not installed" if jax is None else None


def _recurrence(decay, rule, scale, q, k, v, h0, g, beta):
    """q, k, v: [B, H, T, D]; g: [B, H, T] or [B, H, T, D]; beta: [B, H, T]."""
    T = q.shape[2]
    time_major = lambda x: jnp.moveaxis(x, 2, 0) if x is not None else jnp.zeros((T,))

    def step(state, token):
        q_t, k_t, v_t, g_t, b_t = token
        if decay == "scalar":
            state = state * jnp.exp(g_t)[:, :, None, None]
        elif decay == "vector":
            state = state * jnp.exp(g_t)[:, :, :, None]
        elif decay == "retnet":
            state = state * g_t[None, :, None, None]  # g_t: gamma per head
        if rule == "delta":
            v_t = b_t[:, :, None] * (v_t - jnp.einsum("bhde,bhd->bhe", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        return state, scale * jnp.einsum("bhde,bhd->bhe", state, q_t)

    gates = time_major(g) if decay in ("scalar", "vector") else jnp.broadcast_to(g, (T,) + g.shape)
    state, out = jax.lax.scan(step, h0, (time_major(q), time_major(k), time_major(v), gates, time_major(beta)))
    return jnp.moveaxis(out, 0, 2), state


_compiled = {}


@plugin.impl("scan", modes=["fwd"], rules=["additive", "delta"], decays=["none", "retnet", "scalar", "vector"],
             arrays="dlpack", unsupported=_missing)
def scan(case, t):
    key = (case.decay, case.rule)
    if key not in _compiled:
        _compiled[key] = jax.jit(lambda *xs, d=case.decay, r=case.rule, s=case.scale: _recurrence(d, r, s, *xs))
    take = lambda x: jax.dlpack.from_dlpack(x) if x is not None else None
    gate = take(t.g) if case.decay in ("scalar", "vector") else (take(t.gamma) if case.decay == "retnet" else jnp.ones(()))
    out, state = _compiled[key](take(t.q), take(t.k), take(t.v), take(t.h0), gate, take(t.beta))
    t.o.numpy()[...] = np.asarray(out)
    t.hT.numpy()[...] = np.asarray(state)
