//===- ChunkDiagonal.cuh - The diagonal core's kernels --------------------===//
//
// Part of runtime/cuda/ChunkKernels.cu: GLA's, RetNet's and mLSTM's core
// (scalar or row gates, outer-product sources, reads after the update),
// forward and backward, on FMAs and on the tensor cores. A forward runs,
// per chunk, the cumulative log-gates, each read's pair weights and
// outputs, then the state at the chunk's end. The backward takes the
// gradients of k and v from the state's gradient and the pairs, of q from
// the state at the chunk's start, and of the log-gates from the identity
// q dq - k dk (plus the end state's term) summed from the chunk's end.
//
//===----------------------------------------------------------------------===//


namespace {

/// The diagonal forward, its products on FMAs or (`TC`) on the tensor cores:
/// the two kernels below.
template <bool TC>
__device__ void diagForward(const float *a, const float *k, const float *v, const float *S0,
                            const float *q, float *out, float *starts, float *end,
                            float *pairs, i64 BH, i64 T, int K, int V, int L, int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *A = S + K * BV, *ks = A + L * K, *qs = ks + L * K, *vs = qs + L * K,
        *P = vs + L * BV;
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
    loadRows(v, t0, n, BH, bh, V, v0, bv, vs, BV);
    if constexpr (TC) {
      zeroRows(ks, n, L, K, K);
      zeroRows(vs, n, L, bv, BV);
      zeroRows(A, n, L, K, K);
    }
    loadGates(a, t0, n, BH, bh, K, A);
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      if constexpr (TC)
        zeroRows(qs, n, L, K, K);
      __syncthreads();
      float *saved = pairs + ((bh * NC + ch) * R + read) * i64(L) * L;
      for (int i = th; i < L * L; i += nt) {
        int t = i / L, s = i % L;
        float p = 0.0f;
        if (s <= t && t < n)
          for (int c = 0; c < K; ++c)
            p += qs[t * K + c] * ks[s * K + c] * expOf(A[t * K + c] - A[s * K + c]);
        P[i] = p;
        if (ctaY() == 0)
          saved[i] = p;
      }
      __syncthreads();
      // out = (q e^A) S + P v.
      float *o = out + read * T * BH * V;
      if constexpr (TC) {
        for (int i = th; i < L * K; i += nt)
          qs[i] *= expOf(A[i]);
        __syncthreads();
        readTiles(o, qs, S, P, vs, K, L, BV, across, n, t0, BH, bh, V, v0);
      } else {
        for (int i = th; i < n * bv; i += nt) {
          int t = i / bv, c = i % bv;
          float acc = 0.0f;
          for (int r = 0; r < K; ++r)
            acc += qs[t * K + r] * expOf(A[t * K + r]) * S[r * BV + c];
          for (int s = 0; s <= t; ++s)
            acc += P[t * L + s] * vs[s * BV + c];
          o[((t0 + t) * BH + bh) * V + v0 + c] = acc;
        }
      }
    }
    __syncthreads();
    // S = e^{A_L} S + (k e^{A_L - A})^T v.
    const float *An = A + (n - 1) * K;
    if constexpr (TC) {
      for (int i = th; i < n * K; i += nt)
        ks[i] *= expOf(An[i % K] - A[i]);
      __syncthreads();
      for (int t = warp; t < (K / 16) * across; t += warps) {
        const int r0 = (t / across) * 16, c0 = (t % across) * 8;
        float d[4];
        for (int e = 0; e < 4; ++e) {
          int r = tileRow(r0, e), c = tileColumn(c0, e);
          d[e] = expOf(An[r]) * S[r * BV + c];
        }
        tile(d, ks + r0, 1, K, vs + c0, BV, 1, L);
        for (int e = 0; e < 4; ++e)
          S[tileRow(r0, e) * BV + tileColumn(c0, e)] = d[e];
      }
    } else {
      for (int i = th; i < K * bv; i += nt) {
        int r = i / bv, c = i % bv;
        float s = expOf(An[r]) * S[r * BV + c];
        for (int t = 0; t < n; ++t)
          s += ks[t * K + r] * expOf(An[r] - A[t * K + r]) * vs[t * BV + c];
        S[r * BV + c] = s;
      }
    }
  }
  __syncthreads();
  stateOut(S, end + bh * i64(K) * V, K, V, v0, bv, BV);
}

} // namespace

