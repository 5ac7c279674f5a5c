// The `lattn` module's Python source (see python_module.hpp). It is Python kept in a C++ string so
// that the binary carries it: a Python plugin needs nothing installed but the interpreter.
#include "src/plugins/python_module.hpp"

namespace lattn {

const char* const kPythonModuleSource = R"PY(
"""lattnbench's API for kernels written in Python (docs/plugins.md, "Python kernels").

    import lattn
    mine = lattn.Plugin("mine")

    @mine.impl("scan", rules=["additive"], decays=["none"])
    def scan(case, t):          # t.q, t.k, t.v ... NumPy arrays over lattnbench's buffers
        ...                     # write t.o and t.hT whole

The impls become rows NAME:IMPL beside lattnbench's own, timed and checked as they are.
"""
import os as _os
import sys as _sys
import traceback as _traceback

import _lattn

# lattnbench's own libraries (OpenBLAS among them) are in the process's global symbol scope, which
# the dynamic linker searches before an extension module's own dependencies: without deep binding,
# torch's libtorch_cpu.so (which defines sgemm_ from its MKL) calls OpenBLAS's sgemm_ here, and a
# Python impl would be timed with another BLAS than the one it runs with on its own. RTLD_DEEPBIND
# puts each extension's own dependencies first.
_sys.setdlopenflags(_sys.getdlopenflags() | _os.RTLD_DEEPBIND)

threads = 1  # the run's CPU threads (--threads), set before a plugin file loads

OPS = ("linear_attention",)
DEVICES = ("cpu", "cuda")
MODES = ("fwd", "fwd_bwd")
RULES = ("additive", "delta", "dplr", "trapezoidal")
DECAYS = ("none", "retnet", "scalar", "vector")
DTYPES = ("float32", "bfloat16")
ARRAYS = ("numpy", "dlpack")
# How the per-token tensors (q k v o dO dq dk dv, g, beta, dg, dbeta, a b da db, dt trap ddt dtrap) are laid out: lattnbench's
# [B, H, T, ...], or [B, T, H, ...] (flash-linear-attention's), which lattnbench converts to and
# from outside the timed calls. States ([B, H, D, D]) and gamma ([H]) are the same in both.
LAYOUTS = ("BHTD", "BTHD")

_declared = []  # the Plugins of the file being loaded


class Case:
    """A planned case: the fields of the C interface's lattn_case2 (include/lattn/plugin_v2.h), and the
    CUDA stream (an int)."""

    __slots__ = ("op", "mode", "decay", "rule", "dtype", "device", "batch", "heads", "seq", "dim", "chunk",
                 "scale", "threads", "stream", "householder", "bonus", "mimo_rank")

    def __repr__(self):
        return "Case(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"


class Tensors:
    """The case's tensors by name; None for those the case (or the pass) does not have."""

    __slots__ = ("q", "k", "v", "h0", "g", "beta", "gamma", "o", "hT", "dO", "dhT", "dq", "dk", "dv", "dh0",
                 "dg", "dbeta", "a", "b", "u", "dt", "trap", "da", "db", "du", "ddt", "dtrap")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, None)


class DLArray:
    """One of lattnbench's buffers for torch.from_dlpack, jax.dlpack.from_dlpack or
    numpy.from_dlpack: each call of __dlpack__ hands out a new capsule over the same memory."""

    __slots__ = ("_address", "shape", "dtype", "writable", "_device")

    def __init__(self, address, shape, dtype, writable, device):
        self._address, self.shape, self.dtype, self.writable, self._device = address, shape, dtype, writable, device

    def __dlpack__(self, stream=None, **kwargs):
        return _lattn.capsule(self._address, self.shape, self.dtype, self._device[0], self._device[1])

    def __dlpack_device__(self):
        return self._device

    def numpy(self):
        """The same memory as a NumPy array (host tensors only), writable where the tensor is an
        output: numpy.from_dlpack's arrays are read-only."""
        if self._device[0] != 1:
            raise ValueError("a device tensor has no NumPy view")
        return _numpy_view(self._address, self.shape, self.dtype, self.writable)

    def __repr__(self):
        return f"DLArray(shape={self.shape}, dtype={self.dtype}, device={self._device})"


def _names(what, values, allowed):
    values = (values,) if isinstance(values, str) else tuple(values)
    for v in values:
        if v not in allowed:
            raise ValueError(f"{what} {v!r} is not one of {', '.join(allowed)}")
    return values


