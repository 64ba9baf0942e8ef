//===- Cublas.cpp - cuBLAS's GEMM, loaded at run time ---------------------===//

#include "runtime/cuda/Cublas.h"

#include "runtime/cuda/CudaDriver.h"

#include <climits>
#include <cstdlib>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

namespace cellc::cuda {

// The types and values used, as in cublas_api.h and library_types.h.
using cublasHandle_t = void *;
using cublasStatus = int;
constexpr int kOpN = 0, kOpT = 1, kR32F = 0, kR16BF = 14, kCompute32F = 68,
              kCompute32FFastTf32 = 77, kGemmDefault = -1;

struct Cublas::Api {
  cublasStatus (*create)(cublasHandle_t *);
  cublasStatus (*setStream)(cublasHandle_t, void *);
  cublasStatus (*setWorkspace)(cublasHandle_t, void *, size_t);
  cublasStatus (*gemmEx)(cublasHandle_t, int, int, int, int, int, const void *, const void *,
                         int, int, const void *, int, int, const void *, void *, int, int, int,
                         int);
  /// cuBLAS 12 and later: sizes past 2^31.
  cublasStatus (*gemmEx64)(cublasHandle_t, int, int, int64_t, int64_t, int64_t, const void *,
                           const void *, int, int64_t, const void *, int, int64_t,
                           const void *, void *, int, int64_t, int, int) = nullptr;
  const char *(*statusString)(cublasStatus) = nullptr;

  /// A handle per device, made on its first GEMM, with the stream and
  /// workspace it was last given.
  struct Handle {
    cublasHandle_t handle = nullptr;
    void *stream = nullptr, *workspace = nullptr;
    int64_t bytes = -1;
  };
  std::map<int, Handle> handles;
  std::mutex lock;
};

Cublas::Cublas() : table(std::make_unique<Api>()) {
  std::vector<std::string> tried;
  // Already in the process (torch links it), by its soname.
  for (const char *name : {"libcublas.so.13", "libcublas.so.12"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle) {
      path = name;
      break;
    }
  }
  std::vector<std::string> names;
  if (const char *given = std::getenv("CELLC_CUBLAS"))
    names.push_back(given);
  for (const char *name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                           "/usr/local/cuda/lib64/libcublas.so.13",
                           "/usr/local/cuda/lib64/libcublas.so.12"})
    names.push_back(name);
  for (size_t i = 0; !handle && i < names.size(); ++i) {
    handle = dlopen(names[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle)
      path = names[i];
    else
      tried.push_back(names[i]);
  }
  if (!handle) {
    std::string list;
    for (const std::string &t : tried)
      list += (list.empty() ? "" : ", ") + t;
    throw CudaError("cuBLAS not found: the GEMMs of a CUDA call need libcublas (the CUDA "
                    "toolkit's, or the nvidia-cublas wheel that torch brings); tried " +
                    list + "; set CELLC_CUBLAS to its path");
  }
  auto resolve = [&](auto &fn, const char *name, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (!fn && required)
      throw CudaError("cuBLAS (" + path + ") has no " + name);
  };
  Api &a = *table;
  resolve(a.create, "cublasCreate_v2", true);
  resolve(a.setStream, "cublasSetStream_v2", true);
  resolve(a.setWorkspace, "cublasSetWorkspace_v2", true);
  resolve(a.gemmEx, "cublasGemmEx", true);
  resolve(a.gemmEx64, "cublasGemmEx_64", false);
  resolve(a.statusString, "cublasGetStatusString", false);
}

Cublas &Cublas::get() {
  static std::mutex lock;
  static std::unique_ptr<Cublas> cublas;
  std::lock_guard<std::mutex> guard(lock);
  if (!cublas)
    cublas.reset(new Cublas());
  return *cublas;
}

void Cublas::gemm(int device, void *stream, bool transA, bool transB, int64_t m, int64_t n,
                  int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, bool bf16,
                  double beta, void *c, int64_t ldc, bool bf16C, bool tf32, void *workspace,
                  int64_t bytes) {
  Api &api = *table;
  auto check = [&](cublasStatus status, const std::string &what) {
    if (status == 0)
      return;
    std::string text = api.statusString ? api.statusString(status) : "";
    throw CudaError("cuBLAS: " + what + " failed with status " + std::to_string(status) +
                    (text.empty() ? "" : " (" + text + ")"));
  };
  // One GEMM at a time sets a handle's stream and workspace and enqueues.
  std::lock_guard<std::mutex> guard(api.lock);
  Api::Handle *h = &api.handles[device];
  if (!h->handle)
    check(api.create(&h->handle), "cublasCreate");
  if (h->stream != stream) {
    check(api.setStream(h->handle, stream), "cublasSetStream");
    h->stream = stream;
    // cublasSetStream gives the handle its default workspace again.
    h->workspace = nullptr;
    h->bytes = -1;
  }
  if (h->workspace != workspace || h->bytes != bytes) {
    check(api.setWorkspace(h->handle, workspace, size_t(bytes)), "cublasSetWorkspace");
    h->workspace = workspace;
    h->bytes = bytes;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // operands swap, their transposes stay.
  float alpha32 = 1.0f, beta32 = float(beta);
  int ab = bf16 ? kR16BF : kR32F, cType = bf16C ? kR16BF : kR32F;
  int opA = transA ? kOpT : kOpN, opB = transB ? kOpT : kOpN;
  // TF32 multiplies f32 operands only; bf16 operands are bf16 products.
  int compute = tf32 && !bf16 ? kCompute32FFastTf32 : kCompute32F;
  auto what = [&] {
    return "a GEMM of " + std::to_string(m) + " x " + std::to_string(n) + " x " +
           std::to_string(k);
  };
  if (api.gemmEx64) {
    if (cublasStatus status = api.gemmEx64(h->handle, opB, opA, n, m, k, &alpha32, b, ab,
                                           ldb, a, ab, lda, &beta32, c, cType, ldc, compute,
                                           kGemmDefault))
      check(status, what());
    return;
  }
  for (int64_t v : {m, n, k, lda, ldb, ldc})
    if (v > INT_MAX)
      throw CudaError(what() + " has a size past 2^31, and this cuBLAS (" + path +
                      ") has no cublasGemmEx_64");
  if (cublasStatus status = api.gemmEx(h->handle, opB, opA, int(n), int(m), int(k), &alpha32, b,
                                       ab, int(ldb), a, ab, int(lda), &beta32, c, cType,
                                       int(ldc), compute, kGemmDefault))
    check(status, what());
}

} // namespace cellc::cuda