/// Grid (BH, ceil(V / BV)), dynamic shared memory
/// 4 * (K * BV + 3 * L * K + L * BV + L * L) bytes.
KERNEL void cellc_chunk_diag_forward(const float *a, const float *k, const float *v,
                                     const float *S0, const float *q, float *out,
                                     float *starts, float *end, float *pairs, i64 BH, i64 T,
                                     int K, int V, int L, int R, int BV) {
  diagForward<false>(a, k, v, S0, q, out, starts, end, pairs, BH, T, K, V, L, R, BV);
}

/// The same on the tensor cores: the same grid, shared memory and results.
KERNEL void cellc_chunk_diag_forward_tc(const float *a, const float *k, const float *v,
                                        const float *S0, const float *q, float *out,
                                        float *starts, float *end, float *pairs, i64 BH,
                                        i64 T, int K, int V, int L, int R, int BV) {
  diagForward<true>(a, k, v, S0, q, out, starts, end, pairs, BH, T, K, V, L, R, BV);
}

/// Grid (BH), dynamic shared memory
/// 4 * (K * V + 3 * L * K + 2 * L * V + L * L + K) bytes. dout [R, T, BH, V]
/// and dEnd [BH, K, V] whole (zeros where no gradient came). da, dk and dv
/// hold each element's sums as they grow: a thread owns the same elements
/// in every loop over them.
KERNEL void cellc_chunk_diag_backward(
    const float *a, const float *k, const float *v, const float *starts, const float *end,
    const float *pairs, const float *q, const float *dout, const float *dEnd, float *da,
    float *dk, float *dv, float *dS0, float *dq, i64 BH, i64 T, int K, int V, int L, int R) {
  extern __shared__ float smem[];
  const int bh = ctaX(), nt = threads(), th = thread();
  float *dS = smem, *A = dS + K * V, *ks = A + L * K, *qs = ks + L * K, *vs = qs + L * K,
        *dos = vs + L * V, *dP = dos + L * V, *Gn = dP + L * L;
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * V; i += nt)
    dS[i] = dEnd[bh * i64(K) * V + i];
  for (i64 ch = NC - 1; ch >= 0; --ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    const float *Sc = starts + (bh * NC + ch) * i64(K) * V;
    const float *Se = ch + 1 < NC ? Sc + i64(K) * V : end + bh * i64(K) * V;
    __syncthreads();
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadRows(v, t0, n, BH, bh, V, 0, V, vs, V);
    loadGates(a, t0, n, BH, bh, K, A);
    __syncthreads();
    const float *An = A + (n - 1) * K;
    // The end state's own term of its log-gate's gradient, and what the
    // state's gradient gives k and v.
    for (int r = th; r < K; r += nt) {
      float g = 0.0f;
      for (int c = 0; c < V; ++c)
        g += dS[r * V + c] * Se[r * V + c];
      Gn[r] = g;
    }
    for (int i = th; i < n * V; i += nt) {
      int s = i / V, c = i % V;
      float acc = 0.0f;
      for (int r = 0; r < K; ++r)
        acc += ks[s * K + r] * expOf(An[r] - A[s * K + r]) * dS[r * V + c];
      dv[((t0 + s) * BH + bh) * V + c] = acc;
    }
    for (int i = th; i < n * K; i += nt) {
      int s = i / K, r = i % K;
      float acc = 0.0f;
      for (int c = 0; c < V; ++c)
        acc += dS[r * V + c] * vs[s * V + c];
      i64 g = ((t0 + s) * BH + bh) * K + r;
      dk[g] = expOf(An[r] - A[s * K + r]) * acc;
      da[g] = 0.0f;
    }
    __syncthreads();
    for (int i = th; i < K * V; i += nt)
      dS[i] *= expOf(An[i / V]);
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      loadRows(dout + read * T * BH * V, t0, n, BH, bh, V, 0, V, dos, V);
      __syncthreads();
      for (int i = th; i < n * n; i += nt) {
        int t = i / n, s = i % n;
        float p = 0.0f;
        if (s <= t)
          for (int c = 0; c < V; ++c)
            p += dos[t * V + c] * vs[s * V + c];
        dP[t * L + s] = p;
      }
      __syncthreads();
      const float *P = pairs + ((bh * NC + ch) * R + read) * i64(L) * L;
      for (int i = th; i < n * V; i += nt) {
        int s = i / V, c = i % V;
        float acc = 0.0f;
        for (int t = s; t < n; ++t)
          acc += P[t * L + s] * dos[t * V + c];
        dv[((t0 + s) * BH + bh) * V + c] += acc;
      }
      float *dqr = dq + read * T * BH * K;
      for (int i = th; i < n * K; i += nt) {
        int t = i / K, r = i % K;
        float inter = 0.0f;
        for (int c = 0; c < V; ++c)
          inter += Sc[r * V + c] * dos[t * V + c];
        float acc = expOf(A[t * K + r]) * inter, back = 0.0f;
        for (int s = 0; s <= t; ++s)
          acc += dP[t * L + s] * ks[s * K + r] * expOf(A[t * K + r] - A[s * K + r]);
        for (int u = t; u < n; ++u)
          back += dP[u * L + t] * qs[u * K + r] * expOf(A[u * K + r] - A[t * K + r]);
        i64 g = ((t0 + t) * BH + bh) * K + r;
        dqr[g] = acc;
        dk[g] += back;
        da[g] += qs[t * K + r] * acc;
      }
      for (int i = th; i < K * V; i += nt) {
        int r = i / V, c = i % V;
        float acc = 0.0f;
        for (int t = 0; t < n; ++t)
          acc += qs[t * K + r] * expOf(A[t * K + r]) * dos[t * V + c];
        dS[i] += acc;
      }
    }
    __syncthreads();
    // da: the sum from the chunk's end of q dq - k dk, with the end state's
    // term at the last step.
    for (int r = th; r < K; r += nt) {
      float acc = Gn[r];
      for (int t = n - 1; t >= 0; --t) {
        i64 g = ((t0 + t) * BH + bh) * K + r;
        acc += da[g] - ks[t * K + r] * dk[g];
        da[g] = acc;
      }
    }
  }
  __syncthreads();
  for (int i = th; i < K * V; i += nt)
    dS0[bh * i64(K) * V + i] = dS[i];
}


