//===- HostKernels.cu - The CUDA backend's own small kernels --------------===//
//
// What the sequence driver asks of a backend besides the cell's kernels and
// its GEMMs: converting copies, sums into a buffer, rows filled from the
// biases, column sums (the biases' gradients), and the passes over
// per-sample lengths (rows past a length zeroed, a sample's row at its last
// step gathered or added to), in f32 and bf16. The
// runtime carries their PTX (HostKernels.ptx.inc, which
// scripts/gen-host-kernels.sh writes from this file with nvcc) and loads it
// with the driver, so it builds with neither nvcc nor LLVM. Every loop is
// grid-strided and every sum has one fixed order: results do not depend on
// the grid or the schedule.
//
//===----------------------------------------------------------------------===//

#include <cuda_bf16.h>

namespace {

__device__ __forceinline__ float load(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16 *p, long long i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, long long i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ long long first() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long stride() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

/// The vectors whose sum fills every row (an LSTM's b_ih and b_hh).
struct Vectors {
  const float *at[8];
  int count;
};

} // namespace

/// to[i] = from[i], converted.
template <typename From, typename To>
__device__ void convertBody(const From *from, To *to, long long n) {
  for (long long i = first(); i < n; i += stride())
    store(to, i, load(from, i));
}

/// to[i] += from[i].
template <typename From, typename To>
__device__ void accumulateBody(const From *from, To *to, long long n) {
  for (long long i = first(); i < n; i += stride())
    store(to, i, load(to, i) + load(from, i));
}

/// m[r, j] = the sum of the vectors' j-th elements, for every row r.
template <typename To>
__device__ void fillRowsBody(To *m, long long rows, long long cols, Vectors v) {
  long long n = rows * cols;
  for (long long i = first(); i < n; i += stride()) {
    long long j = i % cols;
    float sum = 0.0f;
    for (int k = 0; k < v.count; ++k)
      sum += v.at[k][j];
    store(m, i, sum);
  }
}

/// The first pass of column sums: partials[p, j] = the sum of m[r, j] over
/// rows r in part p (rows p * per .. (p + 1) * per), one block of 256
/// threads a part and 32 columns, its 8 warps' row strides summed in a
/// fixed order.
template <typename From>
__device__ void columnPartsBody(const From *m, long long rows, long long cols,
                                long long per, float *partials) {
  __shared__ float sums[8][33];
  unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long j = static_cast<long long>(blockIdx.x) * 32 + lane;
  long long part = blockIdx.y;
  long long r0 = part * per, r1 = min(rows, r0 + per);
  float sum = 0.0f;
  if (j < cols)
    for (long long r = r0 + warp; r < r1; r += 8)
      sum += load(m, r * cols + j);
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && j < cols) {
    float total = 0.0f;
    for (int w = 0; w < 8; ++w)
      total += sums[w][lane];
    partials[part * cols + j] = total;
  }
}

/// The second pass: acc[j] += the sum of partials[p, j] over the parts.
__device__ void columnFoldBody(const float *partials, long long parts, long long cols,
                               float *acc) {
  for (long long j = first(); j < cols; j += stride()) {
    float total = 0.0f;
    for (long long p = 0; p < parts; ++p)
      total += partials[p * cols + j];
    acc[j] += total;
  }
}

/// v[s, b, :] = 0 where lengths[b] <= from + s, over v's [len, B, n].
template <typename T>
__device__ void maskPastLengthsBody(T *v, long long len, long long B, long long n,
                                    const int *lengths, long long from) {
  long long total = len * B * n;
  for (long long i = first(); i < total; i += stride()) {
    long long row = i / n;
    if (lengths[row % B] <= from + row / B)
      store(v, i, 0.0f);
  }
}

/// to[b, :] = src[lengths[b] - 1 - t0, b, :] where that step is one of the
/// `len` of src.
template <typename From, typename To>
__device__ void gatherAtLengthsBody(const From *src, long long len, long long B, long long n,
                                    long long t0, const int *lengths, To *to) {
  for (long long i = first(); i < B * n; i += stride()) {
    long long b = i / n, s = static_cast<long long>(lengths[b]) - 1 - t0;
    if (s >= 0 && s < len)
      store(to, i, load(src, (s * B + b) * n + i % n));
  }
}

