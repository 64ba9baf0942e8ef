//===- KernelsToLLVM.cpp - Lower the sequence kernels for the CPU ---------===//

#include "compiler/Conversion/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTKERNELSTOLLVM
#include "compiler/Conversion/Passes.h.inc"

namespace {

struct ConvertKernelsToLLVM
    : public impl::ConvertKernelsToLLVMBase<ConvertKernelsToLLVM> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    WalkResult flag = module.walk([](SaveGatesOp op) {
      op.emitOpError("is still here; run cell-specialize before lowering");
      return WalkResult::interrupt();
    });
    if (flag.wasInterrupted())
      return signalPassFailure();

    // Kernels, not the C functions they call (sched_yield).
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal())
        func->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                      UnitAttr::get(&getContext()));

    RewritePatternSet approximations(&getContext());
    populateMathPolynomialApproximationPatterns(approximations);
    if (failed(applyPatternsAndFoldGreedily(module, std::move(approximations))))
      return signalPassFailure();

    OpPassManager pm(ModuleOp::getOperationName());
    pm.addPass(createConvertSCFToCFPass());
    // Math first: libm calls on vectors are scalarized into vector ops.
    pm.addPass(createConvertMathToLLVMPass());
    pm.addPass(createConvertMathToLibmPass());
    // Row dot products sum in a tree, not one element after another.
    ConvertVectorToLLVMPassOptions vectorOptions;
    vectorOptions.reassociateFPReductions = true;
    pm.addPass(createConvertVectorToLLVMPass(vectorOptions));
    pm.addPass(createArithToLLVMConversionPass());
    pm.addPass(memref::createExpandStridedMetadataPass());
    pm.addPass(createFinalizeMemRefToLLVMConversionPass());
    pm.addPass(createConvertFuncToLLVMPass());
    pm.addPass(createConvertControlFlowToLLVMPass());
    pm.addPass(createArithToLLVMConversionPass());
    pm.addPass(createReconcileUnrealizedCastsPass());
    if (failed(runPipeline(pm, module)))
      return signalPassFailure();

    // The kernels stream only whole vectors at addresses they checked are
    // multiples of the vector's size (the batched kernels' streamAt). Told
    // so, LLVM emits one streaming store (vmovntps); with the element's
    // alignment it would split the vector into 8-byte streaming stores.
    module.walk([](LLVM::StoreOp store) {
      if (!store.getNontemporal())
        return;
      auto type = dyn_cast<VectorType>(store.getValue().getType());
      if (type && type.getElementTypeBitWidth() % 8 == 0)
        store.setAlignment(type.getNumElements() * type.getElementTypeBitWidth() / 8);
    });
  }
};

} // namespace
} // namespace mlir::cell
