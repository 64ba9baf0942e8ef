#!/usr/bin/env python3
"""CPU benchmark in one process: cellc (through its Python package) against
torch.nn.LSTM / GRU, oneDNN's LSTM / GRU training primitives, and a PyTorch
loop for a custom cell. Every implementation runs once per round, in turn, so
that drift in the machine's speed hits all alike, each after the OpenMP
threads of the one before have parked (shape.settle); figures are medians over
the rounds, forward plus backward of `out.sum()` (the gradients of the input
and every weight, written fresh each round: set to None before, as oneDNN
writes its own).

Before anything is timed, oneDNN's outputs and gradients are checked against
torch's, and cellc's against torch's.

The ceilings, measured in the same run: OpenBLAS's sgemm at 1024^3, and the
cores' peak of f32 multiply-adds (chains of FMAs with nothing from memory);
'oneDNN %' and 'cellc %' are each one's rate over the peak, which says how
much faster any implementation of the same products could be.

Run it through bench/cpu/run.sh, which pins the process and the BLAS threads:
one core means `taskset -c 0`, OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1
for torch, oneDNN and cellc alike.

  PYTHONPATH=build/python python3 bench/cpu/compare.py --threads 1
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

import cellc

sys.path.insert(0, os.path.dirname(__file__))
from shape import settle, sgemm_gflops  # noqa: E402
from torch_rnn import PeepholeLoop  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEEPHOLE = os.path.join(HERE, "..", "..", "examples", "peephole_lstm.cell")


class OneDNN:
    """oneDNN's LSTM / GRU through bench/cpu/onednn_rnn.cpp."""

    def __init__(self, build):
        path = os.path.join(build, "lib", "libcellc_onednn_bench.so")
        self.lib = ctypes.CDLL(path) if os.path.exists(path) else None
        if self.lib:
            f = self.lib.cellc_onednn_rnn
            P = ctypes.POINTER
            f.argtypes = ([ctypes.c_char_p] + [ctypes.c_int] * 4 +
                          [ctypes.c_void_p] * 10 + [ctypes.c_int, P(ctypes.c_double),
                                                    P(ctypes.c_double), ctypes.c_char_p,
                                                    ctypes.c_size_t])

    def run(self, name, ref, x, repeats=1):
        """Outputs, gradients (x, W_ih, W_hh, bias) and median ms (fwd, fwd+bwd)."""
        T, B, I = x.shape
        H = ref.hidden_size
        G = 4 if name == "lstm" else 3
        out = torch.empty(T, B, H)
        dx = torch.empty(T, B, I)
        dwih, dwhh, db = torch.empty(G * H, I), torch.empty(G * H, H), torch.empty(G * H)
        fwd, both = ctypes.c_double(), ctypes.c_double()
        err = ctypes.create_string_buffer(1024)
        p = lambda t: ctypes.c_void_p(t.data_ptr())
        w = [t.detach().contiguous() for t in (ref.weight_ih_l0, ref.weight_hh_l0,
                                               ref.bias_ih_l0, ref.bias_hh_l0)]
        xc = x.detach().contiguous()
        rc = self.lib.cellc_onednn_rnn(name.encode(), T, B, I, H, p(xc), *map(p, w),
                                       p(out), p(dx), p(dwih), p(dwhh), p(db), repeats,
                                       ctypes.byref(fwd), ctypes.byref(both), err,
                                       len(err))
        if rc:
            raise RuntimeError("oneDNN: " + err.value.decode())
        return (out, dx, dwih, dwhh, db), (fwd.value, both.value)


def timed_once(fn):
    settle()
    t0 = time.perf_counter()
    loss = fn()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def close(a, b, what, tol=2e-3):
    err = ((a - b).abs().max() / (b.abs().max() + 1e-6)).item()
    if err > tol:
        raise AssertionError(f"{what}: relative error {err:.2e} over {tol:.0e}")
    return err


def flops(name, T, B, I, H):
    """Forward plus backward: the forward's products, and twice them back."""
    G = 4 if name == "lstm" else 3
    return 3 * 2 * T * B * G * H * (I + H)


def fma_peak(build, threads, repeats):
    """The cores' f32 FMA peak in GFLOP/s on `threads` threads, measured in
    this run (bench/cpu/sgemm_bench.cpp's cellc_fma_peak), or 0: the ceiling
    that no product passes, where sgemm's is one library's."""
    path = os.path.join(build, "lib", "libcellc_sgemm_bench.so")
    if not os.path.exists(path):
        return 0.0
    f = getattr(ctypes.CDLL(path), "cellc_fma_peak", None)
    if f is None:
        return 0.0  # a library built before the probe
    f.argtypes, f.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_double
    return f(threads, repeats)


