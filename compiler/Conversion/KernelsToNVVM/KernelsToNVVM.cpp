//===- KernelsToNVVM.cpp - Lower the batch-tiled kernels for CUDA ---------===//

#include "compiler/Conversion/Passes.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUCommon/GPUCommonPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/LLVMCommon/ConversionTarget.h"
#include "mlir/Conversion/LLVMCommon/TypeConverter.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/Vector/Transforms/LoweringPatterns.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/DialectConversion.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTKERNELSTONVVM
#include "compiler/Conversion/Passes.h.inc"

namespace {

struct ConvertKernelsToNVVM
    : public impl::ConvertKernelsToNVVMBase<ConvertKernelsToNVVM> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    WalkResult flag = module.walk([](SaveGatesOp op) {
      op.emitOpError("is still here; run cell-specialize before lowering");
      return WalkResult::interrupt();
    });
    if (flag.wasInterrupted())
      return signalPassFailure();

    // The same polynomial approximations as on the CPU: no libdevice calls.
    RewritePatternSet approximations(ctx);
    populateMathPolynomialApproximationPatterns(approximations);
    // What convert-vector-to-llvm lowers first: broadcasts and the like.
    vector::populateVectorBroadcastLoweringPatterns(approximations);
    vector::populateVectorMaskOpLoweringPatterns(approximations);
    vector::populateVectorShapeCastLoweringPatterns(approximations);
    if (failed(applyPatternsAndFoldGreedily(module, std::move(approximations))))
      return signalPassFailure();

    OpPassManager pm(ModuleOp::getOperationName());
    OpPassManager &nested = pm.nest<gpu::GPUModuleOp>();
    nested.addPass(createConvertSCFToCFPass());
    nested.addPass(memref::createExpandStridedMetadataPass());
    nested.addPass(createLowerAffinePass());
    if (failed(runPipeline(pm, module)))
      return signalPassFailure();

    for (auto gpuModule : module.getOps<gpu::GPUModuleOp>()) {
      LowerToLLVMOptions options(ctx);
      options.overrideIndexBitwidth(64);
      LLVMTypeConverter converter(ctx, options);
      populateGpuMemorySpaceAttributeConversions(
          converter, [](gpu::AddressSpace space) -> unsigned {
            switch (space) {
            case gpu::AddressSpace::Global:
              return static_cast<unsigned>(
                  NVVM::NVVMMemorySpace::kGlobalMemorySpace);
            case gpu::AddressSpace::Workgroup:
              return static_cast<unsigned>(
                  NVVM::NVVMMemorySpace::kSharedMemorySpace);
            case gpu::AddressSpace::Private:
              return 0;
            }
            llvm_unreachable("unknown address space");
          });

      // sqrt, abs and fma become LLVM intrinsics that NVPTX selects
      // directly, before the GPU patterns could turn them into libdevice
      // calls.
      {
        RewritePatternSet patterns(ctx);
        populateMathToLLVMConversionPatterns(converter, patterns);
        ConversionTarget target(*ctx);
        target.addLegalDialect<LLVM::LLVMDialect>();
        target.addIllegalDialect<math::MathDialect>();
        target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
        if (failed(applyPartialConversion(gpuModule, target, std::move(patterns))))
          return signalPassFailure();
      }

      RewritePatternSet patterns(ctx);
      arith::populateArithToLLVMConversionPatterns(converter, patterns);
      cf::populateControlFlowToLLVMConversionPatterns(converter, patterns);
      populateFuncToLLVMConversionPatterns(converter, patterns);
      populateFinalizeMemRefToLLVMConversionPatterns(converter, patterns);
      populateVectorToLLVMConversionPatterns(converter, patterns,
                                             /*reassociateFPReductions=*/true);
      populateGpuToNVVMConversionPatterns(converter, patterns);
      LLVMConversionTarget target(*ctx);
      target.addLegalDialect<NVVM::NVVMDialect>();
      target.addIllegalDialect<gpu::GPUDialect, func::FuncDialect,
                               arith::ArithDialect, vector::VectorDialect,
                               memref::MemRefDialect, math::MathDialect>();
      target.addLegalOp<gpu::GPUModuleOp, gpu::ModuleEndOp>();
      if (failed(applyPartialConversion(gpuModule, target, std::move(patterns))))
        return signalPassFailure();
    }

    // LLVM 19 declares gpu.dynamic_shared_memory as an internal zero-length
    // array, which NVPTX prints as a 1-byte static `.shared` variable; the
    // dynamic shared memory of a launch is `.extern .shared ... []`.
    module.walk([](LLVM::GlobalOp global) {
      auto array = dyn_cast<LLVM::LLVMArrayType>(global.getGlobalType());
      if (global.getAddrSpace() ==
              static_cast<unsigned>(NVVM::NVVMMemorySpace::kSharedMemorySpace) &&
          array && array.getNumElements() == 0)
        global.setLinkage(LLVM::Linkage::External);
    });

    OpPassManager cleanup(ModuleOp::getOperationName());
    OpPassManager &inner = cleanup.nest<gpu::GPUModuleOp>();
    inner.addPass(createCanonicalizerPass());
    inner.addPass(createCSEPass());
    inner.addPass(createReconcileUnrealizedCastsPass());
    if (failed(runPipeline(cleanup, module)))
      return signalPassFailure();
  }
};

} // namespace
} // namespace mlir::cell
