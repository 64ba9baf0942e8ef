//===- JitKernels.cpp - Sequence kernels compiled for the host CPU --------===//

#include "runtime/JitKernels.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"

#include <mutex>

using namespace cellc::runtime;

JitKernels::JitKernels() = default;
JitKernels::~JitKernels() = default;

static void initializeTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

llvm::Expected<std::unique_ptr<JitKernels>>
JitKernels::load(std::unique_ptr<llvm::MemoryBuffer> object) {
  initializeTarget();
  auto jit = llvm::orc::LLJITBuilder().create();
  if (!jit)
    return jit.takeError();
  // The kernels call libm (tanh and friends for f64).
  auto process = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!process)
    return process.takeError();
  (*jit)->getMainJITDylib().addGenerator(std::move(*process));
  if (llvm::Error e = (*jit)->addObjectFile(std::move(object)))
    return std::move(e);
  std::unique_ptr<JitKernels> kernels(new JitKernels());
  kernels->jit = std::move(*jit);
  return kernels;
}

llvm::Expected<std::unique_ptr<JitKernels>>
JitKernels::compile(mlir::ModuleOp module, std::string *object) {
  initializeTarget();
  mlir::registerBuiltinDialectTranslation(*module->getContext());
  mlir::registerLLVMDialectTranslation(*module->getContext());

  mlir::ExecutionEngineOptions options;
  auto transformer = mlir::makeOptimizingTransformer(
      /*optLevel=*/3, /*sizeLevel=*/0, /*targetMachine=*/nullptr);
  options.transformer = transformer;
  options.jitCodeGenOptLevel = llvm::CodeGenOptLevel::Aggressive;
  options.enableObjectDump = object != nullptr;
  auto engine = mlir::ExecutionEngine::create(module, options);
  if (!engine)
    return engine.takeError();
  if (object) {
    // Compile the module now, through one of its own functions: the object
    // dump would otherwise look up every function, libm declarations too, and
    // print an error for each.
    for (auto func : module.getOps<mlir::LLVM::LLVMFuncOp>()) {
      if (func.isExternal())
        continue;
      auto compiled = (*engine)->lookupPacked(func.getName());
      if (!compiled)
        return compiled.takeError();
      break;
    }
    llvm::SmallString<128> path;
    if (std::error_code ec =
            llvm::sys::fs::createTemporaryFile("cellc-kernels", "o", path))
      return llvm::createStringError(ec, "cannot create a temporary file");
    (*engine)->dumpToObjectFile(path);
    auto file = llvm::MemoryBuffer::getFile(path, false, false);
    llvm::sys::fs::remove(path);
    if (!file)
      return llvm::createStringError(file.getError(),
                                     "cannot read back the compiled kernels");
    *object = (*file)->getBuffer().str();
  }
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
  std::string symbol = ("_mlir_ciface_" + name).str();
  if (engine)
    return engine->invokePacked(symbol, pointers);
  // The packed wrapper that the ExecutionEngine put into the object.
  auto address = jit->lookup("_mlir_" + symbol);
  if (!address)
    return address.takeError();
  address->toPtr<void (*)(void **)>()(pointers.data());
  return llvm::Error::success();
}
