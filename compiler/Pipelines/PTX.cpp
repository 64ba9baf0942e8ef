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
