//===- CpuJit.h - Compile a cell to a CPU package, cache it, load it -*- C++ -*-===//
//
// The JIT is a layer over the package flow: the compiler builds the CPU
// package (compiler/Pipelines: buildCpuPackage, writeCpuPackage), the kernel
// cache keeps it, and the runtime loads it (runtime/cpu) as it loads a
// package that `cellc --emit=package --target=cpu` wrote.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_JIT_CPUJIT_H
#define CELLC_JIT_CPUJIT_H

#include "compiler/Frontend/Sizes.h"
#include "compiler/Pipelines/Pipelines.h"
#include "jit/TuningCache.h"
#include "runtime/cpu/CpuCell.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <string>

namespace cellc::jit {

using runtime::CpuCell;

/// How the CPU kernels are built, and how the loaded cell runs.
struct CpuOptions {
  /// Threads for the recurrent kernels; 0 means one per core.
  int threads = 0;
  /// With fewer batch tiles than threads: 1, a tile's threads split its
  /// units (CpuCell::setUnitSlices); 0, its rows; -1, as
  /// CpuCell::splitsRows says.
  int unitSlices = -1;
  /// The bytes of the cell's matrix params (CpuCell::matrixBytes), which
  /// prepareCpuPackage reads off the cell.
  int64_t weightBytes = 0;
  /// Whether packages are read from and written to the kernel cache
  /// (`$CELLC_CACHE_DIR`, default `~/.cache/cellc`). Without it, the package
  /// is built in a temporary directory that goes once it is loaded.
  bool useCache = true;
  /// The cache directory; empty for the default.
  std::string cacheDir;
  /// The kernels that run the recurrence (unless `batchTiled`).
  enum class Kernels {
    /// Batched, but per-row for a batch of one row (`batchHint` 1) on one
    /// thread.
    Auto,
    /// Each step as phases over a tile of rows, its products
    /// register-blocked matrix products over the tile.
    Batched,
    /// One row at a time, whole vectors in registers.
    PerRow,
  };
  Kernels kernels = Kernels::Auto;
  /// Batched kernels: the products' register block, rows by vectors (0:
  /// the largest that the host's vector registers hold), and the lanes of
  /// a vector (0: 256 bits).
  int64_t productRows = 0;
  int64_t productVectors = 0;
  int64_t vectorWidth = 0;
  /// Runs the batch-tiled kernels built for CUDA, emulated on the host:
  /// to test the GPU strategy's code here. Slower than the default.
  bool batchTiled = false;
  /// Rows per tile of the batched kernels, or of the batch-tiled ones; 0
  /// chooses.
  int64_t batchTile = 0;
  /// With `batchTiled`: the persistent strategy's kernels instead, with
  /// `ctas` CTAs per tile (0 chooses), emulated one CTA after another in
  /// each phase.
  bool persistent = false;
  int64_t ctas = 0;
  /// The per-row kernels' recurrent matvec: lanes per FMA (0: whole rows)
  /// and rows per iteration. Must divide the weights' dimensions.
  int64_t matvecWidth = 0;
  int64_t matvecUnroll = 1;
  /// The batch size the cell will run at, when known. With `useTuned`, a
  /// tuning-cache entry for it (cellc-tune, in `cacheDir`'s `tuning`)
  /// replaces the knobs above.
  int64_t batchHint = 0;
  bool useTuned = true;
  /// The kernels of a streaming step (`CpuCell::step`): the products of
  /// inputs stay in the kernel, not hoisted as projections.
  bool step = false;
  /// Non-empty: the kernels of that part of the cell's chunkwise form
  /// (takeChunkPart: "prologue"). No tuned config applies to it.
  std::string chunkPart;
  /// Rows (steps times the batch) per piece of the projections and the
  /// gradients' GEMMs; 0: the driver's default.
  int64_t pieceRows = 0;
  /// Batched kernels count the cycles each thread works and waits between
  /// barriers (CpuCell::phaseProfile). A package of its own in the cache.
  bool profilePhases = false;
};

/// Whether `options` run the batched kernels.
bool usesBatchedKernels(const CpuOptions &options);
/// The batched kernels' tile and products' register block that `options`
/// give, with the defaults filled in.
struct BatchedShape {
  int64_t tile, rows, vectors;
};
BatchedShape batchedShape(const CpuOptions &options);
/// The host's vector registers: 32 with AVX-512, 16 with AVX2.
int64_t hostVectorRegisters();

/// The pipeline options that build the kernels `options` describe.
PipelineOptions pipelineOptionsOf(const CpuOptions &options);
/// Sets the knobs of a CPU config in `options`.
void applyConfig(const KernelConfig &config, CpuOptions &options);
/// The CPU config that `options` describe, with `threads` resolved.
KernelConfig configOf(const CpuOptions &options, int threads);
/// The same without threads, which a package does not fix: kernels.json's
/// "config".
std::string kernelConfigText(const CpuOptions &options);

/// A CPU package ready to load: its directory, whether it came from the
/// kernel cache, whether it is a temporary one (no cache: the caller removes
/// it once loaded), whether its config was tuned ("tuned", or "default"),
/// and the threads that config runs on (0: one per core).
struct PreparedPackage {
  std::string dir;
  bool fromCache = false;
  bool temporary = false;
  std::string origin = "default";
  int threads = 0;
  /// How the threads share a tile (CpuOptions::unitSlices).
  int unitSlices = -1;
};

/// Parses, checks and compiles `source` into a CPU package, or finds it in
/// the kernel cache. Errors carry the front end's `file:line:col` messages.
llvm::Expected<PreparedPackage> prepareCpuPackage(llvm::StringRef source,
                                                  llvm::StringRef fileName,
                                                  const SizeBindings &sizes, DType dtype,
                                                  CpuOptions options = {});

/// prepareCpuPackage, then loads the package. Errors carry the front end's
/// `file:line:col` messages.
llvm::Expected<std::unique_ptr<CpuCell>> compileCpu(llvm::StringRef source,
                                                    llvm::StringRef fileName,
                                                    const SizeBindings &sizes,
                                                    DType dtype,
                                                    CpuOptions options = {});

/// Loads the CPU package in `dir` (runtime::CpuCell::load), as an llvm::Error.
llvm::Expected<std::unique_ptr<CpuCell>> loadCpuPackage(llvm::StringRef dir,
                                                        const CpuOptions &options = {});

/// A runtime status as an llvm::Error.
llvm::Error errorOf(const runtime::Status &status);
/// A recompute mode ("none", "full", "chunk:K"), or an error that lists them.
llvm::Expected<runtime::Recompute> parseRecompute(llvm::StringRef text);

/// The slots and kernels of the CPU kernels that `options` build from `cell`
/// (cell IR, not modified; kernels.json only, no code generation): what
/// driver::SequenceDriver::plan plans.
llvm::Expected<driver::Interface> kernelInterface(mlir::ModuleOp cell,
                                                  const PipelineOptions &options,
                                                  llvm::StringRef dtype);

/// The recompute modes the memory tables of `--emit=plan` show.
inline constexpr const char *kPlanModes[] = {"none", "full", "chunk:16", "chunk:64"};

/// printStage (compiler/Pipelines), and for `--emit=plan` the memory table
/// after the save plan: what a training step of `options.planSteps` x
/// `options.planBatch` holds on the CPU in each recompute mode, from the
/// driver's plan over the CPU kernels.
llvm::Error printStage(mlir::ModuleOp module, Emit emit, const PipelineOptions &options,
                       llvm::StringRef chip, llvm::raw_ostream &os);

} // namespace cellc::jit

#endif // CELLC_JIT_CPUJIT_H
