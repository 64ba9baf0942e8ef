//===- JitKernels.cpp - Sequence kernels compiled for the host CPU --------===//

#include "runtime/JitKernels.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/Support/TargetSelect.h"

#include <mutex>

using namespace cellc::runtime;

JitKernels::~JitKernels() = default;

llvm::Expected<std::unique_ptr<JitKernels>>
JitKernels::compile(mlir::ModuleOp module) {
  static std::once_flag initTarget;
  std::call_once(initTarget, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  mlir::registerBuiltinDialectTranslation(*module->getContext());
  mlir::registerLLVMDialectTranslation(*module->getContext());

  mlir::ExecutionEngineOptions options;
  auto transformer = mlir::makeOptimizingTransformer(
      /*optLevel=*/3, /*sizeLevel=*/0, /*targetMachine=*/nullptr);
  options.transformer = transformer;
  options.jitCodeGenOptLevel = llvm::CodeGenOptLevel::Aggressive;
  auto engine = mlir::ExecutionEngine::create(module, options);
  if (!engine)
    return engine.takeError();
  std::unique_ptr<JitKernels> kernels(new JitKernels());
  kernels->engine = std::move(*engine);
  return kernels;
}

llvm::Error JitKernels::call(llvm::StringRef name,
                             llvm::ArrayRef<KernelArg> args) {
  // A memref descriptor: allocated and aligned pointers, offset, sizes and
  // strides, passed by pointer through the kernel's C interface.
  llvm::SmallVector<llvm::SmallVector<int64_t, 9>> descriptors;
  llvm::SmallVector<void *> pointers;
  descriptors.reserve(args.size());
  pointers.reserve(args.size());
  for (const KernelArg &arg : args) {
    llvm::SmallVector<int64_t, 9> desc;
    if (arg.isIndex) {
      desc.push_back(arg.index);
    } else {
      desc.push_back(reinterpret_cast<int64_t>(arg.data));
      desc.push_back(reinterpret_cast<int64_t>(arg.data));
      desc.push_back(0);
      llvm::append_range(desc, arg.shape);
      int64_t stride = 1;
      llvm::SmallVector<int64_t, 3> strides(arg.shape.size());
      for (int i = static_cast<int>(arg.shape.size()) - 1; i >= 0; --i) {
        strides[i] = stride;
        stride *= arg.shape[i];
      }
      llvm::append_range(desc, strides);
    }
    descriptors.push_back(std::move(desc));
  }
  // The packed wrapper takes a pointer to each argument: for a memref, to the
  // pointer to its descriptor; for an index, to the value.
  llvm::SmallVector<void *> descriptorPointers(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isIndex) {
      pointers.push_back(&descriptors[i][0]);
    } else {
      descriptorPointers[i] = descriptors[i].data();
      pointers.push_back(&descriptorPointers[i]);
    }
  }
  return engine->invokePacked(("_mlir_ciface_" + name).str(), pointers);
}
