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


class PeepholeLoop(torch.nn.Module):
    """examples/peephole_lstm.cell written as users write it today."""

    def __init__(self, input_size, hidden):
        super().__init__()
        k = hidden ** -0.5
        u = lambda *shape: torch.nn.Parameter(torch.empty(*shape).uniform_(-k, k))
        self.w_ih, self.w_hh, self.b = u(4 * hidden, input_size), u(4 * hidden, hidden), u(4 * hidden)
        self.p_i, self.p_f, self.p_o = u(hidden), u(hidden), u(hidden)
        self.hidden = hidden

    def forward(self, x):
        T, B, _ = x.shape
        h = x.new_zeros(B, self.hidden)
        c = x.new_zeros(B, self.hidden)
        xp = torch.nn.functional.linear(x, self.w_ih, self.b)
        outs = []
        for t in range(T):
            i, f, g, o = (xp[t] + h @ self.w_hh.t()).chunk(4, dim=1)
            ig = torch.sigmoid(i + self.p_i * c)
            fg = torch.sigmoid(f + self.p_f * c)
            c = fg * c + ig * torch.tanh(g)
            h = torch.sigmoid(o + self.p_o * c) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs), (h, c)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cell", choices=["lstm", "gru", "peephole_lstm"], default="lstm")
    p.add_argument("--input", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.cell == "peephole_lstm":
        rnn = PeepholeLoop(a.input, a.hidden)
        label = "a PyTorch loop (autograd) of examples/peephole_lstm.cell"
    else:
        cls = torch.nn.LSTM if a.cell == "lstm" else torch.nn.GRU
        rnn = cls(a.input, a.hidden)
        label = f"torch.nn.{cls.__name__}"
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
    print(f"{label}, torch {torch.__version__}, f32, T={a.seq_len}, "
          f"B={a.batch}, threads={a.threads}")
    print(f"{'torch':<10} {statistics.median(fwd):12.2f} {statistics.median(both):16.2f}")


if __name__ == "__main__":
    main()
