"""Times torch_chunked.py's forward the way one would in Python, with time.perf_counter around
the same calls lattnbench makes, to hold lattnbench's figure for torch:chunked against it
(docs/plugins.md, "Python kernels"). It runs outside lattnbench: a stand-in for the `lattn`
module takes the decorators.

    python3 examples/python/perf_counter_torch_chunked.py --seq 8192 --dim 128 --threads 2
    lattnbench --suite kernel --plugin examples/python/torch_chunked.py --impl torch:chunked \\
               --seq 8192 --dim 128 --mode fwd --threads 2
"""
import argparse
import os
import statistics
import sys
import time
import types


def stand_in_lattn():
    module = types.ModuleType("lattn")

    class Impl:
        def __init__(self, forward):
            self.forward = forward

        def backward(self, fn):
            return self

        def __call__(self, case, tensors):
            return self.forward(case, tensors)

    class Plugin:
        def __init__(self, name):
            self.name = name

        def impl(self, name, **kwargs):
            return Impl

    module.Plugin = Plugin
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--min-sample-ms", type=float, default=25.0)
    args = parser.parse_args()

    sys.modules["lattn"] = stand_in_lattn()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch_chunked

    B, H, T, D = args.batch, args.heads, args.seq, args.dim
    case = types.SimpleNamespace(op="linear_attention", mode="fwd", decay="none", rule="additive", dtype="float32",
                                 device="cpu", batch=B, heads=H, seq=T, dim=D, chunk=args.chunk, scale=D ** -0.5,
                                 threads=args.threads, stream=0)
    gen = torch.Generator().manual_seed(0)
    t = types.SimpleNamespace(q=torch.randn(B, H, T, D, generator=gen), k=torch.randn(B, H, T, D, generator=gen),
                              v=torch.randn(B, H, T, D, generator=gen), h0=torch.zeros(B, H, D, D), g=None,
                              beta=None, gamma=None, o=torch.empty(B, H, T, D), hT=torch.empty(B, H, D, D))
    call = lambda: torch_chunked.chunked(case, t)
    for _ in range(2):  # warm-up, as lattnbench's
        call()
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    inner = max(1, int(args.min_sample_ms * 1e-3 / once + 0.5))
    samples = []
    for _ in range(args.samples):
        start = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - start) / inner * 1e3)
    print(f"torch:chunked fwd B {B} H {H} T {T} D {D} chunk {args.chunk} threads {args.threads}: "
          f"median {statistics.median(samples):.3f} ms per call ({args.samples} samples of {inner} calls)")


if __name__ == "__main__":
    main()
