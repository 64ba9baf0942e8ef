//===- JitKernels.h - Sequence kernels compiled for the host CPU -*- C++ -*-===//

#ifndef CELLC_RUNTIME_JITKERNELS_H
#define CELLC_RUNTIME_JITKERNELS_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <memory>

namespace mlir {
class ExecutionEngine;
} // namespace mlir
namespace llvm {
class MemoryBuffer;
namespace orc {
class LLJIT;
} // namespace orc
} // namespace llvm

namespace cellc::runtime {

/// One argument of a kernel: a contiguous row-major buffer, or an index.
struct KernelArg {
  void *data = nullptr;
  llvm::SmallVector<int64_t, 3> shape;
  int64_t index = 0;
  bool isIndex = false;

  static KernelArg buffer(void *data, llvm::ArrayRef<int64_t> shape) {
    KernelArg arg;
    arg.data = data;
    arg.shape.assign(shape.begin(), shape.end());
    return arg;
  }
  static KernelArg indexValue(int64_t value) {
    KernelArg arg;
    arg.index = value;
    arg.isIndex = true;
    return arg;
  }
};

/// The kernels of a module in the LLVM dialect, compiled for the host CPU at
/// O3 by MLIR's ExecutionEngine (ORC JIT).
class JitKernels {
public:
  ~JitKernels();

  /// Compiles `module`, which must be in the LLVM dialect (after
  /// convert-kernels-to-llvm). With `object`, also returns the object file,
  /// for the kernel cache.
  static llvm::Expected<std::unique_ptr<JitKernels>>
  compile(mlir::ModuleOp module, std::string *object = nullptr);

  /// Links an object file that `compile` produced earlier.
  static llvm::Expected<std::unique_ptr<JitKernels>>
  load(std::unique_ptr<llvm::MemoryBuffer> object);

  /// Whether these kernels were linked from a cached object.
  bool fromObject() const { return jit != nullptr; }

  /// Calls kernel `name` with `args` in its argument order. The caller checks
  /// shapes against the kernel's signature; this only passes them on.
  llvm::Error call(llvm::StringRef name, llvm::ArrayRef<KernelArg> args);

private:
  JitKernels();
  std::unique_ptr<mlir::ExecutionEngine> engine;
  std::unique_ptr<llvm::orc::LLJIT> jit;
};

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_JITKERNELS_H
