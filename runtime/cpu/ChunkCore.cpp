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

/// One (sample, head)'s scratch and the chunk's cumulative log-gates.
template <typename F> struct Chunk {
  const Shape &s;
  int64_t l = 0;
  std::vector<F> A, W, qt, kt, up, tmp, tmp2;
  explicit Chunk(const Shape &shape)
      : s(shape), A(shape.L * shape.K), W(shape.L * shape.L), qt(shape.L * shape.K),
        kt(shape.L * shape.K), up(shape.L * shape.K),
        tmp(shape.L * std::max(shape.K, shape.V)), tmp2(shape.L * shape.K) {}

  /// A = the log-gates a[0..l) summed from the chunk's start.
  void cumulate(const F *a, int64_t steps) {
    l = steps;
    const int64_t K = s.K;
    for (int64_t i = 0; i < l; ++i)
      for (int64_t k = 0; k < K; ++k)
        A[i * K + k] = a[i * K + k] + (i ? A[(i - 1) * K + k] : F(0));
  }

  /// W[i, j] = sum_k q_ik k_jk exp(A_ik - A_jk) for j <= i, 0 above.
  void pairs(const F *q, const F *k) {
    const int64_t K = s.K, L = s.L;
    if (!s.rows) {
      mm<F>(false, true, l, l, K, q, K, k, K, 0.0, W.data(), L);
      for (int64_t i = 0; i < l; ++i)
        for (int64_t j = 0; j < l; ++j)
          W[i * L + j] = j <= i ? W[i * L + j] * std::exp(A[i * K] - A[j * K]) : F(0);
      return;
    }
    for (int64_t i = 0; i < l; ++i)
      std::fill_n(&W[i * L], l, F(0));
    for (int64_t i0 = 0; i0 < l; i0 += kSub) {
      int64_t i1 = std::min(l, i0 + kSub);
      const F *ref = &A[i0 * K];
      if (i0) {
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t c = 0; c < K; ++c)
            qt[i * K + c] = q[i * K + c] * std::exp(A[i * K + c] - ref[c]);
        for (int64_t j = 0; j < i0; ++j)
          for (int64_t c = 0; c < K; ++c)
            kt[j * K + c] = k[j * K + c] * std::exp(ref[c] - A[j * K + c]);
        mm<F>(false, true, i1 - i0, i0, K, &qt[i0 * K], K, kt.data(), K, 0.0, &W[i0 * L], L);
      }
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = i0; j <= i; ++j) {
          F sum = 0;
          for (int64_t c = 0; c < K; ++c)
            sum += q[i * K + c] * k[j * K + c] * std::exp(A[i * K + c] - A[j * K + c]);
          W[i * L + j] = sum;
        }
    }
  }

  /// The adjoint of `pairs`: dq += and dk += from dW (in W, zero above the
  /// diagonal).
  void pairGrads(const F *q, const F *k, F *dq, F *dk) {
    const int64_t K = s.K, L = s.L;
    if (!s.rows) {
      for (int64_t i = 0; i < l; ++i)
        for (int64_t j = 0; j <= i; ++j)
          W[i * L + j] *= std::exp(A[i * K] - A[j * K]);
      mm<F>(false, false, l, K, l, W.data(), L, k, K, 1.0, dq, K);
      mm<F>(true, false, l, K, l, W.data(), L, q, K, 1.0, dk, K);
      return;
    }
    for (int64_t i0 = 0; i0 < l; i0 += kSub) {
      int64_t i1 = std::min(l, i0 + kSub), n = i1 - i0;
      const F *ref = &A[i0 * K];
      if (i0) {
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t c = 0; c < K; ++c) {
            up[i * K + c] = std::exp(A[i * K + c] - ref[c]);
            qt[i * K + c] = q[i * K + c] * up[i * K + c];
          }
        for (int64_t j = 0; j < i0; ++j)
          for (int64_t c = 0; c < K; ++c)
            kt[j * K + c] = k[j * K + c] * std::exp(ref[c] - A[j * K + c]);
        // dq[I] += up * (dW[I, :i0] kt);  dk[:i0] += down * (dW[I, :i0]^T qt[I])
        mm<F>(false, false, n, K, i0, &W[i0 * L], L, kt.data(), K, 0.0, tmp.data(), K);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < K; ++c)
            dq[(i0 + i) * K + c] += up[(i0 + i) * K + c] * tmp[i * K + c];
        mm<F>(true, false, i0, K, n, &W[i0 * L], L, &qt[i0 * K], K, 0.0, tmp2.data(), K);
        for (int64_t j = 0; j < i0; ++j)
          for (int64_t c = 0; c < K; ++c)
            dk[j * K + c] += std::exp(ref[c] - A[j * K + c]) * tmp2[j * K + c];
      }
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = i0; j <= i; ++j) {
          F d = W[i * L + j];
          for (int64_t c = 0; c < K; ++c) {
            F e = d * std::exp(A[i * K + c] - A[j * K + c]);
            dq[i * K + c] += e * k[j * K + c];
            dk[j * K + c] += e * q[i * K + c];
          }
        }
    }
  }
};

