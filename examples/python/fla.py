"""flash-linear-attention (FLA; `pip install flash-linear-attention`, module `fla`) as lattnbench
impls on the CUDA backend (docs/plugins.md, "Python kernels"), every family FLA has, bf16 and
float32, fwd and fwd_bwd (torch autograd through FLA's own backward):

    lattnbench --backend cuda --suite kernel --plugin examples/python/fla.py \\
        --impl fla:chunk,fla:scan,chunked,scan --rule additive,delta --decay none,retnet,scalar,vector
    lattnbench --backend cuda --suite kernel --plugin examples/python/fla.py --impl fla:chunk,fla:scan,scan \\
        --rule dplr --decay vector --dtype bf16          (RWKV-7; and --rule delta --householder 2, DeltaProduct;
                                                          --rule additive --decay vector --bonus true, RWKV-6)

    rule, decay          fla:chunk (chunked form)          fla:scan (FLA's fused_recurrent form)
    additive, none       chunk_linear_attn                 fused_recurrent_linear_attn  (normalize=False)
    additive, retnet     chunk_simple_gla, g_gamma         fused_recurrent_simple_gla, g_gamma
    additive, scalar     chunk_simple_gla, g               fused_recurrent_simple_gla, g
    additive, vector     chunk_gla, g                      fused_recurrent_gla, gk
    delta, none          chunk_delta_rule                  fused_recurrent_delta_rule
    delta, retnet        chunk_gated_delta_rule, g         fused_recurrent_gated_delta_rule (fwd only)
    delta, scalar        chunk_gated_delta_rule, g         fused_recurrent_gated_delta_rule (fwd only)
    delta, vector        chunk_kda, g                      fused_recurrent_kda (fwd only)
    dplr, every decay    chunk_dplr_delta_rule, gk         fused_recurrent_dplr_delta_rule (fwd only)
                         (RWKV-7: chunk_rwkv7 and fused_recurrent_rwkv7 are these calls with r = q, w = gk)
    delta, householder n chunk_gated_delta_product, g      (FLA has no recurrent DeltaProduct)
      (decay none, retnet, scalar; bf16: FLA asserts it)
    additive, vector,    chunk_rwkv6, w = g, u             fused_recurrent_rwkv6, w = g, u
      bonus (RWKV-6)

    fla:flashqla         QwenLM's FlashQLA (flash_qla.chunk_gated_delta_rule) for delta with
                         retnet or scalar decay, bf16, dim 128, where flash_qla imports and the
                         GPU is one it runs on (sm90, sm100); declined otherwise, with the reason.

MoonshotAI's FlashKDA is not an impl: its kernel computes the KDA gate from raw inputs
(-exp(A_log) softplus(g + dt_bias)), L2-normalises q and k and takes beta's sigmoid itself, so it
cannot take docs/spec.md's inputs (a log-gate g, keys as given, beta in (0, 1)).

How docs/spec.md section 1b maps onto FLA's conventions (FLA's docstrings; fla-core 0.6):
- layout: FLA takes [B, T, H, D] (head_first=False): the impls declare layout="BTHD", so
  lattnbench hands them their tensors in that order, the copy outside the timed calls and counted
  in the records' layout_copy_mb. States are [B, H, Dk, Dv] in both (state_v_first=False).
- gates: FLA's g is the natural-log decay, S_t = exp(g_t) S_{t-1} + ..., applied before token t is
  written, per head ([B, T, H]) or per key channel ([B, T, H, K], scaling the state's key rows):
  our g as it is. retnet's gamma_h is the constant log-gate log(gamma_h), FLA's g_gamma [H] for the
  simple-GLA kernels and a constant g for the gated delta rule.
- delta rule: S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T with S'_t the decayed state, beta in
  post-sigmoid space (use_beta_sigmoid_in_kernel=False); FLA's in-kernel q/k L2 normalisation is
  off (use_qk_l2norm_in_kernel=False): lattnbench's inputs are already what the rule takes.
- scale: s = Dk^-1/2 (case.scale), passed explicitly; o_t = s S_t^T q_t (token t sees itself).
- dplr (docs/spec.md section 1f; FLA's generalized_delta_rule/dplr/naive.py): FLA's recurrence is
  S_t = diag(exp(gk_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T with S as K x V, as ours, but its
  a is the direction the state is read along and its b the one the correction is written along:
  FLA's a is our b and FLA's b our a, so the call is chunk_dplr_delta_rule(q, k, v, a=OUR b,
  b=OUR a, gk=g). The gate has our orientation (gk_t decays S_{t-1} before token t's writes, in
  log space, per key channel): vector g as it is, scalar g broadcast over the key channels,
  retnet's log gamma_h and none's 0 made [B, T, H, K] once. tests/kernels/test_dplr.cpp holds
  FLA's recurrence, written in FLA's naming, equal to ours with the names swapped;
  tests/python_kernels/test_python_kernels.py (group fla) holds this file's mapping against FLA's
  own naive recurrence (dplr/naive.py, plain torch on the CPU) where torch and fla import.
- DeltaProduct (section 1h): FLA's k, v [B, T n, H, D] and beta [B, T n, H], token t's writes
  in rows t n .. t n + n - 1, are lattnbench's [B, H, T n, ...] in the BTHD layout as they are; the
  gate g [B, T, H] once per token (none: g=None). num_householder = case.householder.
- RWKV-6 (section 1g): chunk_rwkv6(r=q, k, v, w=g, u): o_t reads S_{t-1} plus the bonus
  diag(u) k_t v_t^T, as ours; u [H, K] is per head, the same in both layouts.
- dtypes: q, k, v, o and their gradients in the case's dtype (bf16 or float32); g, beta, the
  states and their gradients float32, as lattnbench hands them.
- FLA's backend dispatch (FlashQLA, FlashKDA when installed) is switched off for fla:chunk
  (FLA_DISABLE_BACKEND_DISPATCH=1, set before fla is imported), so that its figures are FLA's
  Triton kernels; fla:flashqla calls FlashQLA itself.

Each call writes lattnbench's o and hT (and the gradients) from FLA's outputs: a device copy of o
(and of dq, dk, dv, dg, dbeta) inside the timed call, as any impl that allocates its own outputs
pays. Declined with the reason: grouped heads, Dk != Dv and packed documents (the plugin interface
takes square dense cases), and what torch, triton or a GPU missing here leaves out: where nothing
imports, every case is a skip, never a pass.
"""
import os

