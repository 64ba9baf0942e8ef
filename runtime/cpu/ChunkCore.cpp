//===- ChunkCore.cpp - The chunk form's diagonal core on the CPU ----------===//

#include "runtime/cpu/ChunkCore.h"

#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#if defined(__x86_64__) || defined(__SSE__)
#include <immintrin.h>
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

#if defined(__x86_64__)
/// Rows [0, R) of `c[:, 0:64) = op(a) b + beta c` with b's rows `ldb` apart
/// and its columns from `n` on masked off; op(a)(i, p) is a[p * lda + i]
/// when `ta`, else a[i * lda + p]. Six rows of four vectors, 24 FMAs for
/// four loads and six broadcasts, as the host GEMM's kernel.
template <int R, bool ta>
__attribute__((target("avx512f,fma"))) void rows64(int64_t k, const float *a, int64_t lda,
                                                   const float *b, int64_t ldb,
                                                   const __mmask16 *mask, float beta,
                                                   float *c, int64_t ldc) {
  __m512 acc[R][4];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < 4; ++v)
      acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 row[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      row[v] = _mm512_maskz_loadu_ps(mask[v], b + p * ldb + 16 * v);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      __m512 x = _mm512_set1_ps(ta ? a[p * lda + i] : a[i * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v)
        acc[i][v] = _mm512_fmadd_ps(x, row[v], acc[i][v]);
    }
  }
  __m512 scale = _mm512_set1_ps(beta);
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      float *to = c + i * ldc + 16 * v;
      __m512 sum = beta == 0.0f ? acc[i][v]
                                : _mm512_fmadd_ps(scale, _mm512_maskz_loadu_ps(mask[v], to),
                                                  acc[i][v]);
      _mm512_mask_storeu_ps(to, mask[v], sum);
    }
}

template <bool ta>
void rows64(int rows, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
            const __mmask16 *mask, float beta, float *c, int64_t ldc) {
  switch (rows) {
  case 6: return rows64<6, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  case 5: return rows64<5, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  case 4: return rows64<4, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  case 3: return rows64<3, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  case 2: return rows64<2, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  default: return rows64<1, ta>(k, a, lda, b, ldb, mask, beta, c, ldc);
  }
}

/// The chunk's products in f32 on AVX-512 (a chunk's or a state's rows
/// and columns a side), without the host GEMM's packing: their operands lie
/// in the L1 or the L2, and the host GEMM packed them a row's memcpy at a
/// time. A transposed b is transposed once into this thread's scratch. The
/// delta rule's core ran 6% faster forward + backward with it (three
/// interleaved A/B runs); the diagonal core's, no differently.
void smallSgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return;
  if (tb) {
    thread_local std::vector<float> bt;
    if (int64_t(bt.size()) < k * n)
      bt.resize(k * n);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        bt[p * n + j] = b[j * ldb + p];
    b = bt.data();
    ldb = n;
  }
  for (int64_t j0 = 0; j0 < n; j0 += 64) {
    __mmask16 mask[4];
    for (int v = 0; v < 4; ++v) {
      int64_t have = std::clamp<int64_t>(n - j0 - 16 * v, 0, 16);
      mask[v] = __mmask16((1u << have) - 1u);
    }
    for (int64_t i0 = 0; i0 < m; i0 += 6) {
      int rows = int(std::min<int64_t>(6, m - i0));
      if (ta)
        rows64<true>(rows, k, a + i0, lda, b + j0, ldb, mask, beta, c + i0 * ldc + j0, ldc);
      else
        rows64<false>(rows, k, a + i0 * lda, lda, b + j0, ldb, mask, beta,
                      c + i0 * ldc + j0, ldc);
    }
  }
}
#endif

/// Row-major `c = op(a) op(b) + beta c`.
template <typename F>
void mm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const F *a, int64_t lda,
        const F *b, int64_t ldb, double beta, F *c, int64_t ldc) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<F, float>)
    if (wide())
      return smallSgemm(ta, tb, m, n, k, a, lda, b, ldb, float(beta), c, ldc);
#endif
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
