#!/usr/bin/env python3
"""CPU benchmark in one process: cellc (through its Python package) against
torch.nn.LSTM / GRU, and against a PyTorch loop for a custom cell, at the same
thread count. Medians of repeated runs, interleaved so that drift in the
machine's speed hits both sides alike.

  PYTHONPATH=build/python python3 bench/cpu/compare.py --threads 1 2
"""

import argparse
import os
import statistics
import sys
import time

import torch

import cellc

sys.path.insert(0, os.path.dirname(__file__))
from torch_rnn import PeepholeLoop  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEEPHOLE = os.path.join(HERE, "..", "..", "examples", "peephole_lstm.cell")


def timed(fn, repeats):
    fwd, both = [], []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        loss = fn()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if r:
            fwd.append((t1 - t0) * 1e3)
            both.append((t2 - t0) * 1e3)
    return statistics.median(fwd), statistics.median(both)


def kept_bytes(module, x):
    """Bytes the autograd graph keeps for backward, measured with saved-tensor
    hooks on the torch side; cellc reports its own."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)[0]
    return total, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--size", type=int, default=256)
    a = p.parse_args()
    H = I = a.size
    shapes = [(64, 100), (8, 500), (256, 50)]
    print(f"torch {torch.__version__}, f32, I = H = {H}; medians of {a.repeats} runs, ms")
    print(f"{'cell':<9} {'B x T':>9} {'thr':>3} {'mode':<9} {'fwd':>9} {'fwd+bwd':>9} "
          f"{'torch fwd':>10} {'torch f+b':>10} {'speedup':>8}")
    for threads in a.threads:
        torch.set_num_threads(threads)
        for name in ["lstm", "gru"]:
            for B, T in shapes:
                torch.manual_seed(0)
                ref = (torch.nn.LSTM if name == "lstm" else torch.nn.GRU)(I, H)
                mine = (cellc.nn.LSTM if name == "lstm" else cellc.nn.GRU)(I, H)
                mine.load_state_dict(ref.state_dict())
                for m in mine.modules():
                    if hasattr(m, "cell"):
                        m.cell.threads = threads
                x = torch.randn(T, B, I, requires_grad=True)
                tf, tb = timed(lambda: ref(x)[0].sum(), a.repeats)
                for mode in ["none", "full", "chunk:16"]:
                    mine.recompute = mode
                    f, b = timed(lambda: mine(x)[0].sum(), a.repeats)
                    print(f"{name:<9} {B:>4} x {T:<4}{threads:>3} {mode:<9} {f:9.1f} {b:9.1f} "
                          f"{tf:10.1f} {tb:10.1f} {tb / b:7.2f}x")
        torch.manual_seed(0)
        loop = PeepholeLoop(I, H)
        cell = cellc.compile(PEEPHOLE, threads=threads)
        params = {"W_ih": loop.w_ih, "W_hh": loop.w_hh, "b": loop.b,
                  "p_i": loop.p_i, "p_f": loop.p_f, "p_o": loop.p_o}
        x = torch.randn(100, 64, I, requires_grad=True)
        tf, tb = timed(lambda: loop(x)[0].sum(), a.repeats)
        for mode in ["none", "full"]:
            f, b = timed(lambda: cell(x, params, recompute=mode)[0].sum(), a.repeats)
            print(f"{'peephole':<9} {64:>4} x {100:<4}{threads:>3} {mode:<9} {f:9.1f} {b:9.1f} "
                  f"{tf:10.1f} {tb:10.1f} {tb / b:7.2f}x   (torch: a PyTorch loop)")


if __name__ == "__main__":
    main()
