//===- Sgemm.cpp - cellc's own f32 GEMM on AVX-512 ------------------------===//
//
// Blocked as in GotoBLAS: for each block of NC columns and KC of depth, B's
// block is packed into panels of kNR columns (kc x 64, contiguous); then for
// each kMR rows of C, A's rows are copied into an L1-sized panel and the
// kernel sweeps B's panels. The kernel broadcasts one element of A a row and
// takes four vectors of B a step: 24 FMAs for 4 vector loads and 6
// broadcasts, which keeps Zen 4's one 512-bit FMA a cycle busy where 14 x 32
// (14 broadcasts for 28 FMAs) ran at 0.92x OpenBLAS.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Sgemm.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

namespace cellc::runtime::host {
namespace {

constexpr int kMR = 6;              // rows of C a kernel call
constexpr int kVectors = 4;         // 16-float vectors of C a row
constexpr int kNR = 16 * kVectors;  // columns of C a kernel call
constexpr int64_t kKC = 384;        // depth of a packed block
constexpr int64_t kNC = 1024;       // columns of a packed block
constexpr int64_t kPad = 16;        // floats between A's copied rows
constexpr int64_t kMC = 16 * kMR;   // rows of a transposed A packed at once

/// `C[kMR x kNR] = sum over p < kc of A(i, p) B[p, :] (+ beta C)`, with
/// `A(i, p)` at `a[p * ld + i]` when `rowsContiguous`, else `a[i * ld + p]`;
/// B one packed panel (kc x kNR, 64-byte aligned).
template <bool rowsContiguous>
__attribute__((target("avx512f,fma"))) void kernel(int64_t kc, const float *a, int64_t ld,
                                                   const float *b, float *c, int64_t ldc,
                                                   float beta) {
  __m512 acc[kMR][kVectors];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kVectors; ++v)
      acc[i][v] = _mm512_setzero_ps();
  // C's lines come from memory while the products run.
  if (beta != 0.0f)
    for (int i = 0; i < kMR; ++i)
      for (int v = 0; v < kVectors; ++v)
        _mm_prefetch(reinterpret_cast<const char *>(c + i * ldc + 16 * v), _MM_HINT_T0);
  for (int64_t p = 0; p < kc; ++p) {
    __m512 row[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v)
      row[v] = _mm512_load_ps(b + p * kNR + 16 * v);
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      __m512 x = _mm512_set1_ps(rowsContiguous ? a[p * ld + i] : a[i * ld + p]);
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v)
        acc[i][v] = _mm512_fmadd_ps(x, row[v], acc[i][v]);
    }
  }
  __m512 scale = _mm512_set1_ps(beta);
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      float *to = c + i * ldc + 16 * v;
      __m512 sum = beta == 0.0f ? acc[i][v]
                                : _mm512_fmadd_ps(scale, _mm512_loadu_ps(to), acc[i][v]);
      _mm512_storeu_ps(to, sum);
    }
}

float *aligned(std::vector<float> &v, int64_t floats) {
  if (int64_t(v.size()) < floats + 16)
    v.resize(floats + 16);
  auto at = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float *>((at + 63) & ~uintptr_t(63));
}

} // namespace

bool ownSgemm() {
  static const bool own = [] {
    const char *env = std::getenv("CELLC_CPU_GEMM");
    if (env && std::strcmp(env, "openblas") == 0)
      return false;
    return hostHas("avx512f");
  }();
  return own;
}

namespace {

/// One GEMM's operands, and the block of B in hand. Columns from `split`
/// on are a second product's that shares op(A) (`parallelSgemmPair`): B's
/// and C's columns j >= split are b2's and c2's columns j - split.
struct Product {
  bool transA, transB;
  int64_t m, n, k;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float beta;
  float *c;
  int64_t ldc;
  int64_t split;
  const float *b2 = nullptr;
  int64_t ldb2 = 0;
  float *c2 = nullptr;
  int64_t ldc2 = 0;

