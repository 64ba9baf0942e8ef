//===- StepEmitter.h - A step's phases, element by element -----*- C++ -*-===//
//
// The code that the CPU's batched kernels and the GPU's tiled kernels share:
// evaluating a cell value at an element index (chunks as offsets, concats by
// part, restores as saved-or-replayed), with what is already computed in the
// same loop reused, and emitting the phases of a `PhasePlan`. A strategy
// derives from `StepEmitter` and says where things are: how a buffer is laid
// out and read, what a lane holds (rows of a tile on the GPU, units of a row
// on the CPU), how a product is computed, how a phase ends.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_COMMON_STEPEMITTER_H
#define CELLC_COMPILER_CONVERSION_COMMON_STEPEMITTER_H

#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/Common/PhasePlan.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"

#include <functional>
#include <tuple>

namespace mlir::cell {

/// An element index: `base + offset`, where `base` runs over `[0, extent)`.
struct Index {
  Value base;
  int64_t offset = 0;
  int64_t extent = 0;
};

/// Writes an evaluated element (a lane vector) at element `j + offset`.
using Sink = std::function<void(OpBuilder &, Location, Value, Value, int64_t)>;

/// A value written out in some phase, with where it goes.
struct Item {
  Value value;
  SmallVector<std::pair<Sink, int64_t>> sinks;
  /// When set, the writes happen only where it is true.
  Value guard;
};

/// Where a leaf value is read from.
struct Source {
  enum Kind { Shared, PerStep } kind = Shared;
  Value buffer;
  /// Shared: the ping-pong slot, when the buffer has one.
  Value slot;
};

/// Evaluates a step's values element by element and emits its phases.
class StepEmitter {
public:
  StepEmitter(OpBuilder &builder, Location loc, Type element, VectorType lane)
      : builder(builder), loc(loc), element(element), lane(lane) {}
  virtual ~StepEmitter() = default;

  OpBuilder &builder;
  Location loc;
  Type element;
  /// What one evaluation yields: a vector of the element type.
  VectorType lane;

  /// Set by the kernel before building the body.
  Value t, saveGates;
  DenseMap<Value, Source> sources;
  DenseMap<StringRef, Value> params;
  DenseMap<Operation *, Value> projectionBuffers;
  Value gates;
  /// The buffers of the plan's materialized values.
  DenseMap<Value, Value> sharedOf;
  PhasePlan *plan = nullptr;
  unsigned phase = 0;
  /// What the next `barrier` ends, for a strategy that names its barriers
  /// (profiles): "products" or "elements" of `phase`, or a kernel's own.
  StringRef ending;
  /// The products computed before the element loops of a phase, read from
  /// here.
  DenseMap<Operation *, Value> products;
  bool failedEval = false;

  Value index(int64_t v) {
    return builder.create<arith::ConstantIndexOp>(loc, v);
  }
  Value shifted(Value j, int64_t offset) {
    if (offset == 0)
      return j;
    return builder.create<arith::AddIOp>(loc, j, index(offset));
  }
  Value at(const Index &i) { return shifted(i.base, i.offset); }

  /// Where the backward step's block arguments are read from: the inputs
  /// and output gradients per step (kernel arguments `arg(0..numInputs)` and
  /// `arg(firstDOut..)`), the states before the step (`prevBufs`) and the
  /// carried state gradients (`gradBufs`, at `slot`) from shared buffers.
  void bindBackwardStep(Block &body, function_ref<Value(unsigned)> arg,
                        unsigned numInputs, unsigned numOutputs, unsigned firstDOut,
                        ArrayRef<Value> prevBufs, ArrayRef<Value> gradBufs, Value slot);

  /// Evaluates `v` at element `i`.
  Value eval(Value v, const Index &i);
  /// Emits the phases that compute `items`.
  LogicalResult emitPhases(ArrayRef<Item> items);
  /// The buffer (and its slot) that holds `v` whole, if any.
  Value bufferOf(Value v, Value &slot);

  //===--------------------------------------------------------------------===//
  // What a strategy says
  //===--------------------------------------------------------------------===//

