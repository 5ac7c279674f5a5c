#!/usr/bin/python3
"""Time the layer of docs/spec.md section 2 in JAX (on the CPU, jit-compiled) beside lattnbench's
layer suite on the same shapes and machine, and print both per case as a Markdown table.

    layer_vs_jax.py [--lattnbench build/lattnbench | --results FILE] [--threads 2] [--reps 10]
                    [--seq 512,2048] [--impl scan,chunked] [--mode fwd,fwd_bwd]

JAX is not a dependency of the project: run this with a Python that has it, e.g.
    python3 -m venv /tmp/jax && /tmp/jax/bin/pip install jax && /tmp/jax/bin/python scripts/layer_vs_jax.py

The JAX layer is the hybrid block of section 2 at the layer suite's defaults (B 2, H 8, head dim 64,
window 128, chunk 128, decay none): Q, K, V projections, the linear branch in the chunked form
(a lax.scan over chunks: intra-chunk causal products plus the entering state; the same function
stands beside lattnbench's scan and chunked forms, since JAX has no faster scan), the sliding window
as blocks of W queries against their own and the previous block's keys (O(T W)), RMSNorm, the gate
and the output projection; fwd_bwd is jax.grad of <out, dOut> with respect to x, the four weights,
g and beta. Before timing, its float32 output at the shortest seq is checked against the same layer
in float64 with the token-by-token scan and a dense masked softmax window (relative error printed).
Times are the median of --reps calls after a compile call and a warm-up call, each call ended by
block_until_ready. XLA's CPU threads are limited to --threads through XLA_FLAGS (set before JAX
loads) and the process's CPU affinity.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lattnbench", default="build/lattnbench", help="the binary to run the layer suite with")
    ap.add_argument("--results", help="a lattnbench result file with the layer cases, instead of running it")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seq", default="512,2048")
    ap.add_argument("--impl", default="scan,chunked")
    ap.add_argument("--mode", default="fwd,fwd_bwd")
    return ap.parse_args()


ARGS = parse()
os.environ.setdefault(
    "XLA_FLAGS", f"--xla_cpu_multi_thread_eigen={'true' if ARGS.threads > 1 else 'false'} "
    f"intra_op_parallelism_threads={ARGS.threads}")
# float64 for the check's reference; the timed layer is float32 throughout (its inputs are, and
# every constant is a weakly typed Python scalar or built with the inputs' dtype).
os.environ.setdefault("JAX_ENABLE_X64", "1")
try:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:ARGS.threads])
except (AttributeError, OSError):
    pass

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402

B, H, DH, W, CHUNK = 2, 8, 64, 128, 128
M = H * DH


def heads(z, T):  # [B, T, M] -> [B, H, T, Dh]
    return z.reshape(B, T, H, DH).transpose(0, 2, 1, 3)


def linear_chunked(q, k, v):
    """Section 1, decay none, h0 = 0, in chunks of CHUNK rows (T a multiple of CHUNK)."""
    T = q.shape[2]
    n = T // CHUNK
    s = DH ** -0.5
    qc, kc, vc = (z.reshape(B, H, n, CHUNK, DH).transpose(2, 0, 1, 3, 4) for z in (q, k, v))
    mask = jnp.tril(jnp.ones((CHUNK, CHUNK), q.dtype))

    def step(S, qkv):
        qi, ki, vi = qkv
        scores = jnp.einsum("bhid,bhjd->bhij", qi, ki) * mask
        o = s * (jnp.einsum("bhij,bhjd->bhid", scores, vi) + jnp.einsum("bhid,bhde->bhie", qi, S))
        return S + jnp.einsum("bhjd,bhje->bhde", ki, vi), o

    _, o = jax.lax.scan(step, jnp.zeros((B, H, DH, DH), q.dtype), (qc, kc, vc))
    return o.transpose(1, 2, 0, 3, 4).reshape(B, H, T, DH)


def linear_scan(q, k, v):
    """The token-by-token recurrence: the check's reference."""
    s = DH ** -0.5

    def step(S, qkv):
        qt, kt, vt = qkv
        S = S + kt[..., :, None] * vt[..., None, :]
        return S, s * jnp.einsum("bhd,bhde->bhe", qt, S)

    _, o = jax.lax.scan(step, jnp.zeros((B, H, DH, DH), q.dtype), tuple(z.transpose(2, 0, 1, 3) for z in (q, k, v)))
    return o.transpose(1, 2, 0, 3)


def sliding_window(q, k, v):
    """Query t over keys max(0, t - W + 1) .. t, in blocks of W queries (T a multiple of W)."""
    T = q.shape[2]
    n = T // W
    qb = q.reshape(B, H, n, W, DH)
    pad = lambda z: jnp.concatenate([jnp.zeros_like(z[:, :, :1]), z[:, :, :-1]], axis=2)  # noqa: E731
    kb, vb = k.reshape(B, H, n, W, DH), v.reshape(B, H, n, W, DH)
    keys = jnp.concatenate([pad(kb), kb], axis=3)  # the previous block's W keys, then the block's own
    values = jnp.concatenate([pad(vb), vb], axis=3)
    i = jnp.arange(W)[:, None] + W  # query position within [previous block, block]
    j = jnp.arange(2 * W)[None, :]
    block = jnp.arange(n)[:, None, None]
    allowed = (j <= i) & (j > i - W) & ((block > 0) | (j >= W))
    scores = jnp.einsum("bhnid,bhnjd->bhnij", qb, keys) * DH ** -0.5
    scores = jnp.where(allowed, scores, -jnp.inf)
    p = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhnij,bhnjd->bhnid", p, values).reshape(B, H, T, DH)


