//===- TiledBuilder.h - The tiled kernels' emitter and strategies -*- C++ -*-===//
//
// The pieces of convert-cell-to-tiled-kernels:
//
// - `TilePlan` (TilePlan.cpp): the tile and memory budget of one kernel, the
//   single source of its workgroup and dynamic shared-memory figures;
// - `TiledBuilder` (TiledBuilder.cpp, TensorCoreMatvec.cpp): the step
//   emitter whose lanes are the rows of a batch tile;
// - `TileStrategy` (BatchTiled.cpp, Persistent.cpp): what differs between a
//   CTA per tile and a tile split over CTAs that keep the weights;
// - the pass (CellToTiledKernels.cpp): the kernels' signatures, the forward
//   and backward time loops, and the launch structure on CUDA and the CPU.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_CELLTOTILEDKERNELS_TILEDBUILDER_H
#define CELLC_COMPILER_CONVERSION_CELLTOTILEDKERNELS_TILEDBUILDER_H

#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/Common/StepEmitter.h"
#include "dialects/Cell/IR/KernelInterface.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/StringMap.h"

#include <memory>

namespace mlir::cell {

/// The pass's options, parsed.
struct TiledOptions {
  bool gpu = false;
  bool persistent = false;
  cellc::Precision precision = cellc::Precision::Ieee;
  cellc::Storage storage = cellc::Storage::F32;
  int64_t batchTile = 0, threads = 128, sharedLimit = 0, ctas = 0, maxCtas = 0,
          maxRegisters = 0;
};

/// Whether `op` (a matvec or vecmat) runs on tensor cores at `precision`:
/// its rows must fill 16-row MMA tiles and its depth the MMA's k.
bool onTensorCores(Operation *op, cellc::Precision precision);

/// The tile and memory budget of one kernel. The step's row buffers take
/// `rowElements` elements per batch row: in workgroup memory with a CTA per
/// tile, in the global workspace with the persistent strategy, whose CTAs
/// keep their slices of the recurrent weights (and, on CUDA, per-thread
/// partial products) in dynamic shared memory instead.
struct TilePlan {
  int64_t rowElements = 0;
  int64_t tile = 1;
  /// Bytes of an element of the cell.
  int64_t elementBytes = 4;
  /// The persistent strategy: CTAs per tile (0: a CTA per tile) and the
  /// dynamic shared memory each takes.
  int64_t slices = 0;
  int64_t dynamicSharedBytes = 0;
  /// The leading dim of the states (a matrix state's heads) when the step
  /// keeps its heads apart (`stepHeads`) and its CTAs take whole heads: each
  /// of the `slices` CTAs then owns `heads / slices` heads of every value,
  /// keeps its part of the row buffers in dynamic shared memory, and a phase
  /// ends with the CTA's own barrier. 1 for a step with no weights to cache
  /// whose heads mix: one CTA owns the tile's rows whole. 0 otherwise.
  int64_t heads = 0;
  /// The persistent strategy's products whose weights stay in global memory
  /// (read from L2 at every step) because `slices` CTAs capped by
  /// `max-ctas` cannot hold their slices in shared memory.
  SmallPtrSet<Operation *, 4> uncached;

  /// Elements of the step's row buffers for a whole tile.
  int64_t tileElements() const { return rowElements * tile; }
  /// Bytes of the global workspace a tile takes: none when a CTA keeps its
  /// heads' buffers in shared memory.
  int64_t workspaceBytes(bool gpu) const {
    return gpu && heads > 0 ? 0 : tileElements() * elementBytes;
  }
  /// The workgroup memory a CTA takes: what `cell.workgroup_bytes` says.
  int64_t workgroupBytes() const {
    return slices > 0 ? dynamicSharedBytes : tileElements() * elementBytes;
  }
};

/// The heads of the step `body` of `def` (its forward, or with `backward`
/// its backward step): the leading dim that all of `def`'s states share,
/// when one is declared with several dims and each element of every value
/// that the states reach is computed from the same head's elements of the
/// others (elementwise ops, and expands and reduces that keep the heads). Then
/// a head's part of a step needs no other head's. 0 when not.
int64_t stepHeads(DefOp def, Block &body, const PhasePlan &phases, bool backward);

/// Plans the kernel of `def` (its forward, or with `backward` the step
/// `body` of its backward whose results are `args.kinds`): the elements per
/// row that the phases of `phases` and the states need, the tile that fits
/// `options.sharedLimit`, and the persistent strategy's CTAs. Errors are on
/// `def`.
FailureOr<TilePlan> planTile(DefOp def, Block &body, const PhasePlan &phases,
                             const BackwardArgs &args, bool backward,
                             Type element, const TiledOptions &options);

class TileStrategy;

/// Builds the batch-tiled kernels of one cell: each element a `vector<BT>`
/// of the tile's rows.
class TiledBuilder : public StepEmitter {
public:
  TiledBuilder(OpBuilder &builder, Location loc, int64_t tile, Type element,
               bool gpu)
      : StepEmitter(builder, loc, element, VectorType::get({tile}, element)),
        tile(tile), gpu(gpu) {}
  ~TiledBuilder() override;

