//===- ChunkCore.cpp - The chunk form's diagonal core on the CPU ----------===//

#include "runtime/cpu/ChunkCore.h"

#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace cellc::runtime::chunk {
namespace {

/// The sub-chunk of a row gate's pairs: below the diagonal blocks, products
/// of rescaled q and k; on them, pair by pair.
constexpr int64_t kSub = 16;

template <typename F> DType dtypeOf();
template <> DType dtypeOf<float>() { return DType::F32; }
template <> DType dtypeOf<double>() { return DType::F64; }

/// Row-major `c = op(a) op(b) + beta c`.
template <typename F>
void mm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const F *a, int64_t lda,
        const F *b, int64_t ldb, double beta, F *c, int64_t ldc) {
  host::gemm(dtypeOf<F>(), ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

#define CELLC_CHUNK_ISA baseline
#include "runtime/cpu/ChunkCoreLoops.inc"
#undef CELLC_CHUNK_ISA
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
#define CELLC_CHUNK_ISA avx512
#include "runtime/cpu/ChunkCoreLoops.inc"
#undef CELLC_CHUNK_ISA
#pragma GCC pop_options

/// Whether the loops run on AVX-512 (checked once).
bool wide() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq");
  return has;
}

template <typename F> const F *const *typed(const void *const *p) {
  return reinterpret_cast<const F *const *>(p);
}

} // namespace

void forward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
             const void *S0, const void *const *qs, void *const *outs, void *starts,
             void *end, void *pairs, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        (wide() ? avx512::forwardOne<F> : baseline::forwardOne<F>)(s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
                      static_cast<const F *>(v), static_cast<const F *>(S0), typed<F>(qs),
                      reinterpret_cast<F *const *>(outs), static_cast<F *>(starts),
                      static_cast<F *>(end), static_cast<F *>(pairs));
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

void backward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
              const void *starts, const void *end, const void *pairs, const void *const *qs,
              const void *const *douts, const void *dEnd, void *da, void *dk, void *dv,
              void *dS0, void *const *dqs, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        (wide() ? avx512::backwardOne<F> : baseline::backwardOne<F>)(s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
                       static_cast<const F *>(v), static_cast<const F *>(starts),
                       static_cast<const F *>(end), static_cast<const F *>(pairs),
                       typed<F>(qs), typed<F>(douts),
                       static_cast<const F *>(dEnd), static_cast<F *>(da),
                       static_cast<F *>(dk), static_cast<F *>(dv), static_cast<F *>(dS0),
                       reinterpret_cast<F *const *>(dqs));
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

void deltaForward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                  const void *beta, const void *S0, const void *const *qs, void *const *outs,
                  void *starts, void *end, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        (wide() ? avx512::deltaForwardOne<F> : baseline::deltaForwardOne<F>)(
            s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
            static_cast<const F *>(w), static_cast<const F *>(beta),
            static_cast<const F *>(S0), typed<F>(qs), reinterpret_cast<F *const *>(outs),
            static_cast<F *>(starts), static_cast<F *>(end));
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

void deltaBackward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                   const void *beta, const void *starts, const void *end,
                   const void *const *qs, const void *const *douts, const void *dEnd, void *da,
                   void *dk, void *dw, void *dbeta, void *dS0, void *const *dqs, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        (wide() ? avx512::deltaBackwardOne<F> : baseline::deltaBackwardOne<F>)(
            s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
            static_cast<const F *>(w), static_cast<const F *>(beta),
            static_cast<const F *>(starts), static_cast<const F *>(end), typed<F>(qs),
            typed<F>(douts), static_cast<const F *>(dEnd), static_cast<F *>(da),
            static_cast<F *>(dk), static_cast<F *>(dw), static_cast<F *>(dbeta),
            static_cast<F *>(dS0), reinterpret_cast<F *const *>(dqs));
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

} // namespace cellc::runtime::chunk