  /// B's column `j`, and its leading dimension, from either product.
  const float *bColumn(int64_t j, int64_t &ld) const {
    ld = j < split ? ldb : ldb2;
    const float *from = j < split ? b : b2;
    int64_t at = j < split ? j : j - split;
    return transB ? from + at * ld : from + at;
  }
  /// C's element (i, j), and its leading dimension, from either product.
  float *cAt(int64_t i, int64_t j, int64_t &ld) const {
    ld = j < split ? ldc : ldc2;
    return j < split ? c + i * ld + j : c2 + i * ld + (j - split);
  }
};

/// Packs panels [first, last) of B's block (rows pc..pc+kc, columns
/// jc..jc+nc) into `packedB`, kNR columns a panel, zeros past the last.
void packB(const Product &t, int64_t pc, int64_t kc, int64_t jc, int64_t nc, float *packedB,
           int64_t first, int64_t last) {
  for (int64_t panel = first; panel < last; ++panel) {
    int64_t jr = panel * kNR;
    float *to = packedB + jr * kc;
    int64_t width = std::min<int64_t>(kNR, nc - jr);
    // A panel is one product's: `split` is a multiple of kNR.
    int64_t ldb;
    const float *column = t.bColumn(jc + jr, ldb);
    for (int64_t p = 0; p < kc; ++p) {
      float *line = to + p * kNR;
      if (!t.transB) {
        std::memcpy(line, column + (pc + p) * ldb, width * sizeof(float));
      } else {
        const float *from = column + pc + p;
        for (int64_t j = 0; j < width; ++j)
          line[j] = from[j * ldb];
      }
      std::fill(line + width, line + kNR, 0.0f);
    }
  }
}

/// Rows [r0, r1) of C (r0 a multiple of kMR) for B's packed block: A's rows
/// packed into this thread's buffer, the kernel over B's panels.
void computeRows(const Product &t, int64_t pc, int64_t kc, int64_t jc, int64_t nc,
                 const float *packedB, int64_t r0, int64_t r1) {
  // Each thread keeps its A buffer for its next call: kMC x kKC floats
  // (144 KiB) at most.
  thread_local std::vector<float> aStore;
  float *packedA = aligned(aStore, t.transA ? kMC * kc : kMR * (kc + kPad));
  alignas(64) float edge[kMR * kNR];
  // The first block of depth applies beta; the rest add to it.
  float blockBeta = pc == 0 ? t.beta : 1.0f;
  const float *a = t.a;
  int64_t lda = t.lda;
  for (int64_t ir = r0; ir < r1; ir += kMR) {
    int64_t rows = std::min<int64_t>(kMR, r1 - ir);
    // A's rows: as kc x kMR when op(A)'s rows run along memory, else as
    // kMR rows of kc apart by kc + kPad floats, so that they do not share
    // L1 sets as rows of a power-of-two stride would.
    int64_t ld;
    const float *panelA = packedA;
    if (t.transA) {
      // kMC rows at a time: each line of A read once and whole, in order,
      // where a panel alone would read kc lines kc apart.
      ld = kMR;
      if ((ir - r0) % kMC == 0) {
        int64_t blockRows = std::min(kMC, r1 - ir);
        for (int64_t p = 0; p < kc; ++p) {
          const float *from = a + (pc + p) * lda + ir;
          for (int64_t i = 0; i < blockRows; i += kMR) {
            float *to = packedA + i * kc + p * kMR;
            int64_t have = std::min<int64_t>(kMR, blockRows - i);
            if (have == kMR) {
              std::memcpy(to, from + i, kMR * sizeof(float));
            } else {
              std::memcpy(to, from + i, have * sizeof(float));
              std::fill(to + have, to + kMR, 0.0f);
            }
          }
        }
      }
      panelA = packedA + (ir - r0) % kMC * kc;
    } else {
      ld = kc + kPad;
      for (int64_t i = 0; i < kMR; ++i) {
        if (i < rows)
          std::memcpy(packedA + i * ld, a + (ir + i) * lda + pc, kc * sizeof(float));
        else
          std::fill(packedA + i * ld, packedA + i * ld + kc, 0.0f);
      }
    }
    // The next rows of A, not transposed, come from memory while these
    // run: a share of their lines a panel of B.
    int64_t next = ir + kMR, lines = (kc + 15) / 16 + 1;
    int64_t toFetch = !t.transA && next < r1 ? std::min<int64_t>(kMR, r1 - next) * lines : 0;
    int64_t panels = (nc + kNR - 1) / kNR, fetched = 0;
    // Transposed, the next block of kMC rows: kc runs of up to kMC floats,
    // lda apart, a share of them each kernel call of this block. Packed
    // as it came, a block waited on memory for every run (the weight
    // gradients read a chunk of dG that the backward kernel streamed past
    // the caches).
    int64_t blockStart = r0 + (ir - r0) / kMC * kMC, nextBlock = blockStart + kMC;
    int64_t runLines = 0, runFetch = 0, calls = 1, call = 0;
    if (t.transA && nextBlock < r1) {
      runLines = (std::min(kMC, r1 - nextBlock) + 15) / 16 + 1;
      runFetch = kc * runLines;
      calls = (std::min(kMC, r1 - blockStart) + kMR - 1) / kMR * panels;
      call = (ir - blockStart) / kMR * panels;
    }
    int64_t runFetched = runFetch * call / calls;
    for (int64_t jr = 0; jr < nc; jr += kNR) {
      for (int64_t end = toFetch * (jr / kNR + 1) / panels; fetched < end; ++fetched)
        _mm_prefetch(reinterpret_cast<const char *>(a + (next + fetched / lines) * lda + pc +
                                                    fetched % lines * 16),
                     _MM_HINT_T0);
      for (int64_t end = runFetch * (++call) / calls; runFetched < end; ++runFetched)
        _mm_prefetch(reinterpret_cast<const char *>(a + (pc + runFetched / runLines) * lda +
                                                    nextBlock + runFetched % runLines * 16),
                     _MM_HINT_T0);
      int64_t width = std::min<int64_t>(kNR, nc - jr);
      int64_t ldc;
      float *to = t.cAt(ir, jc + jr, ldc);
      bool whole = rows == kMR && width == kNR;
      float *out = whole ? to : edge;
      int64_t ldOut = whole ? ldc : kNR;
      float outBeta = whole ? blockBeta : 0.0f;
      if (t.transA)
        kernel<true>(kc, panelA, ld, packedB + jr * kc, out, ldOut, outBeta);
      else
        kernel<false>(kc, panelA, ld, packedB + jr * kc, out, ldOut, outBeta);
      if (!whole)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < width; ++j) {
            float &into = to[i * ldc + j];
            into = edge[i * kNR + j] + (blockBeta == 0.0f ? 0.0f : blockBeta * into);
          }
    }
  }
}