template <typename F>
void forwardOne(const Shape &s, int64_t bh, const F *a, const F *k, const F *v, const F *S0,
                const F *const *qs, F *const *outs, F *starts, F *end) {
  const int64_t T = s.T, K = s.K, V = s.V, L = s.L, NC = s.chunks();
  Chunk<F> ch(s);
  std::vector<F> S(S0 + bh * K * V, S0 + (bh + 1) * K * V), kend(L * K);
  for (int64_t c = 0; c < NC; ++c) {
    int64_t t0 = c * L, l = std::min(L, T - t0);
    const F *ac = a + (bh * T + t0) * K, *kc = k + (bh * T + t0) * K,
            *vc = v + (bh * T + t0) * V;
    ch.cumulate(ac, l);
    std::copy(S.begin(), S.end(), starts + (bh * NC + c) * K * V);
    for (int r = 0; r < s.reads; ++r) {
      const F *qc = qs[r] + (bh * T + t0) * K;
      F *oc = outs[r] + (bh * T + t0) * V;
      ch.pairs(qc, kc);
      mm<F>(false, false, l, V, l, ch.W.data(), L, vc, V, 0.0, oc, V);
      for (int64_t i = 0; i < l; ++i)
        for (int64_t x = 0; x < K; ++x)
          ch.qt[i * K + x] = qc[i * K + x] * std::exp(ch.A[i * K + x]);
      mm<F>(false, false, l, V, K, ch.qt.data(), K, S.data(), V, 1.0, oc, V);
    }
    const F *AL = &ch.A[(l - 1) * K];
    for (int64_t i = 0; i < l; ++i)
      for (int64_t x = 0; x < K; ++x)
        kend[i * K + x] = kc[i * K + x] * std::exp(AL[x] - ch.A[i * K + x]);
    for (int64_t x = 0; x < K; ++x) {
      F g = std::exp(AL[x]);
      for (int64_t y = 0; y < V; ++y)
        S[x * V + y] *= g;
    }
    mm<F>(true, false, K, V, l, kend.data(), K, vc, V, 1.0, S.data(), V);
  }
  std::copy(S.begin(), S.end(), end + bh * K * V);
}

