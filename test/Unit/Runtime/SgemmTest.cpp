//===- SgemmTest.cpp - cellc's own AVX-512 GEMM against a float64 product -===//

#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/Sgemm.h"

#include "gtest/gtest.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace cellc::runtime;

namespace {

struct Case {
  bool transA, transB;
  int64_t m, n, k;
  float beta;
  /// A's and B's rows a power of two apart (where rows of A share L1 sets).
  bool powerOfTwo = false;
};

int64_t powerOfTwoAbove(int64_t x) {
  int64_t p = 1;
  while (p <= x)
    p *= 2;
  return p;
}

/// Runs `product` on random operands stored with leading dimensions wider
/// than the matrices, in buffers that end with their last row's last
/// element, and checks every element of C against a float64 product, and
/// that C's padding columns are untouched.
template <typename Product> void check(const Case &t, Product product) {
  std::mt19937 gen(int(t.m * 131 + t.n * 17 + t.k + t.transA * 2 + t.transB));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t aRows = t.transA ? t.k : t.m, aCols = t.transA ? t.m : t.k;
  int64_t bRows = t.transB ? t.n : t.k, bCols = t.transB ? t.k : t.n;
  int64_t lda = t.powerOfTwo ? powerOfTwoAbove(aCols) : aCols + 3;
  int64_t ldb = t.powerOfTwo ? powerOfTwoAbove(bCols) : bCols + 5, ldc = t.n + 7;
  std::vector<float> a((aRows - 1) * lda + aCols), b((bRows - 1) * ldb + bCols),
      c(t.m * ldc);
  for (float &x : a)
    x = u(gen);
  for (float &x : b)
    x = u(gen);
  for (float &x : c)
    x = u(gen);
  // beta 0 must not read C: NaNs in it stay out of the result.
  if (t.beta == 0.0f)
    for (int64_t i = 0; i < t.m; ++i)
      for (int64_t j = 0; j < t.n; ++j)
        c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> before = c;
  product(t.transA, t.transB, t.m, t.n, t.k, a.data(), lda, b.data(), ldb, t.beta, c.data(),
          ldc);
  double tolerance = 4e-6 * double(t.k) + 1e-6;
  int64_t wrong = 0;
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      float got = c[i * ldc + j];
      if (j >= t.n) {
        wrong += got != before[i * ldc + j];
        continue;
      }
      double want = t.beta == 0.0f ? 0.0 : double(t.beta) * before[i * ldc + j];
      for (int64_t p = 0; p < t.k; ++p)
        want += double(t.transA ? a[p * lda + i] : a[i * lda + p]) *
                double(t.transB ? b[j * ldb + p] : b[p * ldb + j]);
      if (!(std::fabs(got - want) <= tolerance) && wrong++ < 3)
        ADD_FAILURE() << "C[" << i << ", " << j << "] = " << got << ", want " << want;
    }
  EXPECT_EQ(wrong, 0) << "transA " << t.transA << " transB " << t.transB << " m " << t.m
                      << " n " << t.n << " k " << t.k << " beta " << t.beta;
}

/// Shapes around the kernel's 6 x 64 tile, its 384-deep, 1024-wide blocks
/// of B and its 96-row blocks of a transposed A, with every transpose and
/// beta 0, 1 and 0.5.
std::vector<Case> cases() {
  std::vector<Case> all;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      all.push_back({ta, tb, 6, 64, 384, 0.0f});
      all.push_back({ta, tb, 13, 65, 385, 1.0f});
      all.push_back({ta, tb, 7, 130, 800, 0.5f});
      all.push_back({ta, tb, 1, 1, 1, 0.0f});
      all.push_back({ta, tb, 5, 1100, 17, 0.5f});
      all.push_back({ta, tb, 37, 256, 1, 0.0f});
      all.push_back({ta, tb, 200, 70, 390, 0.5f});
      // Large enough for parallelGemm to share B between threads
      // (parallelSgemm), with row ranges that do not start on a 96-row
      // block, beta 0 over several depth blocks, and strides of 1024.
      all.push_back({ta, tb, 200, 256, 390, 0.0f});
      all.push_back({ta, tb, 197, 1100, 400, 0.5f});
      all.push_back({ta, tb, 100, 256, 1000, 1.0f, true});
    }
  return all;
}

TEST(Sgemm, MatchesAFloat64ProductAtEveryEdge) {
  if (!host::ownSgemm())
    GTEST_SKIP() << "no AVX-512F here, or CELLC_CPU_GEMM=openblas";
  for (const Case &t : cases())
    check(t, [](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
      host::sgemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    });
}

