//===- LinearRecurrence.h - Matrix states with a chunkwise form -*- C++ -*-===//
//
// Finds the matrix states of a cell whose update is a gated linear
// recurrence, S' = D(S) + sum of outer(k, v) (or the delta rule's
// (I - b k k^T) D(S) + b k v^T), with D a product of scalar, row and column
// gates from values that do not depend on S, and whose reads are linear in S.
// Such a state has a chunkwise-parallel training form: chunks of steps as
// matrix products, the state passed between chunks only. The analysis splits
// the step into a prologue (what S's gates, keys, values and queries are
// computed from, gate-only states included), the core (S's update and reads)
// and an epilogue (the rest), or says at an op's location why a state does
// not qualify (research/chunkwise-design.md, section 4).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_DIALECTS_CELL_TRANSFORMS_LINEARRECURRENCE_H
#define CELLC_DIALECTS_CELL_TRANSFORMS_LINEARRECURRENCE_H

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <string>

namespace mlir::cell {

/// How a factor multiplied into a state of dims [NH, K, V] varies: along
/// heads at most (scalar), along K (row), along V (column), or along both
/// (not separable: no chunk form).
enum class GateKind { Scalar, Row, Column, Full };

/// One factor of a product over a state's dims: the value it repeats (an
/// expand's input, or the factor itself) and how it varies.
struct LinearFactor {
  Value vector;
  /// The dims of the state that the factor varies along.
  SmallVector<bool> varies;
  GateKind kind = GateKind::Scalar;
};

/// `outer(k, v)` times scalar factors, added to (or subtracted from) a state.
struct LinearSource {
  Value value;
  SmallVector<LinearFactor> keys, values, scales;
  bool negated = false;
};

/// A read `q @ S` (contracting K) or `S q` (contracting V) of the state
/// before or after its update.
struct LinearRead {
  ReduceOp reduce;
  bool contractsK = true;
  bool afterUpdate = true;
  /// The factors along the contracted dim (q), and the others (scales of
  /// the result).
  SmallVector<LinearFactor> queries, scales;
};

struct LinearState {
  unsigned index = 0;
  StringRef name;
  SmallVector<int64_t> dims;
  /// Dim 0 is a head dim; a 2-D state read per head holds one column (V=1).
  bool heads = false;
  bool oneColumn = false;
  SmallVector<LinearFactor> gates;
  SmallVector<LinearSource, 1> sources;
  SmallVector<LinearRead, 1> reads;
  /// The delta rule: the source reads the (gated) state back,
  /// outer(k, beta * (w - k^T D(S))).
  bool delta = false;
  Value deltaKey, deltaTarget;
  SmallVector<LinearFactor> deltaScales;
  /// Empty when the state qualifies; otherwise why not, at `where`.
  std::string reason;
  Operation *where = nullptr;
};

/// Where an op of the step goes in the chunk form: before the core (from
/// values that depend on no linear state), the core's linear values (never
/// materialised) and reads, or after it.
enum class ChunkPhase { Prologue, Linear, Read, Rest };

struct ChunkwiseSplit {
  SmallVector<LinearState, 1> states;
  /// The states computed before the linear ones from values that do not
  /// depend on them (mLSTM's stabiliser m).
  SmallVector<unsigned> gateOnlyStates, postStates;
  unsigned prologueOps = 0, coreOps = 0, epilogueOps = 0;
  DenseMap<Operation *, ChunkPhase> phases;
  /// The ops of the qualifying states' updates and reads.
  SmallPtrSet<Operation *, 32> core;
  /// True when at least one matrix state qualifies.
  bool qualifies() const;
};

/// Analyses a cell after cell-split-projections.
ChunkwiseSplit analyzeChunkwise(DefOp def);

/// Whether something outside the core uses a read's result (an output, a
/// state, the rest of the step): the delta rule's read-back is the core's.
bool readUsedOutsideCore(const LinearRead &read, const ChunkwiseSplit &split);

/// The kernel template a qualifying state's core fits (the runtime's
/// ChunkCore kernels, cellc._chunkcore): Diagonal (scalar or row gates, one
/// outer-product term) or Delta (the delta rule with scalar gates), with
/// every read used outside the core a q @ S after the update. None: the
/// generic core (torch's reverse mode: reads before the update, column
/// gates, several outer products). A call with resets takes the generic
/// core whatever the template (cellc._chunkcore._kept).
enum class ChunkTemplate { None, Diagonal, Delta };
ChunkTemplate chunkTemplateOf(const LinearState &state, const ChunkwiseSplit &split);
const char *chunkTemplateName(ChunkTemplate t);

/// The ids that describeChunkwise gives the values of `def`: the inputs,
/// the states, then each op's results, in order.
DenseMap<Value, int64_t> chunkwiseIds(DefOp def);

/// The cell's step and its split as JSON, for the chunk form's reference
/// driver (cellc._chunkwise): every value an id (the inputs, the states,
/// then each op's results), every op with its operands, attributes and
/// phase, and each linear state's gates, sources and reads by id.
std::string describeChunkwise(DefOp def);

/// Prints the split of every cell in `module` (`cellc --emit=chunkwise`):
/// per matrix state its gates, sources and reads, or the reason it does not
/// qualify at the op's file:line:col.
void printChunkwise(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::cell

#endif // CELLC_DIALECTS_CELL_TRANSFORMS_LINEARRECURRENCE_H