  int64_t tile;
  bool gpu;
  /// Where buffers live, how elements are split, what a barrier is.
  std::unique_ptr<TileStrategy> strategy;

  /// Set by the kernel before building the body.
  Value tid, ntid;
  int64_t ntidStatic = 1;
  SmallVector<Value> rows, rowValid;
  Value tileIndex;
  /// Elements of the row buffers allocated so far (checked against the
  /// plan's).
  int64_t sharedElements = 0;
  /// CUDA: tf32 or bf16 runs the matvecs that `onTensorCores` accepts with
  /// mma.sync.
  cellc::Precision precision = cellc::Precision::Ieee;
  /// Batch-tiled CUDA: the transposed copies (`[cols, rows]`) of the
  /// weights of the matvecs computed element by element, by param name: a
  /// thread computes a row, and the lanes of a warp read adjacent columns
  /// of the copy where they would read rows a whole row apart.
  llvm::StringMap<Value> transposedParams;

  /// A `[shape..., BT]` row buffer (TileStrategy::rowBuffer).
  Value buffer(ArrayRef<int64_t> shape) override;
  Value shared(ArrayRef<int64_t> shape) { return buffer(shape); }

  Value load(Value buffer, Value slot, Value j) override;
  void store(Value v, Value buffer, Value slot, Value j) override;
  Value loadShared(Value buffer, Value slot, Value j) { return load(buffer, slot, j); }
  void storeShared(Value v, Value buffer, Value slot, Value j) {
    store(v, buffer, slot, j);
  }
  Value loadPerStep(Value buffer, Value j) override { return gather(buffer, true, j); }
  Value loadParam(Value param, Value j) override;
  Value evalProduct(Operation *op, const Index &i) override;
  /// cell.expand and cell.reduce at element `i`, from the input's buffer.
  Value evalExpandOrReduce(Operation *op, const Index &i);
  void forEachElement(int64_t n, function_ref<void(Value j)> body) override;
  /// On CUDA, where the step has a reduction of many terms and a CTA has no
  /// more of the `n` elements than warps: a warp an element, its lanes
  /// splitting each reduction's terms (evalExpandOrReduce), lane 0 writing.
  /// Else a thread an element, which sums the terms alone: gated
  /// DeltaNet's decay gradient, 4,096 terms a head, ran in one thread of
  /// its CTA at every step while the other 255 waited.
  void forEachItemElement(int64_t n, function_ref<void(Value j)> body) override;
  void barrier() override;
  /// The reductions, and the products that the strategy computes whole.
  bool computesProduct(Operation *op) override;
  void emitProduct(Operation *op, Value out) override;
  /// A reduction into the buffer `out` (`[1, BT]`), through `partials`.
  void emitSum(SumOp sum, Value out);
  /// In forEachItemElement's warp-an-element loops: this thread's lane.
  Value warpLane;
  /// `v` (a lane vector) combined over the warp's 32 lanes by `combine`,
  /// in every lane (a butterfly of shuffles).
  Value warpAllReduce(Value v, const ReduceCombine &combine);
  /// The partial sums of a reduction (`TileStrategy::partialSlots` of them),
  /// two sets used in turn, allocated with the states when the step has a
  /// reduction.
  Value partials[2];
  unsigned nextPartials = 0;

  /// A loop from `begin` to `end` by `step`, `body` built inside it.
  void forRange(Value begin, Value end, Value step, function_ref<void(Value)> body);
  /// The sum of `term(j)` (a lane) for j from `begin` to `end` by `step`.
  Value sumRange(Value begin, Value end, Value step, function_ref<Value(Value)> term);
  /// The same, combined by `combine` (a cell.reduce's sum, max or min).
  Value reduceRange(const ReduceCombine &combine, Value begin, Value end, Value step,
                    function_ref<Value(Value)> term);
  /// The partial sums a CTA keeps: one a warp on CUDA, where a warp's
  /// threads add theirs with shuffles; one a thread on the CPU.
  int64_t partialsPerCta() const { return gpu ? ntidStatic / 32 : ntidStatic; }
  /// Hands this thread's `partial` to `sink` at slot `first` plus its warp
  /// (CUDA: summed over the warp by shuffles, from its first lane) or its
  /// thread (the CPU).
  void sinkPartial(Value first, Value partial,
                   function_ref<void(Value slot, Value partial)> sink);

