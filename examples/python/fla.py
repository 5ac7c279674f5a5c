"""flash-linear-attention's Triton kernels (`pip install flash-linear-attention`, module `fla`) as
lattnbench impls (docs/plugins.md, "Python kernels"), forward only, float32:

    lattnbench --backend cuda --suite kernel --plugin examples/python/fla.py --impl fla:chunk,chunked

    rule additive, decay none      fla.ops.linear_attn.chunk_linear_attn (normalize=False)
    rule additive, retnet, scalar  fla.ops.simple_gla.chunk_simple_gla (retnet: g = log gamma_h)
    rule additive, decay vector    fla.ops.gla.chunk_gla
    rule delta, decay none         fla.ops.delta_rule.chunk_delta_rule
    rule delta, decay scalar       fla.ops.gated_delta_rule.chunk_gated_delta_rule

fla takes [B, T, H, D] tensors and lattnbench hands over [B, H, T, D] (docs/spec.md section 1): each call
transposes q, k, v (and g, beta) into fla's layout and o back, and that copy is part of its time.
The impls need fla, torch with CUDA, and lattnbench's CUDA backend; elsewhere every case is
declined with the reason.
"""
import lattn

try:
    import torch
    import fla.ops
except ImportError as error:
    torch = None
    _import_error = str(error)

plugin = lattn.Plugin("fla")


def _why_not(case):
    if torch is None:
        return "flash-linear-attention is not importable (" + _import_error + ")"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if case.rule == "delta" and case.decay not in ("none", "scalar"):
        return "fla's delta-rule kernels here take decay none or scalar"
    return None


def _fla(x):
    """[B, H, T, ...] -> fla's [B, T, H, ...], contiguous."""
    return x.transpose(1, 2).contiguous()


@plugin.impl("chunk", device="cuda", modes=["fwd"], rules=["additive", "delta"],
             decays=["none", "retnet", "scalar", "vector"], arrays="dlpack", unsupported=_why_not)
def chunk(case, t):
    take = lambda x: torch.from_dlpack(x) if x is not None else None
    q, k, v, h0, g, beta = (take(x) for x in (t.q, t.k, t.v, t.h0, t.g, t.beta))
    stream = torch.cuda.ExternalStream(case.stream) if case.stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        args = dict(scale=case.scale, initial_state=h0, output_final_state=True)
        if case.rule == "delta" and case.decay == "none":
            o, hT = fla.ops.delta_rule.chunk_delta_rule(_fla(q), _fla(k), _fla(v), _fla(beta), **args)
        elif case.rule == "delta":
            o, hT = fla.ops.gated_delta_rule.chunk_gated_delta_rule(_fla(q), _fla(k), _fla(v), _fla(g), _fla(beta), **args)
        elif case.decay == "none":
            o, hT = fla.ops.linear_attn.chunk_linear_attn(_fla(q), _fla(k), _fla(v), normalize=False, **args)
        elif case.decay == "vector":
            o, hT = fla.ops.gla.chunk_gla(_fla(q), _fla(k), _fla(v), _fla(g), **args)
        else:
            if case.decay == "retnet":
                g = torch.log(take(t.gamma))[None, :, None].expand(case.batch, case.heads, case.seq)
            o, hT = fla.ops.simple_gla.chunk_simple_gla(_fla(q), _fla(k), _fla(v), _fla(g), **args)
        take(t.o).copy_(o.transpose(1, 2))
        take(t.hT).copy_(hT)
