//===- CudaDriver.cpp - The CUDA driver, loaded at run time ---------------===//

#include "runtime/cuda/CudaDriver.h"

#include "runtime/driver/CErrors.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

namespace cellc::cuda {

// The few driver types and signatures used, as in cuda.h; cellc does not
// need the toolkit's headers to build.
using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
using CUmodule = void *;
using CUfunction = void *;
using CUstream = void *;

struct Driver::Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *,
                                 void **);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
  CUresult (*cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction,
                                                          int, size_t);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
  CUresult (*cuMemsetD8Async)(unsigned long long, unsigned char, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(unsigned long long, unsigned long long, size_t, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(unsigned long long, const void *, size_t, CUstream);
};

Driver::Driver() : table(std::make_unique<Api>()) {
  const char *path = std::getenv("CELLC_LIBCUDA");
  handle = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw CudaError(std::string("no CUDA driver/GPU: cannot load libcuda (") +
                    dlerror() + ")");
  auto resolve = [&](auto &fn, const char *name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn)
      throw CudaError(std::string("no CUDA driver/GPU: libcuda has no ") + name);
  };
  Api &a = *table;
  resolve(a.cuInit, "cuInit");
  resolve(a.cuDeviceGetCount, "cuDeviceGetCount");
  resolve(a.cuDeviceGet, "cuDeviceGet");
  resolve(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(a.cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  resolve(a.cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  resolve(a.cuStreamSynchronize, "cuStreamSynchronize");
  resolve(a.cuCtxSynchronize, "cuCtxSynchronize");
  resolve(a.cuModuleLoadDataEx, "cuModuleLoadDataEx");
  resolve(a.cuModuleUnload, "cuModuleUnload");
  resolve(a.cuModuleGetFunction, "cuModuleGetFunction");
  resolve(a.cuFuncGetAttribute, "cuFuncGetAttribute");
  resolve(a.cuLaunchKernel, "cuLaunchKernel");
  resolve(a.cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel");
  resolve(a.cuOccupancyMaxActiveBlocksPerMultiprocessor,
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  resolve(a.cuFuncSetAttribute, "cuFuncSetAttribute");
  resolve(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  resolve(a.cuGetErrorName, "cuGetErrorName");
  resolve(a.cuGetErrorString, "cuGetErrorString");
  resolve(a.cuMemsetD8Async, "cuMemsetD8Async");
  resolve(a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  resolve(a.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  CUresult init = a.cuInit(0);
  int count = 0;
  if (init != 0 || a.cuDeviceGetCount(&count) != 0 || count == 0)
    throw CudaError("no CUDA driver/GPU: libcuda loaded but found no device");
}

Driver &Driver::get() {
  // A failed load is retried on the next call rather than cached.
  static std::mutex lock;
  static std::unique_ptr<Driver> driver;
  std::lock_guard<std::mutex> guard(lock);
  if (!driver)
    driver.reset(new Driver());
  return *driver;
}

void Driver::check(int result, const std::string &what) const {
  if (result == 0)
    return;
  const char *name = "CUDA_ERROR_UNKNOWN", *message = "unknown error";
  table->cuGetErrorName(result, &name);
  table->cuGetErrorString(result, &message);
  throw CudaError(what + ": " + name + " (" + message + ")");
}

void *Driver::primaryContext(int device) {
  // Retained once a device and kept: an entry pushes it, which costs no
  // more than a look-up.
  std::lock_guard<std::mutex> guard(contextsLock);
  auto it = contexts.find(device);
  if (it == contexts.end()) {
    CUdevice dev;
    check(table->cuDeviceGet(&dev, device), "cuDeviceGet");
    CUcontext ctx;
    check(table->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    it = contexts.emplace(device, ctx).first;
  }
  return it->second;
}

void Driver::push(void *context) {
  check(table->cuCtxPushCurrent(context), "cuCtxPushCurrent");
}

void Driver::pop() {
  CUcontext popped = nullptr;
  check(table->cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
}

void Driver::synchronize(void *stream) {
  check(table->cuStreamSynchronize(stream), "cuStreamSynchronize");
}

ContextScope::ContextScope(int device) {
  Driver &d = Driver::get();
  d.push(d.primaryContext(device));
}

ContextScope::~ContextScope() {
  // A failed pop leaves nothing to restore; a destructor must not throw.
  try {
    Driver::get().pop();
  } catch (const CudaError &) {
  }
}

std::vector<std::string> ptxEntries(const std::string &ptx) {
  // A line `[.visible|.weak] .entry NAME(` (not a comment's words).
  std::vector<std::string> names;
  size_t line = 0;
  while (line < ptx.size()) {
    size_t end = ptx.find('\n', line);
    if (end == std::string::npos)
      end = ptx.size();
    size_t at = ptx.find_first_not_of(" \t", line);
    for (const char *linkage : {".visible ", ".weak "})
      if (at < end && ptx.compare(at, std::strlen(linkage), linkage) == 0)
        at = ptx.find_first_not_of(" \t", at + std::strlen(linkage));
    if (at < end && ptx.compare(at, 7, ".entry ") == 0) {
      size_t begin = ptx.find_first_not_of(" \t", at + 7);
      size_t stop = ptx.find_first_of("( \t\n", begin);
      if (begin < end && stop > begin)
        names.push_back(ptx.substr(begin, std::min(stop, end) - begin));
    }
    line = end + 1;
  }
  return names;
}

void Driver::zero(void *data, size_t bytes, void *stream) const {
  if (int r = table->cuMemsetD8Async(reinterpret_cast<uintptr_t>(data), 0, bytes, stream))
    check(r, "zeroing " + std::to_string(bytes) + " bytes (cuMemsetD8Async)");
}

void Driver::copy(const void *from, void *to, size_t bytes, void *stream) const {
  if (int r = table->cuMemcpyDtoDAsync(reinterpret_cast<uintptr_t>(to),
                                       reinterpret_cast<uintptr_t>(from), bytes, stream))
    check(r, "copying " + std::to_string(bytes) + " bytes (cuMemcpyDtoDAsync)");
}

void Driver::upload(const void *host, void *to, size_t bytes, void *stream) const {
  if (int r = table->cuMemcpyHtoDAsync(reinterpret_cast<uintptr_t>(to), host, bytes, stream))
    check(r, "copying " + std::to_string(bytes) + " bytes to the device (cuMemcpyHtoDAsync)");
}

Module::Module(int device, const std::string &image, const std::vector<std::string> &kernels)
    : device(device) {
  Driver &d = Driver::get();
  context = d.primaryContext(device);
  ContextScope scope(device);
  // CU_JIT_ERROR_LOG_BUFFER (5) and its size (6).
  std::vector<char> log(8192, '\0');
  int options[] = {5, 6};
  void *values[] = {log.data(), reinterpret_cast<void *>(log.size())};
  int result = d.api().cuModuleLoadDataEx(&module, image.c_str(), 2, options, values);
  if (result != 0) {
    try {
      d.check(result, "loading the PTX (cuModuleLoadDataEx)");
    } catch (CudaError &e) {
      throw CudaError(std::string(e.what()) + "\n" + log.data());
    }
  }
  try {
    for (const std::string &kernel : kernels) {
      CUfunction fn = nullptr;
      d.check(d.api().cuModuleGetFunction(&fn, module, kernel.c_str()),
              "kernel " + kernel + ": cuModuleGetFunction");
      functions[kernel] = fn;
    }
  } catch (...) {
    d.api().cuModuleUnload(module);
    module = nullptr;
    throw;
  }
}

Module::~Module() {
  if (!module)
    return;
  // From whatever thread drops the last reference (Python's collector):
  // the module's own context, and none of its kernels still to run (the
  // context's work, not a stream's: the stream of its last launch may be
  // gone).
  try {
    Driver &d = Driver::get();
    d.push(context);
    if (launched)
      d.api().cuCtxSynchronize();
    d.api().cuModuleUnload(module);
    d.pop();
  } catch (const CudaError &) {
  }
}

void *Module::function(const std::string &kernel) {
  std::lock_guard<std::mutex> guard(lock);
  auto it = functions.find(kernel);
  if (it == functions.end())
    throw CudaError("kernel " + kernel + ": not in the module (its package names no such "
                    "kernel)");
  return it->second;
}

void Module::grantShared(void *fn, const std::string &kernel, unsigned sharedBytes) {
  // Past 48 KiB, dynamic shared memory must be asked for per kernel:
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8). Asked once for the
  // most a launch has wanted.
  if (sharedBytes <= 48 * 1024)
    return;
  std::lock_guard<std::mutex> guard(lock);
  int &granted = sharedGranted[fn];
  if (int(sharedBytes) > granted) {
    Driver &d = Driver::get();
    d.check(d.api().cuFuncSetAttribute(fn, 8, static_cast<int>(sharedBytes)),
            "kernel " + kernel + ": asking for " + std::to_string(sharedBytes) +
                " bytes of shared memory (cuFuncSetAttribute)");
    granted = int(sharedBytes);
  }
}

std::pair<int, int> Module::residency(const std::string &kernel, unsigned block,
                                      unsigned sharedBytes) {
  void *fn = function(kernel);
  grantShared(fn, kernel, sharedBytes);
  auto key = std::make_tuple(fn, block, sharedBytes);
  std::lock_guard<std::mutex> guard(lock);
  auto known = residents.find(key);
  if (known != residents.end())
    return known->second;
  Driver &d = Driver::get();
  CUdevice dev;
  d.check(d.api().cuDeviceGet(&dev, device), "cuDeviceGet");
  int sms = 0, perSm = 0;
  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT (16).
  d.check(d.api().cuDeviceGetAttribute(&sms, 16, dev), "cuDeviceGetAttribute");
  d.check(d.api().cuOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, fn, block,
                                                              sharedBytes),
          "kernel " + kernel + ": cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return residents[key] = std::make_pair(perSm, sms);
}

void Module::launch(const std::string &kernel, unsigned gridX, unsigned gridY,
                    unsigned block, unsigned sharedBytes, bool cooperative,
                    void *stream, void **params) {
  void *fn = function(kernel);
  grantShared(fn, kernel, sharedBytes);
  Driver &d = Driver::get();
  {
    std::lock_guard<std::mutex> guard(lock);
    launched = true;
  }
  // The message is built only on failure: a call launches many kernels.
  if (!cooperative) {
    if (int r = d.api().cuLaunchKernel(fn, gridX, gridY, 1, block, 1, 1, sharedBytes, stream,
                                       params, nullptr))
      d.check(r, "kernel " + kernel + ": cuLaunchKernel");
    return;
  }
  if (int r = d.api().cuLaunchCooperativeKernel(fn, gridX, gridY, 1, block, 1, 1, sharedBytes,
                                                stream, params))
    d.check(r, "kernel " + kernel + ": cuLaunchCooperativeKernel");
}

int Module::registers(const std::string &kernel) {
  int n = 0;
  Driver &d = Driver::get();
  // CU_FUNC_ATTRIBUTE_NUM_REGS = 4.
  d.check(d.api().cuFuncGetAttribute(&n, 4, function(kernel)),
          "kernel " + kernel + ": cuFuncGetAttribute");
  return n;
}

} // namespace cellc::cuda

//===----------------------------------------------------------------------===//
// C API, for ctypes: errors are returned as text, never thrown across it.
//===----------------------------------------------------------------------===//

using cellc::driver::catchErrors;

extern "C" {

/// Whether a driver and a device are there; `error` says why not.
int cellc_cuda_available(char *error, size_t size) {
  return catchErrors(error, size, [] { cellc::cuda::Driver::get(); }) == 0;
}
}
