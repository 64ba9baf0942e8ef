#!/usr/bin/env python3
"""The whole-sequence GEMMs of one LSTM training call in OpenBLAS, in
cellc's own AVX-512 kernel (runtime/cpu/Sgemm.cpp, which the runtime runs
f32 GEMMs on where the CPU has AVX-512F), in BLIS (Debian's libblis, where
installed) and in oneDNN's sgemm: GFLOP/s of each, side by side in one
process. oneDNN's RNN primitives run them on its own JIT GEMMs. Where cellc
trails oneDNN on the CPU (bench/cpu/compare.py), this says how much of it
is the GEMMs.

--rows 1024 measures them as the driver calls them: a chunk of 16 steps of
B = 64 at a time, the projection and the input gradient 1024 rows, the
weight gradient 1024 deep, adding to C (beta 1).

On more than one thread each OpenBLAS and BLIS GEMM is split by rows of C
into single-threaded calls, one a thread, as cellc's runtime splits an
OpenBLAS GEMM (parallelGemm); cellc's kernel runs on the runtime's threads,
which share B's packed blocks (parallelSgemm); oneDNN's sgemm runs on its
own threads. Each run starts
after the OpenMP threads of the one before have parked (shape.settle).

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 taskset -c 0 \\
    python3 bench/cpu/gemms.py --threads 1
"""

import argparse
import ctypes
import os
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(__file__))
from shape import settle, side_by_side  # noqa: E402

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def libraries(build):
    openblas = ctypes.CDLL("libopenblas.so.0")
    openblas.cblas_sgemm.argtypes = ([ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                     ctypes.c_float, ctypes.c_void_p, ctypes.c_int])
    try:
        onednn = ctypes.CDLL("libdnnl.so.2")
        i64 = ctypes.c_int64
        onednn.dnnl_sgemm.argtypes = ([ctypes.c_char, ctypes.c_char, i64, i64, i64,
                                       ctypes.c_float, ctypes.c_void_p, i64, ctypes.c_void_p,
                                       i64, ctypes.c_float, ctypes.c_void_p, i64])
    except OSError:
        onednn = None
    try:
        blis = ctypes.CDLL("libblis.so.4")
        blis.cblas_sgemm.argtypes = openblas.cblas_sgemm.argtypes
    except OSError:
        blis = None
    try:
        cellc = ctypes.CDLL(os.path.join(build, "lib", "libcellc_sgemm_bench.so"))
        i64 = ctypes.c_int64
        cellc.cellc_sgemm.argtypes = ([ctypes.c_int, ctypes.c_int, i64, i64, i64,
                                       ctypes.c_void_p, i64, ctypes.c_void_p, i64,
                                       ctypes.c_float, ctypes.c_void_p, i64, ctypes.c_int])
        if not cellc.cellc_own_sgemm():
            cellc = None
    except OSError:
        cellc = None
    return openblas, onednn, blis, cellc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "build"),
                   help="cellc's build directory (for lib/libcellc_sgemm_bench.so)")
    p.add_argument("--rows", type=int, default=0,
                   help="rows of a chunk (the driver's: 1024), each GEMM adding to C; "
                        "0: the whole sequence at once")
    a = p.parse_args()
    openblas, onednn, blis, cellc = libraries(a.build)
    TB, H, G = a.rows or a.batch * a.steps, a.size, 4 * a.size
    beta = 1.0 if a.rows else 0.0
    # C = op(A) op(B), row-major: (name, transA, transB, M, N, K, A, B).
    x, w, dg = torch.randn(TB, H), torch.randn(G, H), torch.randn(TB, G)
    gemms = [("projection X W_ih^T", False, True, TB, G, H, x, w),
             ("input gradient dG W_ih", False, False, TB, H, G, dg, w),
             ("weight gradient dG^T X", True, False, G, H, TB, dg, x)]
    print(f"LSTM B = {a.batch}, T = {a.steps}, I = H = {H}: the GEMMs of one training call "
          f"(the weight gradient twice), {a.threads} thread(s), cores "
          f"{sorted(os.sched_getaffinity(0))}; GFLOP/s, medians of {a.repeats} interleaved "
          f"rounds")
    print(f"{'GEMM':<24} {'M x N x K':>18} {'OpenBLAS':>9} {'cellc':>9} {'BLIS':>9} "
          f"{'oneDNN':>9} {'cellc/OB':>9} {'BLIS/OB':>8} {'oneDNN/OB':>10}")
    for name, ta, tb, M, N, K, A, B in gemms:
        C = torch.zeros(M, N)
        lda, ldb = A.shape[1], B.shape[1]

        def split(lib):
            def rows(r0, r1):
                at = A.data_ptr() + 4 * (r0 if ta else r0 * lda)
                lib.cblas_sgemm(ROW_MAJOR, TRANS if ta else NO_TRANS,
                                TRANS if tb else NO_TRANS, r1 - r0, N, K, 1.0, at, lda,
                                B.data_ptr(), ldb, beta, C.data_ptr() + 4 * r0 * N, N)

            def run():
                parts = [(M * i // a.threads, M * (i + 1) // a.threads)
                         for i in range(a.threads)]
                others = [threading.Thread(target=rows, args=part) for part in parts[1:]]
                for t in others:
                    t.start()
                rows(*parts[0])
                for t in others:
                    t.join()
            return run

        runs = {"OpenBLAS": split(openblas)}
        if cellc:
            runs["cellc"] = lambda: cellc.cellc_sgemm(
                int(ta), int(tb), M, N, K, A.data_ptr(), lda, B.data_ptr(), ldb, beta,
                C.data_ptr(), N, a.threads)
        if blis:
            runs["BLIS"] = split(blis)
        if onednn:
            runs["oneDNN"] = lambda: onednn.dnnl_sgemm(
                b"T" if ta else b"N", b"T" if tb else b"N", M, N, K, 1.0, A.data_ptr(), lda,
                B.data_ptr(), ldb, beta, C.data_ptr(), N)
        for f in runs.values():
            f()
        med = side_by_side(runs, a.repeats, before_each=settle)
        rate = {k: 2 * M * N * K / t / 1e9 for k, t in med.items()}
        mine = rate["OpenBLAS"]
        nan = float("nan")
        own, other, theirs = (rate.get(k, nan) for k in ("cellc", "BLIS", "oneDNN"))
        print(f"{name:<24} {f'{M} x {N} x {K}':>18} {mine:9.1f} {own:9.1f} {other:9.1f} "
              f"{theirs:9.1f} {own / mine:8.2f}x {other / mine:7.2f}x {theirs / mine:9.2f}x")


if __name__ == "__main__":
    main()