def of_peak(flop, ms, peak):
    """`flop` in `ms` as a share of `peak` GFLOP/s."""
    return f"{100 * flop / ms / 1e6 / peak:.0f}%" if peak and ms == ms else "-"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--build", default=os.path.join(HERE, "..", "..", "build"))
    p.add_argument("--cells", nargs="+", default=["lstm", "gru"])
    p.add_argument("--shapes", nargs="+", default=["64x100", "8x500", "256x50"])
    p.add_argument("--peephole", type=int, default=128, help="H of the peephole LSTM (0: skip)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    onednn = OneDNN(a.build)
    H = I = a.size
    print(f"torch {torch.__version__}, oneDNN 2.6 ({'found' if onednn.lib else 'not built'}), "
          f"f32, I = H = {H}, {a.threads} thread(s), cores {sorted(os.sched_getaffinity(0))}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"medians of {a.repeats} interleaved rounds, ms (forward + backward)")
    # The ceiling: OpenBLAS's sgemm on as many threads, measured in this run.
    ceiling, core = sgemm_gflops(a.repeats)
    print(f"ceiling: sgemm 1024^3 {ceiling:.1f} GFLOP/s on {a.threads} thread(s) "
          f"(OpenBLAS's {core} kernels); 'of sgemm' is cellc's GFLOP/s (none) over it; "
          f"cellc's f32 GEMMs on {cellc._cellc_runtime.gemm_library()}")
    peak = fma_peak(a.build, a.threads, a.repeats)
    print(f"peak: f32 FMAs {peak:.1f} GFLOP/s on {a.threads} thread(s) (chains of FMAs, nothing "
          f"from memory); 'oneDNN %' and 'cellc %' are their GFLOP/s (cellc's none) over it"
          if peak else "peak: not measured (no lib/libcellc_sgemm_bench.so, or no FMA)")
    print(f"{'cell':<6} {'B x T':>9} {'torch':>8} {'oneDNN':>8} {'none':>8} {'full':>8} "
          f"{'chunk:16':>9} {'vs torch':>9} {'vs oneDNN':>9} {'GFLOP/s':>8} {'of sgemm':>9} "
          f"{'full/none':>9} {'oneDNN %':>8} {'cellc %':>8}")
    for name in a.cells:
        for shape in a.shapes:
            B, T = map(int, shape.split("x"))
            torch.manual_seed(0)
            ref = (torch.nn.LSTM if name == "lstm" else torch.nn.GRU)(I, H)
            mine = (cellc.nn.LSTM if name == "lstm" else cellc.nn.GRU)(I, H)
            mine.load_state_dict(ref.state_dict())
            for m in mine.modules():
                if hasattr(m, "cell"):
                    m.cell.threads = a.threads
            x = torch.randn(T, B, I, requires_grad=True)
            # The checks, before any timing: torch's results are the reference.
            out = ref(x)[0]
            out.sum().backward()
            want = (out.detach(), x.grad.clone(), ref.weight_ih_l0.grad.clone(),
                    ref.weight_hh_l0.grad.clone(), ref.bias_ih_l0.grad.clone())
            x.grad = None
            mine.recompute = "none"
            got = mine(x)[0]
            got.sum().backward()
            mine_grads = (got.detach(), x.grad, mine.weight_ih_l0.grad,
                          mine.weight_hh_l0.grad, mine.bias_ih_l0.grad)
            for g, w, what in zip(mine_grads, want, ["out", "dx", "dW_ih", "dW_hh", "db"]):
                close(g, w, f"cellc {name} {what}")
            if onednn.lib:
                results, _ = onednn.run(name, ref, x, repeats=1)
                for g, w, what in zip(results, want, ["out", "dx", "dW_ih", "dW_hh", "db"]):
                    close(g, w, f"oneDNN {name} {what}")
            times = {k: [] for k in ["torch", "oneDNN", "none", "full", "chunk:16"]}
            def fresh_grads():
                # Each round writes its gradients, as oneDNN's does, instead
                # of adding them to the last round's (torch's accumulation,
                # a parallel add over every gradient, is not the RNN's).
                x.grad = None
                ref.zero_grad(set_to_none=True)
                mine.zero_grad(set_to_none=True)

            for _ in range(a.repeats + 1):
                fresh_grads()
                times["torch"].append(timed_once(lambda: ref(x)[0].sum())[1])
                if onednn.lib:
                    settle()
                    times["oneDNN"].append(onednn.run(name, ref, x, repeats=1)[1][1])
                for mode in ["none", "full", "chunk:16"]:
                    mine.recompute = mode
                    fresh_grads()
                    times[mode].append(timed_once(lambda: mine(x)[0].sum())[1])
            med = {k: statistics.median(v[1:]) if v else float("nan") for k, v in times.items()}
            gflops = flops(name, T, B, I, H) / med["none"] / 1e6
            print(f"{name:<6} {B:>4} x {T:<4}{med['torch']:8.1f} {med['oneDNN']:8.1f} "
                  f"{med['none']:8.1f} {med['full']:8.1f} {med['chunk:16']:9.1f} "
                  f"{med['torch'] / med['none']:8.2f}x {med['oneDNN'] / med['none']:8.2f}x "
                  f"{gflops:8.1f} {100 * gflops / ceiling:8.0f}% "
                  f"{med['full'] / med['none']:8.2f}x "
                  f"{of_peak(flops(name, T, B, I, H), med['oneDNN'], peak):>8} "
                  f"{of_peak(flops(name, T, B, I, H), med['none'], peak):>8}", flush=True)
    if a.peephole:
        Hp = a.peephole
        torch.manual_seed(0)
        loop = PeepholeLoop(Hp, Hp)
        cell = cellc.compile(PEEPHOLE, threads=a.threads)
        params = {"W_ih": loop.w_ih, "W_hh": loop.w_hh, "b": loop.b,
                  "p_i": loop.p_i, "p_f": loop.p_f, "p_o": loop.p_o}
        x = torch.randn(100, 64, Hp, requires_grad=True)
        close(cell(x, params)[0].detach(), loop(x)[0].detach(), "cellc peephole out")
        times = {"loop": [], "none": [], "full": []}
        for _ in range(a.repeats + 1):
            times["loop"].append(timed_once(lambda: loop(x)[0].sum())[1])
            for mode in ["none", "full"]:
                times[mode].append(timed_once(
                    lambda: cell(x, params, recompute=mode)[0].sum())[1])
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        print(f"peephole LSTM, B = 64, T = 100, H = I = {Hp}: PyTorch loop {med['loop']:.1f}, "
              f"cellc none {med['none']:.1f} ({med['loop'] / med['none']:.2f}x), "
              f"full {med['full']:.1f} ({med['loop'] / med['full']:.2f}x)")


if __name__ == "__main__":
    main()
