//===- PhasePlan.h - The phases of a step over a batch tile -----*- C++ -*-===//
//
// A step's ops are per unit of a sample, except the cross-unit ops: a
// product (`cell.matvec`, `cell.vecmat`) reads every unit of its vector, a
// reduction (`cell.sum`) every unit of its input. A
// strategy that computes a step unit by unit over a tile of the batch (the
// CPU's batched kernels, the GPU's batch-tiled and persistent kernels) must
// have such an operand whole in a buffer before the op runs, so the step is
// cut into phases: each phase computes, unit by unit, the values written in
// it, and the cross-unit ops whose operand a phase wrote run at the start of
// the next one (on the GPU after a barrier, on the CPU as a GEMM over the
// tile). This analysis decides which values go through buffers and in which
// phase each is computed; it is the one place that knows what ends a phase.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_COMMON_PHASEPLAN_H
#define CELLC_COMPILER_CONVERSION_COMMON_PHASEPLAN_H

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>

namespace mlir::cell {

/// The size of a 1-D cell value.
int64_t sizeOf(Value v);

/// The blocks of a product (`cell.matvec`, `cell.vecmat`): a block-diagonal
/// `[G, M, N]` weight has G, each giving `outs` outputs from `ins` inputs
/// (M and N, or N and M transposed); a dense weight is one block.
struct ProductBlocks {
  bool diagonal = false;
  int64_t blocks = 1, outs = 0, ins = 0;
};
ProductBlocks productBlocks(Operation *product);

/// Which values of a step are written to buffers, and in which phase each
/// value that is written somewhere is computed.
class PhasePlan {
public:
  struct Options {
    /// Writes every concat that an op reads to a buffer, so that its parts
    /// are never chosen at run time within one vector (strategies whose
    /// lanes run along the units).
    bool materializeConcats = false;
    /// Lets a value read a buffered value at its own element (through
    /// elementwise ops only) in the phase that computes it, from the same
    /// loop, rather than in the next phase. Strategies whose loops over
    /// values of one size visit an element in one place (one thread, or
    /// one CPU loop) allow it; it saves phases where several buffered
    /// values feed each other (GRU's replayed backward: 6 phases to 2).
    bool readAlignedInPhase = false;
    /// Reads an expand in place wherever it is used, from its input's
    /// buffer (which the whole step can read), rather than from a buffer of
    /// its own: an expand read in two phases is not written out.
    bool expandsInPlace = false;
    /// Computes a reduce that keeps the last dim, of an elementwise operand,
    /// by evaluating that operand at each element it sums rather than
    /// writing it out first: `Cᵀ q` runs as one loop of vector multiply-adds
    /// over the matrix. (A reduce over the last dim sums across a vector; it
    /// is faster from a buffer.)
    bool reducesInPlace = false;
    /// With `reducesInPlace`, a reduce over the last dim too: where a lane
    /// holds one element of several rows, no dim is read along a vector.
    bool reducesAnyDimInPlace = false;
    /// Computes an elementwise value of leaves (states, inputs, params,
    /// constants, expands read in place), or of such values up to
    /// `kCheapDepth` ops deep, again in each phase that reads it, rather than
    /// writing it out in one for the others: a multiply of the state by a
    /// gate costs one op where a buffer costs a store and a load of the whole
    /// matrix (gated DeltaNet's decayed state, `alpha * C`).
    bool recomputesCheap = false;

    /// The options of a strategy whose lanes run along the units of a row
    /// (the CPU's batched kernels): every one of the above.
    static Options alongUnits() {
      Options o;
      o.materializeConcats = o.readAlignedInPhase = o.expandsInPlace = true;
      o.reducesInPlace = o.recomputesCheap = true;
      return o;
    }
    /// The options of a strategy whose lanes run across the rows of a tile
    /// (the tiled kernels) for `def`: for a cell with matrix states, the
    /// expands and reduces read in place and cheap values computed again,
    /// so that a head's matrices fit in a CTA's shared memory (the
    /// backward of gated DeltaNet at K = V = 64, and of mLSTM on sm_80);
    /// none for the others.
    static Options acrossRows(DefOp def);
  };

  /// `roots` are the values the step writes out. `isLeaf` says which values
  /// are read from a buffer rather than computed; `isWhole` which of those
  /// are whole in a buffer from the start of the step (the states).
  PhasePlan(Block &block, ArrayRef<Value> roots,
            std::function<bool(Value)> isLeaf,
            std::function<bool(Value)> isWhole, Options options);
  PhasePlan(Block &block, ArrayRef<Value> roots,
            std::function<bool(Value)> isLeaf,
            std::function<bool(Value)> isWhole)
      : PhasePlan(block, roots, std::move(isLeaf), std::move(isWhole),
                  Options()) {}

  /// Whether `op` reads an operand across the units of a sample, which must
  /// then be whole in a buffer: it ends a phase. These are the products, the
  /// reductions (`cell.sum`, `cell.reduce`) and `cell.expand`.
  static bool isCrossUnit(Operation *op);
  /// Whether the cross-unit op `op` is a product with a weight.
  static bool isProduct(Operation *op);
  /// The operand that a cross-unit op reads whole.
  static Value wholeOperand(Operation *op);

  /// The phase (from 1) in which `v` is computed when it is written out.
  unsigned level(Value v);
  /// The phase at whose start the cross-unit op `op` runs: the first one
  /// that begins with its operand whole.
  unsigned startPhase(Operation *op);

  /// The values `v` is computed from, element by element.
  static SmallVector<Value> inlineOperands(Value v);
  /// Whether `v` is a view of another value (a chunk), never computed.
  static bool isView(Value v);

  /// Prints the phases: what runs at the start of each, and what each
  /// writes, for the lit tests and `cellc --emit=phases`.
  /// `rootNames` names the roots; `nameOf` other values, or "" for none.
  void print(raw_ostream &os, ArrayRef<Value> roots,
             ArrayRef<std::string> rootNames,
             function_ref<std::string(Value)> nameOf);

  Block &block;
  SetVector<Value> materialized;
  unsigned numPhases = 0;

private:
  /// Whether `v` is computed again where read (Options::recomputesCheap):
  /// an elementwise op of leaves, or of such values `depth - 1` deep.
  bool isCheap(Value v, unsigned depth);
  static constexpr unsigned kCheapDepth = 2;

  std::function<bool(Value)> isLeaf, isWhole;
  Options options;
  DenseMap<Value, unsigned> levels;
};

/// What the forward step of `def` writes out: its next states, its outputs
/// and the values it saves.
SmallVector<Value> forwardRoots(DefOp def);

/// The phases of the forward step of `def`, whose states are whole in
/// buffers from the start of a step.
PhasePlan planForward(DefOp def, PhasePlan::Options options);
/// The phases of the backward step `grad` of `def`, which writes its results
/// and whose previous states and next-state gradients are whole in buffers.
PhasePlan planBackward(DefOp def, func::FuncOp grad, PhasePlan::Options options);

/// Prints the phases of both steps of every cell in `module` (after
/// cell-plan-saves), as `cellc --emit=phases` shows them.
void printPhases(ModuleOp module, raw_ostream &os,
                 function_ref<PhasePlan::Options(DefOp)> options);

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_COMMON_PHASEPLAN_H
