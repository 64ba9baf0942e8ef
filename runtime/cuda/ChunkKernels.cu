//===- ChunkKernels.cu - The chunk form's diagonal core as CUDA kernels ---===//
//
// What runtime/cpu/ChunkCore does for a state with scalar or row gates,
// outer-product sources and reads after the update (GLA, RetNet, mLSTM), on
// a GPU: the chunkwise form, forward and its written-out adjoint, in f32.
//
// The arrays are those of the CPU core, time-major: a, k and the reads' q
// stacked as [R, T, BH, K]; v [T, BH, V], the reads' outputs stacked as
// [R, T, BH, V]; the states [BH, K, V]; `starts` [BH, NC, K, V]; `pairs`
// [BH, NC, R, L, L] (the pair weights q_t (e^{A_t - A_s} k_s) for s <= t,
// zero above the diagonal). A scalar gate comes spread over K.
//
// The forward takes a CTA per (sample and head, tile of BV columns of the
// state): the columns of a diagonal state are independent. It holds its
// state tile in shared memory and runs the chunks in order: the chunk's
// cumulative log-gates, each read's pair weights and outputs, then the
// state at the chunk's end. The backward takes a CTA per sample and head
// and runs the chunks in reverse with the state's gradient in shared
// memory: the gradients of k and v from it and the pairs, of q from the
// state at the chunk's start, and of the log-gates from the identity
// q dq - k dk (plus the end state's term) summed from the chunk's end.
// Every exponent taken is <= 0 where the gates are <= 1.
//
// This file is clang CUDA with no CUDA headers (scripts/gen-chunk-kernels.sh
// compiles it): one LLVM IR for the NVPTX backend (the PTX the runtime
// loads) and for the SIMT emulator (compileSimtObject), so that what the
// emulator checks is what a GPU runs. The exponential is written out (no
// libdevice), the same on both.
//
//===----------------------------------------------------------------------===//

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
// Every kernel runs 256 threads a CTA (ChunkCuda.cpp). No launch bounds:
// with them ptxas caps the registers low and spills; without, the most a
// kernel takes (220) still launches 256 threads.
#define KERNEL extern "C" __global__

typedef long long i64;

namespace {

__device__ inline int thread() { return __nvvm_read_ptx_sreg_tid_x(); }
__device__ inline int threads() { return __nvvm_read_ptx_sreg_ntid_x(); }
__device__ inline int ctaX() { return __nvvm_read_ptx_sreg_ctaid_x(); }
__device__ inline int ctaY() { return __nvvm_read_ptx_sreg_ctaid_y(); }
__device__ inline int imin(int a, int b) { return a < b ? a : b; }

/// e^x in f32 to about an ulp (Cephes' expf): 2^n e^r with |r| <= ln 2 / 2.
__device__ inline float expOf(float x) {
  if (x < -87.0f)
    return 0.0f;
  if (x > 88.0f)
    x = 88.0f;
  float n = __builtin_rintf(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  return e * __builtin_bit_cast(float, (int(n) + 127) << 23);
}

/// The chunk's log-gates [n, K] from a, summed from its start, per column.
__device__ void loadGates(const float *a, i64 t0, int n, i64 BH, int bh, int K, float *A) {
  for (int i = thread(); i < n * K; i += threads()) {
    int t = i / K, c = i % K;
    A[t * K + c] = a[((t0 + t) * BH + bh) * K + c];
  }
  __syncthreads();
  for (int c = thread(); c < K; c += threads()) {
    float s = 0.0f;
    for (int t = 0; t < n; ++t) {
      s += A[t * K + c];
      A[t * K + c] = s;
    }
  }
}

/// rows [n, width] of x ([T, BH, stride], columns from c0) into `to`
/// ([n, ld]).
__device__ void loadRows(const float *x, i64 t0, int n, i64 BH, int bh, int stride, int c0,
                         int width, float *to, int ld) {
  for (int i = thread(); i < n * width; i += threads()) {
    int t = i / width, c = i % width;
    to[t * ld + c] = x[((t0 + t) * BH + bh) * stride + c0 + c];
  }
}

} // namespace

/// Grid (BH, ceil(V / BV)), dynamic shared memory
/// 4 * (K * BV + 3 * L * K + L * BV + L * L) bytes.
KERNEL void cellc_chunk_diag_forward(
    const float *a, const float *k, const float *v, const float *S0, const float *q,
    float *out, float *starts, float *end, float *pairs, i64 BH, i64 T, int K, int V, int L,
    int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *A = S + K * BV, *ks = A + L * K, *qs = ks + L * K, *vs = qs + L * K,
        *P = vs + L * BV;
  const int nt = threads(), th = thread();
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    S[r * BV + c] = S0[(bh * i64(K) + r) * V + v0 + c];
  }
  for (i64 ch = 0; ch < NC; ++ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    __syncthreads();
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      starts[((bh * NC + ch) * K + r) * V + v0 + c] = S[r * BV + c];
    }
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadRows(v, t0, n, BH, bh, V, v0, bv, vs, BV);
    loadGates(a, t0, n, BH, bh, K, A);
    for (int read = 0; read < R; ++read) {
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
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
      float *o = out + read * T * BH * V;
      for (int i = th; i < n * bv; i += nt) {
        int t = i / bv, c = i % bv;
        float acc = 0.0f;
        for (int r = 0; r < K; ++r)
          acc += qs[t * K + r] * expOf(A[t * K + r]) * S[r * BV + c];
        for (int s = 0; s <= t; ++s)
          acc += P[t * L + s] * vs[s * BV + c];
        o[((t0 + t) * BH + bh) * V + v0 + c] = acc;
      }
      __syncthreads();
    }
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      float An = A[(n - 1) * K + r];
      float s = expOf(An) * S[r * BV + c];
      for (int t = 0; t < n; ++t)
        s += ks[t * K + r] * expOf(An - A[t * K + r]) * vs[t * BV + c];
      S[r * BV + c] = s;
    }
  }
  __syncthreads();
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    end[(bh * i64(K) + r) * V + v0 + c] = S[r * BV + c];
  }
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

