//===- Pipelines.cpp - The order of cellc's passes ------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/PhasePlan.h"
#include "dialects/Cell/Transforms/LinearRecurrence.h"
#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void cellc::buildPipeline(OpPassManager &pm, Stage stage,
                          const PipelineOptions &options) {
  if (stage >= Stage::Split) {
    // One op for each value the cell computes twice (an expand that two
    // products of a matrix state share), before the backward doubles it.
    pm.addPass(createCSEPass());
    if (options.splitProjections)
      pm.addPass(cell::createCellSplitProjections());
  }
  if (stage >= Stage::Grad)
    pm.addPass(cell::createCellAutodiff());
  if (stage >= Stage::Plan)
    pm.addPass(cell::createCellPlanSaves());
  if (stage >= Stage::Kernels) {
    const Knobs &knobs = options;
    if (options.strategy == KernelStrategy::Batched) {
      cell::ConvertCellToBatchedKernelsOptions batched;
      batched.vectorBits = options.vectorBits;
      batched.profilePhases = options.profilePhases;
      pm.addPass(cell::createConvertCellToBatchedKernels(knobs, batched));
    } else if (options.strategy != KernelStrategy::PerRow) {
      cell::ConvertCellToTiledKernelsOptions tiled;
      tiled.target = name(options.target);
      Knobs tiledKnobs = knobs;
      // The batch-tiled kernels keep their 48 KiB of static shared memory.
      if (options.strategy != KernelStrategy::Persistent)
        tiledKnobs.sharedLimit = Knobs().sharedLimit;
      pm.addPass(cell::createConvertCellToTiledKernels(tiledKnobs, tiled));
    } else {
      pm.addPass(cell::createConvertCellToKernels(knobs));
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

llvm::Error cellc::runToStage(ModuleOp module, Stage stage, const PipelineOptions &options) {
  PassManager pm(module.getContext());
  buildPipeline(pm, stage, options);
  if (failed(pm.run(module)))
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "the passes failed");
  return llvm::Error::success();
}

llvm::Error cellc::takeChunkPart(ModuleOp module, llvm::StringRef part) {
  PassManager pm(module.getContext());
  buildPipeline(pm, Stage::Split);
  cell::CellChunkPartOptions options;
  options.part = part.str();
  pm.addPass(cell::createCellChunkPart(options));
  // Its errors are about the cell, at its ops: not followed by the IR.
  MLIRContext *context = module.getContext();
  bool printOp = context->shouldPrintOpOnDiagnostic();
  context->printOpOnDiagnostic(false);
  LogicalResult ran = pm.run(module);
  context->printOpOnDiagnostic(printOp);
  if (failed(ran))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "the chunk form's " + part + " could not be built");
  return llvm::Error::success();
}

llvm::Error cellc::setKnob(PipelineOptions &options, llvm::StringRef name,
                          llvm::StringRef value) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
  };
  // One case a knob, from Knobs.def.
