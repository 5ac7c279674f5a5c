"""Mamba-3's authors' Triton kernel (state-spaces/mamba, `pip install mamba-ssm`, module
`mamba_ssm`) as a lattnbench impl on the CUDA backend (docs/plugins.md, "Python kernels"): the
trapezoidal rule of docs/spec.md section 1e, SISO, bf16, fwd and fwd_bwd (torch autograd through
the authors' own backward kernels):

    lattnbench --backend cuda --suite kernel --plugin examples/python/mamba3.py \\
        --impl mamba3:siso,scan,chunked --rule trapezoidal --decay scalar --dtype bf16

    mamba3:siso   mamba_ssm.ops.triton.mamba3.mamba3_siso_combined.mamba3_siso_combined

How section 1e maps onto the entry point's arguments (its docstring and mamba3_siso_fwd.py, read at
commit e9594ce):
- Q = q (C), K = k (B), V = v (x): [batch, seqlen, heads, dim], so the impl declares layout="BTHD"
  (lattnbench hands them in that order, the copy outside the timed calls). The kernel takes rotated
  Q and K from Q_bias, K_bias and Angles: here zero biases and zero angles, whose cumulative
  rotation is the identity, so it sees q and k as given.
- ADT = g, the per-token log-gate A dt_t (the authors' kernels take the product, as lattnbench's
  input is); DT = dt; Trap = trap, lambda's logit (the kernel takes its sigmoid). All three are
  [batch, heads, seqlen] in the authors' order: the impl transposes lattnbench's [B, T, H] copies
  (inside the call: three per-token scalars, against q, k, v's D each).
- The state: Input_States = (angle state 0, SSM state h0^T, K state 0, V state 0). The authors'
  SSM state is [heads, headdim_v, headdim_qk], the transpose of lattnbench's [Dk][Dv]; their K and
  V states, the previous token's k and v, are zero: the kernel suite's first token has none (section
  1e), so beta_0's write is 0 as in lattnbench's reference. hT is their final SSM state transposed.
- No scale (scale 1, as case.scale says for this rule), D = None and Z = None (the skip and the
  gate belong to the block), chunk_size 64 (the authors' default; case.chunk is lattnbench's own).
- Gradients: dq, dk, dv from dQ, dK, dV; dg from dADT; ddt from dDT (with zero angles the rotation's
  share of dDT is 0); dtrap from dTrap; dh0 from the input SSM state's gradient, transposed.

Declined with the reason: float32 (mamba3_siso_combined casts Q, K, V and Trap to bfloat16, so a
float32 case would hold bf16 arithmetic to float32's tolerance), head dims that are not powers of
two (the kernel's TMA loads), MIMO ranks above 1, grouped heads, Dk != Dv and packed documents
(the plugin interface takes square dense cases), and what torch, triton, mamba_ssm or a GPU missing
here leaves out: where nothing imports, every case is a skip, never a pass.

MIMO (mimo_rank R > 1) has no row: the authors' MIMO kernel, mamba_ssm.ops.tilelang.mamba3.mamba3_mimo
(TileLang; the Triton mamba3_mimo_rotary_step is the decode step), takes one v row per token that
it raises to R rows by its learned MIMO_V weights (v_r = x * w_r), and no initial state, so it cannot
take section 1e's R independent v rows and h0.
"""
import lattn

_import_error = None
try:
    import torch
    from mamba_ssm.ops.triton.mamba3.mamba3_siso_combined import mamba3_siso_combined
except Exception as error:  # ImportError, or triton's own errors on a machine without a GPU
    torch = None
    _import_error = f"{type(error).__name__}: {error}"

plugin = lattn.Plugin("mamba3")

CHUNK = 64  # the authors' default chunk_size


def _why_not(case):
    if torch is None:
        return "mamba_ssm's Mamba-3 Triton kernels do not import here (" + _import_error + ")"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if case.dtype != "bfloat16":
        return "mamba3_siso_combined computes in bfloat16 (it casts q, k, v and trap to bf16)"
    if case.dim < 16 or case.dim & (case.dim - 1):
        return "mamba3_siso_combined takes head dims that are powers of two (16 and up)"
    return None


_constants = {}  # zero biases, angles and carried rows per shape, made once


def _zeros(case, device):
    key = (case.batch, case.seq, case.heads, case.dim, device)
    if key not in _constants:
        angles = max(1, case.dim // 4)
        f32 = dict(dtype=torch.float32, device=device)
        _constants[key] = dict(
            q_bias=torch.zeros(case.heads, case.dim, **f32), k_bias=torch.zeros(case.heads, case.dim, **f32),
            angles=torch.zeros(case.batch, case.seq, case.heads, angles, **f32),
            angle_state=torch.zeros(case.batch, case.heads, angles, **f32),
            k_state=torch.zeros(case.batch, case.heads, case.dim, **f32),
            v_state=torch.zeros(case.batch, case.heads, case.dim, **f32))
    return _constants[key]


def _inputs(case, t):
    grad = case.mode == "fwd_bwd"
    x = {n: torch.from_dlpack(getattr(t, n)) for n in ("q", "k", "v", "h0", "g", "dt", "trap")}
    if grad:
        x = {n: value.detach().requires_grad_(True) for n, value in x.items()}
    return x


def _siso(case, x):
    z = _zeros(case, x["q"].device)
    heads_first = lambda a: a.transpose(1, 2).contiguous()  # [B, T, H] to the authors' [B, H, T]
    states = (z["angle_state"], x["h0"].transpose(-1, -2).contiguous(), z["k_state"], z["v_state"])
    out, _, ssm_state, _, _ = mamba3_siso_combined(
        x["q"], x["k"], x["v"], heads_first(x["g"]), heads_first(x["dt"]), heads_first(x["trap"]), z["q_bias"],
        z["k_bias"], z["angles"], D=None, Z=None, Input_States=states, chunk_size=CHUNK, return_final_states=True)
    return out, ssm_state.transpose(-1, -2)


@plugin.impl("siso", device="cuda", rules=["trapezoidal"], decays=["scalar"], dtypes=["float32", "bfloat16"],
             arrays="dlpack", layout="BTHD", unsupported=_why_not)
def siso(case, t):
    stream = torch.cuda.ExternalStream(case.stream) if case.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream), torch.set_grad_enabled(case.mode == "fwd_bwd"):
        x = _inputs(case, t)
        o, hT = _siso(case, x)
        torch.from_dlpack(t.o).copy_(o)
        torch.from_dlpack(t.hT).copy_(hT)
    return (x, o, hT) if case.mode == "fwd_bwd" else None


@siso.backward
def siso_backward(case, t, saved):
    x, o, hT = saved
    stream = torch.cuda.ExternalStream(case.stream) if case.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        names = ["q", "k", "v", "h0", "g", "dt", "trap"]
        grads = torch.autograd.grad([o, hT], [x[n] for n in names],
                                    [torch.from_dlpack(t.dO), torch.from_dlpack(t.dhT)], allow_unused=True)
        out = {"q": t.dq, "k": t.dk, "v": t.dv, "h0": t.dh0, "g": t.dg, "dt": t.ddt, "trap": t.dtrap}
        for name, grad in zip(names, grads):
            target = torch.from_dlpack(out[name])
            target.copy_(grad) if grad is not None else target.zero_()
