#!/usr/bin/env python3
"""cellc's LSTM in a training loop that also runs torch ops, on several
threads: each round runs a torch op first (torch's own LSTM forward and
backward, or a matrix product: both leave OpenBLAS's and OpenMP's threads
spinning for a while), then cellc's LSTM forward and backward. Prints the
spread of cellc's times over the rounds (median, 90th percentile, worst),
and the same loop with no torch op between, side by side in one process.

A model's other layers, its loss and its optimizer run between the RNN's
calls like this. What it catches: threads that wait for each other at every
step's barrier, placed on one core while another core runs a spinner.

  OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 PYTHONPATH=build/python \\
    taskset -c 0,1 python3 bench/cpu/mixed.py --threads 2
"""

import argparse
import statistics
import time

import torch

import cellc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    T, B, H = a.steps, a.batch, a.size
    x = torch.randn(T, B, H, requires_grad=True)
    mine = cellc.nn.LSTM(H, H)
    ref = torch.nn.LSTM(H, H)
    m = torch.randn(1024, 1024)
    between = {
        "nothing": lambda: None,
        "torch matmul": lambda: m @ m,
        "torch LSTM": lambda: ref(x)[0].sum().backward(),
    }
    times = {k: ([], []) for k in between}
    mine(x)[0].sum().backward()  # compiles, and warms the buffers
    for _ in range(a.rounds):
        for name, op in between.items():
            op()
            x.grad = None
            mine.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = mine(x)[0]
            t1 = time.perf_counter()
            out.sum().backward()
            t2 = time.perf_counter()
            times[name][0].append((t1 - t0) * 1e3)
            times[name][1].append((t2 - t0) * 1e3)
            x.grad = None
    print(f"cellc LSTM I = H = {H}, B = {B}, T = {T}, {a.threads} thread(s), "
          f"{a.rounds} rounds; ms: median / 90th percentile / worst")
    print(f"{'before each round':<18} {'forward':>22} {'forward + backward':>24}")
    for name, (fwd, both) in times.items():
        spread = lambda v: (f"{statistics.median(v):6.1f} / "
                            f"{statistics.quantiles(v, n=10)[-1]:6.1f} / {max(v):6.1f}")
        print(f"{name:<18} {spread(fwd):>22} {spread(both):>24}")


if __name__ == "__main__":
    main()
