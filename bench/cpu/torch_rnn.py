#!/usr/bin/env python3
"""Times torch.nn.LSTM / GRU on the CPU: forward, and forward plus backward.

Prints medians in milliseconds, in the same shape of table as cellc-bench, so
the two can be read side by side. Usage:
  torch_rnn.py --cell lstm --input 256 --hidden 256 --batch 64 --seq-len 100 --threads 2
"""

import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cls = torch.nn.LSTM if a.cell == "lstm" else torch.nn.GRU
    rnn = cls(a.input, a.hidden)
    x = torch.randn(a.seq_len, a.batch, a.input, requires_grad=True)
    fwd, both = [], []
    for r in range(a.repeats + 1):
        t0 = time.perf_counter()
        out, _ = rnn(x)
        t1 = time.perf_counter()
        out.sum().backward()
        t2 = time.perf_counter()
        if r:
            fwd.append((t1 - t0) * 1e3)
            both.append((t2 - t0) * 1e3)
    print(f"torch.nn.{cls.__name__} {torch.__version__}, f32, T={a.seq_len}, "
          f"B={a.batch}, threads={a.threads}")
    print(f"{'torch':<10} {statistics.median(fwd):12.2f} {statistics.median(both):16.2f}")


if __name__ == "__main__":
    main()