  /// Gathers element `j` of each row of the tile from a `[T, B, n]` buffer
  /// (at step `t`, or `step`) or a `[B, n]` buffer.
  Value gather(Value buffer, bool perStep, Value j, Value step = {});
  /// Scatters `v` to element `j` of each valid row of the tile.
  void scatter(Value v, Value buffer, bool perStep, Value j);
  /// A per-row flag as a `vector<BT x i1>`.
  Value laneMask(function_ref<Value(Value row)> flag);
  /// Whether any row of the tile has its `mask` lane set. All threads of a
  /// CTA branch the same way on it.
  Value any(Value mask);
  /// `then()` where `cond` holds and `otherwise()` elsewhere, building only
  /// the side taken: the loads of the other side are not issued.
  Value choose(Value cond, function_ref<Value()> then,
               function_ref<Value()> otherwise);

  /// Computes the product of `op` into the buffer `out` (`[rows, BT]`) with
  /// the CTA's warps on tensor cores: all its rows from the weight in global
  /// memory, or (persistent) the `count` rows from `first`, whose weights
  /// `cached(local row, column)` reads (TensorCoreMatvec.cpp).
  void emitTensorCoreMatvec(Operation *op, Value out, Value first = {},
                            int64_t count = 0,
                            function_ref<Value(Value, Value)> cached = nullptr);
};

/// What differs between the strategies. The kernel calls, in order:
/// `addArguments` while building the signature, `beginKernel` in the entry
/// block, `launchTiles` (CUDA), `beforeTiles`, then builds each tile's time
/// loop inside a loop over tiles, and `endKernel`.
class TileStrategy {
public:
  TileStrategy(TiledBuilder &tb, const TilePlan &plan) : tb(tb), plan(plan) {}
  virtual ~TileStrategy() = default;

  /// Adds the kernel's own arguments after the others.
  virtual void addArguments(KernelSignature &sig, MLIRContext *ctx) {}
  /// In the entry block: `extraArgs` is the first argument `addArguments`
  /// added; `kernel` is the gpu.func on CUDA.
  virtual void beginKernel(Block *entry, unsigned extraArgs,
                           gpu::GPUFuncOp kernel) = 0;
  /// CUDA: the first tile this CTA runs and the stride to its next (a grid
  /// may hold fewer CTAs than the batch has tiles: each loops over tiles),
  /// or no stride where the CTA runs one tile; and the strategy's own ids.
  virtual std::pair<Value, Value> launchTiles() = 0;
  /// Once, before the loop over tiles.
  virtual void beforeTiles(Block &step) {}
  /// The CPU: after the loop over tiles.
  virtual void endKernel() {}
  /// The dynamic shared memory the kernel used (checked against the plan's).
  virtual int64_t dynamicSharedUsed() const { return 0; }

  /// A `[shape..., BT]` buffer of the step's values.
  virtual Value rowBuffer(ArrayRef<int64_t> full) = 0;
  /// Where element `j` of the row buffer `buffer` is: `j`, unless the
  /// buffer holds only this CTA's heads.
  virtual Value localIndex(Value buffer, Value j) { return j; }
  /// A loop over this thread's elements of `[0, n)`.
  virtual void forEachElement(int64_t n, function_ref<void(Value j)> body) = 0;
  /// How many of `[0, n)` a CTA's threads split.
  virtual int64_t elementsPerCta(int64_t n) const { return n; }
  /// The sum of `term(j)` over this thread's elements of `[0, n)`, handed
  /// to `sink` with the thread's slot among `partialSlots()` (the tile's
  /// threads, of every CTA of the tile).
  virtual void forEachPartial(int64_t n, function_ref<Value(Value j)> term,
                              function_ref<void(Value slot, Value partial)> sink) = 0;
  virtual int64_t partialSlots() const = 0;
  virtual void barrier() = 0;
  /// Whether the matvec or vecmat `op` is computed whole before the element
  /// loops that read it, and how.
  virtual bool computesProduct(Operation *op) = 0;
  virtual void emitProduct(Operation *op, Value out) = 0;

protected:
  TiledBuilder &tb;
  const TilePlan &plan;
};

/// A CTA per tile (BatchTiled.cpp).
std::unique_ptr<TileStrategy> makeBatchTiled(TiledBuilder &tb, const TilePlan &plan);
/// A tile split over `plan.slices` CTAs, with grid barriers (Persistent.cpp).
std::unique_ptr<TileStrategy> makePersistent(TiledBuilder &tb, const TilePlan &plan);

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_CELLTOTILEDKERNELS_TILEDBUILDER_H
