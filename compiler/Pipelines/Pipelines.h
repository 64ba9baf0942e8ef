//===- Pipelines.h - The order of cellc's passes ----------------*- C++ -*-===//

#ifndef CELLC_COMPILER_PIPELINES_PIPELINES_H
#define CELLC_COMPILER_PIPELINES_PIPELINES_H

#include "dialects/Cell/IR/KernelInterface.h"
#include "dialects/Cell/IR/Knobs.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <optional>
#include <string>

namespace llvm {
class Function;
class Module;
} // namespace llvm

namespace cellc {

/// The stages of compilation, in order. Each names the IR after its passes.
enum class Stage {
  /// The cell IR the front end builds.
  Cell,
  /// After cell-split-projections.
  Split,
  /// After cell-autodiff: the cell and its backward step.
  Grad,
  /// After cell-plan-saves: the saved values chosen.
  Plan,
  /// After convert-cell-to-kernels: the sequence kernels.
  Kernels,
  /// After convert-kernels-to-llvm: the kernels in the LLVM dialect, for the
  /// CPU. Needs SAVE_GATES fixed; it defaults to 1.
  LLVM,
  /// After convert-kernels-to-nvvm: the CUDA kernels (batch-tiled, target
  /// cuda) in the LLVM and NVVM dialects. SAVE_GATES defaults to 1.
  NVVM,
};

/// How the sequence kernels are organized (KernelInterface.def):
/// - Batched: convert-cell-to-batched-kernels, the CPU's kernels: a tile of
///   rows per thread, each step as phases over the tile, its products
///   register-blocked matrix products.
/// - PerRow: convert-cell-to-kernels, one batch row at a time, whole vectors
///   in registers; the CPU's kernels for a batch of one row.
/// - BatchTiled: convert-cell-to-tiled-kernels, a tile of rows per program,
///   elements across threads. The GPU's kernels; on the CPU, their
///   emulation.
/// - Persistent: convert-cell-to-tiled-kernels with strategy=persistent:
///   CTAs split each step of a tile, keep their slices of the recurrent
///   weights on chip, and meet at grid barriers. On the CPU, its emulation.
using KernelStrategy = Strategy;

/// Whether `strategy` organizes CUDA kernels.
inline bool isCudaStrategy(Strategy strategy) {
  return strategy == Strategy::BatchTiled || strategy == Strategy::Persistent;
}

/// What the pipeline builds: the kernel knobs of Knobs.def (strategy,
/// precision, storage, batchTile, ctas, sharedLimit, threads per CTA,
/// maxRegisters, productRows, productVectors, vectorWidth, matvecWidth and
/// matvecUnroll), which the kernel passes take, and the rest. Persistent
/// kernels: 0 CTAs is the fewest that fit, and sharedLimit the dynamic
/// shared memory a CTA may use for its slice of the weights.
struct PipelineOptions : Knobs {
  /// When set, the kernels are specialized for SAVE_GATES and canonicalized.
  std::optional<bool> saveGates;
  /// Whether products of inputs leave the step as projections (a GEMM over
  /// the whole sequence). A streaming step's kernels keep them: one step has
  /// no sequence to batch, and a GEMM of B rows packs its weight each call.
  bool splitProjections = true;
  /// For batch-tiled kernels: the target (CUDA, or the CPU for their
  /// emulation).
  Target target = Target::Cpu;
  /// For batched kernels: with vectorWidth 0, `vectorBits` bits a vector.
  /// The JIT gives the host's vector bits (512 with AVX-512); the command
  /// line's stages keep 256.
  int64_t vectorBits = 256;
  /// For batched kernels: counters of the cycles each thread works and
  /// waits between barriers (convert-cell-to-batched-kernels' profile-phases).
  bool profilePhases = false;
  /// For --emit=plan: the sequence whose training step's memory it predicts.
  int64_t planSteps = 100;
  int64_t planBatch = 64;
};

/// Replaces the cell of `module` (front-end cell IR) by `part` of its
/// chunkwise form (cell-chunk-part: "prologue"), its projections split: what
/// the rest of the pipeline, the packages and the stages' printers then take
/// as any cell. Pass errors go to the context's handler.
llvm::Error takeChunkPart(mlir::ModuleOp module, llvm::StringRef part);

/// Sets the knob `name` of Knobs.def in `options` from `value`: digits for
/// an integer knob, a word of its enum for a word knob.
llvm::Error setKnob(PipelineOptions &options, llvm::StringRef name,
                    llvm::StringRef value);

/// Adds the passes that take front-end cell IR to `stage`. This is the only
/// place where pass order is written down.
void buildPipeline(mlir::OpPassManager &pm, Stage stage,
                   const PipelineOptions &options = {});

/// Runs buildPipeline's passes up to `stage` on `module`, in place. Pass
/// errors go to the context's handler; the Error says "the passes failed".
llvm::Error runToStage(mlir::ModuleOp module, Stage stage,
                       const PipelineOptions &options = {});

/// The dynamic shared memory a CTA may opt in to on `arch` (sm_80: 166912
/// bytes, sm_90: 232448, ...; 49152 where unknown).
int64_t sharedOptIn(llvm::StringRef arch);
/// The fewest SMs of the architecture's data-centre GPUs (sm_80: 108, sm_90:
/// 114), which a persistent tile's CTAs are capped at when no strategy is
/// named and the CTAs are not (0: no cap).
int64_t fewestSms(llvm::StringRef arch);

/// The CUDA options for a caller that names no strategy (the cellc tool and
/// Python choose the same way): persistent where the step keeps its heads
/// apart and they make more than one CTA a tile; else batch-tiled where a
/// CTA's buffers fit its 48 KiB of static shared memory, else persistent.
/// Persistent CTAs may use `options.sharedLimit` bytes (0: the
/// architecture's opt-in, sharedOptIn).
PipelineOptions chooseCudaStrategy(mlir::ModuleOp cell, PipelineOptions options,
                                   llvm::StringRef arch);

/// Runs LLVM's NVPTX backend on the `gpu.module`s of `module` (at Stage::NVVM)
/// and returns their PTX for `chip` (sm_80, sm_90, ...).
llvm::Expected<std::string> serializeToPTX(mlir::ModuleOp module,
                                           llvm::StringRef chip);

/// What ptxas -v says of one kernel.
struct PtxasKernel {
  int registers = 0, spillBytes = 0, sharedBytes = 0;
};
/// Assembles `ptx` for `chip` with ptxas -v ($CELLC_PTXAS, else the
/// toolkit's at /usr/local/cuda/bin/ptxas) and reads each kernel's
/// registers, spills and static shared memory. std::nullopt where there is
/// no ptxas; an error where ptxas rejects the PTX.
llvm::Expected<std::optional<std::map<std::string, PtxasKernel>>>
ptxasReport(llvm::StringRef ptx, llvm::StringRef chip);

/// Writes an AOT package of `cell` (front-end cell IR, sizes bound) to `dir`:
/// the PTX for `arch` of both SAVE_GATES variants built with the CUDA
/// `options`, and kernels.json. With `simt`, also each variant compiled for
/// the SIMT emulator (save.simt.so, replay.simt.so; writeSimtSharedObject).
/// Pass errors are reported to the context's diagnostic handler too.
llvm::Error writePackage(mlir::ModuleOp cell, llvm::StringRef dir,
                         const PipelineOptions &options, llvm::StringRef arch,
                         llvm::StringRef dtype, bool simt = false,
                         llvm::StringRef simtMutation = "");

/// Runs the passes up to `emit` (a stage of KernelInterface.def that prints
/// IR: mlir, split, grad, saves, plan, phases, kernels, llvm, nvvm, ptx) on
/// `module` and prints it; ptx is for `chip`. What cellc --emit and
/// Cell.emit print, in one place. Pass errors go to the context's handler.
llvm::Error printStage(mlir::ModuleOp module, Emit emit,
                       const PipelineOptions &options, llvm::StringRef chip,
                       llvm::raw_ostream &os);

/// A cell's CPU package before code generation: the kernels of both
/// SAVE_GATES variants in the LLVM dialect, and kernels.json (the cell, its
/// slots, each kernel's arguments and scratch bytes, the config).
struct CpuPackage {
  /// The variant that replays (0) and the one that saves gates (1).
  mlir::OwningOpRef<mlir::ModuleOp> variants[2];
  llvm::json::Object meta;
  /// kernels.json's text.
  std::string json() const;
};

/// Builds both variants of the CPU kernels that `options` describe from
/// `cell` (front-end cell IR, sizes bound) and lowers them to the LLVM
/// dialect. `config` is the knobs as `name=value,...`, for kernels.json.
/// Without `lower`, only kernels.json is wanted: the variants stay at
/// Stage::Kernels.
llvm::Expected<CpuPackage> buildCpuPackage(mlir::ModuleOp cell,
                                           const PipelineOptions &options,
                                           llvm::StringRef dtype, llvm::StringRef config,
                                           bool lower = true);

/// Writes `package` to `dir`: kernels.json, and save.so and replay.so
/// compiled for the host (writeHostSharedObject).
llvm::Error writeCpuPackage(const CpuPackage &package, llvm::StringRef dir);

/// Compiles `module` (CPU kernels in the LLVM dialect) at O3 for the host
/// CPU into the shared object `path`, with an entry `cellc_packed_<k>(void
/// **args)` for each kernel; links in-process with lld (or with `$CELLC_CC`).
llvm::Error writeHostSharedObject(mlir::ModuleOp module, llvm::StringRef path);

/// Compiles `ir` at `optLevel` for the host CPU (its triple, model and
/// features, PIC) into the shared object `path`; links in-process with lld
/// (or with `$CELLC_CC`, a C compiler).
llvm::Error compileHostSharedObject(llvm::Module &ir, llvm::StringRef path,
                                    unsigned optLevel = 3);

/// Adds `cellc_packed_<name>(void **args)` to `kernel`'s module: it calls
/// `kernel` with the value that each `args[i]` points to, so that a runtime
/// calls every kernel through one C type (as cuLaunchKernel takes them).
void addPackedEntry(llvm::Function &kernel, llvm::StringRef name);

/// The vector features of the host CPU that code compiled for it may use,
/// among those a runtime can check (runtime/cpu/Kernels.h, hostHas):
/// kernels.json's "cpu_features".
std::vector<std::string> hostVectorFeatures();

/// The SIMT emulator's object: the CUDA kernels of `module` (at Stage::NVVM)
/// as the NVPTX backend would take them, retargeted to the host
/// (SimtToHost.cpp), compiled into the shared object `path` with an entry
/// `cellc_packed_<k>` per kernel that takes cuLaunchKernel's arguments.
/// `mutation` plants a bug, for the tests that show the emulator catches
/// it: "drop-barrier:N" (the N-th bar.sync of the module, from 0, is
/// gone) or "swap-mma-a" (each mma.sync reads its A registers 0 and 1
/// swapped); "" plants none.
llvm::Error writeSimtSharedObject(mlir::ModuleOp module, llvm::StringRef path,
                                  llvm::StringRef mutation = "");

/// The same for LLVM IR that holds NVVM intrinsics (as the NVPTX backend
/// takes it), with the kernels `kernels`.
llvm::Error compileSimtObject(llvm::Module &ir, llvm::ArrayRef<std::string> kernels,
                              llvm::StringRef path, llvm::StringRef mutation = "");

/// The chunk form's CUDA kernels (runtime/cuda/ChunkKernels.cu, as
/// clang compiles them for NVPTX) in the SIMT emulator's object `path`,
/// with writeSimtSharedObject's `mutation`.
llvm::Error writeChunkKernelsSimt(llvm::StringRef path, llvm::StringRef mutation = "");

/// The same LLVM IR, retargeted and printed (--emit=simt).
llvm::Error printSimtIR(mlir::ModuleOp module, llvm::raw_ostream &os,
                        llvm::StringRef mutation = "");

/// Registers the pipelines with the pass registry, for cellc-opt.
void registerPipelines();

} // namespace cellc

#endif // CELLC_COMPILER_PIPELINES_PIPELINES_H