import lattn

# Before fla is imported: its dispatch reads this once (fla/backends.py).
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

_import_error = None
try:
    import torch
    import fla.ops as _fla_ops  # noqa: F401  (fails early where triton or a GPU toolchain is missing)
    from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
    from fla.ops.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule, fused_recurrent_dplr_delta_rule
    from fla.ops.gated_delta_product import chunk_gated_delta_product
    from fla.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
except Exception as error:  # ImportError, or triton's own errors on a machine without a GPU
    torch = None
    _import_error = f"{type(error).__name__}: {error}"

_flash_qla_error = None
try:
    import flash_qla
except Exception as error:
    flash_qla = None
    _flash_qla_error = f"{type(error).__name__}: {error}"

plugin = lattn.Plugin("fla")

RULES = ["additive", "delta", "dplr"]
DECAYS = ["none", "retnet", "scalar", "vector"]
DTYPES = ["float32", "bfloat16"]


def _why_not(case):
    if torch is None:
        return "flash-linear-attention does not import here (" + _import_error + ")"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if case.householder > 1:
        if case.decay == "vector":
            return "FLA's chunk_gated_delta_product takes one gate per token and head (decay none, retnet, scalar)"
        if case.dtype != "bfloat16":
            return "FLA's chunk_gated_delta_product asserts bfloat16 inputs"
    return None


def _scan_why_not(case):
    why = _why_not(case)
    if why:
        return why
    if case.householder > 1:
        return "FLA has no recurrent DeltaProduct (chunk_gated_delta_product only)"
    if case.mode == "fwd_bwd" and case.rule == "dplr":
        return "FLA's fused_recurrent_dplr_delta_rule has no backward"
    if case.mode == "fwd_bwd" and case.rule == "delta" and case.decay != "none":
        name = "fused_recurrent_kda" if case.decay == "vector" else "fused_recurrent_gated_delta_rule"
        return f"FLA's {name} has no backward"
    return None


