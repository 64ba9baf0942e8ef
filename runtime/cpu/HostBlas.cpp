//===- HostBlas.cpp - The CPU backend's GEMMs and host loops --------------===//

#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/Sgemm.h"
#include "runtime/cpu/ThreadPool.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <type_traits>

using namespace cellc::runtime;

namespace cellc::runtime::host {

/// Whether a GEMM runs on cellc's kernel: f32 of more than one row, on a
/// CPU that has it (`ownSgemm`), C's `n` columns filling its 64-column
/// panels to 80% or more (narrower products waste less on OpenBLAS).
static bool onOwnKernel(DType dtype, int64_t m, int64_t n) {
  return dtype == DType::F32 && m > 1 && ownSgemm() && (n + 63) / 64 * 64 * 4 <= n * 5;
}

/// The name of the library a GEMM runs on.
static const char *libraryName(bool own) { return own ? "cellc-avx512" : "openblas"; }

/// Row-major C = alpha op(A) op(B) + beta C.
void gemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n,
          int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
          double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // An empty product: C = beta C, and zeros where beta is 0 (whatever C
    // held), as a BLAS leaves it.
    auto scale = [&](auto *x) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          x[i * ldc + j] = beta == 0.0 ? 0 : beta * x[i * ldc + j];
    };
    if (dtype == DType::F32)
      scale(static_cast<float *>(c));
    else
      scale(static_cast<double *>(c));
    return;
  }
  auto ta = transA ? CblasTrans : CblasNoTrans;
  auto tb = transB ? CblasTrans : CblasNoTrans;
  if (m == 1) {
    // One row (a step of one sample): y = op(B)^T x, a matrix-vector product
    // that reads op(B) once. GEMM would copy it into panels first.
    auto tv = transB ? CblasNoTrans : CblasTrans;
    int64_t rows = transB ? n : k, cols = transB ? k : n, inc = transA ? lda : 1;
    if (dtype == DType::F32)
      cblas_sgemv(CblasRowMajor, tv, rows, cols, 1.0f, static_cast<const float *>(b), ldb,
                  static_cast<const float *>(a), inc, static_cast<float>(beta),
                  static_cast<float *>(c), 1);
    else
      cblas_dgemv(CblasRowMajor, tv, rows, cols, 1.0, static_cast<const double *>(b), ldb,
                  static_cast<const double *>(a), inc, beta, static_cast<double *>(c), 1);
    return;
  }
  if (onOwnKernel(dtype, m, n)) {
    sgemm(transA, transB, m, n, k, static_cast<const float *>(a), lda,
          static_cast<const float *>(b), ldb, static_cast<float>(beta), static_cast<float *>(c),
          ldc);
    return;
  }
  if (dtype == DType::F32)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f,
                static_cast<const float *>(a), lda,
                static_cast<const float *>(b), ldb, static_cast<float>(beta),
                static_cast<float *>(c), ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0,
                static_cast<const double *>(a), lda,
                static_cast<const double *>(b), ldb, beta,
                static_cast<double *>(c), ldc);
}


/// acc[j] += sum over rows of m[row, j] (or += v[j] with rows = 1), each
/// thread a range of columns.
void addColumnSums(DType dtype, const void *m, int64_t rows, int64_t cols, void *acc,
                   int threads) {
  auto sums = [&](auto *a, auto *x) {
    parallelRanges(cols, threads, std::max<int64_t>(16, kHostGrain / std::max<int64_t>(rows, 1)),
                   [&](int64_t j0, int64_t j1) {
                     for (int64_t r = 0; r < rows; ++r)
                       for (int64_t j = j0; j < j1; ++j)
                         a[j] += x[r * cols + j];
                   });
  };
  if (dtype == DType::F32)
    sums(static_cast<float *>(acc), static_cast<const float *>(m));
  else
    sums(static_cast<double *>(acc), static_cast<const double *>(m));
}

/// A GEMM's multiply-adds below which it runs on the calling thread.
constexpr int64_t kGemmGrain = int64_t(1) << 21;

namespace {

/// The GEMM profile: off unless a tool turns it on.
struct GemmProfile {
  std::atomic<bool> on{false};
  std::mutex lock;
  std::vector<GemmProfileRow> rows;
};

GemmProfile &gemmProfileState() {
  static GemmProfile profile;
  return profile;
}

void addToGemmProfile(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      const char *library, double seconds) {
  GemmProfile &profile = gemmProfileState();
  std::lock_guard<std::mutex> hold(profile.lock);
  for (GemmProfileRow &row : profile.rows)
    if (row.transA == transA && row.transB == transB && row.m == m && row.n == n &&
        row.k == k && row.library == library) {
      ++row.calls;
      row.seconds += seconds;
      return;
    }
  profile.rows.push_back({transA, transB, m, n, k, library, 1, seconds});
}

} // namespace

void setGemmProfile(bool on) {
  GemmProfile &profile = gemmProfileState();
  std::lock_guard<std::mutex> hold(profile.lock);
  if (on)
    profile.rows.clear();
  profile.on = on;
}

std::vector<GemmProfileRow> gemmProfile() {
  GemmProfile &profile = gemmProfileState();
  std::lock_guard<std::mutex> hold(profile.lock);
  return profile.rows;
}

const char *gemmLibrary() { return libraryName(ownSgemm()); }

