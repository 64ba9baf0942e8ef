//===- Cublas.h - cuBLAS's GEMM, loaded at run time -------------*- C++ -*-===//
//
// cuBLAS is opened with dlopen, as libcuda is: first the copy that the
// process has loaded already (torch's), then the toolkit's and the
// `nvidia-cublas` wheel's by name, then $CELLC_CUBLAS. The runtime builds
// and loads without it; a GEMM on a GPU without it is an error that says
// where it looked.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_CUBLAS_H
#define CELLC_RUNTIME_CUDA_CUBLAS_H

#include <cstdint>
#include <memory>
#include <string>

namespace cellc::cuda {

/// The cuBLAS entry points cellc uses, and a handle per device.
class Cublas {
public:
  /// The process-wide library. Throws CudaError("cuBLAS not found: ...")
  /// when it cannot be opened; a failed load is tried again next time.
  static Cublas &get();

  /// Row-major `c = op(a) op(b) + beta c` on `stream`, on the current
  /// device: `a` and `b` f32 (`bf16` false) or bf16, `c` f32 or bf16
  /// (`bf16C`), accumulated in f32: CUBLAS_COMPUTE_32F (strict), or with
  /// `tf32` CUBLAS_COMPUTE_32F_FAST_TF32 (f32 operands on the tensor cores
  /// in TF32). The handle works in `workspace` (`bytes`).
  void gemm(int device, void *stream, bool transA, bool transB, int64_t m, int64_t n,
            int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, bool bf16,
            double beta, void *c, int64_t ldc, bool bf16C, bool tf32, void *workspace,
            int64_t bytes);

  struct Api;

private:
  Cublas();
  void *handle = nullptr;
  std::unique_ptr<Api> table;
  std::string path;
};

} // namespace cellc::cuda

#endif // CELLC_RUNTIME_CUDA_CUBLAS_H
