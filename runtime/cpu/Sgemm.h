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

} // namespace cellc::runtime::host

#endif // CELLC_RUNTIME_CPU_SGEMM_H