/// The calling thread's buffer for B's packed blocks, kept for its next
/// call: kKC x kNC floats (1.5 MiB) at most.
float *packedBBuffer(int64_t floats) {
  thread_local std::vector<float> store;
  return aligned(store, floats);
}

/// The product, B's blocks packed once and shared: `split(count, f)` runs
/// f over ranges of [0, count), B's panels and then A's kMR-row panels, on
/// one thread or more.
template <typename Split>
void run(const Product &t, Split split) {
  if (t.m <= 0 || t.n <= 0 || t.k <= 0)
    return; // HostBlas's gemm takes the empty products.
  float *packedB =
      packedBBuffer(std::min(t.k, kKC) * ((std::min(t.n, kNC) + kNR - 1) / kNR * kNR));
  int64_t rowPanels = (t.m + kMR - 1) / kMR;
  for (int64_t jc = 0; jc < t.n; jc += kNC) {
    int64_t nc = std::min(kNC, t.n - jc);
    for (int64_t pc = 0; pc < t.k; pc += kKC) {
      int64_t kc = std::min(kKC, t.k - pc);
      split((nc + kNR - 1) / kNR, [&](int64_t first, int64_t last) {
        packB(t, pc, kc, jc, nc, packedB, first, last);
      });
      split(rowPanels, [&](int64_t first, int64_t last) {
        computeRows(t, pc, kc, jc, nc, packedB, first * kMR, std::min(t.m, last * kMR));
      });
    }
  }
}

} // namespace

namespace {

/// `run` on the calling thread (`threads` 1) or on the pool's.
void runOn(const Product &t, int threads) {
  if (threads <= 1)
    run(t, [](int64_t count, auto body) { body(0, count); });
  else
    run(t, [threads](int64_t count, auto body) {
      parallelRanges(count, threads, 1, [&](int64_t first, int64_t last) { body(first, last); });
    });
}

} // namespace

void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  runOn({transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc, n}, 1);
}

void parallelSgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                   int threads) {
  runOn({transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc, n}, threads);
}

bool sgemmPairFits(int64_t n1) { return n1 > 0 && n1 % kNR == 0; }

void parallelSgemmPair(bool transA, bool transB, int64_t m, int64_t n1, int64_t n2, int64_t k,
                       const float *a, int64_t lda, const float *b1, int64_t ldb1,
                       const float *b2, int64_t ldb2, float beta, float *c1, int64_t ldc1,
                       float *c2, int64_t ldc2, int threads) {
  if (!sgemmPairFits(n1))
    std::abort(); // Callers ask sgemmPairFits first.
  runOn({transA, transB, m, n1 + n2, k, a, lda, b1, ldb1, beta, c1, ldc1, n1, b2, ldb2, c2,
         ldc2},
        threads);
}

} // namespace cellc::runtime::host

#else // Not x86-64: OpenBLAS runs every GEMM.

namespace cellc::runtime::host {

bool ownSgemm() { return false; }

void sgemm(bool, bool, int64_t, int64_t, int64_t, const float *, int64_t, const float *,
           int64_t, float, float *, int64_t) {
  std::abort(); // Callers ask ownSgemm() first.
}

void parallelSgemm(bool, bool, int64_t, int64_t, int64_t, const float *, int64_t, const float *,
                   int64_t, float, float *, int64_t, int) {
  std::abort();
}

bool sgemmPairFits(int64_t) { return false; }

void parallelSgemmPair(bool, bool, int64_t, int64_t, int64_t, int64_t, const float *, int64_t,
                       const float *, int64_t, const float *, int64_t, float, float *, int64_t,
                       float *, int64_t, int) {
  std::abort();
}

} // namespace cellc::runtime::host

#endif
