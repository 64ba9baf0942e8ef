//===- ChunkCuda.cpp - The chunk form's CUDA kernels, launched ------------===//
//
// The C interface's cellc_cuda_chunk_* and _delta_* (CudaC.h): ChunkKernels.cu's kernels
// loaded on a GPU (their PTX, ChunkKernels.ptx.inc) or in the SIMT emulator
// (the object the compiler writes from the same IR), and launched on the
// caller's stream with the grids and shared memory the kernels assume.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CudaC.h"
#include "runtime/cuda/GpuDevice.h"
#include "runtime/driver/CErrors.h"
#include "runtime/emu/EmuDevice.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace cellc;
using cellc::driver::check;

namespace {

const char *const kChunkPtx =
#include "runtime/cuda/ChunkKernels.ptx.inc"
    ;

constexpr unsigned kThreads = 256;
/// The forward's columns of the state a CTA.
constexpr int32_t kColumns = 64;

struct ChunkKernels {
  std::unique_ptr<cuda::Device> device;
};

void checkShape(const cellc_chunk_shape &s) {
  if (s.BH < 1 || s.T < 1 || s.K < 1 || s.V < 1 || s.L < 1 || s.reads < 1)
    throw std::runtime_error("the chunk kernels need BH, T, K, V, L and reads >= 1 (BH=" +
                             std::to_string(s.BH) + ", T=" + std::to_string(s.T) + ")");
  if (s.BH > 0x7fffffff)
    throw std::runtime_error("the chunk kernels take at most 2^31 - 1 samples x heads");
}

int64_t chunks(const cellc_chunk_shape &s) { return (s.T + s.L - 1) / s.L; }

enum class Kernel { DiagForward, DiagBackward, DeltaForward, DeltaBackward };

/// Whether the kernels run their products on the tensor cores: asked, and
/// the tiles fit (16 rows of K and of a chunk, 8 columns of V).
bool tensorCores(const cellc_chunk_shape &s) {
  return s.tensor_cores && s.K % 16 == 0 && s.L % 16 == 0 && s.V % 8 == 0;
}

/// The launch of one kernel: a CTA per (sample and head, column tile) in the
/// forwards, per sample and head in the backwards, with the shared memory
/// each kernel's comment gives.
cuda::LaunchSpec launchOf(const cellc_chunk_shape &s, Kernel kernel) {
  cuda::LaunchSpec spec;
  int64_t K = s.K, V = s.V, L = s.L, BV = std::min<int64_t>(V, kColumns);
  int64_t floats = 0;
  switch (kernel) {
  case Kernel::DiagForward:
    spec.kernel = "cellc_chunk_diag_forward";
    floats = K * BV + 3 * L * K + L * BV + L * L;
    break;
  case Kernel::DiagBackward:
    spec.kernel = "cellc_chunk_diag_backward";
    floats = K * V + 3 * L * K + 2 * L * V + L * L + K;
    if (tensorCores(s)) {
      spec.kernel += "_tc";
      floats += L * K;
    }
    break;
  case Kernel::DeltaForward:
    spec.kernel = "cellc_chunk_delta_forward";
    floats = K * BV + 2 * L * K + L * BV + 2 * L * L + 2 * L;
    break;
  case Kernel::DeltaBackward:
    spec.kernel = "cellc_chunk_delta_backward";
    // The last kThreads: ctaSum's.
    floats = K * V + 2 * L * K + 3 * L * V + 3 * L * L + 3 * L + kThreads;
    if (tensorCores(s)) {
      spec.kernel += "_tc";
      floats += L * K + L * L;
    }
    break;
  }
  if (kernel == Kernel::DiagForward || kernel == Kernel::DeltaForward) {
    spec.gridY = unsigned((V + BV - 1) / BV);
    if (tensorCores(s))
      spec.kernel += "_tc";
  }
  if (floats * 4 > (int64_t(1) << 31))
    throw std::runtime_error("the chunk kernels' shared memory overflows");
  spec.gridX = unsigned(s.BH);
  spec.block = kThreads;
  spec.sharedBytes = unsigned(floats * 4);
  return spec;
}

/// Launches `spec` with `args` (each a pointer to the argument's value) and
/// `buffers` (what the emulator lets it touch) on `stream`.
void run(ChunkKernels &k, cuda::LaunchSpec spec, std::vector<void *> args,
         std::vector<std::pair<const void *, int64_t>> buffers, void *stream) {
  spec.params = args.data();
  spec.numParams = args.size();
  spec.buffers = std::move(buffers);
  check(k.device->begin(stream));
  driver::Status status = k.device->launch(spec);
  k.device->end();
  check(status);
}

} // namespace

