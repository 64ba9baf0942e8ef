//===- CpuCell.h - Run a CPU package: forward, backward, modes --*- C++ -*-===//
//
// A cell's CPU package (kernels.json and the shared objects of both
// SAVE_GATES variants, as `cellc --emit=package --target=cpu` and the JIT
// write it), loaded with dlopen and run through the sequence driver. No LLVM
// or MLIR: this is what a server that only runs trained cells links.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_CPUCELL_H
#define CELLC_RUNTIME_CPU_CPUCELL_H

#include "runtime/driver/Package.h"
#include "runtime/driver/SequenceDriver.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cellc::runtime {

using driver::Status;

/// What the forward keeps for the backward, named as users know it: none
/// (saves the planned gate values), full (only the states; the backward
/// replays every step) or chunk:K (the states every K steps; the backward
/// replays a chunk at a time).
struct Recompute : driver::Recompute {
  /// Parses "none", "full" or "chunk:K", through the driver's one parse
  /// function; an unknown mode is an error that lists the known ones.
  static Status parse(const std::string &text, Recompute &out);
};

/// The element type of a CPU cell.
enum class DType { F32, F64 };

/// A contiguous row-major buffer in the cell's dtype; the caller owns it.
struct Array {
  void *data = nullptr;
  std::vector<int64_t> shape;
};

/// A declared input, state, param or output, with its bound shape: `[n]` for
/// per-step vectors, `[rows, cols]` or `[n]` for params.
using Slot = driver::Slot;

/// What forward keeps for backward. Opaque, but its size is reported.
using Saved = driver::Saved;
using SavedPtr = driver::SavedPtr;

/// A cell's CPU package, loaded: its forward and backward over `[T, B, n]`
/// sequences with resets, in any recompute mode. The hoisted projections and
/// weight gradients run on OpenBLAS; the recurrence runs in the package's
/// kernels, a group of threads per batch tile (or part of one), the threads
/// of a group each a slice of the units.
class CpuCell {
public:
  struct Options {
    /// Threads for the recurrent kernels; 0 means one per core.
    int threads = 0;
    /// Rows (steps times the batch) per piece of the projections and the
    /// gradients' GEMMs; 0: the driver's default.
    int64_t pieceRows = 0;
  };

  ~CpuCell();

  /// Loads the package in `dir`. Errors name the directory and what is
  /// missing or wrong in it.
  static Status load(const std::string &dir, const Options &options,
                     std::unique_ptr<CpuCell> &out);

  const std::vector<Slot> &inputs() const { return info.inputs; }
  const std::vector<Slot> &states() const { return info.states; }
  const std::vector<Slot> &params() const { return info.params; }
  const std::vector<Slot> &outputs() const { return info.outputs; }
  const driver::PackageInfo &package() const { return info; }
  DType dtype() const { return elementType; }
  int threads() const { return numThreads; }
  void setThreads(int threads);
  /// Whether, with fewer batch tiles than threads, the threads of a tile
  /// split its units (1: each a slice of every step's products and element
  /// loops, meeting at barriers) or its rows (0). By default (-1), as
  /// splitsRows says.
  int unitSlices() const;
  void setUnitSlices(int mode);
  /// By default, whether `threads` threads split the rows of a batch of
  /// `batch` (each its own, with no barrier) rather than a tile's units, for
  /// a cell whose matrix params hold `weightBytes` (matrixBytes). Unit slices meet at
  /// barriers in every phase; on two cores split rows trained faster from
  /// 4 rows a thread (LSTM and GRU, H = 256, B = 8 to 64: 3% to 8%, and
  /// more on a busy machine; docs/benchmarks.md). But each thread that
  /// splits rows packs the weights again in its own buffers (LSTM H = 1024
  /// on two threads peaked at 157 MiB in chunk:16 against 109, no faster),
  /// so the extra threads' copies may take 4 MiB in all.
  static bool splitsRows(int64_t batch, int threads, int64_t weightBytes);
  static constexpr int64_t kRowsPerThread = 4;
  static constexpr int64_t kRowSplitBytes = int64_t(4) << 20;
  /// The bytes of the matrix params (2-D, and block-diagonal 3-D) among
  /// `shapes`, of `elementBytes` each: what the batched kernels pack. The
  /// JIT (from the cell) and the runtime (from the package) both ask it.
  static int64_t matrixBytes(const std::vector<std::vector<int64_t>> &shapes,
                             int64_t elementBytes);
  /// How a kernel launch over `batch` rows runs: groups of threads, each
  /// group a range of rows, and the threads of a group (1: no unit slices).
  std::pair<int64_t, int64_t> threadSplit(int64_t batch) const;

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
  Status forward(const Sequence &seq, const std::vector<Array> &outputs,
                 const std::vector<Array> &finalStates, Recompute mode, SavedPtr *saved,
                 const std::vector<Array> *kept = nullptr);