class Impl:
    """An impl as its decorator made it; calling it calls the forward."""

    def __init__(self, plugin, name, forward, device, ops, modes, rules, decays, dtypes, arrays, unsupported,
                 layout="BHTD", householder=False, bonus=False, mimo=False):
        self.plugin, self.name, self.forward = plugin, name, forward
        self.device = _names("device", device, DEVICES)[0]
        self.ops = _names("op", ops, OPS)
        self.modes = _names("mode", modes, MODES)
        self.rules = _names("rule", rules, RULES)
        self.decays = _names("decay", decays, DECAYS)
        self.dtypes = _names("dtype", dtypes, DTYPES)
        self.arrays = _names("arrays", arrays, ARRAYS)[0]
        self.layout = _names("layout", layout, LAYOUTS)[0]
        if self.device == "cuda" and self.arrays == "numpy":
            raise ValueError(f"impl {name!r}: a cuda impl takes arrays='dlpack' (NumPy arrays are host memory)")
        if unsupported is not None and not callable(unsupported):
            raise ValueError(f"impl {name!r}: unsupported= is not callable")
        self.unsupported = unsupported
        # Whether it takes DeltaProduct's several writes per token, RWKV-6's bonus and MIMO's R rows:
        # an impl written for one write, no bonus and one row declines them rather than misread them.
        self.householder, self.bonus, self.mimo = bool(householder), bool(bonus), bool(mimo)
        self.backward_fn = None

    def backward(self, fn):
        """Decorates the backward: fn(case, tensors, saved), saved being what the forward returned."""
        self.backward_fn = fn
        return self

    def __call__(self, case, tensors):
        return self.forward(case, tensors)

    def _why_not(self, case):
        for what, value, allowed in (("op", case.op, self.ops), ("rule", case.rule, self.rules),
                                     ("decay", case.decay, self.decays), ("dtype", case.dtype, self.dtypes)):
            if value not in allowed:
                return f"takes {what} {', '.join(allowed)}, not {value}"
        if case.mode not in self.modes:
            return f"takes mode {', '.join(self.modes)}, not {case.mode}"
        if case.householder > 1 and not self.householder:
            return f"takes householder 1 only, not {case.householder}"
        if case.bonus and not self.bonus:
            return "takes no bonus (bonus: true)"
        if case.mimo_rank > 1 and not self.mimo:
            return f"takes mimo_rank 1 only, not {case.mimo_rank}"
        if self.unsupported is not None:
            why = self.unsupported(case)
            if why:
                return str(why)
        return None


class Plugin:
    """A plugin: its name ([a-z0-9_]+) and the impls its impl decorator declares."""

    def __init__(self, name):
        self.name = name
        self.impls = []
        _declared.append(self)

    def impl(self, name, *, device="cpu", ops=("linear_attention",), modes=("fwd", "fwd_bwd"),
             rules=("additive",), decays=("none",), dtypes=("float32",), arrays="numpy", unsupported=None,
             layout="BHTD", householder=False, bonus=False, mimo=False):
        """Declares the decorated function forward(case, tensors) as impl NAME. It runs the cases
        whose op, mode, rule, decay and dtype are among those given, and unsupported(case), when
        given, returns why it does not run one (or None). A fwd_bwd case needs a backward
        (@impl.backward). arrays: "numpy" (host arrays) or "dlpack" (DLArray views). layout: "BHTD"
        (q as [B, H, T, D], lattnbench's) or "BTHD" ([B, T, H, D]; g [B, T, H] or [B, T, H, D],
        beta [B, T, H]), handed over converted, the copy outside the timed calls. householder, bonus,
        mimo: whether it takes cases with several writes per token (rule delta, householder n > 1),
        with RWKV-6's bonus u (bonus: true) and with MIMO's R rows per token (mimo_rank R > 1); each
        is declined otherwise."""

        def decorate(forward):
            impl = Impl(self, name, forward, device, ops, modes, rules, decays, dtypes, arrays, unsupported,
                        layout, householder, bonus, mimo)
            self.impls.append(impl)
            return impl

        return decorate


# What the bridge calls (src/plugins/python_plugin.cpp).

def _case(op, mode, decay, rule, dtype, device, batch, heads, seq, dim, chunk, scale, threads, stream,
          householder=1, bonus=0, mimo_rank=1):
    c = Case()
    (c.op, c.mode, c.decay, c.rule, c.dtype, c.device, c.batch, c.heads, c.seq, c.dim, c.chunk, c.scale,
     c.threads, c.stream) = (op, mode, decay, rule, dtype, device, batch, heads, seq, dim, chunk, scale, threads,
                             stream)
    c.householder, c.bonus, c.mimo_rank = householder, bool(bonus), mimo_rank
    return c