/// cellc_chunk_diag_backward on the tensor cores: the same grid and
/// results, with an [L, K] block more of shared memory
/// (4 * (K * V + 4 * L * K + 2 * L * V + L * L + K) bytes). The products
/// over V and over the chunk run as tiles; the pairs' terms, whose row
/// gates take an exponent per pair and column, on FMAs, each lane its own
/// four elements of a tile of dq and dk.
KERNEL void cellc_chunk_diag_backward_tc(
    const float *a, const float *k, const float *v, const float *starts, const float *end,
    const float *pairs, const float *q, const float *dout, const float *dEnd, float *da,
    float *dk, float *dv, float *dS0, float *dq, i64 BH, i64 T, int K, int V, int L, int R) {
  extern __shared__ float smem[];
  const int bh = ctaX(), nt = threads(), th = thread(), warp = th / 32, warps = nt / 32;
  float *dS = smem, *A = dS + K * V, *ks = A + L * K, *qs = ks + L * K, *vs = qs + L * K,
        *dos = vs + L * V, *dP = dos + L * V, *Gn = dP + L * L, *kt = Gn + K;
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * V; i += nt)
    dS[i] = dEnd[bh * i64(K) * V + i];
  for (i64 ch = NC - 1; ch >= 0; --ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    const float *Sc = starts + (bh * NC + ch) * i64(K) * V;
    const float *Se = ch + 1 < NC ? Sc + i64(K) * V : end + bh * i64(K) * V;
    __syncthreads();
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadRows(v, t0, n, BH, bh, V, 0, V, vs, V);
    zeroRows(ks, n, L, K, K);
    zeroRows(vs, n, L, V, V);
    zeroRows(A, n, L, K, K);
    loadGates(a, t0, n, BH, bh, K, A);
    __syncthreads();
    const float *An = A + (n - 1) * K;
    for (int r = th; r < K; r += nt) {
      float g = 0.0f;
      for (int c = 0; c < V; ++c)
        g += dS[r * V + c] * Se[r * V + c];
      Gn[r] = g;
    }
    for (int i = th; i < L * K; i += nt)
      kt[i] = ks[i] * expOf(An[i % K] - A[i]);
    __syncthreads();
    // From the state's gradient: dv = (k e^{A_L - A}) dS, dk = e^{A_L - A}
    // (v dS^T).
    for (int t = warp; t < (L / 16) * (V / 8); t += warps) {
      const int r0 = (t / (V / 8)) * 16, c0 = (t % (V / 8)) * 8;
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, kt + r0 * K, K, 1, dS + c0, V, 1, K);
      for (int e = 0; e < 4; ++e) {
        int s = tileRow(r0, e), c = tileColumn(c0, e);
        if (s < n)
          dv[((t0 + s) * BH + bh) * V + c] = d[e];
      }
    }
    for (int t = warp; t < (L / 16) * (K / 8); t += warps) {
      const int r0 = (t / (K / 8)) * 16, c0 = (t % (K / 8)) * 8;
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, vs + r0 * V, V, 1, dS + c0 * V, 1, V, V);
      for (int e = 0; e < 4; ++e) {
        int s = tileRow(r0, e), r = tileColumn(c0, e);
        if (s < n) {
          i64 g = ((t0 + s) * BH + bh) * K + r;
          dk[g] = expOf(An[r] - A[s * K + r]) * d[e];
          da[g] = 0.0f;
        }
      }
    }
    __syncthreads();
    for (int i = th; i < K * V; i += nt)
      dS[i] *= expOf(An[i / V]);
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
      loadRows(dout + read * T * BH * V, t0, n, BH, bh, V, 0, V, dos, V);
      zeroRows(qs, n, L, K, K);
      zeroRows(dos, n, L, V, V);
      __syncthreads();
      // dP = do v^T on and below the diagonal; kt = q e^A.
      for (int t = warp; t < (L / 16) * (L / 8); t += warps) {
        const int r0 = (t / (L / 8)) * 16, c0 = (t % (L / 8)) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, dos + r0 * V, V, 1, vs + c0 * V, 1, V, V);
        for (int e = 0; e < 4; ++e) {
          int r = tileRow(r0, e), s = tileColumn(c0, e);
          dP[r * L + s] = s <= r && r < n ? d[e] : 0.0f;
        }
      }
      for (int i = th; i < L * K; i += nt)
        kt[i] = qs[i] * expOf(A[i]);
      __syncthreads();
      const float *P = pairs + ((bh * NC + ch) * R + read) * i64(L) * L;
      // dv += P^T do.
      for (int t = warp; t < (L / 16) * (V / 8); t += warps) {
        const int r0 = (t / (V / 8)) * 16, c0 = (t % (V / 8)) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, P + r0, 1, L, dos + c0, V, 1, L);
        for (int e = 0; e < 4; ++e) {
          int s = tileRow(r0, e), c = tileColumn(c0, e);
          if (s < n)
            dv[((t0 + s) * BH + bh) * V + c] += d[e];
        }
      }
      // dq = e^A (do Sc^T) + the pairs' (on FMAs), dk += the pairs'.
      float *dqr = dq + read * T * BH * K;
      for (int t = warp; t < (L / 16) * (K / 8); t += warps) {
        const int r0 = (t / (K / 8)) * 16, c0 = (t % (K / 8)) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, dos + r0 * V, V, 1, Sc + c0 * V, 1, V, V);
        for (int e = 0; e < 4; ++e) {
          int u = tileRow(r0, e), r = tileColumn(c0, e);
          if (u >= n)
            continue;
          float acc = expOf(A[u * K + r]) * d[e], back = 0.0f;
          for (int s = 0; s <= u; ++s)
            acc += dP[u * L + s] * ks[s * K + r] * expOf(A[u * K + r] - A[s * K + r]);
          for (int x = u; x < n; ++x)
            back += dP[x * L + u] * qs[x * K + r] * expOf(A[x * K + r] - A[u * K + r]);
          i64 g = ((t0 + u) * BH + bh) * K + r;
          dqr[g] = acc;
          dk[g] += back;
          da[g] += qs[u * K + r] * acc;
        }
      }
      // dS += (q e^A)^T do.
      for (int t = warp; t < (K / 16) * (V / 8); t += warps) {
        const int r0 = (t / (V / 8)) * 16, c0 = (t % (V / 8)) * 8;
        float d[4];
        for (int e = 0; e < 4; ++e)
          d[e] = dS[tileRow(r0, e) * V + tileColumn(c0, e)];
        tile(d, kt + r0, 1, K, dos + c0, V, 1, L);
        for (int e = 0; e < 4; ++e)
          dS[tileRow(r0, e) * V + tileColumn(c0, e)] = d[e];
      }
    }
    __syncthreads();
    for (int r = th; r < K; r += nt) {
      float acc = Gn[r];
      for (int t = n - 1; t >= 0; --t) {
        i64 g = ((t0 + t) * BH + bh) * K + r;
        acc += da[g] - ks[t * K + r] * dk[g];
        da[g] = acc;
      }
    }
  }
  __syncthreads();
  for (int i = th; i < K * V; i += nt)
    dS0[bh * i64(K) * V + i] = dS[i];
}
