//===- CpuCell.h - Run a cell on the CPU: forward, backward, modes -*- C++ -*-===//

#ifndef CELLC_RUNTIME_CPUCELL_H
#define CELLC_RUNTIME_CPUCELL_H

#include "compiler/Frontend/Sizes.h"
#include "runtime/JitKernels.h"
#include "runtime/TuningCache.h"
#include "runtime/driver/SequenceDriver.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace cellc::runtime {

/// What the forward keeps for the backward, named as users know it: none
/// (saves the planned gate values), full (only the states; the backward
/// replays every step) or chunk:K (the states every K steps; the backward
/// replays a chunk at a time).
struct Recompute : driver::Recompute {
  /// Parses "none", "full" or "chunk:K", through the driver's one parse
  /// function.
  static llvm::Expected<Recompute> parse(llvm::StringRef text);
};

/// A contiguous row-major buffer in the cell's dtype; the caller owns it.
struct Array {
  void *data = nullptr;
  std::vector<int64_t> shape;
};

/// A declared input, state, param or output, with its bound shape: `[n]` for
/// per-step vectors, `[rows, cols]` or `[n]` for params.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
};

/// What forward keeps for backward. Opaque, but its size is reported.
using Saved = driver::Saved;
using SavedPtr = driver::SavedPtr;

/// A cell compiled for the host CPU at bound sizes and a dtype: its forward
/// and backward over `[T, B, n]` sequences with resets, in any recompute mode.
/// The hoisted projections and weight gradients run on OpenBLAS; the
/// recurrence runs in JIT-compiled kernels, one batch tile per thread.
class CpuCell {
public:
  struct Options {
    /// Threads for the recurrent kernels; 0 means one per core.
    int threads = 0;
    /// Whether compiled kernels are read from and written to the kernel
    /// cache (`$CELLC_CACHE_DIR`, default `~/.cache/cellc`).
    bool useCache = true;
    /// The cache directory; empty for the default.
    std::string cacheDir;
    /// The kernels that run the recurrence (unless `batchTiled`).
    enum class Kernels {
      /// Batched, but per-row for a batch of one row (`batchHint` 1).
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
    /// Rows (steps times the batch) per piece of the projections and the
    /// gradients' GEMMs; 0: the driver's default.
    int64_t pieceRows = 0;
  };

  ~CpuCell();

  /// Whether `options` run the batched kernels.
  static bool usesBatchedKernels(const Options &options);
  /// The batched kernels' tile and products' register block that `options`
  /// give, with the defaults filled in.
  struct BatchedShape {
    int64_t tile, rows, vectors;
  };
  static BatchedShape batchedShape(const Options &options);
  /// The host's vector registers: 32 with AVX-512, 16 with AVX2.
  static int64_t hostVectorRegisters();

  /// Parses, checks and compiles `source`. Errors carry the front end's
  /// `file:line:col` messages.
  static llvm::Expected<std::unique_ptr<CpuCell>>
  compile(llvm::StringRef source, llvm::StringRef fileName,
          const SizeBindings &sizes, DType dtype, Options options);
  static llvm::Expected<std::unique_ptr<CpuCell>>
  compile(llvm::StringRef source, llvm::StringRef fileName,
          const SizeBindings &sizes, DType dtype) {
    return compile(source, fileName, sizes, dtype, Options());
  }

  const std::vector<Slot> &inputs() const { return inputSlots; }
  const std::vector<Slot> &states() const { return stateSlots; }
  const std::vector<Slot> &params() const { return paramSlots; }
  const std::vector<Slot> &outputs() const { return outputSlots; }
  DType dtype() const { return elementType; }
  int threads() const { return numThreads; }
  void setThreads(int threads);

