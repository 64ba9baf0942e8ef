//===- GpuDevice.h - The CUDA backend's leaves on a GPU ---------*- C++ -*-===//
//
// A package's kernels loaded on one GPU (its PTX, JIT-compiled by the
// driver), the runtime's own small kernels (HostKernels.cu), and cuBLAS for
// the GEMMs: everything enqueued on the call's stream.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_GPUDEVICE_H
#define CELLC_RUNTIME_CUDA_GPUDEVICE_H

#include "runtime/cuda/CudaDriver.h"
#include "runtime/cuda/Device.h"

#include <memory>
#include <string>
#include <vector>

namespace cellc::cuda {

class GpuDevice : public Device {
public:
  /// Loads the variant that replays and the one that saves gates on
  /// `device`, each PTX or a cubin image, with their `kernels` resolved, and
  /// the runtime's own kernels. Throws CudaError (no driver, no GPU, bad
  /// PTX, a cubin for another GPU).
  GpuDevice(int device, const std::string &replayPtx, const std::string &savePtx,
            const std::vector<std::string> &kernels);
  /// Kernels with no variants (the chunk form's cores): one module, loaded
  /// and JIT-compiled by the driver once.
  GpuDevice(int device, const std::string &ptx, const std::vector<std::string> &kernels);

  /// Registers per thread of a package's kernel, from the driver.
  int registers(const std::string &kernel, bool saveGates);

  bool onHost() const override { return false; }
  Status begin(void *stream) override;
  void end() override;
  Status residency(const LaunchSpec &spec, Residency &out) override;
  Status admit(const LaunchSpec &spec) override;
  Status launch(const LaunchSpec &spec) override;
  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const void *a,
              int64_t lda, const void *b, int64_t ldb, Element ab, double beta, void *c,
              int64_t ldc, Element ce, bool tf32, void *workspace,
              int64_t workspaceBytes) override;
  Status zero(void *data, int64_t bytes) override;
  Status copyBytes(const void *from, void *to, int64_t bytes) override;
  Status convert(const void *from, Element fromElement, void *to, Element toElement,
                 int64_t n) override;
  Status accumulate(const void *from, Element fromElement, void *to, Element toElement,
                    int64_t n) override;
  Status fillRows(void *m, Element element, int64_t rows, int64_t cols,
                  const std::vector<const float *> &vectors) override;
  Status columnSums(const void *m, Element element, int64_t rows, int64_t cols,
                    int64_t parts, int64_t per, float *partials, float *acc) override;
  Status transpose(const void *from, void *to, int64_t rows, int64_t cols,
                   Element element) override;
  Status upload(const void *host, void *to, int64_t bytes) override;
  Status maskPastLengths(void *v, Element e, int64_t len, int64_t B, int64_t n,
                         const int32_t *lengths, int64_t first) override;
  Status gatherAtLengths(const void *from, Element fromElement, int64_t len, int64_t B,
                         int64_t n, int64_t t0, const int32_t *lengths, void *to,
                         Element toElement) override;
  Status addAtLengths(const float *from, int64_t B, int64_t n, const int32_t *lengths,
                      int64_t step, float *to) override;

private:
  /// Runs one of the runtime's kernels over `n` elements (grid-strided).
  Status runHostKernel(const std::string &kernel, int64_t n, void **params,
                       unsigned gridY = 1);
  int device;
  void *stream = nullptr;
  /// Whether `begin` made the device's context current.
  bool current = false;
  /// The replaying and the gate-saving variant (one module for both where
  /// the kernels have no variants).
  std::shared_ptr<Module> variants[2];
  /// The runtime's kernels on this device (shared by every cell on it).
  Module *host = nullptr;
};

} // namespace cellc::cuda

#endif // CELLC_RUNTIME_CUDA_GPUDEVICE_H