//===----------------------------------------------------------------------===//
// The delta rule with a scalar gate (DeltaNet, gated DeltaNet), as
// runtime/cpu/ChunkCore's deltaForward and deltaBackward: a and beta
// [T, BH], k [T, BH, K], the targets w [T, BH, V]. Within a chunk the new
// values U = (I + M)^-1 beta (w - e^A k S), M_ij = beta_i (k_i . k_j)
// e^{A_i - A_j} below the diagonal, by substitution a column a thread;
// the state passes as S' = e^{A_L} S + (k e^{A_L - A})^T U. The columns of
// the state are independent, so the forward takes a CTA per (sample and
// head, tile of BV columns).
//===----------------------------------------------------------------------===//

namespace {

/// The chunk's scalar log-gates summed from its start, and beta, [n].
__device__ void loadScalars(const float *a, const float *beta, i64 t0, int n, i64 BH, int bh,
                            float *A, float *bt) {
  for (int i = thread(); i < n; i += threads()) {
    A[i] = a[(t0 + i) * BH + bh];
    bt[i] = beta[(t0 + i) * BH + bh];
  }
  __syncthreads();
  if (thread() == 0)
    for (int i = 1; i < n; ++i)
      A[i] += A[i - 1];
}

__device__ inline float dot(const float *x, const float *y, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i)
    s += x[i] * y[i];
  return s;
}

} // namespace

/// Grid (BH, ceil(V / BV)), dynamic shared memory
/// 4 * (K * BV + 2 * L * K + L * BV + 2 * L * L + 2 * L) bytes.
KERNEL void cellc_chunk_delta_forward(
    const float *a, const float *k, const float *w, const float *beta, const float *S0,
    const float *q, float *out, float *starts, float *end, i64 BH, i64 T, int K, int V,
    int L, int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *ks = S + K * BV, *qs = ks + L * K, *U = qs + L * K, *M = U + L * BV,
        *P = M + L * L, *A = P + L * L, *bt = A + L;
  const int nt = threads(), th = thread();
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    S[r * BV + c] = S0[(bh * i64(K) + r) * V + v0 + c];
  }
  for (i64 ch = 0; ch < NC; ++ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    __syncthreads();
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      starts[((bh * NC + ch) * K + r) * V + v0 + c] = S[r * BV + c];
    }
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadScalars(a, beta, t0, n, BH, bh, A, bt);
    __syncthreads();
    for (int i = th; i < n * n; i += nt) {
      int r = i / n, s = i % n;
      M[r * L + s] = s < r ? bt[r] * dot(ks + r * K, ks + s * K, K) * expOf(A[r] - A[s]) : 0.0f;
    }
    for (int i = th; i < n * bv; i += nt) {
      int t = i / bv, c = i % bv;
      float kS = 0.0f;
      for (int r = 0; r < K; ++r)
        kS += ks[t * K + r] * S[r * BV + c];
      U[t * BV + c] = bt[t] * (w[((t0 + t) * BH + bh) * V + v0 + c] - expOf(A[t]) * kS);
    }
    __syncthreads();
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
      __syncthreads();
      for (int i = th; i < n * n; i += nt) {
        int t = i / n, s = i % n;
        P[t * L + s] = s <= t ? dot(qs + t * K, ks + s * K, K) * expOf(A[t] - A[s]) : 0.0f;
      }
      __syncthreads();
      float *o = out + read * T * BH * V;
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
    __syncthreads();
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      float An = A[n - 1];
      float s = expOf(An) * S[r * BV + c];
      for (int t = 0; t < n; ++t)
        s += ks[t * K + r] * expOf(An - A[t]) * U[t * BV + c];
      S[r * BV + c] = s;
    }
  }
  __syncthreads();
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    end[(bh * i64(K) + r) * V + v0 + c] = S[r * BV + c];
  }
}

