//===- HostObject.cpp - Compile the CPU kernels to a shared object --------===//
//
// The CPU's counterpart of PTX.cpp: the kernels in the LLVM dialect become
// LLVM IR, optimized at O3 and compiled for the host CPU (its model and
// features, as the JIT did), position-independent, with a packed entry per
// kernel; the system's C compiler links the object into a shared object that
// the runtime opens with dlopen.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/SubtargetFeature.h"

#include <mutex>

using namespace cellc;

static llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

void cellc::addPackedEntry(llvm::Function &kernel, llvm::StringRef name) {
  llvm::Module &module = *kernel.getParent();
  llvm::LLVMContext &context = module.getContext();
  llvm::Type *ptr = llvm::PointerType::getUnqual(context);
  auto *type = llvm::FunctionType::get(llvm::Type::getVoidTy(context), {ptr}, false);
  auto *packed = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage,
                                        "cellc_packed_" + name, module);
  llvm::IRBuilder<> builder(llvm::BasicBlock::Create(context, "entry", packed));
  llvm::Value *args = packed->getArg(0);
  std::vector<llvm::Value *> values;
  for (llvm::Argument &arg : kernel.args()) {
    llvm::Value *slot = builder.CreateConstGEP1_64(ptr, args, arg.getArgNo());
    llvm::Value *address = builder.CreateLoad(ptr, slot);
    values.push_back(builder.CreateLoad(arg.getType(), address));
  }
  builder.CreateCall(&kernel, values);
  builder.CreateRetVoid();
}

/// Adds `cellc_packed_<k>` for each `_mlir_ciface_<k>` (addPackedEntry): for
/// a memref, the pointer to its descriptor; for an index, its value.
static void addPackedEntries(llvm::Module &module) {
  llvm::StringRef prefix = "_mlir_ciface_";
  std::vector<llvm::Function *> kernels;
  for (llvm::Function &func : module)
    if (!func.isDeclaration() && func.getName().starts_with(prefix))
      kernels.push_back(&func);
  for (llvm::Function *kernel : kernels)
    addPackedEntry(*kernel, kernel->getName().drop_front(prefix.size()));
}

/// The host's target machine: its CPU model and features, PIC.
static llvm::Expected<std::unique_ptr<llvm::TargetMachine>>
hostMachine(llvm::CodeGenOptLevel level) {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  std::string triple = llvm::sys::getProcessTriple();
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return fail("cellc: no LLVM target for the host (" + triple + "): " + error);
  llvm::SubtargetFeatures features;
  for (const auto &feature : llvm::sys::getHostCPUFeatures())
    features.AddFeature(feature.first(), feature.second);
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, llvm::sys::getHostCPUName(), features.getString(), llvm::TargetOptions(),
      llvm::Reloc::PIC_, std::nullopt, level));
  if (!machine)
    return fail("cellc: cannot create a target machine for " + triple);
  return machine;
}

/// The C compiler that links shared objects: `$CELLC_CC`, else cc, gcc or
/// clang on the PATH.
static llvm::Expected<std::string> linker() {
  if (const char *cc = std::getenv("CELLC_CC"); cc && *cc)
    return std::string(cc);
  for (const char *name : {"cc", "gcc", "clang"})
    if (auto path = llvm::sys::findProgramByName(name))
      return *path;
  return fail("cellc: no C compiler (cc, gcc or clang) on the PATH to link the CPU "
              "kernels into a shared object; install one (Debian: build-essential) "
              "or set CELLC_CC");
}

std::vector<std::string> cellc::hostVectorFeatures() {
  llvm::StringMap<bool> host = llvm::sys::getHostCPUFeatures();
  std::vector<std::string> features;
#define CELLC_CPU_FEATURE(name)                                                \
  if (host.lookup(name))                                                       \
    features.push_back(name);
#include "dialects/Cell/IR/KernelInterface.def"
  return features;
}

llvm::Error cellc::writeHostSharedObject(mlir::ModuleOp module, llvm::StringRef path) {
  mlir::registerBuiltinDialectTranslation(*module->getContext());
  mlir::registerLLVMDialectTranslation(*module->getContext());
  llvm::LLVMContext context;
  std::unique_ptr<llvm::Module> ir = mlir::translateModuleToLLVMIR(module, context);
  if (!ir)
    return fail("cellc: translating the CPU kernels to LLVM IR failed");
  addPackedEntries(*ir);
  return compileHostSharedObject(*ir, path);
}

llvm::Error cellc::compileHostSharedObject(llvm::Module &ir, llvm::StringRef path,
                                           unsigned optLevel) {
  auto machine = hostMachine(optLevel >= 3   ? llvm::CodeGenOptLevel::Aggressive
                             : optLevel == 0 ? llvm::CodeGenOptLevel::None
                                             : llvm::CodeGenOptLevel::Less);
  if (!machine)
    return machine.takeError();
  ir.setDataLayout((*machine)->createDataLayout());
  ir.setTargetTriple((*machine)->getTargetTriple().str());
  // The optimizer as the JIT ran it: O3, without the target's cost model
  // (the kernels come vectorized from the vector dialect).
  auto optimize = mlir::makeOptimizingTransformer(optLevel, /*sizeLevel=*/0,
                                                  /*targetMachine=*/nullptr);
  if (llvm::Error e = optimize(&ir))
    return e;

  llvm::SmallString<128> object;
  int fd;
  if (std::error_code ec =
          llvm::sys::fs::createTemporaryFile("cellc-kernels", "o", fd, object))
    return fail("cellc: cannot create a temporary object file: " + ec.message());
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    llvm::legacy::PassManager codegen;
    if ((*machine)->addPassesToEmitFile(codegen, os, nullptr,
                                        llvm::CodeGenFileType::ObjectFile))
      return fail("cellc: the host target cannot emit object files");
    codegen.run(ir);
  }
  auto cc = linker();
  if (!cc) {
    llvm::sys::fs::remove(object);
    return cc.takeError();
  }
  std::string message;
  // libm: the f64 kernels call tanh and friends.
  llvm::SmallVector<llvm::StringRef> args = {*cc, "-shared", "-o", path, object, "-lm"};
  int status = llvm::sys::ExecuteAndWait(*cc, args, std::nullopt, {}, 0, 0, &message);
  llvm::sys::fs::remove(object);
  if (status != 0)
    return fail("cellc: linking the CPU kernels into " + path + " with " + *cc +
                " failed" + (message.empty() ? "" : ": " + message));
  return llvm::Error::success();
}