/// `gemm` split over `threads` of the pool. On cellc's kernel, the threads
/// share B's packed blocks (`parallelSgemm`). On OpenBLAS, by the rows of C,
/// or by its columns when it has fewer rows than threads, each part a
/// single-threaded BLAS call. OpenBLAS's own threads are set to 1 for the
/// call and back after: left on, they spin after each GEMM on the cores that
/// the kernels' threads run on next.
/// Whether `threads` are worth a GEMM's multiply-adds.
static bool worthThreads(int64_t m, int64_t n, int64_t k, int threads) {
  return threads > 1 && m * n * k >= kGemmGrain && m > 1;
}

/// The threads parallelGemm runs a GEMM on with cellc's kernel (1: the
/// calling thread's `gemm`), or 0 where it runs it on OpenBLAS.
static int ownKernelThreads(DType dtype, int64_t m, int64_t n, int64_t k, int threads) {
  if (!onOwnKernel(dtype, m, n))
    return 0;
  if (!worthThreads(m, n, k, threads))
    return 1;
  return m >= 12 * threads ? threads : 0;
}

static void runParallelGemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n,
                            int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
                            double beta, void *c, int64_t ldc, int threads) {
  if (!worthThreads(m, n, k, threads)) {
    gemm(dtype, transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (ownKernelThreads(dtype, m, n, k, threads) > 1) {
    parallelSgemm(transA, transB, m, n, k, static_cast<const float *>(a), lda,
                  static_cast<const float *>(b), ldb, static_cast<float>(beta),
                  static_cast<float *>(c), ldc, threads);
    return;
  }
  int64_t bytes = dtype == DType::F32 ? 4 : 8;
  auto at = [bytes](const void *p, int64_t elements) {
    return static_cast<const char *>(p) + elements * bytes;
  };
  int before = openblas_get_num_threads();
  openblas_set_num_threads(1);
  if (m >= 2 * threads) {
    // Rows i of C are rows i of op(A): row i of A, or its column i.
    parallelRanges(m, threads, 1, [&](int64_t r0, int64_t r1) {
      gemm(dtype, transA, transB, r1 - r0, n, k, at(a, transA ? r0 : r0 * lda), lda, b, ldb,
           beta, const_cast<char *>(at(c, r0 * ldc)), ldc);
    });
  } else {
    // Columns j of C are columns j of op(B): column j of B, or its row j.
    parallelRanges(n, threads, 1, [&](int64_t c0, int64_t c1) {
      gemm(dtype, transA, transB, m, c1 - c0, k, a, lda, at(b, transB ? c0 * ldb : c0), ldb,
           beta, const_cast<char *>(at(c, c0)), ldc);
    });
  }
  openblas_set_num_threads(before);
}

/// `gemm` split over `threads`, timed into the GEMM profile while it is on.
void parallelGemm(DType dtype, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                  void *c, int64_t ldc, int threads) {
  if (!gemmProfileState().on.load(std::memory_order_relaxed)) {
    runParallelGemm(dtype, transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc, threads);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  runParallelGemm(dtype, transA, transB, m, n, k, a, lda, b, ldb, beta, c, ldc, threads);
  addToGemmProfile(transA, transB, m, n, k,
                   libraryName(ownKernelThreads(dtype, m, n, k, threads) > 0),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                       .count());
}

void parallelGemmPair(DType dtype, bool transA, bool transB, int64_t m, int64_t n1, int64_t n2,
                      int64_t k, const void *a, int64_t lda, const void *b1, int64_t ldb1,
                      const void *b2, int64_t ldb2, double beta, void *c1, int64_t ldc1,
                      void *c2, int64_t ldc2, int threads) {
  int64_t n = n1 + n2;
  // One product where parallelGemm would run one of n1 + n2 columns on
  // cellc's kernel; two calls of parallelGemm otherwise.
  int own = k > 0 && n2 > 0 && sgemmPairFits(n1) ? ownKernelThreads(dtype, m, n, k, threads) : 0;
  if (own == 0) {
    parallelGemm(dtype, transA, transB, m, n1, k, a, lda, b1, ldb1, beta, c1, ldc1, threads);
    parallelGemm(dtype, transA, transB, m, n2, k, a, lda, b2, ldb2, beta, c2, ldc2, threads);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  parallelSgemmPair(transA, transB, m, n1, n2, k, static_cast<const float *>(a), lda,
                    static_cast<const float *>(b1), ldb1, static_cast<const float *>(b2), ldb2,
                    static_cast<float>(beta), static_cast<float *>(c1), ldc1,
                    static_cast<float *>(c2), ldc2, own);
  if (gemmProfileState().on.load(std::memory_order_relaxed))
    addToGemmProfile(transA, transB, m, n, k, libraryName(true),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                         .count());
}

/// m[row, :] = the sum of `vectors` for every row, each thread a range of
/// rows.
void fillRows(DType dtype, void *m, int64_t rows, int64_t cols,
              const std::vector<const void *> &vectors, int threads) {
  auto fill = [&](auto *x) {
    using E = std::remove_pointer_t<decltype(x)>;
    std::vector<E> sum(cols, E(0));
    for (const void *v : vectors)
      for (int64_t j = 0; j < cols; ++j)
        sum[j] += static_cast<const E *>(v)[j];
    parallelRanges(rows, threads, std::max<int64_t>(1, kHostGrain / std::max<int64_t>(cols, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r)
                       std::memcpy(x + r * cols, sum.data(), cols * sizeof(E));
                   });
  };
  if (dtype == DType::F32)
    fill(static_cast<float *>(m));
  else
    fill(static_cast<double *>(m));
}

} // namespace cellc::runtime::host
