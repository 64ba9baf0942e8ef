//===- PTX.cpp - Serialize the CUDA kernels to PTX through NVPTX ----------===//

#include "compiler/Pipelines/Pipelines.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace mlir;

llvm::Expected<std::string> cellc::serializeToPTX(ModuleOp module,
                                                  llvm::StringRef chip) {
  MLIRContext *ctx = module.getContext();
  NVVM::registerNVVMTargetInterfaceExternalModels(*ctx);
  registerLLVMDialectTranslation(*ctx);
  registerNVVMDialectTranslation(*ctx);
  registerGPUDialectTranslation(*ctx);

  if (!chip.starts_with("sm_"))
    return llvm::createStringError("cellc: unknown CUDA architecture '" + chip +
                                   "'; expected sm_80, sm_90, ...");
  // PTX 8.0 is what sm_90 needs and what LLVM 19's NVPTX and CUDA 12 and 13
  // all read.
  auto target = NVVM::NVVMTargetAttr::get(ctx, /*optLevel=*/3,
                                          "nvptx64-nvidia-cuda", chip, "+ptx80");
  unsigned modules = 0;
  for (auto gpuModule : module.getOps<gpu::GPUModuleOp>()) {
    gpuModule.setTargetsAttr(ArrayAttr::get(ctx, {target}));
    ++modules;
  }
  if (modules == 0)
    return llvm::createStringError(
        "cellc: no gpu.module to serialize; build the kernels with target=cuda");

  std::string messages;
  llvm::raw_string_ostream os(messages);
  ScopedDiagnosticHandler handler(ctx, [&](Diagnostic &diag) {
    os << diag << "\n";
    return success();
  });
  PassManager pm(ctx);
  GpuModuleToBinaryPassOptions options;
  options.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(options));
  if (failed(pm.run(module)))
    return llvm::createStringError("cellc: NVPTX code generation failed:\n" +
                                   messages);
  std::string ptx;
  for (auto binary : module.getOps<gpu::BinaryOp>())
    for (Attribute object : binary.getObjects())
      // The backend's string ends in a NUL that ptxas reads as text.
      ptx += cast<gpu::ObjectAttr>(object).getObject().getValue().rtrim('\0').str();
  return ptx;
}

llvm::Expected<std::optional<std::map<std::string, cellc::PtxasKernel>>>
cellc::ptxasReport(llvm::StringRef ptx, llvm::StringRef chip) {
  const char *env = std::getenv("CELLC_PTXAS");
  std::string ptxas = env ? env : "/usr/local/cuda/bin/ptxas";
  if (!llvm::sys::fs::can_execute(ptxas))
    return std::nullopt;
  llvm::SmallString<128> in, out, log;
  for (auto [path, suffix] : {std::pair{&in, "ptx"}, {&out, "cubin"}, {&log, "log"}})
    if (std::error_code ec = llvm::sys::fs::createTemporaryFile("cellc-ptxas", suffix, *path))
      return llvm::createStringError("cellc: cannot make a temporary file for ptxas: " +
                                     ec.message());
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(in, ec);
    os << ptx;
  }
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, log.str(), log.str()};
  int rc = llvm::sys::ExecuteAndWait(
      ptxas, {ptxas, "-v", "-arch=" + chip.str(), in.str(), "-o", out.str()}, std::nullopt,
      redirects);
  auto text = llvm::MemoryBuffer::getFile(log);
  for (const auto &path : {in, out, log})
    llvm::sys::fs::remove(path);
  if (rc != 0 || !text)
    return llvm::createStringError(
        "cellc: ptxas (" + ptxas + ") rejected the PTX" +
        (text ? ":\n" + (*text)->getBuffer().trim().str() : std::string()));
  // "Compiling entry function 'k'" opens a kernel's lines; "Used N
  // registers", "N bytes spill stores" and "N bytes smem" follow.
  std::map<std::string, PtxasKernel> kernels;
  PtxasKernel *current = nullptr;
  llvm::SmallVector<llvm::StringRef> lines;
  (*text)->getBuffer().split(lines, '\n');
  for (llvm::StringRef line : lines) {
    llvm::StringRef rest = line;
    if (size_t at = rest.find("Compiling entry function '"); at != llvm::StringRef::npos) {
      rest = rest.drop_front(at + 26);
      current = &kernels[rest.take_until([](char c) { return c == '\''; }).str()];
      continue;
    }
    if (!current)
      continue;
    auto number = [&](llvm::StringRef before) {
      size_t at = line.find(before);
      if (at == llvm::StringRef::npos)
        return -1;
      llvm::StringRef head = line.substr(0, at).rtrim();
      int v = 0;
      if (head.substr(head.find_last_of(' ') + 1).getAsInteger(10, v))
        return -1;
      return v;
    };
    current->registers = std::max(current->registers, number(" registers"));
    current->spillBytes = std::max(current->spillBytes, number(" bytes spill stores"));
    current->sharedBytes = std::max(current->sharedBytes, number(" bytes smem"));
  }
  return std::optional<std::map<std::string, PtxasKernel>>(std::move(kernels));
}
