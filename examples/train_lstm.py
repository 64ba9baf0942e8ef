#!/usr/bin/env python3
"""Trains a cellc LSTM on a small sequence task and compares recompute modes.

The task: from a stream of random values, predict at every step the sum of the
last five values. The loss falls as the LSTM learns to count. Each recompute
mode trains the same model from the same start; the table gives the time per
step and the bytes the forward keeps for backward.

  PYTHONPATH=build/python python3 examples/train_lstm.py
"""

import time

import torch

import cellc


def batch(generator, T=60, B=32):
    x = torch.randn(T, B, 1, generator=generator)
    y = torch.zeros_like(x)
    for t in range(T):
        y[t] = x[max(0, t - 4):t + 1].sum(0)
    return x, y


def train(recompute, steps=40):
    torch.manual_seed(0)
    lstm = cellc.nn.LSTM(1, 64, recompute=recompute)
    head = torch.nn.Linear(64, 1)
    opt = torch.optim.Adam(list(lstm.parameters()) + list(head.parameters()), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses, times = [], []
    for step in range(steps):
        x, y = batch(g)
        t0 = time.perf_counter()
        opt.zero_grad()
        out, _ = lstm(x)
        loss = (head(out) - y).pow(2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            print(f"  {recompute:<9} step {step:3d}  loss {loss.item():.4f}")
    return losses, sorted(times)[len(times) // 2], lstm.saved_bytes


def main():
    results = {}
    for mode in ["none", "full", "chunk:10"]:
        results[mode] = train(mode)
    print()
    print(f"{'mode':<10} {'first loss':>10} {'last loss':>10} {'ms/step':>8} {'kept KiB':>9}")
    for mode, (losses, t, kept) in results.items():
        print(f"{mode:<10} {losses[0]:10.4f} {losses[-1]:10.4f} {t * 1e3:8.1f} {kept / 1024:9.1f}")
    first, last = results["full"][0][0], results["full"][0][-1]
    assert last < 0.3 * first, "the loss should fall"


if __name__ == "__main__":
    main()
