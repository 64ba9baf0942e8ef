//===- ChunkCore.h - The chunk form's diagonal core on the CPU --*- C++ -*-===//
//
// The core of a linear-recurrence state with scalar or row gates, outer-
// product sources and reads q @ S after the update (GLA, RetNet, mLSTM), in
// the chunkwise form, forward and its written-out adjoint: what
// cellc/_chunkcore.py's _DiagonalCore computes, per (sample, head) on the
// runtime's threads, with the chunk-sized products on a register-blocked
// AVX-512 kernel (smallSgemm; the host GEMM for f64 and elsewhere).
//
// The sequences are time-major, as the step's values are: a, k and each q
// [T, BH, K], v and each output [T, BH, V] (a chunk's rows of one sample and
// head are gathered into a block and its results scattered back). The
// states are [BH, K, V]; `starts` [BH, NC, K, V] is the state at each
// chunk's start (NC = ceil(T / L)). Within a chunk the log-gates are
// summed from its start. A row gate's pairs factor through the chunk's
// start (q e^A times k e^-A) where no |cumulative log-gate| passes 40;
// elsewhere every exponent taken is <= 0 where the gates are <= 1: a
// scalar gate's pairs directly, a row gate's through a reference row per
// sub-chunk of 16 (pairs on the diagonal blocks only). The heads step
// through the chunks together, each chunk's heads one after another: their
// rows lie side by side in the time-major arrays.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_CHUNKCORE_H
#define CELLC_RUNTIME_CPU_CHUNKCORE_H

#include "runtime/cpu/CpuCell.h"

#include <cstdint>

namespace cellc::runtime::chunk {

struct Shape {
  /// Samples times heads, steps, the state's rows and columns, the chunk.
  int64_t BH = 0, T = 0, K = 0, V = 0, L = 64;
  int reads = 1;
  /// The gate varies along K (a row gate); else a[t, :] is one value.
  bool rows = true;
  int64_t chunks() const { return (T + L - 1) / L; }
};

/// outs[r] = the reads; starts, end: the state at each chunk's start and
/// after the last step; pairs [BH, NC, reads, L, L]: each read's pair
/// weights, which the backward reads back.
void forward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
             const void *S0, const void *const *qs, void *const *outs, void *starts,
             void *end, void *pairs, int threads);

/// The gradients of a, k, v, S0 and each q from those of the reads (a null
/// douts[r]: zero) and of the end state (null: zero). Every output is
/// written whole.
void backward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
              const void *starts, const void *end, const void *pairs, const void *const *qs,
              const void *const *douts, const void *dEnd, void *da, void *dk, void *dv,
              void *dS0, void *const *dqs, int threads);

/// The delta rule's core with a scalar gate (DeltaNet, gated DeltaNet):
/// a and beta [T, BH] (one value a step), k [T, BH, K], the targets w
/// [T, BH, V]; the state passes as S' = e^{A_L} S + (k e^{A_L - A})^T U with
/// U = (I + beta k k^T e^{A_i - A_j} below the diagonal)^-1 beta (w - e^A k S).
void deltaForward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                  const void *beta, const void *S0, const void *const *qs, void *const *outs,
                  void *starts, void *end, int threads);
void deltaBackward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                   const void *beta, const void *starts, const void *end,
                   const void *const *qs, const void *const *douts, const void *dEnd, void *da,
                   void *dk, void *dw, void *dbeta, void *dS0, void *const *dqs, int threads);

} // namespace cellc::runtime::chunk

#endif // CELLC_RUNTIME_CPU_CHUNKCORE_H