template <typename F>
void backwardOne(const Shape &s, int64_t bh, const F *a, const F *k, const F *v,
                 const F *starts, const F *end, const F *const *qs, const F *const *douts,
                 const F *dEnd, F *da, F *dk, F *dv, F *dS0, F *const *dqs) {
  const int64_t T = s.T, K = s.K, V = s.V, L = s.L, NC = s.chunks();
  Chunk<F> ch(s);
  std::vector<F> G(K * V, F(0)), Gnext(K * V), dA(L * K), kend(L * K), decay(L * K);
  if (dEnd)
    std::copy(dEnd + bh * K * V, dEnd + (bh + 1) * K * V, G.begin());
  for (int64_t c = NC - 1; c >= 0; --c) {
    int64_t t0 = c * L, l = std::min(L, T - t0);
    const F *ac = a + (bh * T + t0) * K, *kc = k + (bh * T + t0) * K,
            *vc = v + (bh * T + t0) * V;
    const F *Sc = starts + (bh * NC + c) * K * V;
    const F *Snext = c + 1 < NC ? starts + (bh * NC + c + 1) * K * V : end + bh * K * V;
    F *dac = da + (bh * T + t0) * K, *dkc = dk + (bh * T + t0) * K,
      *dvc = dv + (bh * T + t0) * V;
    ch.cumulate(ac, l);
    const F *AL = &ch.A[(l - 1) * K];
    for (int64_t i = 0; i < l; ++i)
      for (int64_t x = 0; x < K; ++x) {
        decay[i * K + x] = std::exp(AL[x] - ch.A[i * K + x]);
        kend[i * K + x] = kc[i * K + x] * decay[i * K + x];
      }
    // From the state at the chunk's end: dv = kend G, dk = decay * (v G^T).
    mm<F>(false, false, l, V, K, kend.data(), K, G.data(), V, 0.0, dvc, V);
    mm<F>(false, true, l, K, V, vc, V, G.data(), V, 0.0, dkc, K);
    for (int64_t i = 0; i < l * K; ++i)
      dkc[i] *= decay[i];
    for (int64_t x = 0; x < K; ++x) {
      F g = std::exp(AL[x]);
      for (int64_t y = 0; y < V; ++y)
        Gnext[x * V + y] = g * G[x * V + y];
    }
    std::fill_n(dA.begin(), l * K, F(0));
    for (int r = 0; r < s.reads; ++r) {
      const F *qc = qs[r] + (bh * T + t0) * K;
      F *dqc = dqs[r] + (bh * T + t0) * K;
      if (!douts[r]) {
        std::fill_n(dqc, l * K, F(0));
        continue;
      }
      const F *doc = douts[r] + (bh * T + t0) * V;
      ch.pairs(qc, kc);
      mm<F>(true, false, l, V, l, ch.W.data(), L, doc, V, 1.0, dvc, V);
      // dW = do v^T, below the diagonal; dq = e^A * (do Sc^T) + the pairs'.
      mm<F>(false, true, l, l, V, doc, V, vc, V, 0.0, ch.W.data(), L);
      for (int64_t i = 0; i < l; ++i)
        std::fill(&ch.W[i * L + i + 1], &ch.W[i * L + l], F(0));
      mm<F>(false, true, l, K, V, doc, V, Sc, V, 0.0, dqc, K);
      for (int64_t i = 0; i < l; ++i)
        for (int64_t x = 0; x < K; ++x) {
          F e = std::exp(ch.A[i * K + x]);
          dqc[i * K + x] *= e;
          ch.qt[i * K + x] = qc[i * K + x] * e;
        }
      // The state at the chunk's start: G += (q e^A)^T do (qt, before
      // pairGrads writes it).
      mm<F>(true, false, K, V, l, ch.qt.data(), K, doc, V, 1.0, Gnext.data(), V);
      ch.pairGrads(qc, kc, dqc, dkc);
      for (int64_t i = 0; i < l * K; ++i)
        dA[i] += qc[i] * dqc[i];
    }
    for (int64_t i = 0; i < l * K; ++i)
      dA[i] -= kc[i] * dkc[i];
    // The state at the chunk's end is scaled by e^{A_L} as a whole.
    for (int64_t x = 0; x < K; ++x) {
      F sum = 0;
      for (int64_t y = 0; y < V; ++y)
        sum += Snext[x * V + y] * G[x * V + y];
      dA[(l - 1) * K + x] += sum;
    }
    // The per-step gradient: the reverse cumulative sum in the chunk.
    for (int64_t x = 0; x < K; ++x) {
      F acc = 0;
      for (int64_t i = l - 1; i >= 0; --i) {
        acc += dA[i * K + x];
        dac[i * K + x] = acc;
      }
    }
    G.swap(Gnext);
  }
  std::copy(G.begin(), G.end(), dS0 + bh * K * V);
}

template <typename F> const F *const *typed(const void *const *p) {
  return reinterpret_cast<const F *const *>(p);
}

} // namespace

void forward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
             const void *S0, const void *const *qs, void *const *outs, void *starts,
             void *end, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        forwardOne<F>(s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
                      static_cast<const F *>(v), static_cast<const F *>(S0), typed<F>(qs),
                      reinterpret_cast<F *const *>(outs), static_cast<F *>(starts),
                      static_cast<F *>(end));
    });
  };
  if (dtype == DType::F32)
    run(0.0f);
  else
    run(0.0);
}

void backward(DType dtype, const Shape &s, const void *a, const void *k, const void *v,
              const void *starts, const void *end, const void *const *qs,
              const void *const *douts, const void *dEnd, void *da, void *dk, void *dv,
              void *dS0, void *const *dqs, int threads) {
  auto run = [&](auto zero) {
    using F = decltype(zero);
    parallelRanges(s.BH, threads, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t bh = b0; bh < b1; ++bh)
        backwardOne<F>(s, bh, static_cast<const F *>(a), static_cast<const F *>(k),
                       static_cast<const F *>(v), static_cast<const F *>(starts),
                       static_cast<const F *>(end), typed<F>(qs), typed<F>(douts),
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

} // namespace cellc::runtime::chunk