def _flash_qla_why_not(case):
    why = _why_not(case)
    if why:
        return why
    if flash_qla is None:
        return "flash_qla does not import here (" + _flash_qla_error + ")"
    if case.rule != "delta" or case.decay not in ("retnet", "scalar"):
        return "FlashQLA is the gated delta rule (delta with retnet or scalar decay)"
    if case.dtype != "bfloat16":
        return "FlashQLA takes float16 or bfloat16"
    if case.dim != 128:
        return "FlashQLA takes head dim 128"
    major, _ = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return "FlashQLA runs forward and backward on sm90 and sm100 only"
    return None


_gammas = {}  # retnet's log gamma_h per (heads, device), made once


def _inputs(case, t):
    """lattnbench's buffers as torch tensors ([B, T, H, ...]: layout="BTHD"), leaves that take
    gradients in a fwd_bwd case."""
    grad = case.mode == "fwd_bwd"
    take = lambda x: torch.from_dlpack(x) if x is not None else None
    x = {n: take(getattr(t, n)) for n in ("q", "k", "v", "h0", "g", "beta", "a", "b", "u")}
    for name, value in x.items():
        if value is not None and grad:
            x[name] = value.detach().requires_grad_(True)
    if case.decay == "retnet":
        key = (case.heads, x["q"].device)
        if key not in _gammas:
            _gammas[key] = torch.log(torch.from_dlpack(t.gamma).double()).float()
        x["g_gamma"] = _gammas[key]
    return x


def _retnet_g(case, x):
    """retnet's constant log-gate as a per-token g [B, T, H] (for the gated delta rule)."""
    key = ("g", case.batch, case.seq, case.heads, x["q"].device)
    if key not in _gammas:
        _gammas[key] = x["g_gamma"][None, None, :].expand(case.batch, case.seq, case.heads).contiguous()
    return _gammas[key]


def _dplr_gk(case, x):
    """FLA's gk [B, T, H, K] for dplr from the case's decay: vector g as it is, the others broadcast
    over the key channels (retnet's constant and none's zeros made once)."""
    if case.decay == "vector":
        return x["g"]
    if case.decay == "scalar":
        return x["g"][..., None].expand(-1, -1, -1, case.dim).contiguous()
    key = ("gk", case.decay, case.batch, case.seq, case.heads, case.dim, x["q"].device)
    if key not in _gammas:
        shape = (case.batch, case.seq, case.heads, case.dim)
        _gammas[key] = (x["g_gamma"][None, None, :, None].expand(*shape).contiguous() if case.decay == "retnet"
                        else torch.zeros(shape, dtype=torch.float32, device=x["q"].device))
    return _gammas[key]


def _fla_dplr(x, gk):
    """Our a (written) and b (read) in FLA's names: FLA's a is the read direction, its b the written."""
    return dict(a=x["b"], b=x["a"], gk=gk)


def _chunk(case, x, args):
    q, k, v = x["q"], x["k"], x["v"]
    if case.rule == "dplr":
        return chunk_dplr_delta_rule(q, k, v, **_fla_dplr(x, _dplr_gk(case, x)), **args)
    if case.householder > 1:
        g = None if case.decay == "none" else _retnet_g(case, x) if case.decay == "retnet" else x["g"]
        return chunk_gated_delta_product(q, k, v, g, x["beta"], num_householder=case.householder,
                                         use_qk_l2norm_in_kernel=False, **args)
    if case.bonus:
        return chunk_rwkv6(q, k, v, w=x["g"], u=x["u"], **args)
    if case.rule == "additive":
        if case.decay == "none":
            return chunk_linear_attn(q, k, v, normalize=False, **args)
        if case.decay == "retnet":
            return chunk_simple_gla(q, k, v, g_gamma=x["g_gamma"], **args)
        if case.decay == "scalar":
            return chunk_simple_gla(q, k, v, g=x["g"], **args)
        return chunk_gla(q, k, v, g=x["g"], **args)
    delta = dict(args, use_qk_l2norm_in_kernel=False)
    if case.decay == "none":
        return chunk_delta_rule(q, k, v, x["beta"], **delta)
    if case.decay == "vector":
        return chunk_kda(q, k, v, x["g"], x["beta"], use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                         **delta)
    g = _retnet_g(case, x) if case.decay == "retnet" else x["g"]
    return chunk_gated_delta_rule(q, k, v, g, x["beta"], use_beta_sigmoid_in_kernel=False, **delta)