/// Grid (BH), dynamic shared memory
/// 4 * (K * V + 2 * L * K + 3 * L * V + 3 * L * L + 3 * L) bytes. The
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
    // U = (I + M)^-1 U0, a column a thread.
    for (int c = th; c < V; c += nt)
      for (int t = 1; t < n; ++t) {
        float x = U[t * V + c];
        for (int s = 0; s < t; ++s)
          x -= bt[t] * KK[t * L + s] * expOf(A[t] - A[s]) * U[s * V + c];
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
    // dR = (I + M)^-T dU, a column a thread.
    for (int c = th; c < V; c += nt)
      for (int t = n - 2; t >= 0; --t) {
        float x = dU[t * V + c];
        for (int s = t + 1; s < n; ++s)
          x -= bt[s] * KK[s * L + t] * expOf(A[s] - A[t]) * dU[s * V + c];
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
    __syncthreads();
    if (th == 0) {
      float sum = 0.0f;
      for (int i = 0; i < K * V; ++i)
        sum += Sc[i] * G[i];
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

//===----------------------------------------------------------------------===//
// The forwards on the tensor cores (mma.sync m16n8k8, tf32 operands), where
// K is a multiple of 16, V of 8 and L of 16: the products over the chunk
// (the reads' q e^A S and P v or P U, the state's k^T v and the delta rule's
// k S) as 16 x 8 tiles a warp, each in three tf32 products (3xTF32: the
// high parts', and each low part's with the other's high part), which keep
// about f32's precision. The pair weights stay on FMAs: a row gate's need
// an exponent per pair and column. A chunk's rows past its last step are
// zeros in shared memory.
//===----------------------------------------------------------------------===//

namespace {

__device__ inline int lane() { return __nvvm_read_ptx_sreg_laneid(); }

/// x as a high tf32 part (its top 10 mantissa bits, as the tensor cores
/// read it) and what is left, exactly.
__device__ inline void split(float x, unsigned &hi, unsigned &lo) {
  unsigned bits = __builtin_bit_cast(unsigned, x) & 0xffffe000u;
  hi = bits;
  lo = __builtin_bit_cast(unsigned, x - __builtin_bit_cast(float, bits));
}

/// d += a b over one m16n8k8 tile, the warp's lanes holding the PTX ISA's
/// fragments.
__device__ inline void mma(float d[4], const unsigned a[4], const unsigned b[2]) {
  float r0, r1, r2, r3;
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
               : "=f"(r0), "=f"(r1), "=f"(r2), "=f"(r3)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                 "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]));
  d[0] = r0;
  d[1] = r1;
  d[2] = r2;
  d[3] = r3;
}

/// The lane's part of a 16 x 8 tile (the C fragment: d0 (g, 2q), d1
/// (g, 2q + 1), d2 (g + 8, 2q), d3 (g + 8, 2q + 1), g = lane / 4, q =
/// lane % 4) plus the product of 16 rows of A and 8 columns of B over
/// `depth` (a multiple of 8), with A(i, k) = A[i * ai + k * ak] and
/// B(k, j) = B[k * bk + j * bj]. The whole warp calls it.
__device__ void tile(float d[4], const float *A, int ai, int ak, const float *B, int bk,
                     int bj, int depth) {
  const int g = lane() >> 2, q = lane() & 3;
  for (int k0 = 0; k0 < depth; k0 += 8) {
    const float a[4] = {A[g * ai + (k0 + q) * ak], A[(g + 8) * ai + (k0 + q) * ak],
                        A[g * ai + (k0 + q + 4) * ak], A[(g + 8) * ai + (k0 + q + 4) * ak]};
    const float b[2] = {B[(k0 + q) * bk + g * bj], B[(k0 + q + 4) * bk + g * bj]};
    unsigned ah[4], al[4], bh[2], bl[2];
    for (int i = 0; i < 4; ++i)
      split(a[i], ah[i], al[i]);
    for (int i = 0; i < 2; ++i)
      split(b[i], bh[i], bl[i]);
    mma(d, al, bh);
    mma(d, ah, bl);
    mma(d, ah, bh);
  }
}

/// The row and column of each of the lane's four elements in a tile at
/// (r0, c0).
__device__ inline int tileRow(int r0, int e) { return r0 + (lane() >> 2) + (e >= 2 ? 8 : 0); }
__device__ inline int tileColumn(int c0, int e) { return c0 + 2 * (lane() & 3) + (e & 1); }

/// Rows [n, L) of an [L, width] block with stride ld: zeros.
__device__ void zeroRows(float *x, int n, int L, int width, int ld) {
  for (int i = thread(); i < (L - n) * width; i += threads())
    x[(n + i / width) * ld + i % width] = 0.0f;
}

} // namespace

/// cellc_chunk_diag_forward on the tensor cores: the same grid, shared
/// memory and results.
KERNEL void cellc_chunk_diag_forward_tc(
    const float *a, const float *k, const float *v, const float *S0, const float *q,
    float *out, float *starts, float *end, float *pairs, i64 BH, i64 T, int K, int V, int L,
    int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *A = S + K * BV, *ks = A + L * K, *qs = ks + L * K, *vs = qs + L * K,
        *P = vs + L * BV;
  const int nt = threads(), th = thread(), warp = th / 32, warps = nt / 32;
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    S[r * BV + c] = S0[(bh * i64(K) + r) * V + v0 + c];
  }
  for (i64 ch = 0; ch < NC; ++ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    __syncthreads();
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      starts[((bh * NC + ch) * K + r) * V + v0 + c] = S[r * BV + c];
    }
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    loadRows(v, t0, n, BH, bh, V, v0, bv, vs, BV);
    zeroRows(ks, n, L, K, K);
    zeroRows(vs, n, L, bv, BV);
    zeroRows(A, n, L, K, K);
    loadGates(a, t0, n, BH, bh, K, A);
    for (int read = 0; read < R; ++read) {
      __syncthreads();
      loadRows(q + read * T * BH * K, t0, n, BH, bh, K, 0, K, qs, K);
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
      for (int i = th; i < L * K; i += nt)
        qs[i] *= expOf(A[i]);
      __syncthreads();
      // out = (q e^A) S + P v, a 16 x 8 tile a warp at a time.
      float *o = out + read * T * BH * V;
      const int across = bv / 8;
      for (int t = warp; t < (L / 16) * across; t += warps) {
        const int r0 = (t / across) * 16, c0 = (t % across) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, qs + r0 * K, K, 1, S + c0, BV, 1, K);
        tile(d, P + r0 * L, L, 1, vs + c0, BV, 1, L);
        for (int e = 0; e < 4; ++e) {
          int r = tileRow(r0, e), c = tileColumn(c0, e);
          if (r < n)
            o[((t0 + r) * BH + bh) * V + v0 + c] = d[e];
        }
      }
    }
    __syncthreads();
    const float *An = A + (n - 1) * K;
    for (int i = th; i < n * K; i += nt)
      ks[i] *= expOf(An[i % K] - A[i]);
    __syncthreads();
    // S = e^{A_L} S + (k e^{A_L - A})^T v, a tile a warp at a time.
    const int across = bv / 8;
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
  }
  __syncthreads();
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    end[(bh * i64(K) + r) * V + v0 + c] = S[r * BV + c];
  }
}