extern "C" {

void *cellc_cuda_chunk_open(int32_t device, const char *simt_object, uint64_t shuffle_seed,
                            char *error, size_t size) {
  auto kernels = std::make_unique<ChunkKernels>();
  int failed = driver::catchErrors(error, size, [&] {
    if (device < 0) {
      if (!simt_object)
        throw std::runtime_error("the emulator's chunk kernels need their object");
      kernels->device =
          std::make_unique<emu::EmuDevice>(simt_object, simt_object, shuffle_seed);
    } else {
      std::vector<std::string> names = {
          "cellc_chunk_diag_forward",     "cellc_chunk_diag_backward",
          "cellc_chunk_delta_forward",    "cellc_chunk_delta_backward",
          "cellc_chunk_diag_forward_tc", "cellc_chunk_delta_forward_tc",
          "cellc_chunk_diag_backward_tc", "cellc_chunk_delta_backward_tc"};
      kernels->device = std::make_unique<cuda::GpuDevice>(device, kChunkPtx, names);
    }
  });
  return failed ? nullptr : kernels.release();
}

void cellc_cuda_chunk_free(void *kernels) { delete static_cast<ChunkKernels *>(kernels); }

const char *cellc_cuda_chunk_ptx(void) { return kChunkPtx; }

int cellc_cuda_chunk_admit(void *kernels, const cellc_chunk_shape *shape, int32_t delta,
                           char *error, size_t size) {
  return driver::catchErrors(error, size, [&] {
    checkShape(*shape);
    auto &k = *static_cast<ChunkKernels *>(kernels);
    for (Kernel kernel : delta ? std::vector{Kernel::DeltaForward, Kernel::DeltaBackward}
                               : std::vector{Kernel::DiagForward, Kernel::DiagBackward})
      check(k.device->admit(launchOf(*shape, kernel)));
  });
}

int cellc_cuda_chunk_forward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                             const float *k, const float *v, const float *S0, const float *q,
                             float *out, float *starts, float *end, float *pairs,
                             void *stream, char *error, size_t size) {
  return driver::catchErrors(error, size, [&] {
    const cellc_chunk_shape &s = *shape;
    checkShape(s);
    int64_t NC = chunks(s), R = s.reads, f = 4;
    int64_t seqK = s.T * s.BH * s.K * f, seqV = s.T * s.BH * s.V * f,
            state = s.BH * int64_t(s.K) * s.V * f;
    int64_t BH = s.BH, T = s.T;
    int32_t K = s.K, V = s.V, L = s.L, reads = s.reads;
    int32_t BV = std::min<int32_t>(s.V, kColumns);
    std::vector<void *> args = {&a,  &k,  &v,  &S0, &q,     &out, &starts, &end, &pairs,
                                &BH, &T,  &K,  &V,  &L,     &reads, &BV};
    run(*static_cast<ChunkKernels *>(kernels), launchOf(s, Kernel::DiagForward), args,
        {{a, seqK}, {k, seqK}, {v, seqV}, {S0, state}, {q, R * seqK}, {out, R * seqV},
         {starts, NC * state}, {end, state}, {pairs, BH * NC * R * L * L * f}},
        stream);
  });
}

