"""A pure-PyTorch chunked form of causal linear attention for lattnbench (docs/plugins.md,
"Python kernels"): the additive rule, the gated decays and the delta rule of docs/spec.md sections 1 and 1b.

    lattnbench --suite kernel --plugin examples/python/torch_chunked.py \\
               --impl torch:chunked,scan,chunked --seq 2048

Per chunk of n rows with cumulative log-decays G (G_i = sum of the log-gates of rows 0..i; per key
channel for vector gates) and the state S entering the chunk:

    Aqk[i][j] = sum_d q_i[d] k_j[d] exp(G_i[d] - G_j[d])   (j <= i; 0 above the diagonal)
    U         = V                                           (additive)
    U         = (I + diag(beta) Akk)^-1 diag(beta) (V - (K . exp(G)) S)   (delta; Akk as Aqk with
                k_i for q_i, strictly below the diagonal: the WY / UT form of the chunk's updates)
    O         = s ((Q . exp(G)) S + Aqk U)
    S_next    = exp(G_last) . S + (K . exp(G_last - G))^T U

exp(G_i - G_j) is taken from the difference, masked before exp, so strong gates stay finite.
The backward is autograd's through the same code (the forward keeps its graph for it).
The impl reads the run's threads (case.threads) and gives them to torch.
"""
import lattn

try:
    import torch
except ImportError:  # the impl then declines every case, saying why
    torch = None

plugin = lattn.Plugin("torch")


def _missing(case):
    return "torch is not installed" if torch is None else None


def _log_decays(case, q, g, gamma):
    """Cumulative log-decay per row of every chunk: [B, H, T, 1] (none, retnet, scalar) or [B, H, T, D]."""
    B, H, T, D = q.shape
    if case.decay == "none":
        return None
    if case.decay == "retnet":
        rows = torch.ones(T, dtype=torch.float32)
        logs = torch.log(gamma.to(torch.float64)).to(torch.float32)[None, :, None] * rows[None, None, :]
        logs = logs.expand(B, H, T)
    else:
        logs = g
    if logs.dim() == 3:
        logs = logs[..., None]
    return logs


def _chunk_cumsum(logs, chunk):
    """Cumulative sums restarted at every chunk boundary."""
    B, H, T, W = logs.shape
    pad = (-T) % chunk
    padded = torch.nn.functional.pad(logs, (0, 0, 0, pad))
    sums = padded.view(B, H, (T + pad) // chunk, chunk, W).cumsum(dim=3)
    return sums.view(B, H, T + pad, W)[:, :, :T]


def chunked_forward(case, q, k, v, h0, g, beta, gamma):
    B, H, T, D = q.shape
    C = case.chunk
    scale = case.scale
    logs = _log_decays(case, q, g, gamma)
    G = _chunk_cumsum(logs, C) if logs is not None else None
    state = h0
    outputs = []
    for start in range(0, T, C):
        n = min(C, T - start)
        qc, kc, vc = q[:, :, start:start + n], k[:, :, start:start + n], v[:, :, start:start + n]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        if G is None:
            scores = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0)
            q_in, k_out, keep = qc, kc, None
        else:
            Gc = G[:, :, start:start + n]                       # [B, H, n, W], W = 1 or D
            last = Gc[:, :, -1:]                                # [B, H, 1, W]
            if Gc.shape[-1] == 1:
                diff = (Gc - Gc.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
                scores = (qc @ kc.transpose(-1, -2)) * torch.exp(diff)
            else:
                diff = (Gc[:, :, :, None, :] - Gc[:, :, None, :, :]).masked_fill(~causal[:, :, None], float("-inf"))
                scores = torch.einsum("bhid,bhjd,bhijd->bhij", qc, kc, torch.exp(diff))
            q_in = qc * torch.exp(Gc)
            k_out = kc * torch.exp(last - Gc)
            keep = torch.exp(last).transpose(-1, -2) if last.shape[-1] > 1 else torch.exp(last)
        if case.rule == "delta":
            bc = beta[:, :, start:start + n, None]
            k_in = kc if G is None else kc * torch.exp(Gc)
            strict = torch.ones(n, n, dtype=torch.bool).tril(-1)
            if G is None:
                kk = (kc @ kc.transpose(-1, -2)).masked_fill(~strict, 0)
            elif Gc.shape[-1] == 1:
                diff_kk = (Gc - Gc.transpose(-1, -2)).masked_fill(~strict, float("-inf"))
                kk = (kc @ kc.transpose(-1, -2)) * torch.exp(diff_kk)
            else:
                diff_kk = (Gc[:, :, :, None, :] - Gc[:, :, None, :, :]).masked_fill(~strict[:, :, None], float("-inf"))
                kk = torch.einsum("bhid,bhjd,bhijd->bhij", kc, kc, torch.exp(diff_kk))
            system = torch.eye(n, dtype=q.dtype) + bc * kk
            u = torch.linalg.solve_triangular(system, bc * (vc - k_in @ state), upper=False, unitriangular=True)
        else:
            u = vc
        outputs.append(scale * (q_in @ state + scores @ u))
        carried = state if keep is None else keep * state
        state = carried + k_out.transpose(-1, -2) @ u
    return torch.cat(outputs, dim=2), state


def _views(t, names):
    return [torch.from_dlpack(getattr(t, n)) if getattr(t, n) is not None else None for n in names]


INPUTS = ("q", "k", "v", "h0", "g", "beta", "gamma")


@plugin.impl("chunked", rules=["additive", "delta"], decays=["none", "retnet", "scalar", "vector"],
             arrays="dlpack", unsupported=_missing)
def chunked(case, t):
    if torch.get_num_threads() != case.threads:
        torch.set_num_threads(case.threads)
    inputs = _views(t, INPUTS)
    o, hT = torch.from_dlpack(t.o), torch.from_dlpack(t.hT)
    if case.mode == "fwd":
        with torch.no_grad():
            out, state = chunked_forward(case, *inputs)
        o.copy_(out)
        hT.copy_(state)
        return None
    # fwd_bwd: the inputs the gradients are taken for become leaves of a graph kept for the backward.
    leaves = [x.detach().clone().requires_grad_(n not in ("gamma",)) if x is not None else None
              for n, x in zip(INPUTS, inputs)]
    with torch.enable_grad():
        out, state = chunked_forward(case, *leaves)
    o.copy_(out.detach())
    hT.copy_(state.detach())
    return leaves, out, state


@chunked.backward
def chunked_backward(case, t, saved):
    leaves, out, state = saved
    torch.autograd.backward([out, state], [torch.from_dlpack(t.dO), torch.from_dlpack(t.dhT)])
    for name, leaf in zip(INPUTS, leaves):
        grad_name = "d" + name
        if leaf is None or name == "gamma" or getattr(t, grad_name, None) is None:
            continue
        target = torch.from_dlpack(getattr(t, grad_name))
        target.copy_(leaf.grad if leaf.grad is not None else torch.zeros_like(target))
