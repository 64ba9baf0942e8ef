//===- HostBlas.h - The CPU backend's GEMMs and host loops ------*- C++ -*-===//
//
// What the CPU backend does besides the kernels: the whole-sequence GEMMs
// on cellc's own AVX-512 kernel or OpenBLAS, split over the runtime's
// threads, and the host loops of the driver's backend interface (column
// sums, rows filled from vectors).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_HOSTBLAS_H
#define CELLC_RUNTIME_CPU_HOSTBLAS_H

#include "runtime/cpu/CpuCell.h"

#include <cstdint>
#include <vector>

namespace cellc::runtime::host {

/// Row-major `c = op(a) op(b) + beta c`: f32 on cellc's own AVX-512 kernel
/// where the CPU has it (Sgemm.h), else on OpenBLAS; a GEMV for one row.
void gemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
          int64_t ldc);

/// Host loops split across threads when they are at least this many
/// elements a thread: below it, a wake costs more than it saves.
inline constexpr int64_t kHostGrain = int64_t(1) << 15;

/// `acc[j] += sum over rows of m[row, j]` (or `+= v[j]` with rows = 1), each
/// thread a range of columns.
void addColumnSums(DType dtype, const void *m, int64_t rows, int64_t cols, void *acc,
                   int threads = 1);

/// `gemm` split over `threads` of the pool: on cellc's kernel, rows of C
/// against B's blocks packed once; on OpenBLAS, by the rows of C or, with
/// fewer rows than threads, its columns, each part a single-threaded call.
void parallelGemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                  void *c, int64_t ldc, int threads);

/// Two products that share op(a): `c1 = op(a) op(b1) + beta c1` (n1
/// columns) and `c2 = op(a) op(b2) + beta c2` (n2). On cellc's kernel, one
/// product over n1 + n2 columns that packs op(a) once (`parallelSgemmPair`;
/// profiled as that shape); elsewhere, or where n1 does not fill whole
/// panels, two `parallelGemm` calls.
void parallelGemmPair(DType dtype, bool transA, bool transB, int64_t m, int64_t n1, int64_t n2,
                      int64_t k, const void *a, int64_t lda, const void *b1, int64_t ldb1,
                      const void *b2, int64_t ldb2, double beta, void *c1, int64_t ldc1,
                      void *c2, int64_t ldc2, int threads);

/// The GEMMs `parallelGemm` ran while the profile was on, a row a shape.
struct GemmProfileRow {
  bool transA, transB;
  int64_t m, n, k;
  /// "cellc-avx512" or "openblas": what ran it.
  const char *library;
  int64_t calls;
  double seconds;
};

/// Turns the GEMM profile on (emptied) or off. While on, each
/// `parallelGemm` call's wall time is added to its shape's row.
void setGemmProfile(bool on);

/// The profile's rows, in the order their shapes first ran.
std::vector<GemmProfileRow> gemmProfile();

/// What runs the f32 GEMMs whose C fills cellc's kernel's panels:
/// "cellc-avx512" or "openblas".
const char *gemmLibrary();

/// `m[row, :]` = the sum of `vectors` for every row, each thread a range of
/// rows.
void fillRows(DType dtype, void *m, int64_t rows, int64_t cols,
              const std::vector<const void *> &vectors, int threads = 1);

} // namespace cellc::runtime::host

#endif // CELLC_RUNTIME_CPU_HOSTBLAS_H