/// An empty product (k = 0) leaves beta C, zeros where beta is 0, on
/// either library and precision.
TEST(Sgemm, TheBackendsGemmOfZeroDepthScalesC) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  host::gemm(DType::F32, false, false, 2, 3, 0, nullptr, 1, nullptr, 3, 0.5, c.data(), 3);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  c.assign(6, std::numeric_limits<float>::quiet_NaN());
  host::gemm(DType::F32, true, true, 2, 3, 0, nullptr, 2, nullptr, 1, 0.0, c.data(), 3);
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
  std::vector<double> d = {1, 2, 3, 4};
  host::parallelGemm(DType::F64, false, false, 2, 2, 0, nullptr, 1, nullptr, 2, 2.0, d.data(),
                     2, 2);
  EXPECT_EQ(d, (std::vector<double>{2, 4, 6, 8}));
}

/// The backend's `gemm`, on whichever library it chose, on one thread and
/// split over two and three: on cellc's kernel, threads sharing B's packed
/// blocks; on OpenBLAS, by rows, or by columns where rows are few.
TEST(Sgemm, TheBackendsGemmMatchesOnEitherLibraryAndSplit) {
  for (const Case &t : cases())
    for (int threads : {1, 2, 3})
      check(t, [threads](bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                         int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc) {
        host::parallelGemm(DType::F32, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc,
                           threads);
      });
}

/// Two products that share op(A), C1 = op(A) op(B1) + beta C1 and C2 =
/// op(A) op(B2) + beta C2, as the backend's gemmPair runs them (one
/// product on cellc's kernel where B1 fills whole 64-column panels, two
/// calls otherwise), each against a float64 product and with the padding
/// of C1 and C2 untouched: every transpose, beta 0 (C's NaNs stay out), 1
/// and 0.5, across depth blocks and a second 1024-column block, one
/// thread and two.
TEST(Sgemm, APairSharingAMatchesTwoFloat64Products) {
  struct Pair {
    int64_t m, n1, n2, k;
    float beta;
  };
  std::vector<Pair> pairs = {{6, 64, 64, 384, 0.0f},   {13, 64, 65, 385, 1.0f},
                             {200, 256, 256, 390, 0.5f}, {97, 128, 1000, 200, 1.0f},
                             {37, 1088, 30, 50, 0.0f},  {50, 100, 64, 30, 0.5f},
                             {1, 64, 64, 8, 1.0f},      {13, 64, 64, 800, 1.0f},
                             {200, 128, 128, 1000, 1.0f}};
  int64_t wrong = 0;
  for (const Pair &t : pairs)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int threads : {1, 2}) {
          std::mt19937 gen(int(t.m * 7 + t.n1 + t.n2 * 3 + t.k + ta * 2 + tb + threads));
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          int64_t lda = (ta ? t.m : t.k) + 3, rowsA = ta ? t.k : t.m;
          std::vector<float> a(rowsA * lda);
          for (float &x : a)
            x = u(gen);
          struct Part {
            int64_t n, ldb, ldc;
            std::vector<float> b, c, before;
          } parts[2];
          for (int q = 0; q < 2; ++q) {
            Part &part = parts[q];
            part.n = q == 0 ? t.n1 : t.n2;
            part.ldb = (tb ? t.k : part.n) + 5 + q;
            part.ldc = part.n + 7 - q;
            part.b.resize((tb ? part.n : t.k) * part.ldb);
            part.c.resize(t.m * part.ldc);
            for (float &x : part.b)
              x = u(gen);
            for (int64_t i = 0; i < t.m; ++i)
              for (int64_t j = 0; j < part.ldc; ++j)
                part.c[i * part.ldc + j] = t.beta == 0.0f && j < part.n
                                               ? std::numeric_limits<float>::quiet_NaN()
                                               : u(gen);
            part.before = part.c;
          }
          host::parallelGemmPair(DType::F32, ta, tb, t.m, t.n1, t.n2, t.k, a.data(), lda,
                                 parts[0].b.data(), parts[0].ldb, parts[1].b.data(),
                                 parts[1].ldb, t.beta, parts[0].c.data(), parts[0].ldc,
                                 parts[1].c.data(), parts[1].ldc, threads);
          double tolerance = 4e-6 * double(t.k) + 1e-6;
          for (const Part &part : parts)
            for (int64_t i = 0; i < t.m; ++i)
              for (int64_t j = 0; j < part.ldc; ++j) {
                float got = part.c[i * part.ldc + j];
                if (j >= part.n) {
                  wrong += got != part.before[i * part.ldc + j];
                  continue;
                }
                double want = t.beta == 0.0f ? 0.0 : double(t.beta) * part.before[i * part.ldc + j];
                for (int64_t p = 0; p < t.k; ++p)
                  want += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                          double(tb ? part.b[j * part.ldb + p] : part.b[p * part.ldb + j]);
                if (!(std::fabs(got - want) <= tolerance) && wrong++ < 3)
                  ADD_FAILURE() << "m " << t.m << " n1 " << t.n1 << " n2 " << t.n2 << " k "
                                << t.k << " transA " << ta << " transB " << tb << " threads "
                                << threads << ": C" << (&part == parts ? 1 : 2) << "[" << i
                                << ", " << j << "] = " << got << ", want " << want;
              }
        }
  EXPECT_EQ(wrong, 0);
}