  /// What one forward reads. Inputs are `[T, B, n]` in declaration order,
  /// params in declaration order, initial states `[B, n]` (null data: zeros),
  /// resets `[T, B]` bytes (null: none). `steps` gives T for a cell without
  /// inputs.
  struct Sequence {
    std::vector<Array> inputs;
    std::vector<Array> params;
    std::vector<Array> initialStates;
    const uint8_t *resets = nullptr;
    /// Per-sample lengths (empty: all T): sample b runs steps 0 ..
    /// lengths[b] - 1; its outputs after them are zero and its final state
    /// is its state after its last step (driver::Sequence::lengths).
    std::vector<int64_t> lengths;
    int64_t steps = -1;
    int64_t batch = -1;
    /// When set, inputs, outputs, their gradients and the resets are laid out
    /// `[B, T, ...]` instead of `[T, B, ...]`. They are transposed into and
    /// out of the kernels' layout.
    bool batchFirst = false;
    /// Forward: the caller keeps the output buffers alive and unchanged as
    /// long as the Saved, so that an output that is a state (`output h`)
    /// serves as that state's history instead of a copy (not with
    /// `batchFirst`, whose outputs are copies).
    bool outputsOutliveSaved = false;
  };

  /// Runs the cell over the sequence, writing outputs `[T, B, n]` and final
  /// states `[B, n]`. With `saved`, keeps what `backward` needs in `mode`.
  /// With `kept` (time-major only), what forward keeps goes into the
  /// caller's buffers, those that `keptLayout` says, and the outputs are kept
  /// by the caller too (`outputsOutliveSaved`): a caller that holds them as
  /// tensors (a torch operator) rebuilds the Saved with `adopt`.
  llvm::Error forward(const Sequence &seq, const std::vector<Array> &outputs,
                      const std::vector<Array> &finalStates, Recompute mode,
                      SavedPtr *saved, const std::vector<Array> *kept = nullptr);

  /// What a training forward in `mode` keeps, as a caller that holds it
  /// allocates it (driver::SequenceDriver::keptLayout; the outputs kept).
  std::vector<driver::KeptBuffer> keptLayout(Recompute mode, bool hasLengths) const;
  /// The outputs such a forward keeps as states' histories (sorted, once).
  std::vector<size_t> keptOutputs(Recompute mode, bool hasLengths) const;

  /// The Saved of a forward of `seq` in `mode` whose kept buffers are the
  /// caller's `kept`, with its `outputs`: for `backward`.
  llvm::Expected<SavedPtr> adopt(const Sequence &seq, Recompute mode,
                                 const std::vector<Array> &outputs,
                                 const std::vector<Array> &kept) const;

  /// The gradients of a loss given its gradients with respect to the outputs
  /// `[T, B, n]` and the final states `[B, n]` (null data: zeros). Writes the
  /// gradients of the inputs, params and initial states into caller buffers
  /// shaped like them (null data: not wanted).
  llvm::Error backward(const Sequence &seq, const Saved &saved,
                       const std::vector<Array> &gradOutputs,
                       const std::vector<Array> &gradFinalStates,
                       const std::vector<Array> &gradInputs,
                       const std::vector<Array> &gradParams,
                       const std::vector<Array> &gradInitialStates);

  /// Bytes that `saved` holds between forward and backward (not the outputs
  /// it reads as states).
  static int64_t savedBytes(const Saved &saved);

  /// The bytes the driver held in the last forward and backward, and holds
  /// now.
  driver::MemoryStats memoryStats() const;

  /// What a training step of `steps` x `batch` in `mode` holds
  /// (driver::SequenceDriver::plan).
  llvm::Expected<driver::MemoryPlan> memoryPlan(int64_t steps, int64_t batch,
                                                Recompute mode) const;

  /// Whether both kernel sets came from the kernel cache, with no compile.
  bool loadedFromCache() const { return fromCache; }

  /// The knobs the kernels were built with, as `name=value,...`, and whether
  /// they came from the tuning cache ("tuned") or not ("default").
  const std::string &config() const { return configText; }
  const std::string &configSource() const { return configOrigin; }

  /// Bytes per element of the cell's dtype.
  int64_t elementBytes() const { return elementType == DType::F32 ? 4 : 8; }

private:
  struct Impl;
  explicit CpuCell(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl;
  DType elementType = DType::F32;
  int numThreads = 1;
  bool fromCache = false;
  std::string configText, configOrigin = "default";
  std::vector<Slot> inputSlots, stateSlots, paramSlots, outputSlots;
};

/// Sets the knobs of a CPU config in `options`.
void applyConfig(const KernelConfig &config, CpuCell::Options &options);
/// The CPU config that `options` describe, with `threads` resolved.
KernelConfig configOf(const CpuCell::Options &options, int threads);


} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPUCELL_H
