"""flash-linear-attention (FLA; `pip install flash-linear-attention`, module `fla`) as lattnbench
impls on the CUDA backend (docs/plugins.md, "Python kernels"), every family FLA has, bf16 and
float32, fwd and fwd_bwd (torch autograd through FLA's own backward):

    lattnbench --backend cuda --suite kernel --plugin examples/python/fla.py \\
        --impl fla:chunk,fla:scan,chunked,scan --rule additive,delta --decay none,retnet,scalar,vector

    rule, decay          fla:chunk (chunked form)          fla:scan (FLA's fused_recurrent form)
    additive, none       chunk_linear_attn                 fused_recurrent_linear_attn  (normalize=False)
    additive, retnet     chunk_simple_gla, g_gamma         fused_recurrent_simple_gla, g_gamma
    additive, scalar     chunk_simple_gla, g               fused_recurrent_simple_gla, g
    additive, vector     chunk_gla, g                      fused_recurrent_gla, gk
    delta, none          chunk_delta_rule                  fused_recurrent_delta_rule
    delta, retnet        chunk_gated_delta_rule, g         fused_recurrent_gated_delta_rule (fwd only)
    delta, scalar        chunk_gated_delta_rule, g         fused_recurrent_gated_delta_rule (fwd only)
    delta, vector        chunk_kda, g                      fused_recurrent_kda (fwd only)

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

RULES = ["additive", "delta"]
DECAYS = ["none", "retnet", "scalar", "vector"]
DTYPES = ["float32", "bfloat16"]


def _why_not(case):
    if torch is None:
        return "flash-linear-attention does not import here (" + _import_error + ")"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def _scan_why_not(case):
    why = _why_not(case)
    if why:
        return why
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
    x = {n: take(getattr(t, n)) for n in ("q", "k", "v", "h0", "g", "beta")}
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


def _chunk(case, x, args):
    q, k, v = x["q"], x["k"], x["v"]
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
        names = [n for n in ("q", "k", "v", "h0", "g", "beta") if x[n] is not None and x[n].requires_grad]
        grads = torch.autograd.grad([o, hT], [x[n] for n in names],
                                    [torch.from_dlpack(t.dO), torch.from_dlpack(t.dhT)], allow_unused=True)
        out = {"q": t.dq, "k": t.dk, "v": t.dv, "h0": t.dh0, "g": t.dg, "beta": t.dbeta}
        for name, grad in zip(names, grads):
            target = torch.from_dlpack(out[name])
            target.copy_(grad) if grad is not None else target.zero_()


def _declare(name, run, unsupported, rules=RULES, decays=DECAYS, dtypes=DTYPES):
    @plugin.impl(name, device="cuda", rules=rules, decays=decays, dtypes=dtypes, arrays="dlpack", layout="BTHD",
                 unsupported=unsupported)
    def forward(case, t):
        return _forward(run, case, t)

    forward.backward(_backward)
    return forward


chunk = _declare("chunk", _chunk, _why_not)
scan = _declare("scan", _scan, _scan_why_not)
flashqla = _declare("flashqla", _flash_qla, _flash_qla_why_not, rules=["delta"], decays=["retnet", "scalar"],
                    dtypes=["bfloat16"])