/// cellc_chunk_delta_forward on the tensor cores: the same grid, shared
/// memory and results.
KERNEL void cellc_chunk_delta_forward_tc(
    const float *a, const float *k, const float *w, const float *beta, const float *S0,
    const float *q, float *out, float *starts, float *end, i64 BH, i64 T, int K, int V,
    int L, int R, int BV) {
  extern __shared__ float smem[];
  const int bh = ctaX(), v0 = ctaY() * BV, bv = imin(BV, V - v0);
  float *S = smem, *ks = S + K * BV, *qs = ks + L * K, *U = qs + L * K, *M = U + L * BV,
        *P = M + L * L, *A = P + L * L, *bt = A + L;
  const int nt = threads(), th = thread(), warp = th / 32, warps = nt / 32;
  const int across = bv / 8;
  const i64 NC = (T + L - 1) / L;
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    S[r * BV + c] = S0[(bh * i64(K) + r) * V + v0 + c];
  }
  for (i64 ch = 0; ch < NC; ++ch) {
    const i64 t0 = ch * L;
    const int n = int(T - t0 < L ? T - t0 : L);
    __syncthreads();
    for (int i = th; i < K * bv; i += nt) {
      int r = i / bv, c = i % bv;
      starts[((bh * NC + ch) * K + r) * V + v0 + c] = S[r * BV + c];
    }
    loadRows(k, t0, n, BH, bh, K, 0, K, ks, K);
    zeroRows(ks, n, L, K, K);
    for (int i = th; i < L; i += nt)
      if (i >= n)
        A[i] = bt[i] = 0.0f;
    loadScalars(a, beta, t0, n, BH, bh, A, bt);
    __syncthreads();
    for (int i = th; i < n * n; i += nt) {
      int r = i / n, s = i % n;
      M[r * L + s] = s < r ? bt[r] * dot(ks + r * K, ks + s * K, K) * expOf(A[r] - A[s]) : 0.0f;
    }
    // U0 = beta (w - e^A k S): k S a tile a warp at a time.
    for (int t = warp; t < (L / 16) * across; t += warps) {
      const int r0 = (t / across) * 16, c0 = (t % across) * 8;
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile(d, ks + r0 * K, K, 1, S + c0, BV, 1, K);
      for (int e = 0; e < 4; ++e) {
        int r = tileRow(r0, e), c = tileColumn(c0, e);
        U[r * BV + c] =
            r < n ? bt[r] * (w[((t0 + r) * BH + bh) * V + v0 + c] - expOf(A[r]) * d[e]) : 0.0f;
      }
    }
    __syncthreads();
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
      zeroRows(qs, n, L, K, K);
      __syncthreads();
      for (int i = th; i < L * L; i += nt) {
        int t = i / L, s = i % L;
        P[i] = s <= t && t < n ? dot(qs + t * K, ks + s * K, K) * expOf(A[t] - A[s]) : 0.0f;
      }
      __syncthreads();
      for (int i = th; i < L * K; i += nt)
        qs[i] *= expOf(A[i / K]);
      __syncthreads();
      float *o = out + read * T * BH * V;
      for (int t = warp; t < (L / 16) * across; t += warps) {
        const int r0 = (t / across) * 16, c0 = (t % across) * 8;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile(d, qs + r0 * K, K, 1, S + c0, BV, 1, K);
        tile(d, P + r0 * L, L, 1, U + c0, BV, 1, L);
        for (int e = 0; e < 4; ++e) {
          int r = tileRow(r0, e), c = tileColumn(c0, e);
          if (r < n)
            o[((t0 + r) * BH + bh) * V + v0 + c] = d[e];
        }
      }
    }
    __syncthreads();
    const float An = A[n - 1];
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
  }
  __syncthreads();
  for (int i = th; i < K * bv; i += nt) {
    int r = i / bv, c = i % bv;
    end[(bh * i64(K) + r) * V + v0 + c] = S[r * BV + c];
  }
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

/// cellc_chunk_delta_backward on the tensor cores: the same grid and
/// results, with an [L, K] block and an [L, L] one more of shared memory
/// (4 * (K * V + 3 * L * K + 3 * L * V + 4 * L * L + 3 * L) bytes). The
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
    for (int c = th; c < V; c += nt)
      for (int t = 1; t < n; ++t) {
        float x = U[t * V + c];
        for (int s = 0; s < t; ++s)
          x -= bt[t] * KK[t * L + s] * expOf(A[t] - A[s]) * U[s * V + c];
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
    // dR = (I + M)^-T dU, a column a thread.
    for (int c = th; c < V; c += nt)
      for (int t = n - 2; t >= 0; --t) {
        float x = dU[t * V + c];
        for (int s = t + 1; s < n; ++s)
          x -= bt[s] * KK[s * L + t] * expOf(A[s] - A[t]) * dU[s * V + c];
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
    __syncthreads();
    if (th == 0) {
      float sum = 0.0f;
      for (int i = 0; i < K * V; ++i)
        sum += Sc[i] * G[i];
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