  /// A buffer of `shape` elements per batch row of the tile.
  virtual Value buffer(ArrayRef<int64_t> shape) = 0;
  /// The buffer a product of `op` is computed into; by default a buffer of
  /// its size.
  virtual Value productBuffer(Operation *op) {
    return buffer({sizeOf(op->getResult(0))});
  }
  /// Reads and writes element `j` of a buffer (at `slot`, when it has one).
  virtual Value load(Value buffer, Value slot, Value j) = 0;
  virtual void store(Value v, Value buffer, Value slot, Value j) = 0;
  /// Reads element `j` of a `[T, B, n]` buffer at step `t`.
  virtual Value loadPerStep(Value buffer, Value j) = 0;
  /// Reads element `j` of a vector param.
  virtual Value loadParam(Value param, Value j) = 0;
  /// A loop over the elements `[0, n)` that this program computes.
  virtual void forEachElement(int64_t n, function_ref<void(Value j)> body) = 0;
  /// The loop over a phase's items of size `n`: forEachElement, unless the
  /// strategy gives each element a group of threads (TiledBuilder: a warp,
  /// whose lanes split the terms of the reductions they evaluate); then
  /// `writeGuard` is set in the body, and only where it holds are the
  /// items written.
  virtual void forEachItemElement(int64_t n, function_ref<void(Value j)> body) {
    forEachElement(n, body);
  }
  /// The end of a phase: what it wrote is visible to the next one.
  virtual void barrier() = 0;
  /// Whether the cross-unit op `op` is computed whole at the start of its
  /// phase (`emitProduct`), rather than element by element (`evalProduct`).
  virtual bool computesProduct(Operation *op) = 0;
  virtual void emitProduct(Operation *op, Value out) = 0;
  virtual Value evalProduct(Operation *op, const Index &i);
  /// The per-sample value `one` (of size 1) at every element of a lane. By
  /// default the lanes hold one element of several rows, so it is `one` at
  /// element 0.
  virtual Value evalBroadcast(Value one);

protected:
  /// Set by forEachItemElement: the threads that write an element.
  Value writeGuard;
  using Key = std::tuple<Value, Value, int64_t>;
  SmallVector<DenseMap<Key, Value>> scopes = SmallVector<DenseMap<Key, Value>>(1);
  Value lookup(const Key &key) {
    for (auto &scope : llvm::reverse(scopes)) {
      auto it = scope.find(key);
      if (it != scope.end())
        return it->second;
    }
    return {};
  }
  Value remember(Value v, const Index &i, Value result) {
    scopes.back()[Key(v, i.base, i.offset)] = result;
    return result;
  }
  Value evalOp(Operation *op, Value v, const Index &i);
  Value evalRestore(RestoreOp restore, unsigned result, const Index &i);
  Value evalConcat(ConcatOp concat, const Index &i);
};

/// A backward kernel's buffers over the steps, made by `emitter.buffer`: per
/// state, the state gradient's two slots (with `withSlots`), the state before
/// the step, and its gradient's sums into the initial and the start state;
/// per vector param of the backward step's results (`ret`), its gradient's
/// sum.
struct BackwardBuffers {
  BackwardBuffers(StepEmitter &emitter, DefOp def, const BackwardArgs &args,
                  Operation *ret, bool withSlots);
  SmallVector<Value> grad, prev, accInit, accStart;
  DenseMap<unsigned, Value> accParam;
};

/// Where each result of a backward step (`ret`'s operands) goes, as the
/// items of its phases: a state's gradient is routed (routeStateGrad) to the
/// initial state's sum at a restart, to the start state's at t = 0, and on
/// to step t - 1 into `gradSlots[i]` at slot `next`, with `origin()` saying
/// where the step's state came from at the element written (and `zero`,
/// when given, the zeros to route with); a vector param's is summed; the
/// others go where `perStep(r)` writes them.
SmallVector<Item> backwardItems(StepEmitter &e, const BackwardArgs &args, Operation *ret,
                                BackwardBuffers &buffers, ArrayRef<Value> gradSlots,
                                Value next, std::function<StepOrigin()> origin, Value zero,
                                function_ref<Sink(unsigned)> perStep);

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_COMMON_STEPEMITTER_H