  /// One step of inference (driver::SequenceDriver::step): inputs `[B, n]`,
  /// params, the states to step from `[B, n]` (all given, as
  /// `seq.initialStates`), outputs and new states `[B, n]`. `seq.resets`,
  /// `lengths` and `batchFirst` must be unset. Buffers are kept for the
  /// next step of the same B; with `paramVersions` (a counter per param
  /// that changes when it is written, as torch's tensor versions do), so
  /// are the packed weights, while the params and versions stay the same.
  Status step(const Sequence &seq, const std::vector<Array> &outputs,
              const std::vector<Array> &newStates,
              const std::vector<int64_t> *paramVersions = nullptr);

  /// A step's kernel bound to its arguments (bindStep), for a stream that
  /// steps tensors of the same shapes again and again: a call writes their
  /// data into the arguments laid out once and runs the kernel, with none
  /// of `step`'s checks, copies or allocations. It must not outlive the
  /// cell.
  class BoundStep {
  public:
    ~BoundStep();
    /// Steps the tensors whose data `data` gives, in `step`'s order
    /// (inputs, params, states stepped from, outputs, new states), shaped
    /// as those it was bound with; `versions` as `step`'s paramVersions.
    /// False, running nothing, where the binding no longer holds (another
    /// B stepped since, or the threads changed): bind again.
    bool run(const std::vector<uintptr_t> &data, const std::vector<int64_t> &versions,
             Status &status);

  private:
    friend class CpuCell;
    struct Impl;
    std::unique_ptr<Impl> impl;
  };
  /// `step`, then that step bound for the next calls (null where it cannot
  /// be: arguments that share data).
  Status bindStep(const Sequence &seq, const std::vector<Array> &outputs,
                  const std::vector<Array> &newStates,
                  const std::vector<int64_t> &paramVersions,
                  std::unique_ptr<BoundStep> &bound);

  /// What a training forward in `mode` keeps, as a caller that holds it
  /// allocates it (driver::SequenceDriver::keptLayout; the outputs kept).
  std::vector<driver::KeptBuffer> keptLayout(Recompute mode, bool hasLengths) const;
  /// The outputs such a forward keeps as states' histories (sorted, once).
  std::vector<size_t> keptOutputs(Recompute mode, bool hasLengths) const;

  /// The Saved of a forward of `seq` in `mode` whose kept buffers are the
  /// caller's `kept`, with its `outputs`: for `backward`.
  Status adopt(const Sequence &seq, Recompute mode, const std::vector<Array> &outputs,
               const std::vector<Array> &kept, SavedPtr &saved) const;

  /// The gradients of a loss given its gradients with respect to the outputs
  /// `[T, B, n]` and the final states `[B, n]` (null data: zeros). Writes the
  /// gradients of the inputs, params and initial states into caller buffers
  /// shaped like them (null data: not wanted).
  Status backward(const Sequence &seq, const Saved &saved,
                  const std::vector<Array> &gradOutputs, const std::vector<Array> &gradFinalStates,
                  const std::vector<Array> &gradInputs, const std::vector<Array> &gradParams,
                  const std::vector<Array> &gradInitialStates);

  /// Bytes that `saved` holds between forward and backward (not the outputs
  /// it reads as states).
  static int64_t savedBytes(const Saved &saved);

  /// The bytes the driver held in the last forward and backward, and holds
  /// now.
  driver::MemoryStats memoryStats() const;

  /// What the barriers of a profiling build (CpuOptions::profilePhases)
  /// counted in the forward (or backward) kernel since the last reset; empty
  /// otherwise.
  const driver::PhaseProfile &phaseProfile(bool backward) const;
  void resetPhaseProfile();

  /// What a training step of `steps` x `batch` in `mode` holds
  /// (driver::SequenceDriver::plan).
  Status memoryPlan(int64_t steps, int64_t batch, Recompute mode,
                    driver::MemoryPlan &plan) const;

  /// Where the package came from, for those who made it (the JIT): whether
  /// it was loaded from the kernel cache, and whether its config was tuned.
  bool loadedFromCache() const { return fromCache; }
  /// The knobs the kernels were built with, the threads and unit slices:
  /// `name=value,...` sorted by name.
  std::string config() const;
  const std::string &configSource() const { return configOrigin; }
  void setOrigin(bool cached, std::string source) {
    fromCache = cached;
    configOrigin = std::move(source);
  }

  /// Bytes per element of the cell's dtype.
  int64_t elementBytes() const { return elementType == DType::F32 ? 4 : 8; }

private:
  struct Impl;
  CpuCell();

  std::unique_ptr<Impl> impl;
  driver::PackageInfo info;
  DType elementType = DType::F32;
  int numThreads = 1;
  bool fromCache = false;
  std::string configOrigin = "default";
};

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_CPUCELL_H