def sliding_window_dense(q, k, v):
    """The window as a masked T x T softmax: the check's reference."""
    T = q.shape[2]
    t, tau = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    scores = jnp.einsum("bhid,bhjd->bhij", q, k) * DH ** -0.5
    p = jax.nn.softmax(jnp.where((tau <= t) & (tau > t - W), scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhij,bhjd->bhid", p, v)


def layer(params, x, linear, window=sliding_window):
    wq, wk, wv, wo, g, beta = params
    T = x.shape[1]
    q, k, v = (heads(x @ w, T) for w in (wq, wk, wv))
    lin = linear(q, k, v)
    swa = window(q, k, v)
    linn = lin * jax.lax.rsqrt(jnp.mean(lin * lin, axis=-1, keepdims=True) + 1e-6) * g.reshape(H, 1, DH)
    sig = jax.nn.sigmoid(beta).reshape(1, H, 1, 1)
    y = sig * linn + (1 - sig) * swa
    return y.transpose(0, 2, 1, 3).reshape(B, T, M) @ wo


def inputs(T, dtype):
    key = jax.random.PRNGKey(0)
    ks = jax.random.split(key, 8)
    w = [jax.random.normal(ks[i], (M, M), dtype) * M ** -0.5 for i in range(4)]
    params = (*w, jnp.ones((M,), dtype), jax.random.normal(ks[4], (H,), dtype))
    return params, jax.random.normal(ks[5], (B, T, M), dtype), jax.random.normal(ks[6], (B, T, M), dtype)


def timed(fn, *args):
    jax.block_until_ready(fn(*args))  # compile
    jax.block_until_ready(fn(*args))  # warm-up
    times = []
    for _ in range(ARGS.reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def jax_ms(T, mode):
    params, x, d_out = inputs(T, jnp.float32)
    fwd = jax.jit(lambda p, x: layer(p, x, linear_chunked))
    assert fwd(params, x).dtype == jnp.float32
    if mode == "fwd":
        return timed(fwd, params, x)
    loss = lambda p, x, d: jnp.vdot(layer(p, x, linear_chunked), d)  # noqa: E731
    return timed(jax.jit(jax.grad(loss, argnums=(0, 1))), params, x, d_out)


def check(T):
    """The timed float32 layer against the same layer in float64 with the scan recurrence."""
    params, x, _ = inputs(T, jnp.float64)
    want = layer(params, x, linear_scan, sliding_window_dense)
    got = jax.jit(lambda p, x: layer(p, x, linear_chunked))(
        tuple(z.astype(jnp.float32) for z in params), x.astype(jnp.float32))
    assert want.dtype == jnp.float64 and got.dtype == jnp.float32, (want.dtype, got.dtype)
    return float(jnp.linalg.norm(got.astype(jnp.float64) - want) / jnp.linalg.norm(want))


def lattnbench_ms(seqs, impls, modes):
    if ARGS.results:
        doc = json.load(open(ARGS.results))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "layer.json")
            subprocess.run([ARGS.lattnbench, "--suite", "layer", "--threads", str(ARGS.threads), "--seq",
                            ",".join(map(str, seqs)), "--impl", ",".join(impls), "--mode", ",".join(modes),
                            "--reps", str(ARGS.reps), "--quiet", "--out", out], check=True, stdout=sys.stderr)
            doc = json.load(open(out))
    found = {}
    for r in doc["results"]:
        if r.get("suite") == "layer" and r.get("status") == "ok":
            found[(r["seq"], r["impl"], r["mode"])] = (r["median_ms"], r.get("peak_fraction"), r.get("variant", ""))
    return found, doc.get("device", {})


def main():
    seqs = [int(s) for s in ARGS.seq.split(",")]
    impls, modes = ARGS.impl.split(","), ARGS.mode.split(",")
    ours, device = lattnbench_ms(seqs, impls, modes)
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, {ARGS.threads} threads; lattnbench "
          f"{device.get('layer_products', '?')} products, load {device.get('load_avg', '?')}")
    print(f"seq {min(seqs)}: the JAX layer's relative error against float64: {check(min(seqs)):.2e}")
    print("\n| seq | impl | mode | lattnbench ms | peak_fraction | JAX ms | JAX / lattnbench |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for T in seqs:
        for mode in modes:
            theirs = jax_ms(T, mode)
            for impl in impls:
                if (T, impl, mode) not in ours:
                    print(f"| {T} | {impl} | {mode} | - | - | {theirs:.1f} | - |")
                    continue
                ms, fraction, _ = ours[(T, impl, mode)]
                frac = f"{fraction:.2f}" if fraction is not None else "-"
                print(f"| {T} | {impl} | {mode} | {ms:.1f} | {frac} | {theirs:.1f} | {theirs / ms:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