def _numpy_view(address, shape, dtype, writable):
    import numpy
    kind = numpy.float32 if dtype == "float32" else numpy.uint16
    size = numpy.dtype(kind).itemsize
    for n in shape:
        size *= n
    return numpy.frombuffer(_lattn.memory(address, size, writable), kind).reshape(shape)


def _tensors(arrays, specs):
    """specs: (name, address, bytes, shape, dtype, writable, device_type, device_id) per tensor."""
    t = Tensors()
    if arrays == "numpy":
        for name, address, size, shape, dtype, writable, _, _ in specs:
            setattr(t, name, _numpy_view(address, shape, dtype, writable))
    else:
        for name, address, size, shape, dtype, writable, device_type, device_id in specs:
            setattr(t, name, DLArray(address, shape, dtype, writable, (device_type, device_id)))
    return t


def _load(path):
    """Runs a plugin file or imports python:MODULE; returns the one Plugin it declares."""
    del _declared[:]
    if path.startswith("python:"):
        import importlib
        module = importlib.import_module(path[len("python:"):])
        source = getattr(module, "__file__", None)
    else:
        import importlib.util
        directory = _os.path.dirname(path)
        if directory not in _sys.path:
            _sys.path.insert(0, directory)  # the file's own helper modules import as they do from python3 FILE
        stem = _os.path.splitext(_os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location("lattn_plugin_" + stem, path)
        module = importlib.util.module_from_spec(spec)
        _sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        source = path
    if len(_declared) != 1:
        raise ValueError(f"declares {len(_declared)} plugins with lattn.Plugin(NAME) (one per file)")
    return _declared[0], source


def _last_line(kind, value, tb):
    """The exception's last traceback line, with where in the plugin it was raised."""
    text = _traceback.format_exception_only(kind, value)[-1].strip()
    frames = _traceback.extract_tb(tb) if tb is not None else []
    if frames:
        text += f" ({_os.path.basename(frames[-1].filename)}:{frames[-1].lineno})"
    return text


def _empty(case, tensors):
    return None


# The scratch of one call, as the impl's library counts it (docs/plugins.md, "Memory"): the bridge
# calls _watch_start, one call of the case, then _watch_stop, outside any timed call. tracemalloc
# slows every allocation while it traces, so it traces that one call only.

def _jax_gpu_stats(jax):
    devices = [d for d in jax.local_devices() if d.platform == "gpu"]
    stats = devices[0].memory_stats() if devices else None
    return stats if stats and "peak_bytes_in_use" in stats and "bytes_in_use" in stats else None


def _watch_start(arrays, device):
    """What _watch_stop takes: the watches started, or why nothing can count the call's memory."""
    if device == "cpu":
        if arrays != "numpy":
            return ("a dlpack impl on the CPU: torch and JAX keep no count of the host memory a call "
                    "allocates (arrays='numpy' impls are counted with tracemalloc)")
        import tracemalloc
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        return [("tracemalloc", tracemalloc.get_traced_memory()[0], started)]
    watches = []
    torch = _sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        watches.append(("torch.cuda", torch.cuda.memory_allocated(), None))
    jax = _sys.modules.get("jax")
    stats = _jax_gpu_stats(jax) if jax is not None else None
    if stats:
        watches.append(("jax.memory_stats", (stats["bytes_in_use"], stats["peak_bytes_in_use"]), None))
    return watches or "neither torch's CUDA allocator nor JAX's device memory stats are there to count it"


def _watch_stop(watches):
    """(bytes, source) of the call's peak beyond what was live before it, or (None, why not)."""
    if isinstance(watches, str):
        return None, watches
    total, sources, unknown = 0, [], None
    for source, before, started in watches:
        if source == "tracemalloc":
            import tracemalloc
            total += max(0, tracemalloc.get_traced_memory()[1] - before)
            if started:
                tracemalloc.stop()
        elif source == "torch.cuda":
            import torch
            torch.cuda.synchronize()
            total += max(0, torch.cuda.max_memory_allocated() - before)
        else:
            stats = _jax_gpu_stats(_sys.modules["jax"])
            in_use, peak = before
            if stats and stats["peak_bytes_in_use"] > peak:
                total += stats["peak_bytes_in_use"] - in_use
            else:
                unknown = "JAX's peak_bytes_in_use, which cannot be reset, did not rise during the call"
        sources.append(source)
    return (None, unknown) if unknown else (total, "+".join(sources))
)PY";

}  // namespace lattn
