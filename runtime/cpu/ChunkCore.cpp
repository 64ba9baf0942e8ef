//===- ChunkCore.cpp - The chunk form's diagonal core on the CPU ----------===//

#include "runtime/cpu/ChunkCore.h"

#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace cellc::runtime::chunk {
namespace {

/// The sub-chunk of a row gate's pairs: below the diagonal blocks, products
/// of rescaled q and k; on them, pair by pair.
constexpr int64_t kSub = 16;

/// The largest |cumulative log-gate| in a chunk whose pairs factor through
/// its start (Chunk::tame).
constexpr double kTame = 40;

template <typename F> DType dtypeOf();
template <> DType dtypeOf<float>() { return DType::F32; }
template <> DType dtypeOf<double>() { return DType::F64; }

/// Whether the loops run on AVX-512 (checked once).
bool wide() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq");
  return has;
}

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

/// The arrays as the loops take them, of the element type F.
template <typename F> const F *in(const void *p) { return static_cast<const F *>(p); }
template <typename F> F *out(void *p) { return static_cast<F *>(p); }
template <typename F> const F *const *in(const void *const *p) {
  return reinterpret_cast<const F *const *>(p);
}
template <typename F> F *const *out(void *const *p) {
  return reinterpret_cast<F *const *>(p);
}

/// Subnormal floats as zeros, in and out, on this thread while it lives
/// (MXCSR's FTZ and DAZ). A chunk's decays e^{A_i - A_j} over many steps
/// of a strong gate fall below f32's normal range, and every product with
/// one then takes a microcode assist: gated DeltaNet's chunk of 64 ran 3x
/// slower than one of 32 on such gates. What is flushed is below 1.2e-38
/// (f32) and 2.2e-308 (f64).
struct FlushSubnormals {
#if defined(__SSE__)
  unsigned saved = _mm_getcsr();
  FlushSubnormals() { _mm_setcsr(saved | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

/// Runs `one(F(), b0, b1)` over ranges of the (sample, head)s on the
/// runtime's threads, with F the element type of `dtype`.
template <typename One>
void perHeads(DType dtype, const Shape &s, int threads, const One &one) {
  auto run = [&](auto zero) {
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      FlushSubnormals flush;
      one(zero, b0, b1);
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

} // namespace

void forward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
             const void *S0, const void *const *qs, void *const *outs, void *starts,
             void *end, void *pairs, int threads) {
  perHeads(dtype, s, threads, [&](auto zero, int64_t b0, int64_t b1) {
    using F = decltype(zero);
    (wide() ? avx512::forwardHeads<F> : baseline::forwardHeads<F>)(
        s, b0, b1, in<F>(a), in<F>(k), in<F>(v), in<F>(S0), in<F>(qs), out<F>(outs),
        out<F>(starts), out<F>(end), out<F>(pairs));
  });
}

void backward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
              const void *starts, const void *end, const void *pairs, const void *const *qs,
              const void *const *douts, const void *dEnd, void *da, void *dk, void *dv,
              void *dS0, void *const *dqs, int threads) {
  perHeads(dtype, s, threads, [&](auto zero, int64_t b0, int64_t b1) {
    using F = decltype(zero);
    (wide() ? avx512::backwardHeads<F> : baseline::backwardHeads<F>)(
        s, b0, b1, in<F>(a), in<F>(k), in<F>(v), in<F>(starts), in<F>(end), in<F>(pairs),
        in<F>(qs), in<F>(douts), in<F>(dEnd), out<F>(da), out<F>(dk), out<F>(dv),
        out<F>(dS0), out<F>(dqs));
  });
}

void deltaForward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                  const void *beta, const void *S0, const void *const *qs, void *const *outs,
                  void *starts, void *end, int threads) {
  perHeads(dtype, s, threads, [&](auto zero, int64_t b0, int64_t b1) {
    using F = decltype(zero);
    (wide() ? avx512::deltaForwardHeads<F> : baseline::deltaForwardHeads<F>)(
        s, b0, b1, in<F>(a), in<F>(k), in<F>(w), in<F>(beta), in<F>(S0), in<F>(qs),
        out<F>(outs), out<F>(starts), out<F>(end));
  });
}

void deltaBackward(DType dtype, const Shape &s, const void *a, const void *k, const void *w,
                   const void *beta, const void *starts, const void *end,
                   const void *const *qs, const void *const *douts, const void *dEnd, void *da,
                   void *dk, void *dw, void *dbeta, void *dS0, void *const *dqs, int threads) {
  perHeads(dtype, s, threads, [&](auto zero, int64_t b0, int64_t b1) {
    using F = decltype(zero);
    (wide() ? avx512::deltaBackwardHeads<F> : baseline::deltaBackwardHeads<F>)(
        s, b0, b1, in<F>(a), in<F>(k), in<F>(w), in<F>(beta), in<F>(starts), in<F>(end),
        in<F>(qs), in<F>(douts), in<F>(dEnd), out<F>(da), out<F>(dk), out<F>(dw),
        out<F>(dbeta), out<F>(dS0), out<F>(dqs));
  });
}

} // namespace cellc::runtime::chunk
