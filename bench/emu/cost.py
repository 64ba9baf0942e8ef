#!/usr/bin/env python3
"""What the SIMT emulator costs: the LSTM (examples/lstm.cell) at H = 64,
B = 8, T = 6, forward and backward through cellc.compile(target="cuda-emu"),
per strategy and precision. Prints the package's build time (PTX and the
emulated objects, both variants) and the median of a training step, with
the emulator's counts of its work.

  OPENBLAS_NUM_THREADS=1 PYTHONPATH=build/python taskset -c 0 \\
    python3 bench/emu/cost.py [--repeats 3]
"""

import argparse
import os
import platform
import statistics
import time

import torch

import cellc

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
# Persistent CTAs with an H100's opt-in shared memory (one CTA holds the
# 64 KiB of W_hh at H = 64).
H100 = {"shared_limit": 232448}
CONFIGS = [("batch-tiled", "ieee", {}), ("batch-tiled", "tf32", {}),
           ("persistent", "ieee", dict(H100, ctas=1)), ("persistent", "ieee", dict(H100, ctas=3)),
           ("persistent", "tf32", dict(H100, ctas=3))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    T, B, I, H = 6, 8, 64, 64
    g = torch.Generator().manual_seed(0)
    params = {n: (0.1 * torch.randn(*s, generator=g)).requires_grad_()
              for n, s in (("W_ih", (4 * H, I)), ("W_hh", (4 * H, H)), ("b_ih", (4 * H,)),
                           ("b_hh", (4 * H,)))}
    x = torch.randn(T, B, I, generator=g)
    print(f"LSTM H={H} I={I} B={B} T={T}, f32, forward+backward (recompute none), "
          f"{platform.processor() or platform.machine()}, median of {a.repeats}")
    print(f"  {'strategy':12s} {'precision':9s} {'CTAs':>4s} {'build s':>8s} {'step s':>7s}")
    for strategy, precision, extra in CONFIGS:
        source = os.path.join(EXAMPLES, "lstm.cell")
        cell = cellc.compile(source, target="cuda-emu",
                             cuda=dict(extra, strategy=strategy, precision=precision))
        t0 = time.perf_counter()
        cell(x[:1, :1], params)  # builds (or finds) the package and loads it
        build = time.perf_counter() - t0
        times = []
        for _ in range(a.repeats):
            for q in params.values():
                q.grad = None
            t0 = time.perf_counter()
            out, _ = cell(x, params)
            out.sum().backward()
            times.append(time.perf_counter() - t0)
        print(f"  {strategy:12s} {precision:9s} {extra.get('ctas', '-'):>4} {build:8.2f} "
              f"{statistics.median(times):7.2f}")


if __name__ == "__main__":
    main()
