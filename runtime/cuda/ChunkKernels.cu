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
extern "C" __global__ void cellc_chunk_diag_forward(
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
extern "C" __global__ void cellc_chunk_diag_backward(
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
