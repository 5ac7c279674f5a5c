"""The tensors the bridge hands a Python impl for the rules and forms of the plugin interface's
version 2 (include/lattn/plugin_v2.h), by name and shape, in both layouts: each impl raises a
ValueError naming the first tensor whose presence or shape is not what the case says, and
otherwise writes zeros (so its cases fail their check, with no error, when the bridge is right)."""
import numpy as np

import lattn

plugin = lattn.Plugin("v2")

INPUTS = ("q", "k", "v", "h0", "g", "beta", "gamma", "a", "b", "u", "dt", "trap")
GRADIENTS = {"q": "dq", "k": "dk", "v": "dv", "h0": "dh0", "g": "dg", "beta": "dbeta", "a": "da", "b": "db",
             "u": "du", "dt": "ddt", "trap": "dtrap"}


def _expected(case, bthd):
    """name -> shape for every tensor the case has (inputs and outputs; cotangents and gradients
    take their primal's shape)."""
    B, H, T, D, R, n = case.batch, case.heads, case.seq, case.dim, case.mimo_rank, case.householder

    def per_token(rows, *inner):
        return (B, rows, H, *inner) if bthd else (B, H, rows, *inner)

    rows = (R, D) if R > 1 else (D,)
    shapes = {"q": per_token(T, *rows), "k": per_token(T * n, *rows), "v": per_token(T * n, *rows),
              "o": per_token(T, *rows), "h0": (B, H, D, D), "hT": (B, H, D, D)}
    if case.decay in ("scalar", "vector"):
        shapes["g"] = per_token(T, D) if case.decay == "vector" else per_token(T)
    if case.decay == "retnet":
        shapes["gamma"] = (H,)
    if case.rule == "delta":
        shapes["beta"] = per_token(T * n)
    if case.rule == "dplr":
        shapes["a"] = shapes["b"] = per_token(T, D)
    if case.rule == "trapezoidal":
        shapes["dt"] = shapes["trap"] = per_token(T)
    if case.bonus:
        shapes["u"] = (H, D)
    return shapes


def _check(case, t, bthd, backward):
    shapes = _expected(case, bthd)
    for name in INPUTS + ("o", "hT"):
        want = shapes.get(name)
        got = getattr(t, name)
        if (got is None) != (want is None) or (got is not None and tuple(got.shape) != want):
            raise ValueError(f"{name}: {None if got is None else tuple(got.shape)}, expected {want}")
        grad = GRADIENTS.get(name)
        if grad is not None:
            given = getattr(t, grad)
            want_grad = want if backward and name != "gamma" else None
            if (given is None) != (want_grad is None) or (given is not None and tuple(given.shape) != want_grad):
                raise ValueError(f"{grad}: {None if given is None else tuple(given.shape)}, expected {want_grad}")
    for name, primal in (("dO", "o"), ("dhT", "hT")):
        given = getattr(t, name)
        want = shapes[primal] if backward else None
        if (given is None) != (want is None) or (given is not None and tuple(given.shape) != want):
            raise ValueError(f"{name}: {None if given is None else tuple(given.shape)}, expected {want}")
    if case.rule == "trapezoidal" and case.scale != 1.0:
        raise ValueError(f"scale {case.scale} for the trapezoidal rule (expected 1)")


def _declare(name, layout):
    @plugin.impl(name, rules=["additive", "delta", "dplr", "trapezoidal"],
                 decays=["none", "retnet", "scalar", "vector"], layout=layout, householder=True, bonus=True, mimo=True)
    def forward(case, t):
        _check(case, t, layout == "BTHD", False)
        t.o[...] = 0
        t.hT[...] = 0

    @forward.backward
    def backward(case, t, saved):
        _check(case, t, layout == "BTHD", True)
        for grad in GRADIENTS.values():
            if getattr(t, grad) is not None:
                getattr(t, grad)[...] = 0

    return forward


shapes = _declare("shapes", "BHTD")
shapes_bthd = _declare("shapes_bthd", "BTHD")


@plugin.impl("one_row", rules=["additive", "delta", "trapezoidal"], decays=["none", "scalar", "vector"])
def one_row(case, t):
    """Declares no householder, bonus or mimo: the bridge declines those cases for it."""
    t.o[...] = 0
    t.hT[...] = np.zeros_like(t.hT)
