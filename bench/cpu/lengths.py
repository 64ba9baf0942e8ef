#!/usr/bin/env python3
"""Variable-length sequences on the CPU, side by side in one process: an LSTM
over a batch whose lengths are drawn uniformly from 1..T, forward plus
backward (of a weighted sum of the outputs and final states).

- torch packed:  torch.nn.LSTM on a PackedSequence (enforce_sorted=False);
- torch padded:  torch.nn.LSTM on the padded batch, all T steps;
- cellc padded:  cellc.nn.LSTM on the padded batch, all T steps;
- cellc lengths: cellc.nn.LSTM on the same PackedSequence (the driver's
  per-sample lengths, run longest first, so that ended samples stop running);
- cellc unsorted: the cell on the padded batch with the lengths in the
  batch's order, where every row runs every step (what sorting saves).

The padded runs compute different final states (those of step T); they are
there for their time. cellc's packed outputs and gradients are checked
against torch's before anything is timed. Run it pinned, one BLAS thread:

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/lengths.py
"""

import torch
from torch.nn.utils.rnn import pack_padded_sequence

import cellc
from shape import parse_shape, side_by_side


def main():
    a = parse_shape(__doc__.splitlines()[0], steps=200)
    B, T, I, H = a.batch, a.steps, a.size, a.size
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    x = torch.randn(T, B, I, generator=g)
    ref = torch.nn.LSTM(I, H)
    mine = cellc.nn.LSTM(I, H)
    mine.load_state_dict(ref.state_dict())
    w_h, w_c = torch.randn(1, B, H, generator=g), torch.randn(1, B, H, generator=g)

    def packed_step(module):
        xs = x.clone().requires_grad_()
        out, (h, c) = module(pack_padded_sequence(xs, lengths, enforce_sorted=False))
        (out.data.sum() + (h * w_h).sum() + (c * w_c).sum()).backward()
        return out, h, c, xs.grad

    def unsorted_step():
        xs = x.clone().requires_grad_()
        out, final = mine.cell(xs, mine._params(0), lengths=lengths)
        (out.sum() + (final["h"] * w_h[0]).sum() + (final["c"] * w_c[0]).sum()).backward()

    def padded_step(module):
        xs = x.clone().requires_grad_()
        out, (h, c) = module(xs)
        (out.sum() + (h * w_h).sum() + (c * w_c).sum()).backward()

    # Check before timing.
    got, want = packed_step(mine), packed_step(ref)
    pairs = [(got[0].data, want[0].data), (got[1], want[1]), (got[2], want[2]),
             (got[3], want[3])] + [(p.grad, q.grad) for p, q in
                                   zip(mine.parameters(), ref.parameters())]
    # Relative to each tensor's largest value: the weight gradients sum
    # T * B rows in float32.
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in pairs)
    print(f"cellc (lengths) against torch (packed): largest difference {worst:.1e} "
          "of each tensor's largest value")
    assert worst < 1e-4

    runs = {"torch packed": lambda: packed_step(ref), "torch padded": lambda: padded_step(ref),
            "cellc padded": lambda: padded_step(mine),
            "cellc lengths": lambda: packed_step(mine), "cellc unsorted": unsorted_step}

    def clear_grads():
        for q in list(ref.parameters()) + list(mine.parameters()):
            q.grad = None

    medians = side_by_side(runs, a.repeats, clear_grads)
    steps = int(lengths.sum())
    print(f"LSTM B={B} T={T} I=H={H}, lengths uniform in 1..T ({steps} of {T * B} "
          f"sample-steps, {100 * steps / (T * B):.0f}%), {a.threads} thread(s), "
          f"forward+backward, median of {a.repeats}")
    for n, m in medians.items():
        print(f"  {n:14s} {1e3 * m:8.1f} ms   {medians['torch packed'] / m:5.2f}x torch packed")

if __name__ == "__main__":
    main()