int cellc_cuda_chunk_backward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                              const float *k, const float *v, const float *starts,
                              const float *end, const float *pairs, const float *q,
                              const float *dout, const float *dEnd, float *da, float *dk,
                              float *dv, float *dS0, float *dq, void *stream, char *error,
                              size_t size) {
  return driver::catchErrors(error, size, [&] {
    const cellc_chunk_shape &s = *shape;
    checkShape(s);
    int64_t NC = chunks(s), R = s.reads, f = 4;
    int64_t seqK = s.T * s.BH * s.K * f, seqV = s.T * s.BH * s.V * f,
            state = s.BH * int64_t(s.K) * s.V * f;
    int64_t BH = s.BH, T = s.T;
    int32_t K = s.K, V = s.V, L = s.L, reads = s.reads;
    std::vector<void *> args = {&a,  &k,  &v,  &starts, &end, &pairs, &q, &dout,
                                &dEnd, &da, &dk, &dv, &dS0, &dq, &BH, &T, &K, &V, &L, &reads};
    run(*static_cast<ChunkKernels *>(kernels), launchOf(s, Kernel::DiagBackward), args,
        {{a, seqK}, {k, seqK}, {v, seqV}, {starts, NC * state}, {end, state},
         {pairs, BH * NC * R * L * L * f}, {q, R * seqK}, {dout, R * seqV}, {dEnd, state},
         {da, seqK}, {dk, seqK}, {dv, seqV}, {dS0, state}, {dq, R * seqK}},
        stream);
  });
}

int cellc_cuda_delta_forward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                             const float *k, const float *w, const float *beta,
                             const float *S0, const float *q, float *out, float *starts,
                             float *end, void *stream, char *error, size_t size) {
  return driver::catchErrors(error, size, [&] {
    const cellc_chunk_shape &s = *shape;
    checkShape(s);
    int64_t NC = chunks(s), R = s.reads, f = 4;
    int64_t seq = s.T * s.BH * f, seqK = seq * s.K, seqV = seq * s.V,
            state = s.BH * int64_t(s.K) * s.V * f;
    int64_t BH = s.BH, T = s.T;
    int32_t K = s.K, V = s.V, L = s.L, reads = s.reads;
    int32_t BV = std::min<int32_t>(s.V, kColumns);
    std::vector<void *> args = {&a,  &k, &w, &beta, &S0, &q,     &out, &starts,
                                &end, &BH, &T, &K,   &V,  &L, &reads, &BV};
    run(*static_cast<ChunkKernels *>(kernels), launchOf(s, Kernel::DeltaForward), args,
        {{a, seq}, {k, seqK}, {w, seqV}, {beta, seq}, {S0, state}, {q, R * seqK},
         {out, R * seqV}, {starts, NC * state}, {end, state}},
        stream);
  });
}

int cellc_cuda_delta_backward(void *kernels, const cellc_chunk_shape *shape, const float *a,
                              const float *k, const float *w, const float *beta,
                              const float *starts, const float *end, const float *q,
                              const float *dout, const float *dEnd, float *da, float *dk,
                              float *dw, float *dbeta, float *dS0, float *dq, void *stream,
                              char *error, size_t size) {
  return driver::catchErrors(error, size, [&] {
    const cellc_chunk_shape &s = *shape;
    checkShape(s);
    int64_t NC = chunks(s), R = s.reads, f = 4;
    int64_t seq = s.T * s.BH * f, seqK = seq * s.K, seqV = seq * s.V,
            state = s.BH * int64_t(s.K) * s.V * f;
    int64_t BH = s.BH, T = s.T;
    int32_t K = s.K, V = s.V, L = s.L, reads = s.reads;
    std::vector<void *> args = {&a,  &k,  &w,    &beta, &starts, &end, &q,  &dout, &dEnd,
                                &da, &dk, &dw, &dbeta, &dS0,   &dq,  &BH, &T,   &K,
                                &V,  &L,  &reads};
    run(*static_cast<ChunkKernels *>(kernels), launchOf(s, Kernel::DeltaBackward), args,
        {{a, seq}, {k, seqK}, {w, seqV}, {beta, seq}, {starts, NC * state}, {end, state},
         {q, R * seqK}, {dout, R * seqV}, {dEnd, state}, {da, seq}, {dk, seqK}, {dw, seqV},
         {dbeta, seq}, {dS0, state}, {dq, R * seqK}},
        stream);
  });
}

} // extern "C"
