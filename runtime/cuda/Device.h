//===- Device.h - What the CUDA backend runs on: a GPU or the emulator -*- C++ -*-===//
//
// The CUDA backend (CudaBackend.h) does the host work of a call once: it
// places the call's buffers in one workspace, builds each launch's
// arguments and grid, and chooses the element types of each GEMM. A Device
// carries out what is left at the leaves, on device memory: a GPU through
// libcuda and cuBLAS (GpuDevice), or the SIMT emulator with host loops and
// the host's BLAS (runtime/emu/EmuDevice). Both see the same calls, in the
// same order, on the same buffers.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_DEVICE_H
#define CELLC_RUNTIME_CUDA_DEVICE_H

#include "runtime/driver/SequenceDriver.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cellc::cuda {

using driver::Element;
using driver::Status;

/// One launch of a cell's kernel, as cuLaunchKernel takes it.
struct LaunchSpec {
  std::string kernel;
  /// The package's variant: the one that saves gates, or the one that
  /// replays them.
  bool saveGates = false;
  unsigned gridX = 1, gridY = 1, block = 1, sharedBytes = 0;
  /// All CTAs resident together (the persistent strategy's grid barriers).
  bool cooperative = false;
  /// Registers per thread, where the package knows them (ptxas's figure;
  /// -1: not known). A GPU's driver knows its own; the SIMT emulator's
  /// device model counts these.
  int registers = -1;
  /// A pointer to each kernel parameter's value (a memref's descriptor
  /// words one by one, as NVPTX expands it).
  void **params = nullptr;
  size_t numParams = 0;
  /// The memory each memref argument spans, (address, bytes): what the
  /// emulator lets the kernel touch.
  std::vector<std::pair<const void *, int64_t>> buffers;
};

/// How many CTAs of one kernel a device keeps resident at once: what a
/// cooperative launch may hold.
struct Residency {
  int64_t perSm = 0, sms = 0;
  int64_t total() const { return perSm * sms; }
};

/// The refusal of a cooperative grid larger than the device holds, as the
/// driver gives it (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), with what
/// was asked for and what fits: the same words from a GPU and from the
/// emulator's device model.
inline Status cooperativeTooLarge(const LaunchSpec &spec, const Residency &fits) {
  return Status::error(
      "kernel " + spec.kernel +
      ": cuLaunchCooperativeKernel: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE (too many "
      "blocks in cooperative launch): a grid of " +
      std::to_string(int64_t(spec.gridX) * spec.gridY) + " CTAs (" +
      std::to_string(spec.gridX) + " x " + std::to_string(spec.gridY) + ") of " +
      std::to_string(spec.block) + " threads and " + std::to_string(spec.sharedBytes) +
      " bytes of dynamic shared memory, and this GPU keeps " + std::to_string(fits.total()) +
      " resident (" + std::to_string(fits.perSm) + " per SM x " + std::to_string(fits.sms) +
      " SMs)");
}

/// The leaves of the CUDA backend. Every call is asynchronous on the
/// stream of the call (`begin`) where the device has streams, and none
/// allocates or synchronises.
class Device {
public:
  virtual ~Device() = default;

  /// Whether buffers live on the host (the emulator) rather than a GPU.
  virtual bool onHost() const = 0;
  /// Makes the device current for a call on `stream` (a CUstream; null:
  /// the default stream), until `end`, which leaves the thread's current
  /// device as `begin` found it.
  virtual Status begin(void *stream) = 0;
  virtual void end() {}

  /// How many CTAs of `spec`'s kernel (its block, shared memory and
  /// registers) the device keeps resident at once.
  virtual Status residency(const LaunchSpec &spec, Residency &out) = 0;
  /// Whether the device would launch `spec`: its block, shared memory and
  /// grid within the device's limits and, cooperative, every CTA resident
  /// at once. What a refusal says is the driver's. `launch` admits first.
  virtual Status admit(const LaunchSpec &spec) = 0;
  virtual Status launch(const LaunchSpec &spec) = 0;
  /// Row-major `c = op(a) op(b) + beta c`, with `a` and `b` of the element
  /// type `ab` (F32 or BF16) and `c` of `ce` (F32 or BF16), accumulated in
  /// f32; f32 operands multiplied in TF32 where `tf32` (a tf32 package's:
  /// CUBLAS_COMPUTE_32F_FAST_TF32), else in strict f32. `workspace`
  /// (`workspaceBytes`) is the GEMM library's for the call.
  virtual Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      const void *a, int64_t lda, const void *b, int64_t ldb, Element ab,
                      double beta, void *c, int64_t ldc, Element ce, bool tf32,
                      void *workspace, int64_t workspaceBytes) = 0;
  virtual Status zero(void *data, int64_t bytes) = 0;
  virtual Status copyBytes(const void *from, void *to, int64_t bytes) = 0;
  /// `to[i] = from[i]`, converted; F32 and BF16.
  virtual Status convert(const void *from, Element fromElement, void *to, Element toElement,
                         int64_t n) = 0;
  /// `to[i] += from[i]`; F32 and BF16.
  virtual Status accumulate(const void *from, Element fromElement, void *to,
                            Element toElement, int64_t n) = 0;
  /// Every row of `m` (`rows x cols`, F32 or BF16) becomes the sum of
  /// `vectors` (f32, at most kMaxVectors).
  virtual Status fillRows(void *m, Element element, int64_t rows, int64_t cols,
                          const std::vector<const float *> &vectors) = 0;
  static constexpr size_t kMaxVectors = 8;
  /// `acc[j] += sum over r of m[r, j]` for `m` (`rows x cols`, F32 or
  /// BF16), in two passes: `parts` partial sums over `per` rows each into
  /// `partials` (`parts x cols` f32), then their sum.
  virtual Status columnSums(const void *m, Element element, int64_t rows, int64_t cols,
                            int64_t parts, int64_t per, float *partials, float *acc) = 0;
  /// `to` ([cols, rows]) = `from` ([rows, cols]) transposed.
  virtual Status transpose(const void *from, void *to, int64_t rows, int64_t cols,
                           Element element) = 0;
  /// `bytes` of host memory into `to`, on the call's stream.
  virtual Status upload(const void *host, void *to, int64_t bytes) = 0;
  /// driver::Backend's passes over per-sample lengths ([B] int32 on the
  /// device), one launch each: rows of `v` ([len, B, n]) past their length
  /// zeroed; `to[b] = from[lengths[b] - 1 - t0, b]` where that step is one
  /// of `from`'s `len` ([B, n] `to`); `to[b] += from[b]` where a sample's
  /// last step is `step`.
  virtual Status maskPastLengths(void *v, Element e, int64_t len, int64_t B, int64_t n,
                                 const int32_t *lengths, int64_t first) = 0;
  virtual Status gatherAtLengths(const void *from, Element fromElement, int64_t len,
                                 int64_t B, int64_t n, int64_t t0, const int32_t *lengths,
                                 void *to, Element toElement) = 0;
  virtual Status addAtLengths(const float *from, int64_t B, int64_t n, const int32_t *lengths,
                              int64_t step, float *to) = 0;

  /// What the device was asked since the last reset, by kind (launch, gemm,
  /// zero, copy, ...), where it counts (the emulator does).
  virtual std::vector<std::pair<std::string, int64_t>> calls(bool reset) { return {}; }
};

} // namespace cellc::cuda

#endif // CELLC_RUNTIME_CUDA_DEVICE_H
