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
    opt = torch.optim.Adam(params, lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(150):
        x = torch.randn(30, 32, G * IN, generator=g)
        target = torch.cat([torch.zeros_like(x[:2]), x[:-2]])
        opt.zero_grad()
        out, _ = rnn(embed(x))
        loss = (head(out) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 30 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    print(f"mean loss of the first 5 steps {first:.4f}, of the last 10 {last:.4f}")
    assert last < 0.5 * first, "the loss should fall"


if __name__ == "__main__":
    main()
