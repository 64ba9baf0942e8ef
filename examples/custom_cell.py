#!/usr/bin/env python3
"""A cell nobody has written kernels for, written inline and trained.

A minimal gated unit with a learned, positive decay: the state leaks at a rate
softplus(d) per step, and a gate decides how much new input enters. cellc
derives its backward; with recompute="full" the forward saves only the state.

  PYTHONPATH=build/python python3 examples/custom_cell.py
"""

import torch

import cellc
from _fit import fit

SOURCE = """
cell leaky_gated {
  input x: [I]
  state h: [H]
  param W: [2*H, I], U: [2*H, H], b: [2*H], d: [H]
  z, n = chunk(W @ x + U @ h + b, 2)
  g = sigmoid(z)
  h = exp(-softplus(d)) * h + g * tanh(n)
  output h
}
"""


def main():
    torch.manual_seed(0)
    cell = cellc.compile(SOURCE)
    print(cell)
    model = cellc.nn.Recurrent(cell, I=2, H=32, recompute="full")
    head = torch.nn.Linear(32, 1)
    params = [*model.parameters(), *head.parameters()]

    def batch(g):
        # Predict the running mean of the first channel, gated by the second.
        x = torch.randn(40, 16, 2, generator=g)
        y = (x[..., :1] * (x[..., 1:] > 0)).cumsum(0) / torch.arange(1, 41).view(40, 1, 1)
        return x, y

    fit(lambda x: head(model(x)[0]), params, batch, steps=100, lr=1e-2, report_every=20, seed=2)


if __name__ == "__main__":
    main()