def _scan(case, x, args):
    q, k, v = x["q"], x["k"], x["v"]
    if case.rule == "dplr":
        return fused_recurrent_dplr_delta_rule(q, k, v, **_fla_dplr(x, _dplr_gk(case, x)), **args)
    if case.bonus:
        return fused_recurrent_rwkv6(q, k, v, w=x["g"], u=x["u"], **args)
    if case.rule == "additive":
        if case.decay == "none":
            return fused_recurrent_linear_attn(q, k, v, normalize=False, **args)
        if case.decay == "retnet":
            return fused_recurrent_simple_gla(q, k, v, g_gamma=x["g_gamma"], **args)
        if case.decay == "scalar":
            return fused_recurrent_simple_gla(q, k, v, g=x["g"], **args)
        return fused_recurrent_gla(q, k, v, gk=x["g"], **args)
    delta = dict(args, use_qk_l2norm_in_kernel=False)
    if case.decay == "none":
        return fused_recurrent_delta_rule(q, k, v, x["beta"], **delta)
    if case.decay == "vector":
        return fused_recurrent_kda(q, k, v, x["g"], x["beta"], **delta)
    g = _retnet_g(case, x) if case.decay == "retnet" else x["g"]
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=x["beta"], **delta)


def _flash_qla(case, x, args):
    g = _retnet_g(case, x) if case.decay == "retnet" else x["g"]
    return flash_qla.chunk_gated_delta_rule(q=x["q"], k=x["k"], v=x["v"], g=g, beta=x["beta"],
                                            use_qk_l2norm_in_kernel=False, **args)


def _forward(run, case, t):
    stream = torch.cuda.ExternalStream(case.stream) if case.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream), torch.set_grad_enabled(case.mode == "fwd_bwd"):
        x = _inputs(case, t)
        args = dict(scale=case.scale, initial_state=x["h0"], output_final_state=True)
        o, hT = run(case, x, args)
        torch.from_dlpack(t.o).copy_(o)
        torch.from_dlpack(t.hT).copy_(hT)
    return (x, o, hT) if case.mode == "fwd_bwd" else None


def _backward(case, t, saved):
    x, o, hT = saved
    stream = torch.cuda.ExternalStream(case.stream) if case.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        names = [n for n in ("q", "k", "v", "h0", "g", "beta", "a", "b", "u") if x[n] is not None and x[n].requires_grad]
        grads = torch.autograd.grad([o, hT], [x[n] for n in names],
                                    [torch.from_dlpack(t.dO), torch.from_dlpack(t.dhT)], allow_unused=True)
        out = {"q": t.dq, "k": t.dk, "v": t.dv, "h0": t.dh0, "g": t.dg, "beta": t.dbeta, "a": t.da, "b": t.db,
               "u": t.du}
        for name, grad in zip(names, grads):
            target = torch.from_dlpack(out[name])
            target.copy_(grad) if grad is not None else target.zero_()


def _declare(name, run, unsupported, rules=RULES, decays=DECAYS, dtypes=DTYPES, householder=True, bonus=True):
    @plugin.impl(name, device="cuda", rules=rules, decays=decays, dtypes=dtypes, arrays="dlpack", layout="BTHD",
                 unsupported=unsupported, householder=householder, bonus=bonus)
    def forward(case, t):
        return _forward(run, case, t)

    forward.backward(_backward)
    return forward


chunk = _declare("chunk", _chunk, _why_not)
scan = _declare("scan", _scan, _scan_why_not)
flashqla = _declare("flashqla", _flash_qla, _flash_qla_why_not, rules=["delta"], decays=["retnet", "scalar"],
                    dtypes=["bfloat16"], householder=False, bonus=False)
