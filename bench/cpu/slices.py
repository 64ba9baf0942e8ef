#!/usr/bin/env python3
"""Threads on one sequence: cellc's kernels with the threads of a batch tile
splitting its units (unit slices: `cellc.compile(..., unit_slices=True)`)
against the same threads splitting its rows (`unit_slices=False`, each
thread a tile of its share), against one thread, and against
torch.nn.LSTM / GRU on the same threads. Side by side in
one process, interleaved rounds, medians; training (forward plus backward of
`out.sum()`, recompute `none`) and inference (`no_grad`).

The threads are set in the process for everyone: `taskset`,
OPENBLAS_NUM_THREADS and OMP_NUM_THREADS, torch.set_num_threads. cellc's
"1 thread" runs its kernels and host loops on one thread, with OpenBLAS's
GEMMs still on the process's threads.

  OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 PYTHONPATH=build/python \\
    taskset -c 0,1 python3 bench/cpu/slices.py --threads 2
"""

import argparse
import os
import sys

import torch

import cellc

sys.path.insert(0, os.path.dirname(__file__))
from shape import sgemm_ceiling, side_by_side  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--cells", nargs="+", default=["lstm", "gru"])
    p.add_argument("--shapes", nargs="+", default=["64x100", "8x500", "256x50", "16x100"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--barrier-steps", type=int, default=20000,
                   help="steps of the barrier probe (0: skip it)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    H = I = a.size
    print(f"torch {torch.__version__}, f32, I = H = {H}, {a.threads} threads, cores "
          f"{sorted(os.sched_getaffinity(0))}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}; medians of {a.repeats} interleaved "
          f"rounds")
    print(sgemm_ceiling(a.repeats, a.threads))

    print(f"\n{'cell':>5} {'B x T':>8} {'what':>9} {'torch':>8} {'1 thread':>9} {'rows':>8} "
          f"{'slices':>8} {'split':>6} {'slices/1':>9} {'slices/rows':>12} {'vs torch':>9}"
          f" {'GFLOP/s':>8}")
    for name in a.cells:
        path = os.path.join(HERE, "..", "..", "examples", f"{name}.cell")
        cells = {slices: cellc.compile(path, threads=a.threads, unit_slices=slices)
                 for slices in (True, False)}
        G = 4 if name == "lstm" else 3
        ref = (torch.nn.LSTM if name == "lstm" else torch.nn.GRU)(I, H)
        params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
                  "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}
        for shape in a.shapes:
            B, T = map(int, shape.split("x"))
            x = torch.randn(T, B, I, requires_grad=True)
            sizes = {"H": H, "I": I}
            compiled = {s: c.jit(sizes, torch.float32, batch=B) for s, c in cells.items()}
            split = compiled[True].thread_split(B)

            def ours(threads, slices, train):
                cell = cells[slices]

                def run():
                    compiled[slices].threads = threads
                    if train:
                        out, _ = cell(x, params, recompute="none")
                        out.sum().backward()
                    else:
                        with torch.no_grad():
                            cell(x, params)
                return run

            def theirs(train):
                def run():
                    if train:
                        ref(x)[0].sum().backward()
                    else:
                        with torch.no_grad():
                            ref(x)
                return run

            for train in (True, False):
                runs = {"torch": theirs(train), "one": ours(1, True, train),
                        "rows": ours(a.threads, False, train),
                        "slices": ours(a.threads, True, train)}
                for f in runs.values():
                    f()
                med = side_by_side(runs, a.repeats)
                compiled[True].threads = a.threads
                ms = {k: v * 1e3 for k, v in med.items()}
                flops = 2 * T * B * G * H * (I + H) * (3 if train else 1)
                print(f"{name:>5} {shape:>8} {'train' if train else 'infer':>9} "
                      f"{ms['torch']:>8.1f} {ms['one']:>9.1f} {ms['rows']:>8.1f} "
                      f"{ms['slices']:>8.1f} {'%dx%d' % split:>6} "
                      f"{ms['one'] / ms['slices']:>8.2f}x {ms['rows'] / ms['slices']:>11.2f}x "
                      f"{ms['torch'] / ms['slices']:>8.2f}x "
                      f"{flops / ms['slices'] / 1e6:>8.1f}")

    if a.barrier_steps and a.threads > 1:
        barrier_probe(a)


def barrier_probe(a):
    """What a barrier costs: an LSTM so small (H = 16, B = 1) that a step is
    little more than its barriers (3 in the forward: after the reset copy,
    the product and the element phase), under no_grad, per step, on one
    thread and on the slices of one tile."""
    cell = cellc.compile(os.path.join(HERE, "..", "..", "examples", "lstm.cell"),
                         threads=a.threads)
    H, T = 16, a.barrier_steps
    x = torch.randn(T, 1, H)
    params = {"W_ih": torch.randn(4 * H, H) * 0.1, "W_hh": torch.randn(4 * H, H) * 0.1,
              "b_ih": torch.zeros(4 * H), "b_hh": torch.zeros(4 * H)}
    compiled = cell.jit({"H": H, "I": H}, torch.float32, batch=1)

    def run(threads):
        def go():
            compiled.threads = threads
            with torch.no_grad():
                cell(x, params)
        return go

    runs = {"one": run(1), "slices": run(a.threads)}
    for f in runs.values():
        f()
    med = side_by_side(runs, a.repeats)
    compiled.threads = a.threads
    one, many = (med[k] / T * 1e6 for k in ("one", "slices"))
    print(f"\nbarrier probe: LSTM H = 16, B = 1, T = {T}, no_grad, per step: 1 thread "
          f"{one:.2f} us, {a.threads} slices {many:.2f} us; 3 barriers a step: about "
          f"{max(many - one, 0) / 3:.2f} us a barrier beyond the step's own work")


if __name__ == "__main__":
    main()
