//===- Pipelines.cpp - The order of cellc's passes ------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Passes.h"
#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void cellc::buildPipeline(OpPassManager &pm, Stage stage,
                          const PipelineOptions &options) {
  if (stage >= Stage::Split)
    pm.addPass(cell::createCellSplitProjections());
  if (stage >= Stage::Grad)
    pm.addPass(cell::createCellAutodiff());
  if (stage >= Stage::Plan)
    pm.addPass(cell::createCellPlanSaves());
  if (stage >= Stage::Kernels) {
    if (options.strategy == KernelStrategy::Batched) {
      cell::ConvertCellToBatchedKernelsOptions batched;
      if (options.batchTile > 0)
        batched.batchTile = options.batchTile;
      batched.vectorWidth = options.vectorWidth;
      batched.productRows = options.productRows;
      batched.productVectors = options.productVectors;
      pm.addPass(cell::createConvertCellToBatchedKernels(batched));
    } else if (options.strategy != KernelStrategy::PerRow) {
      cell::ConvertCellToTiledKernelsOptions tiled;
      tiled.strategy = name(options.strategy);
      tiled.ctas = options.ctas;
      if (options.strategy == KernelStrategy::Persistent)
        tiled.sharedLimit = options.sharedLimit;
      tiled.target = name(options.target);
      tiled.batchTile = options.batchTile;
      tiled.threads = options.threads;
      tiled.maxRegisters = options.maxRegisters;
      tiled.precision = name(options.precision);
      tiled.storage = name(options.storage);
      pm.addPass(cell::createConvertCellToTiledKernels(tiled));
    } else {
      cell::ConvertCellToKernelsOptions perRow;
      perRow.matvecWidth = options.matvecWidth;
      perRow.matvecUnroll = options.matvecUnroll;
      pm.addPass(cell::createConvertCellToKernels(perRow));
    }
    std::optional<bool> saveGates = options.saveGates;
    if (stage >= Stage::LLVM && !saveGates)
      saveGates = true;
    if (saveGates) {
      cell::CellSpecializeOptions specialize;
      specialize.saveGates = *saveGates;
      pm.addPass(cell::createCellSpecialize(specialize));
    }
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
  }
  if (stage == Stage::LLVM)
    pm.addPass(cell::createConvertKernelsToLLVM());
  if (stage == Stage::NVVM)
    pm.addPass(cell::createConvertKernelsToNVVM());
}

namespace {
struct KernelPipelineOptions
    : public PassPipelineOptions<KernelPipelineOptions> {
  Option<int> saveGates{*this, "save-gates",
                        llvm::cl::desc("Specialize SAVE_GATES to 0 or 1; -1 "
                                       "keeps the flag"),
                        llvm::cl::init(-1)};
};
} // namespace

void cellc::registerPipelines() {
  PassPipelineRegistration<KernelPipelineOptions>(
      "cell-to-kernels",
      "Runs the whole pipeline from cell IR to sequence kernels",
      [](OpPassManager &pm, const KernelPipelineOptions &opts) {
        PipelineOptions options;
        if (opts.saveGates >= 0)
          options.saveGates = opts.saveGates != 0;
        buildPipeline(pm, Stage::Kernels, options);
      });
}
