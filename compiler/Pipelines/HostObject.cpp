//===- HostObject.cpp - Compile the CPU kernels to a shared object --------===//
//
// The CPU's counterpart of PTX.cpp: the kernels in the LLVM dialect become
// LLVM IR, optimized at O3 and compiled for the host CPU (its model and
// features, as the JIT did), position-independent, with a packed entry per
// kernel; lld's ELF driver, linked into cellc (run in a child process),
// links the object into a shared object that the runtime opens with dlopen
// (no C compiler on the machine; `$CELLC_CC` names one to use instead).
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "lld/Common/Driver.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/SubtargetFeature.h"

#include <cerrno>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <mutex>
#include <sys/wait.h>
#include <unistd.h>

LLD_HAS_DRIVER(elf)

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

/// The file this process loaded the shared library `soname` from ("" where
/// it has not).
static std::string loadedLibrary(const char *soname) {
  void *handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle)
    return "";
  std::string path;
  struct link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name)
    path = map->l_name;
  dlclose(handle);
  return path;
}

/// Links `object` into the shared object `path` with lld's ELF driver, built
/// into cellc: as `cc -shared -o path object -lm` does, with the C library
/// and libm this process runs (the kernels call sched_yield, and exp and
/// tanh in f64) as needed libraries. It runs in a child of this process:
/// lld resets every LLVM command-line option of the process it runs in
/// (a tool's `-o` among them) and keeps global state between links. The
/// child writes its result code and lld's messages to a file, which the
/// parent reads once the child is gone: a pipe's end would stay open in
/// any process that another thread forks meanwhile, and a process that
/// ignores SIGCHLD gets no exit status.
static llvm::Error linkInProcess(llvm::StringRef object, llvm::StringRef path) {
  std::string out = path.str(), in = object.str();
  std::vector<std::string> libraries;
  for (const char *soname : {"libc.so.6", "libm.so.6"})
    if (std::string lib = loadedLibrary(soname); !lib.empty())
      libraries.push_back(lib);
  std::vector<const char *> args = {"ld.lld",        "-shared",      "--hash-style=gnu",
                                    "--eh-frame-hdr", "--build-id",   "--threads=1",
                                    "-o",             out.c_str(),    in.c_str(),
                                    "--as-needed"};
  for (const std::string &lib : libraries)
    args.push_back(lib.c_str());
  llvm::SmallString<128> report;
  int fd;
  if (std::error_code ec = llvm::sys::fs::createTemporaryFile("cellc-lld", "txt", fd, report))
    return fail("cellc: cannot link the CPU kernels: no temporary file: " + ec.message());
  close(fd);
  pid_t child = fork();
  if (child < 0) {
    int error = errno;
    llvm::sys::fs::remove(report);
    return fail("cellc: cannot link the CPU kernels: fork failed: " +
                std::string(strerror(error)));
  }
  if (child == 0) {
    // lld's fatal errors return here, with their message, rather than exit.
    llvm::CrashRecoveryContext::Enable();
    std::string messages;
    llvm::raw_string_ostream os(messages);
    lld::Result result = lld::lldMain(args, os, os, {{lld::Gnu, &lld::elf::link}});
    os.flush();
    std::string text = "rc=" + std::to_string(result.retCode) + "\n" + messages;
    int outFd = open(report.c_str(), O_WRONLY | O_TRUNC);
    bool written = outFd >= 0;
    for (size_t done = 0; written && done < text.size();) {
      ssize_t n = write(outFd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      written = n > 0;
      done += n > 0 ? size_t(n) : 0;
    }
    if (outFd >= 0)
      close(outFd);
    _exit(written && result.retCode == 0 ? 0 : 1);
  }
  while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  // The result is the report's, whether or not this process saw the exit.
  auto text = llvm::MemoryBuffer::getFile(report);
  llvm::sys::fs::remove(report);
  llvm::StringRef body = text ? (*text)->getBuffer() : "";
  if (!body.consume_front("rc=0\n"))
    return fail("cellc: linking the CPU kernels into " + path + " (lld) failed" +
                (body.empty() ? std::string(": the linker's process ended with no report")
                              : ": " + body.drop_until([](char c) { return c == '\n'; })
                                           .drop_front()
                                           .str()));
  return llvm::Error::success();
}

/// `$CELLC_CC`, a C compiler to link with instead, or "".
static std::string externalLinker() {
  const char *cc = std::getenv("CELLC_CC");
  return cc ? cc : "";
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
  std::string cc = externalLinker();
  if (cc.empty()) {
    llvm::Error linked = linkInProcess(object, path);
    llvm::sys::fs::remove(object);
    return linked;
  }
  auto program = llvm::sys::findProgramByName(cc);
  if (!program) {
    llvm::sys::fs::remove(object);
    return fail("cellc: CELLC_CC is '" + cc + "', which is not a program on the PATH; unset "
                "it to link with cellc's own lld");
  }
  std::string message;
  // libm: the f64 kernels call tanh and friends.
  llvm::SmallVector<llvm::StringRef> args = {*program, "-shared", "-o", path, object, "-lm"};
  int status = llvm::sys::ExecuteAndWait(*program, args, std::nullopt, {}, 0, 0, &message);
  llvm::sys::fs::remove(object);
  if (status != 0)
    return fail("cellc: linking the CPU kernels into " + path + " with " + cc + " failed" +
                (message.empty() ? "" : ": " + message));
  return llvm::Error::success();
}
