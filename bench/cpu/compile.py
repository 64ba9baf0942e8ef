#!/usr/bin/env python3
"""cellc under torch.compile against eager, side by side in one process (torch
>= 2.4): a training step (forward and backward of a weighted sum of the
outputs) of cellc.nn.LSTM,

- eager (op):       the call through the torch operator cellc::sequence;
- eager (Function): the torch 1.13 path (an autograd.Function), for the op's
                    own cost;
- compiled:         torch.compile(fullgraph=True, dynamic=True), inductor;
- torch.nn.LSTM:    eager, for scale;

and torch.mm at the step's input-product shape as the machine's GEMM ceiling.
Outputs and gradients of the compiled step are checked against eager before
anything is timed. Run it pinned, one thread for everyone:

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
    PYTHONPATH=build/python taskset -c 0 \\
    build-torch2/venv-2.9.1/bin/python bench/cpu/compile.py
"""

import statistics
import time

import torch

import cellc
from cellc import _ops
from shape import parse_shape


def main():
    a = parse_shape(__doc__.splitlines()[0], steps=100)
    if not _ops.AVAILABLE:
        raise SystemExit(f"torch {torch.__version__} has no custom_op: run this on torch >= 2.4")
    B, T, I, H = a.batch, a.steps, a.size, a.size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    weights = torch.randn(T, B, H, generator=g)
    mine = cellc.nn.LSTM(I, H)
    mine.cell.threads = a.threads
    ref = torch.nn.LSTM(I, H)
    ref.load_state_dict(mine.state_dict())
    compiled = torch.compile(mine, fullgraph=True, dynamic=True)

    def step(module, legacy=False):
        _ops.AVAILABLE = not legacy
        try:
            xs = x.clone().requires_grad_()
            out, _ = module(xs)
            (out * weights).sum().backward()
            return out, xs.grad
        finally:
            _ops.AVAILABLE = True

    def grads(module):
        for p in module.parameters():
            p.grad = None
        out, dx = step(module)
        return [out.detach(), dx] + [p.grad.clone() for p in module.parameters()]

    t0 = time.perf_counter()
    got = grads(compiled)
    print(f"torch {torch.__version__}: compiled in {time.perf_counter() - t0:.1f} s")
    want = grads(mine)
    worst = max(((p - q).abs().max() / q.abs().max()).item() for p, q in zip(got, want))
    print(f"compiled against eager: largest difference {worst:.1e} of each tensor's largest value")
    assert worst < 1e-5

    M, K, N = T * B, I, 4 * H
    A, W = torch.randn(M, K), torch.randn(K, N)
    runs = {"eager (op)": lambda: step(mine), "eager (Function)": lambda: step(mine, True),
            "compiled": lambda: step(compiled), "torch.nn.LSTM": lambda: step(ref),
            "torch.mm": lambda: torch.mm(A, W)}
    times = {n: [] for n in runs}
    for f in runs.values():
        f()  # warm
    for _ in range(a.repeats):
        for n, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[n].append(time.perf_counter() - t0)
    med = {n: statistics.median(t) for n, t in times.items()}
    flops = 3 * 2 * T * B * 4 * H * (I + H)
    print(f"LSTM, T = {T}, B = {B}, I = H = {H}, {a.threads} thread(s), median of "
          f"{a.repeats}; torch.mm [{M}x{K}] x [{K}x{N}]: "
          f"{2 * M * K * N / med['torch.mm'] / 1e9:.1f} GFLOP/s (the ceiling)")
    print(f"{'':18} {'ms':>8} {'GFLOP/s':>8} {'vs eager (op)':>14}")
    for n in runs:
        if n == "torch.mm":
            continue
        print(f"{n:18} {1e3 * med[n]:8.1f} {flops / med[n] / 1e9:8.1f} "
              f"{med[n] / med['eager (op)']:14.3f}")


if __name__ == "__main__":
    main()
