//===- sgemm_bench.cpp - cellc's own sgemm, for bench/cpu/gemms.py --------===//
//
// A C entry to the runtime's AVX-512 GEMM (runtime/cpu/Sgemm.h), loaded
// with ctypes beside OpenBLAS, BLIS and oneDNN; and the cores' peak of f32
// multiply-adds, the ceiling of every product (bench/cpu/compare.py).
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Sgemm.h"
#include "runtime/cpu/ThreadPool.h"

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>

namespace {

/// `n` rounds of 24 independent FMA chains (enough to cover the FMA's
/// latency on two pipes), 16 lanes each; returns a sum so that none is
/// dead.
__attribute__((target("avx512f,fma"))) float chains512(int64_t n) {
  __m512 acc[24];
  __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 24; ++i)
    acc[i] = _mm512_set1_ps(float(i));
  for (int64_t r = 0; r < n; ++r)
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i)
      acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  alignas(64) float lanes[16];
  float sum = 0;
  for (int i = 0; i < 24; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float v : lanes)
      sum += v;
  }
  return sum;
}

/// The same on 8-lane vectors, for CPUs with FMA and no AVX-512: 12 chains,
/// which AVX2's 16 registers hold (24 would spill), twice as many rounds.
__attribute__((target("avx2,fma"))) float chains256(int64_t n) {
  __m256 acc[12];
  __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i)
    acc[i] = _mm256_set1_ps(float(i));
  for (int64_t r = 0; r < 2 * n; ++r)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  alignas(32) float lanes[8];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes)
      sum += v;
  }
  return sum;
}

} // namespace
#endif

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

/// The peak of f32 multiply-adds on `threads` threads of the runtime's pool,
/// in GFLOP/s (2 a lane): chains of FMAs on the widest vectors the CPU has,
/// with nothing from memory, each thread the same count; the best of
/// `repeats` runs of about 0.1 s. 0 where the CPU has no FMA.
double cellc_fma_peak(int threads, int repeats) {
#if defined(__x86_64__)
  bool wide = __builtin_cpu_supports("avx512f");
  if (!wide && !__builtin_cpu_supports("fma"))
    return 0.0;
  int64_t rounds = wide ? 150000000 / 24 : 300000000 / 24;
  double lanes = wide ? 16 : 8, best = 0.0;
  std::atomic<float> sink{0.0f};
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    cellc::runtime::runTasks(threads, [&](int) {
      sink.store(wide ? chains512(rounds) : chains256(rounds), std::memory_order_relaxed);
    });
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double gflops = double(threads) * double(rounds) * 24 * lanes * 2 / seconds / 1e9;
    best = gflops > best ? gflops : best;
  }
  return best;
#else
  (void)threads, (void)repeats;
  return 0.0;
#endif
}
}
