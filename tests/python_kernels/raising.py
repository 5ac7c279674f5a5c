"""Impls that fail on purpose, for test_python_kernels.py: an exception in the forward, one in the
backward, a write to an input, and (for --isolate) a crash of the interpreter."""
import ctypes

import lattn

plugin = lattn.Plugin("raising")


@plugin.impl("forward")
def forward(case, t):
    raise ValueError(f"no kernel for seq {case.seq}")


@plugin.impl("backward")
def backward(case, t):
    t.o[...] = 0
    t.hT[...] = 0


@backward.backward
def backward_fails(case, t, saved):
    raise RuntimeError("the backward is missing")


@plugin.impl("writes_input")
def writes_input(case, t):
    t.q[0, 0, 0, 0] = 1.0


@plugin.impl("crash")
def crash(case, t):
    ctypes.string_at(0)
