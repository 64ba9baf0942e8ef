//===- CudaDriver.h - The CUDA driver, loaded at run time -------*- C++ -*-===//
//
// libcuda is opened with dlopen, so this library builds, links and loads on
// machines without a driver or GPU; calls there fail with a clear message.
// It needs neither MLIR nor LLVM: it runs kernels compiled ahead of time to
// PTX. It allocates nothing and never synchronizes inside a launch.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_CUDADRIVER_H
#define CELLC_RUNTIME_CUDA_CUDADRIVER_H

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <string>
#include <vector>

namespace cellc::cuda {

/// A CUDA failure: what was being done, the kernel when there is one, and the
/// driver's error name and message.
class CudaError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The driver entry points cellc uses, resolved from libcuda.
class Driver {
public:
  /// The process-wide driver. Throws CudaError("no CUDA driver/GPU: ...")
  /// when libcuda cannot be opened or has no device.
  static Driver &get();

  /// Makes the primary context of `device` current (the one PyTorch uses).
  void useDevice(int device);

  /// Throws a CudaError for a non-zero CUresult.
  void check(int result, const std::string &what) const;

  /// Zeroes `bytes` of device memory, and copies them, on `stream`: enqueued,
  /// never waited for.
  void zero(void *data, size_t bytes, void *stream) const;
  void copy(const void *from, void *to, size_t bytes, void *stream) const;

  struct Api;
  const Api &api() const { return *table; }

private:
  Driver();
  void *handle = nullptr;
  std::unique_ptr<Api> table;
  std::mutex contextsLock;
  std::map<int, void *> contexts;
};

/// A loaded PTX module and its kernels.
class Module {
public:
  /// Loads `image` on the current device (cuModuleLoadDataEx): PTX, which
  /// the driver JIT-compiles (its log goes into errors), or a cubin.
  explicit Module(const std::string &image);
  ~Module();
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  /// Launches `kernel` on `stream` with `params` (pointers to each argument's
  /// value, as cuLaunchKernel takes them). A `cooperative` launch (the
  /// persistent strategy's grid barriers) first checks that the whole grid
  /// fits on the GPU at once.
  void launch(const std::string &kernel, unsigned gridX, unsigned gridY,
              unsigned block, unsigned sharedBytes, bool cooperative,
              void *stream, void **params);

  /// Registers used by `kernel`, from the driver.
  int registers(const std::string &kernel);

private:
  /// The kernel's handle, looked up once and kept: launches do not search.
  void *function(const std::string &kernel);
  void *module = nullptr;
  /// Guards the maps below: cells on one device share a module (the
  /// runtime's own kernels), and calls come from several threads.
  std::mutex lock;
  std::map<std::string, void *> functions;
  /// The dynamic shared memory each kernel has been granted past 48 KiB,
  /// and the CTAs per SM and SMs of each (kernel, block, shared bytes)
  /// launched cooperatively.
  std::map<void *, int> sharedGranted;
  std::map<std::tuple<void *, unsigned, unsigned>, std::pair<int, int>> residents;
};

} // namespace cellc::cuda

/// Whether a CUDA driver and a GPU are there: 1, or 0 with the reason in
/// `error` (the C entry point that python/cellc/cuda.py calls too).
extern "C" int cellc_cuda_available(char *error, size_t size);

#endif // CELLC_RUNTIME_CUDA_CUDADRIVER_H
