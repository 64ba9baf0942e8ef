//===- ChunkDevice.cuh - What the chunk kernels share --------------------===//
//
// Part of runtime/cuda/ChunkKernels.cu, the one translation unit the
// chunk kernels are (clang CUDA with no CUDA headers): CUDA's words, the
// thread and CTA indices, the exponential written out (no libdevice: the
// same arithmetic on a GPU and in the SIMT emulator), the loads of a
// chunk's rows, and the tensor cores' tiles (mma.sync m16n8k8 with tf32
// operands, each product in three: 3xTF32).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_CHUNKDEVICE_CUH
#define CELLC_RUNTIME_CUDA_CHUNKDEVICE_CUH

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

/// The CTA's state tile, [K, bv] at row stride BV in shared memory, from the
/// [K, V] matrix `m` at column v0, or back into it.
__device__ void stateIn(float *S, const float *m, int K, int V, int v0, int bv, int BV) {
  for (int i = thread(); i < K * bv; i += threads())
    S[(i / bv) * BV + i % bv] = m[i64(i / bv) * V + v0 + i % bv];
}
__device__ void stateOut(const float *S, float *m, int K, int V, int v0, int bv, int BV) {
  for (int i = thread(); i < K * bv; i += threads())
    m[i64(i / bv) * V + v0 + i % bv] = S[(i / bv) * BV + i % bv];
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

/// The sum over the CTA of each thread's `x`, in every thread: a tree
/// through `part` (shared memory, a float a thread; the CTA's threads a
/// power of two). Every thread of the CTA calls it.
__device__ float ctaSum(float x, float *part) {
  const int th = thread();
  __syncthreads();
  part[th] = x;
  for (int half = threads() / 2; half > 0; half /= 2) {
    __syncthreads();
    if (th < half)
      part[th] += part[th + half];
  }
  __syncthreads();
  return part[0];
}

} // namespace

// The tensor cores (mma.sync m16n8k8, tf32 operands), where K is a multiple
// of 16, V of 8 and L of 16: the products over the chunk as 16 x 8 tiles a
// warp, each in three tf32 products (3xTF32: the high parts', and each low
// part's with the other's high part), which keep about f32's precision. The
// pair weights stay on FMAs: a row gate's need an exponent per pair and
// column. A chunk's rows past its last step are zeros in shared memory.

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

/// The tensor cores' output rows of a read, a warp a 16 x 8 tile:
/// o[(t0 + r) * BH + bh, v0 + c] = (qs S + P X)[r, c] for the chunk's n rows,
/// with qs [L, K] (the queries already scaled by their gates), P [L, L] and
/// S, X [., BV] in shared memory, and bv = 8 * across columns.
__device__ void readTiles(float *o, const float *qs, const float *S, const float *P,
                          const float *X, int K, int L, int BV, int across, int n, i64 t0,
                          i64 BH, int bh, int V, int v0) {
  const int warp = thread() / 32, warps = threads() / 32;
  for (int t = warp; t < (L / 16) * across; t += warps) {
    const int r0 = (t / across) * 16, c0 = (t % across) * 8;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile(d, qs + r0 * K, K, 1, S + c0, BV, 1, K);
    tile(d, P + r0 * L, L, 1, X + c0, BV, 1, L);
    for (int e = 0; e < 4; ++e) {
      int r = tileRow(r0, e), c = tileColumn(c0, e);
      if (r < n)
        o[((t0 + r) * BH + bh) * V + v0 + c] = d[e];
    }
  }
}

/// Rows [n, L) of an [L, width] block with stride ld: zeros.
__device__ void zeroRows(float *x, int n, int L, int width, int ld) {
  for (int i = thread(); i < (L - n) * width; i += threads())
    x[(n + i / width) * ld + i % width] = 0.0f;
}

} // namespace

#endif // CELLC_RUNTIME_CUDA_CHUNKDEVICE_CUH
