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

  /// The primary context of `device` (the one PyTorch uses), retained once
  /// and kept.
  void *primaryContext(int device);
  /// Pushes `context` onto the calling thread's stack of current contexts,
  /// and pops it: cellc's calls leave the thread's current context (torch's
  /// current device) as they found it.
  void push(void *context);
  void pop();
  /// Waits for the work enqueued on `stream` so far.
  void synchronize(void *stream);

  /// Throws a CudaError for a non-zero CUresult.
  void check(int result, const std::string &what) const;

  /// Zeroes `bytes` of device memory, and copies them, on `stream`: enqueued,
  /// never waited for.
  void zero(void *data, size_t bytes, void *stream) const;
  void copy(const void *from, void *to, size_t bytes, void *stream) const;
  /// Host memory to the device, on `stream`.
  void upload(const void *host, void *to, size_t bytes, void *stream) const;

  struct Api;
  const Api &api() const { return *table; }

private:
  Driver();
  void *handle = nullptr;
  std::unique_ptr<Api> table;
  std::mutex contextsLock;
  std::map<int, void *> contexts;
};

/// The primary context of a device made current for a scope, and the
/// thread's previous one current again at its end.
class ContextScope {
public:
  explicit ContextScope(int device);
  ~ContextScope();
  ContextScope(const ContextScope &) = delete;
  ContextScope &operator=(const ContextScope &) = delete;
};

/// The `.entry` kernels of a PTX text, by name.
std::vector<std::string> ptxEntries(const std::string &ptx);

/// A loaded PTX module and its kernels, on one device.
class Module {
public:
  /// Loads `image` on `device` (cuModuleLoadDataEx, in the device's primary
  /// context): PTX, which the driver JIT-compiles (its log goes into
  /// errors), or a cubin; and resolves `kernels` there and then, so that no
  /// call loads code (CUDA 12.2+ loads a module's functions lazily, at
  /// their first look-up, which may allocate outside the caller's pool).
  Module(int device, const std::string &image, const std::vector<std::string> &kernels);
  /// Unloads in the module's context, after the context's work.
  ~Module();
  Module(const Module &) = delete;
  Module &operator=(const Module &) = delete;

  /// Launches `kernel` on `stream` with `params` (pointers to each argument's
  /// value, as cuLaunchKernel takes them); `cooperative`, every CTA
  /// resident at once (the caller admitted the grid: `residency`). The
  /// device's context is current.
  void launch(const std::string &kernel, unsigned gridX, unsigned gridY,
              unsigned block, unsigned sharedBytes, bool cooperative,
              void *stream, void **params);

  /// How many CTAs of `kernel` with `block` threads and `sharedBytes` of
  /// dynamic shared memory the GPU keeps resident at once (the occupancy
  /// query, times the SMs), asked once per (kernel, block, shared bytes).
  std::pair<int, int> residency(const std::string &kernel, unsigned block,
                                unsigned sharedBytes);

  /// Registers used by `kernel`, from the driver.
  int registers(const std::string &kernel);

private:
  /// The kernel's handle, resolved when the module loaded.
  void *function(const std::string &kernel);
  /// Grants `fn` `sharedBytes` of dynamic shared memory past 48 KiB.
  void grantShared(void *fn, const std::string &kernel, unsigned sharedBytes);
  int device;
  void *context = nullptr;
  void *module = nullptr;
  /// Whether a kernel was launched, which the unload waits for.
  bool launched = false;
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
