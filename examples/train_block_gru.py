#!/usr/bin/env python3
"""The DreamerV3-style block GRU (examples/block_gru.cell) trained on a small
task: G = 4 blocks of D = 16 units, block-diagonal weights, an RMS-normalized
state. Each block must remember the input of its own part of the vector two
steps back (a copy task that block-diagonal weights can solve block by
block), through an input and an output projection. `recompute="full"` keeps
only the states between forward and backward.

  PYTHONPATH=build/python python3 examples/train_block_gru.py
"""

import os

import torch

import cellc
from _fit import fit

G, D, IN = 4, 16, 2


def main():
    torch.manual_seed(0)
    cell = cellc.compile(os.path.join(os.path.dirname(__file__), "block_gru.cell"))
    rnn = cellc.nn.Recurrent(cell, G=G, D=D, recompute="full")
    with torch.no_grad():  # the RMSNorm gain starts at one
        rnn.layers[0]["g"].fill_(1.0)
    embed = torch.nn.Linear(G * IN, G * D)
    head = torch.nn.Linear(G * D, G * IN)
    params = [*rnn.parameters(), *embed.parameters(), *head.parameters()]

    def batch(g):
        x = torch.randn(30, 32, G * IN, generator=g)
        return x, torch.cat([torch.zeros_like(x[:2]), x[:-2]])

    fit(lambda x: head(rnn(embed(x))[0]), params, batch, steps=150, lr=3e-3, report_every=30)


if __name__ == "__main__":
    main()
