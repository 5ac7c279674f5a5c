"""A Python impl on the CUDA backend, for the emulation's test (test_python_plugin.cpp): the additive
scan without decay, forward only, on the device tensors lattnbench hands over as DLPack capsules.

It reads what a consumer such as torch.from_dlpack reads: each tensor's capsule, its DLTensor (device,
dtype, shape, data pointer), and fails the case if the device is not CUDA's or the dtype not
float32. In the emulation device memory is host memory, so the impl then reads and writes the
buffers through ctypes at those pointers; on a GPU an impl hands the same arrays to torch.from_dlpack
and launches on torch.cuda.ExternalStream(case.stream) (examples/python/fla.py).

emu:scan_bthd is the same scan taking [B, T, H, D] (layout="BTHD", as fla.py does), in float32 or
bf16 (q, k, v and o as bf16 bits, h0 and hT float32): the row's layout conversion and its bf16
outputs on the CUDA backend.
"""
import ctypes
import struct

import lattn

plugin = lattn.Plugin("emu")


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_CUDA = 2
_FLOAT = 2
_BFLOAT = 4


def _buffer(array, name, case):
    """The tensor's memory as ctypes floats or bf16 bits (uint16), after checking its capsule."""
    capsule = array.__dlpack__(stream=case.stream)
    t = _Tensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if (t.device.device_type, t.device.device_id) != (_CUDA, 0):
        raise ValueError(f"{name}: the capsule's device is ({t.device.device_type}, {t.device.device_id})")
    want = (_BFLOAT, 16) if array.dtype == "bfloat16" else (_FLOAT, 32)
    if (t.dtype.code, t.dtype.bits) != want:
        raise ValueError(f"{name}: the capsule's dtype is ({t.dtype.code}, {t.dtype.bits}), not {array.dtype}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    count = 1
    for n in shape:
        count *= n
    kind = ctypes.c_uint16 if array.dtype == "bfloat16" else ctypes.c_float
    return (kind * count).from_address(t.data), shape, array.dtype == "bfloat16"


def _widen(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _narrow(x):
    """float32 to bf16 bits, rounding to nearest even."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _floats(array, name, case):
    """The tensor's floats, after checking its capsule as a DLPack consumer would."""
    if array.__dlpack_device__() != (_CUDA, 0):
        raise ValueError(f"{name}: __dlpack_device__ is {array.__dlpack_device__()}, not CUDA device 0")
    capsule = array.__dlpack__(stream=case.stream)
    t = _Tensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if (t.device.device_type, t.device.device_id) != (_CUDA, 0):
        raise ValueError(f"{name}: the capsule's device is ({t.device.device_type}, {t.device.device_id})")
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (_FLOAT, 32, 1):
        raise ValueError(f"{name}: the capsule's dtype is not float32")
    shape = [t.shape[i] for i in range(t.ndim)]
    if tuple(shape) != tuple(array.shape):
        raise ValueError(f"{name}: the capsule's shape {shape} is not {array.shape}")
    count = 1
    for n in shape:
        count *= n
    return (ctypes.c_float * count).from_address(t.data)


@plugin.impl("scan", device="cuda", modes=["fwd"], arrays="dlpack")
def scan(case, t):
    if case.device != "cuda" or not isinstance(case.stream, int):
        raise ValueError(f"case.device {case.device!r}, case.stream {case.stream!r}")
    q, k, v, h0, o, hT = (_floats(getattr(t, n), n, case) for n in ("q", "k", "v", "h0", "o", "hT"))
    T, D = case.seq, case.dim
    for bh in range(case.batch * case.heads):
        state = [h0[bh * D * D + i] for i in range(D * D)]  # S[i][j]: key channel i, value channel j
        for step in range(T):
            row = (bh * T + step) * D
            for i in range(D):
                ki = k[row + i]
                for j in range(D):
                    state[i * D + j] += ki * v[row + j]
            for j in range(D):
                o[row + j] = case.scale * sum(state[i * D + j] * q[row + i] for i in range(D))
        for i in range(D * D):
            hT[bh * D * D + i] = state[i]


@plugin.impl("scan_bthd", device="cuda", modes=["fwd"], dtypes=["float32", "bfloat16"], arrays="dlpack",
             layout="BTHD")
def scan_bthd(case, t):
    B, H, T, D = case.batch, case.heads, case.seq, case.dim
    views = {n: _buffer(getattr(t, n), n, case) for n in ("q", "k", "v", "h0", "o", "hT")}
    for name in ("q", "k", "v", "o"):
        if views[name][1] != (B, T, H, D):
            raise ValueError(f"{name} has shape {views[name][1]}, not {(B, T, H, D)}")
    read = lambda n, i: _widen(views[n][0][i]) if views[n][2] else views[n][0][i]
    o, o_bf16 = views["o"][0], views["o"][2]
    h0, hT = views["h0"][0], views["hT"][0]
    for b in range(B):
        for h in range(H):
            state = [h0[(b * H + h) * D * D + i] for i in range(D * D)]
            for step in range(T):
                row = ((b * T + step) * H + h) * D  # [B, T, H, D]
                for i in range(D):
                    ki = read("k", row + i)
                    for j in range(D):
                        state[i * D + j] += ki * read("v", row + j)
                for j in range(D):
                    value = case.scale * sum(state[i * D + j] * read("q", row + i) for i in range(D))
                    o[row + j] = _narrow(value) if o_bf16 else value
            for i in range(D * D):
                hT[(b * H + h) * D * D + i] = state[i]


@plugin.impl("fails", device="cuda", modes=["fwd"], arrays="dlpack")
def fails(case, t):
    raise RuntimeError("raised on the CUDA backend")


@plugin.impl("host", device="cpu", modes=["fwd"])
def host(case, t):
    raise RuntimeError("a CPU impl is not a row of the CUDA backend")
