//===- Sgemm.h - cellc's own f32 GEMM on AVX-512 ----------------*- C++ -*-===//
//
// The whole-sequence GEMMs of a training call (the input projection, the
// input gradient, the weight gradients) on a register-blocked AVX-512
// kernel: 6 rows by 64 columns of C in 24 registers, B packed into 64-column
// panels once a block, A's six rows copied where they would alias in L1.
// On the Zen 4 VM it ran these shapes at 1.03x to 1.20x OpenBLAS's sgemm
// (bench/cpu/gemms.py). HostBlas's `gemm` takes it for f32 on a CPU with
// AVX-512, unless CELLC_CPU_GEMM=openblas.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_SGEMM_H
#define CELLC_RUNTIME_CPU_SGEMM_H

#include <cstdint>

namespace cellc::runtime::host {

/// Whether this process runs f32 GEMMs on `sgemm` below: the CPU has
/// AVX-512F and CELLC_CPU_GEMM is not "openblas". Read once.
bool ownSgemm();

/// Row-major `c = op(a) op(b) + beta c`, one thread, for m, n and k of 1 or
/// more (HostBlas's `gemm` takes the empty products; this returns at once).
/// With `beta` 0, `c` is only written (NaNs in it stay out). Needs AVX-512F
/// (`ownSgemm`).
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/// `sgemm` on `threads` of the runtime's pool: they pack each block of B
/// once between them, then each computes a share of C's rows against it.
void parallelSgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                   int threads);

/// Whether `parallelSgemmPair` takes a first product of `n1` columns: a
/// whole number of the kernel's 64-column panels, so that no panel
/// straddles the two.
bool sgemmPairFits(int64_t n1);

/// Two products that share op(a), as one over n1 + n2 columns:
/// `c1 = op(a) op(b1) + beta c1` (n1 columns) and `c2 = op(a) op(b2) +
/// beta c2` (n2), op(a) packed once for both where two calls would pack it
/// twice (an LSTM's weight gradients dW_ih and dW_hh: dG^T against x and
/// against h). n1 as `sgemmPairFits` says; `threads` as `parallelSgemm`'s
/// (1: the calling thread).
void parallelSgemmPair(bool transA, bool transB, int64_t m, int64_t n1, int64_t n2, int64_t k,
                       const float *a, int64_t lda, const float *b1, int64_t ldb1,
                       const float *b2, int64_t ldb2, float beta, float *c1, int64_t ldc1,
                       float *c2, int64_t ldc2, int threads);

} // namespace cellc::runtime::host

#endif // CELLC_RUNTIME_CPU_SGEMM_H