#define CELLC_INT_KNOB(Name, Member, Default, Uses, Help)                      \
  if (name == #Name)                                                           \
    return value.getAsInteger(10, options.Member)                              \
               ? fail(#Name " takes an integer, not '" + value + "'")          \
               : llvm::Error::success();
#define CELLC_WORD_KNOB(Name, Member, Enum, Default, Uses, Help)               \
  if (name == #Name) {                                                         \
    std::optional<Enum> word = parse<Enum>(value);                             \
    if (!word)                                                                 \
      return fail("unknown " #Name " '" + value + "'; expected " +             \
                  Words<Enum>::expected());                                    \
    options.Member = *word;                                                    \
    return llvm::Error::success();                                             \
  }
#include "dialects/Cell/IR/Knobs.def"
  return fail("unknown knob '" + name + "'");
}

int64_t cellc::sharedOptIn(llvm::StringRef arch) {
  // cudaDevAttrMaxSharedMemoryPerBlockOptin of each architecture.
  static const std::pair<llvm::StringRef, int64_t> table[] = {
      {"sm_80", 166912}, {"sm_86", 101376}, {"sm_87", 166912},
      {"sm_89", 101376}, {"sm_90", 232448}, {"sm_90a", 232448}};
  for (auto [name, bytes] : table)
    if (arch == name)
      return bytes;
  return 49152;
}

cellc::PipelineOptions cellc::chooseCudaStrategy(ModuleOp cell, PipelineOptions options,
                                          llvm::StringRef arch) {
  int64_t persistentLimit = options.sharedLimit > 0 ? options.sharedLimit : sharedOptIn(arch);
  // A step that keeps its heads apart takes a CTA per head where its heads
  // make more than one CTA a tile (both kernels split by heads): more CTAs
  // than a batch tile's one, none waiting for another. Only a cell with
  // states of several dims has heads, so only such a cell is tried.
  bool matrixStates = false;
  cell.walk([&](cell::DefOp def) { matrixStates |= def->hasAttr("state_dims"); });
  if (matrixStates) {
    OwningOpRef<ModuleOp> trial = cell.clone();
    PipelineOptions persistent = options;
    persistent.strategy = Strategy::Persistent;
    persistent.sharedLimit = persistentLimit;
    persistent.saveGates = true;
    PassManager pm(cell.getContext());
    buildPipeline(pm, Stage::Kernels, persistent);
    ScopedDiagnosticHandler quiet(cell.getContext(), [](Diagnostic &) { return success(); });
    int split = 0, kernels = 0;
    if (succeeded(pm.run(*trial)))
      trial->walk([&](gpu::GPUFuncOp func) {
        ++kernels;
        auto ctas = func->getAttrOfType<IntegerAttr>("cell.ctas");
        if (func->hasAttr("cell.heads") && ctas && ctas.getInt() > 1)
          ++split;
      });
    if (kernels > 0 && split == kernels)
      return persistent;
  }
  options.strategy = Strategy::BatchTiled;
  options.sharedLimit = 49152;
  // A trial of the batch-tiled kernels, quietly: whether its plan fits.
  OwningOpRef<ModuleOp> trial = cell.clone();
  PipelineOptions tiled = options;
  tiled.saveGates = true;
  PassManager pm(cell.getContext());
  buildPipeline(pm, Stage::Kernels, tiled);
  bool tooBig = false;
  {
    ScopedDiagnosticHandler quiet(cell.getContext(), [&](Diagnostic &d) {
      tooBig |= llvm::StringRef(d.str()).contains("bytes of workgroup memory per CTA");
      return success();
    });
    // It fits, or fails otherwise: the real run reports that.
    if (succeeded(pm.run(*trial)) || !tooBig)
      return options;
  }
  options.strategy = Strategy::Persistent;
  options.sharedLimit = persistentLimit;
  // A tile's CTAs all resident on the smallest GPU of the arch, unless
  // the CTAs are named (Python gives the device's own SMs).
  if (options.ctas == 0 && options.maxCtas == 0)
    options.maxCtas = fewestSms(arch);
  return options;
}

int64_t cellc::fewestSms(llvm::StringRef arch) {
  // The data-centre parts: an A100's 108 SMs, an H100 PCIe's 114 (an SXM
  // H100 and an H200 have 132).
  if (arch == "sm_80")
    return 108;
  if (arch == "sm_90" || arch == "sm_90a")
    return 114;
  return 0;
}

llvm::Error cellc::printStage(ModuleOp module, Emit emit,
                              const PipelineOptions &options, llvm::StringRef chip,
                              llvm::raw_ostream &os) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
  };
  std::optional<Stage> stage;
  switch (emit) {
  case Emit::Mlir:
    break;
  case Emit::Split:
  case Emit::Chunkwise:
    stage = Stage::Split;
    break;
  case Emit::Grad:
    stage = Stage::Grad;
    break;
  case Emit::Saves:
  case Emit::Plan:
  case Emit::Phases:
    stage = Stage::Plan;
    break;
  case Emit::Kernels:
    stage = Stage::Kernels;
    break;
  case Emit::Llvm:
    stage = Stage::LLVM;
    break;
  case Emit::Nvvm:
  case Emit::Ptx:
  case Emit::Simt:
    stage = Stage::NVVM;
    break;
  case Emit::Ast:
  case Emit::Summary:
  case Emit::Package:
    return fail(std::string("--emit=") + name(emit) + " is not a stage of the IR");
  }
  if (stage) {
    PassManager pm(module.getContext());
    buildPipeline(pm, *stage, options);
    if (failed(pm.run(module)))
      return fail("the passes failed");
  }
  switch (emit) {
  case Emit::Ptx: {
    auto ptx = serializeToPTX(module, chip);
    if (!ptx)
      return ptx.takeError();
    os << *ptx;
    return llvm::Error::success();
  }
  case Emit::Simt:
    return printSimtIR(module, os);
  case Emit::Chunkwise:
    cell::printChunkwise(module, os);
    return llvm::Error::success();
  case Emit::Plan:
    // The memory table that follows needs the driver: jit::printStage.
    cell::printSavePlan(module, os);
    return llvm::Error::success();
  case Emit::Phases: {
    // The CPU's lanes run along the units (the batched kernels' plans),
    // CUDA's across the rows of a tile.
    bool cuda = options.target == Target::Cuda;
    cell::printPhases(module, os, [&](cell::DefOp def) {
      return cuda ? cell::PhasePlan::Options::acrossRows(def)
                  : cell::PhasePlan::Options::alongUnits();
    });
    return llvm::Error::success();
  }
  case Emit::Mlir:
  case Emit::Split:
  case Emit::Grad:
  case Emit::Saves:
  case Emit::Kernels:
  case Emit::Llvm:
  case Emit::Nvvm:
    module.print(os);
    return llvm::Error::success();
  case Emit::Ast:
  case Emit::Summary:
  case Emit::Package:
    break;
  }
  llvm_unreachable("handled above");
}

namespace {
struct KernelPipelineOptions
    : public PassPipelineOptions<KernelPipelineOptions> {
  Option<int> saveGates{*this, "save-gates",
                        llvm::cl::desc("Specialize SAVE_GATES to 0 or 1; -1 "
                                       "keeps the flag"),
                        llvm::cl::init(-1)};
  Option<bool> splitProjections{
      *this, "split-projections",
      llvm::cl::desc("Hoist products of inputs out of the step (false: a "
                     "streaming step's kernels)"),
      llvm::cl::init(true)};
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
        options.splitProjections = opts.splitProjections;
        buildPipeline(pm, Stage::Kernels, options);
      });
}
