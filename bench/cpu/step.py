#!/usr/bin/env python3
"""Streaming and inference on one core: one LSTM step under no_grad
(cellc.Cell.step, cellc.nn.LSTM.step, the one-step sequence call of a
Cell, and of the module, `lstm(x[None], hx)`, as an RL actor makes it)
against torch.nn.LSTMCell, and a whole sequence under no_grad against
torch.nn.LSTM. Side by side in one process, interleaved rounds, medians.
OpenBLAS's sgemm at 1024^3 is measured in the same run as the ceiling.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/step.py
"""

import argparse
import os
import sys

import torch

import cellc

sys.path.insert(0, os.path.dirname(__file__))
from shape import sgemm_ceiling, side_by_side  # noqa: E402


def loop(f, n):
    def run():
        for _ in range(n):
            f()
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args()
    torch.set_num_threads(1)
    H = I = a.size
    print(f"torch {torch.__version__}, f32, I = H = {H}, cores {sorted(os.sched_getaffinity(0))}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; medians of "
          f"{a.repeats} interleaved rounds")
    print(sgemm_ceiling(a.repeats))

    cell = cellc.compile(cellc.nn.LSTM_CELL)
    module = cellc.nn.LSTM(I, H)
    ref = torch.nn.LSTMCell(I, H)
    with torch.no_grad():
        for w, v in ((ref.weight_ih, module.weight_ih_l0), (ref.weight_hh, module.weight_hh_l0),
                     (ref.bias_ih, module.bias_ih_l0), (ref.bias_hh, module.bias_hh_l0)):
            w.copy_(v)
    params = {"W_ih": ref.weight_ih.detach(), "W_hh": ref.weight_hh.detach(),
              "b_ih": ref.bias_ih.detach(), "b_hh": ref.bias_hh.detach()}

    print("\none step under no_grad, microseconds")
    print(f"{'B':>5} {'LSTMCell':>9} {'Cell.step':>10} {'nn.LSTM.step':>13} {'call T=1':>9} "
          f"{'nn T=1':>7} {'step vs torch':>14} {'nn vs step':>11} {'nn T=1 vs torch':>16} "
          f"{'nn T=1 vs step':>15} {'GFLOP/s':>8}")
    for B in a.batches:
        x = torch.randn(B, I)
        h, c = torch.randn(B, H), torch.randn(B, H)
        st, hx = {"h": h, "c": c}, (h[None], c[None])
        n = max(3, 3000 // B)
        runs = {"torch": loop(lambda: ref(x, (h, c)), n),
                "step": loop(lambda: cell.step(x, params, st), n),
                "nn": loop(lambda: module.step(x, hx), n),
                "call": loop(lambda: cell(x[None], params, st), n),
                "nn_call": loop(lambda: module(x[None], hx), n)}
        with torch.no_grad():
            for f in runs.values():
                f()
            med = side_by_side(runs, a.repeats)
        us = {k: v / n * 1e6 for k, v in med.items()}
        flops = 2 * 2 * B * 4 * H * I
        print(f"{B:>5} {us['torch']:>9.0f} {us['step']:>10.0f} {us['nn']:>13.0f} "
              f"{us['call']:>9.0f} {us['nn_call']:>7.0f} {us['torch'] / us['step']:>13.2f}x "
              f"{us['nn'] / us['step']:>10.2f}x {us['torch'] / us['nn_call']:>15.2f}x "
              f"{us['nn_call'] / us['nn']:>14.2f}x {flops / us['step'] / 1e3:>8.1f}")

    print("\na sequence under no_grad (inference), milliseconds")
    print(f"{'B x T':>10} {'nn.LSTM':>9} {'cellc':>8} {'vs torch':>9} {'GFLOP/s':>8}")
    lstm = torch.nn.LSTM(I, H)
    with torch.no_grad():
        for w, v in ((lstm.weight_ih_l0, ref.weight_ih), (lstm.weight_hh_l0, ref.weight_hh),
                     (lstm.bias_ih_l0, ref.bias_ih), (lstm.bias_hh_l0, ref.bias_hh)):
            w.copy_(v)
    for B, T in ((64, 100),):
        x = torch.randn(T, B, I)
        runs = {"torch": lambda: lstm(x), "cellc": lambda: cell(x, params)}
        with torch.no_grad():
            torch.testing.assert_close(cell(x, params)[0], lstm(x)[0], rtol=1e-4, atol=1e-5)
            med = side_by_side(runs, a.repeats)
        flops = 2 * 2 * T * B * 4 * H * I
        print(f"{f'{B} x {T}':>10} {med['torch'] * 1e3:>9.1f} {med['cellc'] * 1e3:>8.1f} "
              f"{med['torch'] / med['cellc']:>8.2f}x {flops / med['cellc'] / 1e9:>8.1f}")


if __name__ == "__main__":
    main()
