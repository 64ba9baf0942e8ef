//===- ChunkDelta.cuh - The delta rule's kernels --------------------------===//
//
// Part of runtime/cuda/ChunkKernels.cu. The delta rule with a scalar gate (DeltaNet, gated DeltaNet), as
// runtime/cpu/ChunkCore's deltaForward and deltaBackward: a and beta
// [T, BH], k [T, BH, K], the targets w [T, BH, V]. Within a chunk the new
// values U = (I + M)^-1 beta (w - e^A k S), M_ij = beta_i (k_i . k_j)
// e^{A_i - A_j} below the diagonal, by substitution a column a thread;
// the state passes as S' = e^{A_L} S + (k e^{A_L - A})^T U. The columns of
// the state are independent, so the forward takes a CTA per (sample and
// head, tile of BV columns).
//===----------------------------------------------------------------------===//


namespace {

/// M = beta_t (k_t . k_s) e^{A_t - A_s} below the diagonal (s < t < n), 0
/// on and above it, into M [n, L] from KK = k k^T, over the CTA.
__device__ void lowerM(float *M, const float *KK, const float *A, const float *bt, int n,
                       int L) {
  for (int i = thread(); i < n * n; i += threads()) {
    int t = i / n, s = i % n;
    M[t * L + s] = s < t ? bt[t] * KK[t * L + s] * expOf(A[t] - A[s]) : 0.0f;
  }
}

/// The delta rule's forward, its products on FMAs or (`TC`) on the tensor
/// cores: the two kernels below.
template <bool TC>
__device__ void deltaForward(const float *a, const float *k, const float *w,
                             const float *beta, const float *S0, const float *q, float *out,
                             float *starts, float *end, i64 BH, i64 T, int K, int V, int L,
                             int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *ks = S + K * BV, *qs = ks + L * K, *U = qs + L * K, *M = U + L * BV,
        *P = M + L * L, *A = P + L * L, *bt = A + L;
  const int nt = threads(), th = thread(), warp = th / 32, warps = nt / 32;
  const int across = bv / 8;
  const i64 NC = (T + L - 1) / L;
  stateIn(S, S0 + bh * i64(K) * V, K, V, v0, bv, BV);
  for (i64 ch = 0; ch < NC; ++ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    __syncthreads();
    stateOut(S, starts + (bh * NC + ch) * K * V, K, V, v0, bv, BV);
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    if constexpr (TC) {
      zeroRows(ks, n, L, K, K);
      for (int i = th; i < L; i += nt)
        if (i >= n)
          A[i] = bt[i] = 0.0f;
    }
    loadScalars(a, beta, t0, n, BH, bh, A, bt);
    __syncthreads();
    for (int i = th; i < n * n; i += nt) {
      int r = i / n, s = i % n;
      M[r * L + s] = s < r ? bt[r] * dot(ks + r * K, ks + s * K, K) * expOf(A[r] - A[s]) : 0.0f;
    }
    // U0 = beta (w - e^A k S).
    if constexpr (TC) {
      for (int t = warp; t < (L / 16) * across; t += warps) {
        const int r0 = (t / across) * 16, c0 = (t % across) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, ks + r0 * K, K, 1, S + c0, BV, 1, K);
        for (int e = 0; e < 4; ++e) {
          int r = tileRow(r0, e), c = tileColumn(c0, e);
          U[r * BV + c] = r < n ? bt[r] * (w[((t0 + r) * BH + bh) * V + v0 + c] -
                                           expOf(A[r]) * d[e])
                                : 0.0f;
        }
      }
    } else {
      for (int i = th; i < n * bv; i += nt) {
        int t = i / bv, c = i % bv;
        float kS = 0.0f;
        for (int r = 0; r < K; ++r)
          kS += ks[t * K + r] * S[r * BV + c];
        U[t * BV + c] = bt[t] * (w[((t0 + t) * BH + bh) * V + v0 + c] - expOf(A[t]) * kS);
      }
    }
    __syncthreads();
    // U = (I + M)^-1 U0, a column a thread.
    for (int c = th; c < bv; c += nt)
      for (int t = 1; t < n; ++t) {
        float x = U[t * BV + c];
        for (int s = 0; s < t; ++s)
          x -= M[t * L + s] * U[s * BV + c];
        U[t * BV + c] = x;
      }
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      if constexpr (TC)
        zeroRows(qs, n, L, K, K);
      __syncthreads();
      for (int i = th; i < L * L; i += nt) {
        int t = i / L, s = i % L;
        P[i] = s <= t && t < n ? dot(qs + t * K, ks + s * K, K) * expOf(A[t] - A[s]) : 0.0f;
      }
      __syncthreads();
      // out = e^A (q S) + P U.
      float *o = out + read * T * BH * V;
      if constexpr (TC) {
        for (int i = th; i < L * K; i += nt)
          qs[i] *= expOf(A[i / K]);
        __syncthreads();
        readTiles(o, qs, S, P, U, K, L, BV, across, n, t0, BH, bh, V, v0);
      } else {
        for (int i = th; i < n * bv; i += nt) {
          int t = i / bv, c = i % bv;
          float inter = 0.0f, acc = 0.0f;
          for (int r = 0; r < K; ++r)
            inter += qs[t * K + r] * S[r * BV + c];
          for (int s = 0; s <= t; ++s)
            acc += P[t * L + s] * U[s * BV + c];
          o[((t0 + t) * BH + bh) * V + v0 + c] = expOf(A[t]) * inter + acc;
        }
      }
    }
    __syncthreads();
    // S = e^{A_L} S + (k e^{A_L - A})^T U.
    const float An = A[n - 1];
    if constexpr (TC) {
      for (int i = th; i < n * K; i += nt)
        ks[i] *= expOf(An - A[i / K]);
      __syncthreads();
      for (int t = warp; t < (K / 16) * across; t += warps) {
        const int r0 = (t / across) * 16, c0 = (t % across) * 8;
        float d[4];
        for (int e = 0; e < 4; ++e)
          d[e] = expOf(An) * S[tileRow(r0, e) * BV + tileColumn(c0, e)];
        tile(d, ks + r0, 1, K, U + c0, BV, 1, L);
        for (int e = 0; e < 4; ++e)
          S[tileRow(r0, e) * BV + tileColumn(c0, e)] = d[e];
      }
    } else {
      for (int i = th; i < K * bv; i += nt) {
        int r = i / bv, c = i % bv;
        float s = expOf(An) * S[r * BV + c];
        for (int t = 0; t < n; ++t)
          s += ks[t * K + r] * expOf(An - A[t]) * U[t * BV + c];
        S[r * BV + c] = s;
      }
    }
  }
  __syncthreads();
  stateOut(S, end + bh * i64(K) * V, K, V, v0, bv, BV);
}

} // namespace