extern "C" __global__ void cellc_rt_mask_past_lengths_f32(float *v, long long len, long long B,
                                                          long long n, const int *lengths,
                                                          long long from) {
  maskPastLengthsBody(v, len, B, n, lengths, from);
}
extern "C" __global__ void cellc_rt_mask_past_lengths_bf16(__nv_bfloat16 *v, long long len,
                                                           long long B, long long n,
                                                           const int *lengths, long long from) {
  maskPastLengthsBody(v, len, B, n, lengths, from);
}
extern "C" __global__ void cellc_rt_gather_at_lengths_f32_f32(const float *src, long long len,
                                                              long long B, long long n,
                                                              long long t0, const int *lengths,
                                                              float *to) {
  gatherAtLengthsBody(src, len, B, n, t0, lengths, to);
}
extern "C" __global__ void cellc_rt_gather_at_lengths_bf16_f32(const __nv_bfloat16 *src,
                                                               long long len, long long B,
                                                               long long n, long long t0,
                                                               const int *lengths, float *to) {
  gatherAtLengthsBody(src, len, B, n, t0, lengths, to);
}
/// to[b, :] += src[b, :] where lengths[b] - 1 == step.
extern "C" __global__ void cellc_rt_add_at_lengths(const float *src, long long B, long long n,
                                                   const int *lengths, long long step,
                                                   float *to) {
  for (long long i = first(); i < B * n; i += stride())
    if (lengths[i / n] - 1 == step)
      to[i] += src[i];
}

/// to[c, r] = src[r, c] ([rows, cols] into [cols, rows]), a 32 x 32 tile a
/// block (blockIdx.x along the columns, blockIdx.y along the rows, by
/// gridDim.y), its 256 threads 8 rows of 32 at a time, through shared memory
/// so that both the reads and the writes go along rows.
template <typename T>
__device__ void transposeBody(const T *src, T *to, long long rows, long long cols) {
  __shared__ T tile[32][33];
  unsigned lane = threadIdx.x % 32, row = threadIdx.x / 32;
  long long c0 = static_cast<long long>(blockIdx.x) * 32;
  for (long long r0 = static_cast<long long>(blockIdx.y) * 32; r0 < rows;
       r0 += static_cast<long long>(gridDim.y) * 32) {
    for (unsigned k = row; k < 32; k += 8)
      if (r0 + k < rows && c0 + lane < cols)
        tile[k][lane] = src[(r0 + k) * cols + c0 + lane];
    __syncthreads();
    for (unsigned k = row; k < 32; k += 8)
      if (c0 + k < cols && r0 + lane < rows)
        to[(c0 + k) * rows + r0 + lane] = tile[lane][k];
    __syncthreads();
  }
}

extern "C" __global__ void cellc_rt_transpose_f32(const float *src, float *to, long long rows,
                                                  long long cols) {
  transposeBody(src, to, rows, cols);
}
extern "C" __global__ void cellc_rt_transpose_bf16(const __nv_bfloat16 *src, __nv_bfloat16 *to,
                                                   long long rows, long long cols) {
  transposeBody(src, to, rows, cols);
}

#define CELLC_PAIR(NAME, FROM, TO, F, T)                                         \
  extern "C" __global__ void cellc_rt_convert_##F##_##T(const FROM *from, TO *to, \
                                                        long long n) {           \
    convertBody(from, to, n);                                                    \
  }                                                                              \
  extern "C" __global__ void cellc_rt_accumulate_##F##_##T(const FROM *from,     \
                                                           TO *to, long long n) { \
    accumulateBody(from, to, n);                                                 \
  }

CELLC_PAIR(pair, float, float, f32, f32)
CELLC_PAIR(pair, float, __nv_bfloat16, f32, bf16)
CELLC_PAIR(pair, __nv_bfloat16, float, bf16, f32)
CELLC_PAIR(pair, __nv_bfloat16, __nv_bfloat16, bf16, bf16)

extern "C" __global__ void cellc_rt_fill_rows_f32(float *m, long long rows, long long cols,
                                                  Vectors v) {
  fillRowsBody(m, rows, cols, v);
}
extern "C" __global__ void cellc_rt_fill_rows_bf16(__nv_bfloat16 *m, long long rows,
                                                   long long cols, Vectors v) {
  fillRowsBody(m, rows, cols, v);
}
extern "C" __global__ void cellc_rt_column_parts_f32(const float *m, long long rows,
                                                     long long cols, long long per,
                                                     float *partials) {
  columnPartsBody(m, rows, cols, per, partials);
}
extern "C" __global__ void cellc_rt_column_parts_bf16(const __nv_bfloat16 *m, long long rows,
                                                      long long cols, long long per,
                                                      float *partials) {
  columnPartsBody(m, rows, cols, per, partials);
}
extern "C" __global__ void cellc_rt_column_fold(const float *partials, long long parts,
                                                long long cols, float *acc) {
  columnFoldBody(partials, parts, cols, acc);
}
