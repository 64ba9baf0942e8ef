//===- sgemm_bench.cpp - cellc's own sgemm, for bench/cpu/gemms.py --------===//
//
// A C entry to the runtime's AVX-512 GEMM (runtime/cpu/Sgemm.h), loaded
// with ctypes beside OpenBLAS, BLIS and oneDNN.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Sgemm.h"

#include <cstdint>

extern "C" {

/// 1 where the runtime runs f32 GEMMs on its own kernel.
int cellc_own_sgemm() { return cellc::runtime::host::ownSgemm() ? 1 : 0; }

/// Row-major `c = op(a) op(b) + beta c` on cellc's kernel: `threads` of the
/// runtime's pool sharing B's packed blocks, as the runtime calls it.
void cellc_sgemm(int transA, int transB, int64_t m, int64_t n, int64_t k, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                 int threads) {
  cellc::runtime::host::parallelSgemm(transA != 0, transB != 0, m, n, k, a, lda, b, ldb, beta,
                                      c, ldc, threads);
}
}