/// Grid (BH, ceil(V / BV)), dynamic shared memory
/// 4 * (K * BV + 2 * L * K + L * BV + 2 * L * L + 2 * L) bytes.
KERNEL void cellc_chunk_delta_forward(const float *a, const float *k, const float *w,
                                      const float *beta, const float *S0, const float *q,
                                      float *out, float *starts, float *end, i64 BH, i64 T,
                                      int K, int V, int L, int R, int BV) {
  deltaForward<false>(a, k, w, beta, S0, q, out, starts, end, BH, T, K, V, L, R, BV);
}

/// The same on the tensor cores: the same grid, shared memory and results.
KERNEL void cellc_chunk_delta_forward_tc(const float *a, const float *k, const float *w,
                                         const float *beta, const float *S0, const float *q,
                                         float *out, float *starts, float *end, i64 BH,
                                         i64 T, int K, int V, int L, int R, int BV) {
  deltaForward<true>(a, k, w, beta, S0, q, out, starts, end, BH, T, K, V, L, R, BV);
}

/// Grid (BH), dynamic shared memory
/// 4 * (K * V + 2 * L * K + 3 * L * V + 3 * L * L + 3 * L + 256) bytes. The
/// state's gradient after the chunk is in shared memory (G), the one before
/// it grows in dS0 (a thread its elements), which ends as its own; dk and
/// dbeta grow in place as the diagonal backward's sums do.
KERNEL void cellc_chunk_delta_backward(
    const float *a, const float *k, const float *w, const float *beta, const float *starts,
    const float *end, const float *q, const float *dout, const float *dEnd, float *da,
    float *dk, float *dw, float *dbeta, float *dS0, float *dq, i64 BH, i64 T, int K, int V,
    int L, int R) {
  extern __shared__ float smem[];
  const int bh = ctaX(), nt = threads(), th = thread();
  float *G = smem, *ks = G + K * V, *qs = ks + L * K, *U = qs + L * K, *dU = U + L * V,
        *dos = dU + L * V, *KK = dos + L * V, *W1 = KK + L * L, *W2 = W1 + L * L,
        *A = W2 + L * L, *bt = A + L, *dA = bt + L;
  const i64 NC = (T + L - 1) / L;
  float *Gp = dS0 + bh * i64(K) * V;
  for (int i = th; i < K * V; i += nt)
    G[i] = dEnd[bh * i64(K) * V + i];
  for (i64 ch = NC - 1; ch >= 0; --ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    const float *Sc = starts + (bh * NC + ch) * i64(K) * V;
    __syncthreads();
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadScalars(a, beta, t0, n, BH, bh, A, bt);
    __syncthreads();
    const float AL = A[n - 1], gL = expOf(AL);
    for (int i = th; i < n * n; i += nt) {
      int r = i / n, s = i % n;
      KK[r * L + s] = dot(ks + r * K, ks + s * K, K);
    }
    for (int i = th; i < n * V; i += nt) {
      int t = i / V, c = i % V;
      float kS = 0.0f, kG = 0.0f;
      for (int r = 0; r < K; ++r) {
        kS += ks[t * K + r] * Sc[r * V + c];
        kG += ks[t * K + r] * G[r * V + c];
      }
      U[t * V + c] = bt[t] * (w[((t0 + t) * BH + bh) * V + c] - expOf(A[t]) * kS);
      // The new values' gradient from the state passed on.
      dU[t * V + c] = expOf(AL - A[t]) * kG;
    }
    for (int i = th; i < K * V; i += nt)
      Gp[i] = gL * G[i];
    for (int i = th; i < n; i += nt)
      dA[i] = 0.0f;
    for (int i = th; i < n * K; i += nt) {
      int t = i / K, r = i % K;
      dk[((t0 + t) * BH + bh) * K + r] = 0.0f;
    }
    __syncthreads();
    // U = (I + M)^-1 U0, a column a thread, M in W1 first (over the CTA:
    // what the solves' serial steps would each compute again).
    lowerM(W1, KK, A, bt, n, L);
    __syncthreads();
    for (int c = th; c < V; c += nt)
      for (int t = 1; t < n; ++t) {
        float x = U[t * V + c];
        for (int s = 0; s < t; ++s)
          x -= W1[t * L + s] * U[s * V + c];
        U[t * V + c] = x;
      }
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      loadRows(dout + read * T * BH * V, t0, n, BH, bh, V, 0, V, dos, V);
      __syncthreads();
      // W1: q k^T, and W2: (do U^T) e^{A_i - A_j}, on and below the diagonal.
      for (int i = th; i < n * n; i += nt) {
        int r = i / n, s = i % n;
        bool lower = s <= r;
        W1[r * L + s] = lower ? dot(qs + r * K, ks + s * K, K) : 0.0f;
        W2[r * L + s] =
            lower ? dot(dos + r * V, U + s * V, V) * expOf(A[r] - A[s]) : 0.0f;
      }
      __syncthreads();
      for (int i = th; i < n * V; i += nt) {
        int s = i / V, c = i % V;
        float acc = 0.0f;
        for (int t = s; t < n; ++t)
          acc += W1[t * L + s] * expOf(A[t] - A[s]) * dos[t * V + c];
        dU[s * V + c] += acc;
      }
      for (int i = th; i < K * V; i += nt) {
        int r = i / V, c = i % V;
        float acc = 0.0f;
        for (int t = 0; t < n; ++t)
          acc += qs[t * K + r] * expOf(A[t]) * dos[t * V + c];
        Gp[i] += acc;
      }
      float *dqr = dq + read * T * BH * K;
      for (int i = th; i < n * K; i += nt) {
        int t = i / K, r = i % K;
        float inter = 0.0f, acc = 0.0f, back = 0.0f;
        for (int c = 0; c < V; ++c)
          inter += dos[t * V + c] * Sc[r * V + c];
        for (int s = 0; s <= t; ++s)
          acc += W2[t * L + s] * ks[s * K + r];
        for (int u = t; u < n; ++u)
          back += W2[u * L + t] * qs[u * K + r];
        i64 g = ((t0 + t) * BH + bh) * K + r;
        dqr[g] = expOf(A[t]) * inter + acc;
        dk[g] += back;
      }
      for (int t = th; t < n; t += nt) {
        float seen = 0.0f;
        for (int c = 0; c < V; ++c) {
          float qS = 0.0f;
          for (int r = 0; r < K; ++r)
            qS += qs[t * K + r] * Sc[r * V + c];
          seen += dos[t * V + c] * qS;
        }
        // The decay's gradient: e^A in the state's read, and the pairs'.
        float e = expOf(A[t]) * seen;
        for (int s = 0; s < n; ++s)
          e += W2[t * L + s] * W1[t * L + s] - W2[s * L + t] * W1[s * L + t];
        dA[t] += e;
      }
    }
    __syncthreads();
    // dR = (I + M)^-T dU, a column a thread, M in W1 again.
    lowerM(W1, KK, A, bt, n, L);
    __syncthreads();
    for (int c = th; c < V; c += nt)
      for (int t = n - 2; t >= 0; --t) {
        float x = dU[t * V + c];
        for (int s = t + 1; s < n; ++s)
          x -= W1[s * L + t] * dU[s * V + c];
        dU[t * V + c] = x;
      }
    __syncthreads();
    const float *dR = dU;
    for (int i = th; i < K * V; i += nt) {
      int r = i / V, c = i % V;
      float acc = 0.0f;
      for (int t = 0; t < n; ++t)
        acc += bt[t] * expOf(A[t]) * ks[t * K + r] * dR[t * V + c];
      Gp[i] -= acc;
    }
    for (int i = th; i < n * V; i += nt) {
      int t = i / V, c = i % V;
      dw[((t0 + t) * BH + bh) * V + c] = bt[t] * dR[t * V + c];
    }
    for (int i = th; i < n * K; i += nt) {
      int t = i / K, r = i % K;
      float acc = 0.0f;
      for (int c = 0; c < V; ++c)
        acc += dR[t * V + c] * Sc[r * V + c];
      dk[((t0 + t) * BH + bh) * K + r] -= bt[t] * expOf(A[t]) * acc;
    }
    // W1: -dR U^T below the diagonal (the gradient of M).
    for (int i = th; i < n * n; i += nt) {
      int r = i / n, s = i % n;
      W1[r * L + s] = s < r ? -dot(dR + r * V, U + s * V, V) : 0.0f;
    }
    __syncthreads();
    for (int t = th; t < n; t += nt) {
      float sdb = 0.0f, sda = 0.0f, e = expOf(A[t]);
      for (int c = 0; c < V; ++c) {
        float kS = 0.0f;
        for (int r = 0; r < K; ++r)
          kS += ks[t * K + r] * Sc[r * V + c];
        float wc = w[((t0 + t) * BH + bh) * V + c];
        sdb += dR[t * V + c] * (wc - e * kS);
        sda += dR[t * V + c] * kS;
      }
      float dAt = -bt[t] * e * sda;
      for (int s = 0; s < t; ++s) {
        float d = expOf(A[t] - A[s]), m = W1[t * L + s];
        sdb += m * KK[t * L + s] * d;
        dAt += m * bt[t] * KK[t * L + s] * d;
      }
      for (int u = t + 1; u < n; ++u)
        dAt -= W1[u * L + t] * bt[u] * KK[u * L + t] * expOf(A[u] - A[t]);
      // The state passed on: e^{A_L} S + (k e^{A_L - A})^T U.
      float Ek = 0.0f;
      for (int r = 0; r < K; ++r) {
        float UG = 0.0f;
        for (int c = 0; c < V; ++c)
          UG += U[t * V + c] * G[r * V + c];
        Ek += ks[t * K + r] * expOf(AL - A[t]) * UG;
      }
      dA[t] += dAt - Ek;
      W2[t] = Ek;
      dbeta[(t0 + t) * BH + bh] = sdb;
    }
    for (int i = th; i < n * K; i += nt) {
      int t = i / K, r = i % K;
      // The symmetric gradient of k k^T: beta_i e^{A_i - A_j} dM_ij, j < i.
      float acc = 0.0f;
      for (int s = 0; s < t; ++s)
        acc += W1[t * L + s] * bt[t] * expOf(A[t] - A[s]) * ks[s * K + r];
      for (int u = t + 1; u < n; ++u)
        acc += W1[u * L + t] * bt[u] * expOf(A[u] - A[t]) * ks[u * K + r];
      float UG = 0.0f;
      for (int c = 0; c < V; ++c)
        UG += U[t * V + c] * G[r * V + c];
      dk[((t0 + t) * BH + bh) * K + r] += acc + expOf(AL - A[t]) * UG;
    }
    // The state at the chunk's end is scaled by e^{A_L} as a whole: its
    // K V terms over the CTA (one thread's loop of them waited on memory
    // while the others waited at the barrier).
    float mine = 0.0f;
    for (int i = th; i < K * V; i += nt)
      mine += Sc[i] * G[i];
    const float sum = ctaSum(mine, dA + L);
    if (th == 0) {
      float dLast = gL * sum;
      for (int t = 0; t < n; ++t)
        dLast += W2[t];
      float acc = dLast;
      for (int t = n - 1; t >= 0; --t) {
        acc += dA[t];
        da[(t0 + t) * BH + bh] = acc;
      }
    }
    __syncthreads();
    for (int i = th; i < K * V; i += nt)
      G[i] = Gp[i];
  }
}