/// The pair runs as one product, profiled as its n1 + n2 columns, only
/// where cellc's kernel runs f32, n1 fills whole panels and the product
/// does not want threads it cannot split by rows; otherwise as two.
TEST(Sgemm, APairIsOneProductOnlyWhereItsFirstFillsWholePanels) {
  std::vector<float> a(64 * 32, 0.5f), b1(32 * 128, 0.25f), b2(32 * 64, 1.0f),
      c1(64 * 128), c2(64 * 64);
  auto pair = [&](int64_t n1) {
    host::parallelGemmPair(DType::F32, false, false, 64, n1, 64, 32, a.data(), 32, b1.data(),
                           n1, b2.data(), 64, 0.0, c1.data(), n1, c2.data(), 64, 1);
  };
  host::setGemmProfile(true);
  pair(128);
  pair(100);
  auto rows = host::gemmProfile();
  host::setGemmProfile(false);
  if (host::ownSgemm()) {
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].n, 192);
    EXPECT_EQ(rows[1].n, 100);
    EXPECT_EQ(rows[2].n, 64);
  } else {
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].n, 128);
    EXPECT_EQ(rows[1].n, 64);
    EXPECT_EQ(rows[2].n, 100);
  }
  EXPECT_FLOAT_EQ(c1[0], 32 * 0.5f * 0.25f);
  EXPECT_FLOAT_EQ(c2[63 * 64 + 63], 32 * 0.5f);
  // Worth two threads, with too few rows of C to split by: two calls, each
  // of which parallelGemm splits as it would alone.
  int64_t m = 13, k = 1300;
  std::vector<float> wa(m * k, 0.5f), wb1(k * 64, 0.25f), wb2(k * 64, 1.0f), wc1(m * 64),
      wc2(m * 64);
  host::setGemmProfile(true);
  host::parallelGemmPair(DType::F32, false, false, m, 64, 64, k, wa.data(), k, wb1.data(), 64,
                         wb2.data(), 64, 0.0, wc1.data(), 64, wc2.data(), 64, 2);
  rows = host::gemmProfile();
  host::setGemmProfile(false);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].n, 64);
  EXPECT_EQ(rows[0].calls, 2);
  EXPECT_FLOAT_EQ(wc1[12 * 64 + 63], k * 0.5f * 0.25f);
  EXPECT_FLOAT_EQ(wc2[0], k * 0.5f);
  // The pair's twice-as-wide product alone is split by OpenBLAS, and the
  // profile says so (it said cellc's kernel, whose columns C would fill).
  std::vector<float> wide(k * 128, 0.25f), wc(m * 128);
  host::setGemmProfile(true);
  host::parallelGemm(DType::F32, false, false, m, 128, k, wa.data(), k, wide.data(), 128, 0.0,
                     wc.data(), 128, 2);
  rows = host::gemmProfile();
  host::setGemmProfile(false);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_STREQ(rows[0].library, "openblas");
  EXPECT_FLOAT_EQ(wc[12 * 128 + 127], k * 0.5f * 0.25f);
}

} // namespace

namespace {

/// The GEMM profile counts parallelGemm's calls by shape and library while
/// it is on, and only then; turning it on empties it.
TEST(Sgemm, TheProfileCountsCallsByShapeWhileOn) {
  std::vector<float> a(64 * 32, 0.5f), b(32 * 128, 0.25f), c(64 * 128);
  auto call = [&](int64_t m) {
    host::parallelGemm(DType::F32, false, false, m, 128, 32, a.data(), 32, b.data(), 128, 0.0,
                       c.data(), 128, 1);
  };
  host::setGemmProfile(true);
  call(64);
  call(64);
  call(8);
  auto rows = host::gemmProfile();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].m, 64);
  EXPECT_EQ(rows[0].n, 128);
  EXPECT_EQ(rows[0].k, 32);
  EXPECT_EQ(rows[0].calls, 2);
  EXPECT_EQ(rows[1].m, 8);
  EXPECT_EQ(rows[1].calls, 1);
  EXPECT_STREQ(rows[0].library, host::ownSgemm() ? "cellc-avx512" : "openblas");
  EXPECT_GT(rows[0].seconds, 0.0);
  EXPECT_FLOAT_EQ(c[0], 32 * 0.5f * 0.25f);
  host::setGemmProfile(false);
  call(64);
  EXPECT_EQ(host::gemmProfile().size(), 2u);
  host::setGemmProfile(true);
  EXPECT_TRUE(host::gemmProfile().empty());
  host::setGemmProfile(false);
}

} // namespace
