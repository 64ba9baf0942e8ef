#!/usr/bin/env python3
"""Gated DeltaNet (examples/gated_deltanet.cell) trained on associative
recall: a sequence shows 8 key-value pairs (a one-hot key of 8 and a value
of 4), then asks for the keys again in another order, with the value part
zero. The target at every step is the value that belongs to the step's key.
The delta rule's matrix state is a memory written and read by key, which is
what the task needs. `recompute="chunk:8"` keeps a matrix state only every
8 steps between forward and backward.

  PYTHONPATH=build/python python3 examples/train_deltanet.py
"""

import os

import torch

import cellc
from _fit import fit

KEYS, VALUE, NH, K, V = 8, 4, 2, 8, 8


def main():
    torch.manual_seed(0)
    cell = cellc.compile(os.path.join(os.path.dirname(__file__), "gated_deltanet.cell"))
    rnn = cellc.nn.Recurrent(cell, I=KEYS + VALUE, NH=NH, K=K, V=V, recompute="chunk:8")
    head = torch.nn.Linear(NH * V, VALUE)
    params = [*rnn.parameters(), *head.parameters()]

    def batch(g, B=32):
        keys = torch.stack([torch.randperm(KEYS, generator=g) for _ in range(B)], 1)
        values = torch.randn(KEYS, B, VALUE, generator=g)
        asked = torch.stack([torch.randperm(KEYS, generator=g) for _ in range(B)], 1)
        onehot = lambda k: torch.nn.functional.one_hot(k, KEYS).float()
        value_of = lambda k: torch.gather(values, 0, k[..., None].expand(-1, -1, VALUE))
        shown = torch.cat([onehot(keys), value_of(keys)], -1)
        queries = torch.cat([onehot(asked), torch.zeros(KEYS, B, VALUE)], -1)
        return (torch.cat([shown, queries]),
                torch.cat([value_of(keys), value_of(asked)]))

    fit(lambda x: head(rnn(x)[0]), params, batch, steps=200, lr=1e-2, report_every=40)


if __name__ == "__main__":
    main()