/// cellc_chunk_delta_backward on the tensor cores: the same grid and
/// results, with an [L, K] block and an [L, L] one more of shared memory
/// (4 * (K * V + 3 * L * K + 3 * L * V + 4 * L * L + 3 * L + 256) bytes). The
/// products over K, V and the chunk run as tiles; the solves (a column a
/// thread) and the sums a step on FMAs. Each sum a step that a product's
/// rows meet (q . dq, k . (dR Sc^T), k . (U G^T)) is taken from the
/// product's tile, stored in X, by a thread a step.
KERNEL void cellc_chunk_delta_backward_tc(
    const float *a, const float *k, const float *w, const float *beta, const float *starts,
    const float *end, const float *q, const float *dout, const float *dEnd, float *da,
    float *dk, float *dw, float *dbeta, float *dS0, float *dq, i64 BH, i64 T, int K, int V,
    int L, int R) {
  extern __shared__ float smem[];
  const int bh = ctaX(), nt = threads(), th = thread(), warp = th / 32, warps = nt / 32;
  float *G = smem, *ks = G + K * V, *qs = ks + L * K, *X = qs + L * K, *U = X + L * K,
        *dU = U + L * V, *dos = dU + L * V, *KK = dos + L * V, *W1 = KK + L * L,
        *W2 = W1 + L * L, *W3 = W2 + L * L, *A = W3 + L * L, *bt = A + L, *dA = bt + L;
  const i64 NC = (T + L - 1) / L;
  float *Gp = dS0 + bh * i64(K) * V;
  for (int i = th; i < K * V; i += nt)
    G[i] = dEnd[bh * i64(K) * V + i];
  // An [rows x cols] product's tiles, a warp at a time: `body(r0, c0)`.
  auto tiles = [&](int rows, int cols, auto body) {
    for (int t = warp; t < (rows / 16) * (cols / 8); t += warps)
      body((t / (cols / 8)) * 16, (t % (cols / 8)) * 8);
  };
  for (i64 ch = NC - 1; ch >= 0; --ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    const float *Sc = starts + (bh * NC + ch) * i64(K) * V;
    __syncthreads();
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    zeroRows(ks, n, L, K, K);
    for (int i = th; i < L; i += nt)
      if (i >= n)
        A[i] = bt[i] = 0.0f;
    loadScalars(a, beta, t0, n, BH, bh, A, bt);
    __syncthreads();
    const float AL = A[n - 1], gL = expOf(AL);
    // KK = k k^T; U0 = beta (w - e^A k Sc) and dU = e^{A_L - A} k G.
    tiles(L, L, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, ks + r0 * K, K, 1, ks + c0 * K, 1, K, K);
      for (int e = 0; e < 4; ++e)
        KK[tileRow(r0, e) * L + tileColumn(c0, e)] = d[e];
    });
    tiles(L, V, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, ks + r0 * K, K, 1, Sc + c0, V, 1, K);
      tile(g, ks + r0 * K, K, 1, G + c0, V, 1, K);
      for (int e = 0; e < 4; ++e) {
        int t = tileRow(r0, e), c = tileColumn(c0, e);
        bool live = t < n;
        U[t * V + c] =
            live ? bt[t] * (w[((t0 + t) * BH + bh) * V + c] - expOf(A[t]) * d[e]) : 0.0f;
        dU[t * V + c] = live ? expOf(AL - A[t]) * g[e] : 0.0f;
      }
    });
    for (int i = th; i < K * V; i += nt)
      Gp[i] = gL * G[i];
    for (int i = th; i < n; i += nt)
      dA[i] = 0.0f;
    for (int i = th; i < n * K; i += nt) {
      int t = i / K, r = i % K;
      dk[((t0 + t) * BH + bh) * K + r] = 0.0f;
    }
    __syncthreads();
    lowerM(W3, KK, A, bt, n, L);
    __syncthreads();
    for (int c = th; c < V; c += nt)
      for (int t = 1; t < n; ++t) {
        float x = U[t * V + c];
        for (int s = 0; s < t; ++s)
          x -= W3[t * L + s] * U[s * V + c];
        U[t * V + c] = x;
      }
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      loadRows(dout + read * T * BH * V, t0, n, BH, bh, V, 0, V, dos, V);
      zeroRows(qs, n, L, K, K);
      zeroRows(dos, n, L, V, V);
      __syncthreads();
      // W1 = q k^T, W3 = W1 e^{A_t - A_s} and W2 = (do U^T) e^{A_t - A_s}, on
      // and below the diagonal; X = q e^A.
      tiles(L, L, [&](int r0, int c0) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, qs + r0 * K, K, 1, ks + c0 * K, 1, K, K);
        tile(g, dos + r0 * V, V, 1, U + c0 * V, 1, V, V);
        for (int e = 0; e < 4; ++e) {
          int t = tileRow(r0, e), s = tileColumn(c0, e);
          bool lower = s <= t && t < n;
          float decay = lower ? expOf(A[t] - A[s]) : 0.0f;
          W1[t * L + s] = lower ? d[e] : 0.0f;
          W3[t * L + s] = d[e] * decay;
          W2[t * L + s] = g[e] * decay;
        }
      });
      for (int i = th; i < L * K; i += nt)
        X[i] = qs[i] * expOf(A[i / K]);
      __syncthreads();
      // dU += W3^T do; Gp += (q e^A)^T do.
      tiles(L, V, [&](int r0, int c0) {
        float d[4];
        for (int e = 0; e < 4; ++e)
          d[e] = dU[tileRow(r0, e) * V + tileColumn(c0, e)];
        tile(d, W3 + r0, 1, L, dos + c0, V, 1, L);
        for (int e = 0; e < 4; ++e)
          dU[tileRow(r0, e) * V + tileColumn(c0, e)] = d[e];
      });
      tiles(K, V, [&](int r0, int c0) {
        float d[4];
        for (int e = 0; e < 4; ++e)
          d[e] = Gp[tileRow(r0, e) * V + tileColumn(c0, e)];
        tile(d, X + r0, 1, K, dos + c0, V, 1, L);
        for (int e = 0; e < 4; ++e)
          Gp[tileRow(r0, e) * V + tileColumn(c0, e)] = d[e];
      });
      // dq = e^A (do Sc^T) + W2 k; dk += W2^T q.
      float *dqr = dq + read * T * BH * K;
      tiles(L, K, [&](int r0, int c0) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, dos + r0 * V, V, 1, Sc + c0 * V, 1, V, V);
        for (int e = 0; e < 4; ++e)
          d[e] *= expOf(A[tileRow(r0, e)]);
        tile(d, W2 + r0 * L, L, 1, ks + c0, K, 1, L);
        tile(b, W2 + r0, 1, L, qs + c0, K, 1, L);
        for (int e = 0; e < 4; ++e) {
          int t = tileRow(r0, e), r = tileColumn(c0, e);
          if (t < n) {
            i64 g = ((t0 + t) * BH + bh) * K + r;
            dqr[g] = d[e];
            dk[g] += b[e];
          }
        }
      });
      __syncthreads();
      // The decay's gradient: q . dq a step (the state's read and the pairs
      // W2 W1 of the step as the later one), less the pairs as the earlier.
      for (int t = th; t < n; t += nt) {
        float e = 0.0f;
        for (int r = 0; r < K; ++r)
          e += qs[t * K + r] * dqr[((t0 + t) * BH + bh) * K + r];
        for (int s = t; s < n; ++s)
          e -= W2[s * L + t] * W1[s * L + t];
        dA[t] += e;
      }
    }
    __syncthreads();
    // dR = (I + M)^-T dU, a column a thread, M in W3 again.
    lowerM(W3, KK, A, bt, n, L);
    __syncthreads();
    for (int c = th; c < V; c += nt)
      for (int t = n - 2; t >= 0; --t) {
        float x = dU[t * V + c];
        for (int s = t + 1; s < n; ++s)
          x -= W3[s * L + t] * dU[s * V + c];
        dU[t * V + c] = x;
      }
    for (int i = th; i < L * K; i += nt)
      X[i] = bt[i / K] * expOf(A[i / K]) * ks[i];
    __syncthreads();
    const float *dR = dU;
    // Gp -= (beta e^A k)^T dR; W1 = -dR U^T below the diagonal (M's
    // gradient).
    tiles(K, V, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, X + r0, 1, K, dR + c0, V, 1, L);
      for (int e = 0; e < 4; ++e)
        Gp[tileRow(r0, e) * V + tileColumn(c0, e)] -= d[e];
    });
    tiles(L, L, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, dR + r0 * V, V, 1, U + c0 * V, 1, V, V);
      for (int e = 0; e < 4; ++e) {
        int t = tileRow(r0, e), s = tileColumn(c0, e);
        W1[t * L + s] = s < t && t < n ? -d[e] : 0.0f;
      }
    });
    for (int i = th; i < n * V; i += nt) {
      int t = i / V, c = i % V;
      dw[((t0 + t) * BH + bh) * V + c] = bt[t] * dR[t * V + c];
    }
    __syncthreads();
    // X = dR Sc^T: dk -= beta e^A X. W2 = the symmetric gradient of k k^T.
    tiles(L, K, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, dR + r0 * V, V, 1, Sc + c0 * V, 1, V, V);
      for (int e = 0; e < 4; ++e) {
        int t = tileRow(r0, e), r = tileColumn(c0, e);
        X[t * K + r] = d[e];
        if (t < n)
          dk[((t0 + t) * BH + bh) * K + r] -= bt[t] * expOf(A[t]) * d[e];
      }
    });
    for (int i = th; i < L * L; i += nt) {
      int t = i / L, s = i % L;
      float x = 0.0f;
      if (s < t)
        x = W1[t * L + s] * bt[t] * expOf(A[t] - A[s]);
      else if (t < s)
        x = W1[s * L + t] * bt[s] * expOf(A[s] - A[t]);
      W2[i] = x;
    }
    __syncthreads();
    // beta's and the decay's gradients from R = beta (w - e^A k S) and M.
    for (int t = th; t < n; t += nt) {
      float kX = 0.0f, dRw = 0.0f, e = expOf(A[t]);
      for (int r = 0; r < K; ++r)
        kX += ks[t * K + r] * X[t * K + r];
      for (int c = 0; c < V; ++c)
        dRw += dR[t * V + c] * w[((t0 + t) * BH + bh) * V + c];
      float sdb = dRw - e * kX, dAt = -bt[t] * e * kX;
      for (int s = 0; s < t; ++s) {
        float d = expOf(A[t] - A[s]), m = W1[t * L + s];
        sdb += m * KK[t * L + s] * d;
        dAt += m * bt[t] * KK[t * L + s] * d;
      }
      for (int u = t + 1; u < n; ++u)
        dAt -= W1[u * L + t] * bt[u] * KK[u * L + t] * expOf(A[u] - A[t]);
      dA[t] += dAt;
      dbeta[(t0 + t) * BH + bh] = sdb;
    }
    __syncthreads();
    // X = U G^T: the state passed on, e^{A_L} S + (k e^{A_L - A})^T U;
    // dk += W2 k + e^{A_L - A} X.
    tiles(L, K, [&](int r0, int c0) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, U + r0 * V, V, 1, G + c0 * V, 1, V, V);
      tile(b, W2 + r0 * L, L, 1, ks + c0, K, 1, L);
      for (int e = 0; e < 4; ++e) {
        int t = tileRow(r0, e), r = tileColumn(c0, e);
        X[t * K + r] = d[e];
        if (t < n)
          dk[((t0 + t) * BH + bh) * K + r] += b[e] + expOf(AL - A[t]) * d[e];
      }
    });
    __syncthreads();
    for (int t = th; t < n; t += nt) {
      float Ek = 0.0f;
      for (int r = 0; r < K; ++r)
        Ek += ks[t * K + r] * X[t * K + r];
      Ek *= expOf(AL - A[t]);
      dA[t] -= Ek;
      W3[t] = Ek;
    }
    float mine = 0.0f;
    for (int i = th; i < K * V; i += nt)
      mine += Sc[i] * G[i];
    const float sum = ctaSum(mine, dA + L);
    if (th == 0) {
      float acc = gL * sum;
      for (int t = 0; t < n; ++t)
        acc += W3[t];
      for (int t = n - 1; t >= 0; --t) {
        acc += dA[t];
        da[(t0 + t) * BH + bh] = acc;
      }
    }
    __syncthreads();
    for (int i = th; i < K * V; i += nt)
      G[i] = Gp[i];
  }
}
