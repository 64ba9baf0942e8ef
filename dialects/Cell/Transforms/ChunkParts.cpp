//===- ChunkParts.cpp - A cell's chunk form prologue, epilogue as cells ---===//
//
// cell-chunk-part: the prologue or the epilogue of the chunkwise form
// (LinearRecurrence.h) as a cell of its own, so that the pipeline compiles
// it, derives its backward and plans its saves as it does any cell's.
// cellc._chunkwise runs them over the whole sequence before and after the
// core.
//
//===----------------------------------------------------------------------===//

#include "dialects/Cell/Transforms/LinearRecurrence.h"
#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CELLCHUNKPART
#include "dialects/Cell/Transforms/Passes.h.inc"

namespace {

/// The value a gate's log is read from: an exp's operand, or the gate.
Value logOf(Value gate) {
  if (auto e = gate.getDefiningOp<ExpOp>())
    return e.getOperand();
  return gate;
}

/// The values the core and the rest of the step read from the prologue.
llvm::SetVector<Value> wantedOf(DefOp def, const ChunkwiseSplit &split) {
  llvm::SetVector<Value> wanted;
  auto factors = [&](ArrayRef<LinearFactor> list) {
    for (const LinearFactor &f : list)
      wanted.insert(f.vector);
  };
  for (const LinearState &s : split.states) {
    if (!s.reason.empty())
      continue;
    for (const LinearFactor &g : s.gates)
      wanted.insert(logOf(g.vector));
    for (const LinearSource &src : s.sources) {
      factors(src.keys);
      factors(src.values);
      factors(src.scales);
    }
    for (const LinearRead &r : s.reads) {
      factors(r.queries);
      factors(r.scales);
    }
    if (s.delta) {
      wanted.insert(s.deltaKey);
      wanted.insert(s.deltaTarget);
      factors(s.deltaScales);
    }
  }
  for (Operation &op : def.getBody().front().without_terminator()) {
    auto phase = split.phases.find(&op);
    if (phase != split.phases.end() && phase->second == ChunkPhase::Rest)
      for (Value v : op.getOperands())
        wanted.insert(v);
  }
  YieldOp yield = def.getYield();
  for (Value v : yield.getOutputs())
    wanted.insert(v);
  for (unsigned i : split.postStates)
    wanted.insert(yield.getStates()[i]);
  return wanted;
}

/// What a part of the step reads and gives: its inputs (values of the
/// step, named), its states (indices into the step's), its outputs (values
/// of the step, named) and the ops of the step it runs.
struct PartSignature {
  SmallVector<Value> inputs;
  SmallVector<Attribute> inputNames;
  SmallVector<unsigned> states;
  SmallVector<Value> outputs;
  SmallVector<Attribute> outputNames;
  llvm::SetVector<Operation *> ops;
};

/// The ops that `values` are computed by, in the step's order, from the
/// values of `stop` and the block's arguments.
llvm::SetVector<Operation *> sliceOf(ArrayRef<Value> values, const DenseSet<Value> &stop) {
  llvm::SetVector<Operation *> needed;
  SmallVector<Value> work(values.begin(), values.end());
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *op = v.getDefiningOp();
    if (!op || stop.contains(v) || !needed.insert(op))
      continue;
    work.append(op->getOperands().begin(), op->getOperands().end());
  }
  return needed;
}

/// Builds `def`'s part `<name>_<suffix>` beside it from `sig`: the ops of
/// `sig.ops`, cloned in the step's order, on the part's inputs and states.
/// A cell has a state: where the part has none, one element that stays as
/// it is, named apart from the cell's names.
DefOp buildPart(DefOp def, StringRef suffix, const PartSignature &sig) {
  MLIRContext *ctx = def.getContext();
  Block &body = def.getBody().front();
  YieldOp yield = def.getYield();
  OpBuilder builder(def);
  SmallVector<Attribute> stateNames;
  NamedAttrList dims;
  auto stateDims = def->getAttrOfType<DictionaryAttr>("state_dims");
  for (unsigned i : sig.states) {
    auto name = cast<StringAttr>(def.getStateNames()[i]);
    stateNames.push_back(name);
    if (stateDims)
      if (Attribute d = stateDims.get(name))
        dims.append(name, d);
  }
  bool carried = sig.states.empty();
  if (carried) {
    llvm::StringSet<> taken;
    for (Attribute n : llvm::concat<const Attribute>(def.getInputNames().getValue(),
                                                     def.getStateNames().getValue()))
      taken.insert(cast<StringAttr>(n).getValue());
    def.walk([&](ParamOp p) { taken.insert(p.getName()); });
    std::string name = "unused";
    while (taken.contains(name))
      name += "_";
    stateNames.push_back(builder.getStringAttr(name));
  }
  auto part = builder.create<DefOp>(
      def.getLoc(), builder.getStringAttr(def.getSymName() + "_" + suffix),
      builder.getArrayAttr(sig.inputNames), builder.getArrayAttr(stateNames),
      builder.getArrayAttr(sig.outputNames), def.getSizesAttr());
  for (NamedAttribute attr : def->getDiscardableAttrs())
    part->setAttr(attr.getName(), attr.getValue());
  if (stateDims)
    part->setAttr("state_dims", dims.getDictionary(ctx));
  Block *block = new Block();
  part.getBody().push_back(block);
  IRMapping map;
  for (Value in : sig.inputs)
    map.map(in, block->addArgument(in.getType(), in.getLoc()));
  for (unsigned i : sig.states) {
    Value s = def.getStates()[i];
    map.map(s, block->addArgument(s.getType(), s.getLoc()));
  }
  if (carried) {
    Type element = cast<ShapedType>(sig.outputs.front().getType()).getElementType();
    block->addArgument(RankedTensorType::get({1}, element), def.getLoc());
  }
  builder.setInsertionPointToEnd(block);
  for (Operation &op : body.without_terminator())
    if (sig.ops.contains(&op))
      builder.clone(op, map);
  SmallVector<Value> states, outputs;
  for (unsigned i : sig.states)
    states.push_back(map.lookupOrDefault(yield.getStates()[i]));
  if (carried)
    states.push_back(block->getArguments().back());
  for (Value v : sig.outputs)
    outputs.push_back(map.lookup(v));
  builder.create<YieldOp>(yield.getLoc(), states, outputs);
  return part;
}

struct ChunkPart : public impl::CellChunkPartBase<ChunkPart> {
  using CellChunkPartBase::CellChunkPartBase;

  void runOnOperation() override {
    if (part != "prologue" && part != "epilogue") {
      getOperation().emitError("cell-chunk-part: unknown part '")
          << part << "'; expected prologue or epilogue";
      return signalPassFailure();
    }
    for (DefOp def : llvm::to_vector(getOperation().getOps<DefOp>())) {
      ChunkwiseSplit split = analyzeChunkwise(def);
      if (!split.qualifies()) {
        def.emitError("cell '") << def.getSymName()
                                << "' has no chunkwise form (cellc --emit=chunkwise says why)";
        return signalPassFailure();
      }
      PartSignature sig;
      if (failed(part == "prologue" ? prologue(def, split, sig) : epilogue(def, split, sig)))
        return signalPassFailure();
      buildPart(def, part, sig);
      def.erase();
    }
  }

  /// The states stepped before the core: all but the linear ones and those
  /// computed after them.
  static llvm::SmallBitVector statesBefore(DefOp def, const ChunkwiseSplit &split) {
    llvm::SmallBitVector before(def.getStates().size(), true);
    for (const LinearState &s : split.states)
      if (s.reason.empty())
        before.reset(s.index);
    for (unsigned i : split.postStates)
      before.reset(i);
    return before;
  }

  static ChunkPhase phaseOf(const ChunkwiseSplit &split, Operation *op) {
    auto phase = split.phases.find(op);
    return phase == split.phases.end() ? ChunkPhase::Prologue : phase->second;
  }

  LogicalResult prologue(DefOp def, const ChunkwiseSplit &split, PartSignature &sig) {
    Block &body = def.getBody().front();
    llvm::SmallBitVector before = statesBefore(def, split);
    // What varies by row: the inputs, those states, and what is computed
    // from them.
    DenseSet<Value> rowful(def.getInputs().begin(), def.getInputs().end());
    for (unsigned i : before.set_bits())
      rowful.insert(def.getStates()[i]);
    auto inPrologue = [&](Operation *op) {
      auto phase = split.phases.find(op);
      return phase != split.phases.end() && phase->second == ChunkPhase::Prologue;
    };
    for (Operation &op : body.without_terminator())
      if (inPrologue(&op) && llvm::any_of(op.getOperands(),
                                          [&](Value v) { return rowful.contains(v); }))
        rowful.insert(op.getResults().begin(), op.getResults().end());

    DenseMap<Value, int64_t> ids = chunkwiseIds(def);
    Builder b(def.getContext());
    llvm::SetVector<Value> wanted;
    for (Value v : wantedOf(def, split)) {
      // An expand repeats its input: the caller repeats it (a view), not the
      // prologue's output ([NH, K, V] a row where [NH, K] would do).
      while (auto e = v.getDefiningOp<ExpandOp>())
        v = e.getOperand();
      wanted.insert(v);
    }
    for (Value v : wanted) {
      Operation *op = v.getDefiningOp();
      if (!rowful.contains(v))
        continue;
      if (!op) {
        // A state's value before the step: the chunk form has no history of
        // it to give the rest of the step.
        if (!llvm::is_contained(def.getInputs(), v))
          return def.emitError("the chunk form does not yet give the ops after the core "
                               "a state's value before the step");
        continue;
      }
      if (!inPrologue(op))
        continue;
      sig.outputs.push_back(v);
      sig.outputNames.push_back(b.getStringAttr("v" + std::to_string(ids.lookup(v))));
    }
    if (sig.outputs.empty())
      return def.emitError("the chunk form's prologue of cell '")
             << def.getSymName() << "' gives the core nothing that varies by row";
    sig.inputs.assign(def.getInputs().begin(), def.getInputs().end());
    sig.inputNames.assign(def.getInputNames().begin(), def.getInputNames().end());
    for (unsigned i : before.set_bits())
      sig.states.push_back(i);
    SmallVector<Value> computed(sig.outputs.begin(), sig.outputs.end());
    for (unsigned i : sig.states)
      computed.push_back(def.getYield().getStates()[i]);
    sig.ops = sliceOf(computed, {});
    return success();
  }

  /// The rest of the step after the core, as a cell: its inputs are the
  /// reads and the values of the step before the core that vary by row
  /// (named v<id>), its states those computed after the core, its outputs
  /// the cell's. Values of params and constants alone it computes itself.
  LogicalResult epilogue(DefOp def, const ChunkwiseSplit &split, PartSignature &sig) {
    Block &body = def.getBody().front();
    YieldOp yield = def.getYield();
    DenseSet<Value> post;
    for (unsigned i : split.postStates)
      post.insert(def.getStates()[i]);
    // What varies by row: the block's arguments and what is computed from
    // them.
    DenseSet<Value> rowful(body.getArguments().begin(), body.getArguments().end());
    for (Operation &op : body.without_terminator())
      if (llvm::any_of(op.getOperands(), [&](Value v) { return rowful.contains(v); }))
        rowful.insert(op.getResults().begin(), op.getResults().end());
    // The rest's inputs: what it reads that is neither its own (an op after
    // the core, or of params and constants alone) nor its states.
    SmallVector<Value> computed(yield.getOutputs().begin(), yield.getOutputs().end());
    for (unsigned i : split.postStates)
      computed.push_back(yield.getStates()[i]);
    auto own = [&](Value v) {
      Operation *op = v.getDefiningOp();
      return op && (phaseOf(split, op) == ChunkPhase::Rest || !rowful.contains(v));
    };
    llvm::SetVector<Value> reads;
    SmallVector<Value> work(computed);
    DenseSet<Value> seen;
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (!seen.insert(v).second || post.contains(v))
        continue;
      if (!own(v)) {
        reads.insert(v);
        continue;
      }
      Operation *op = v.getDefiningOp();
      work.append(op->getOperands().begin(), op->getOperands().end());
    }
    bool anyRest = llvm::any_of(body.without_terminator(), [&](Operation &op) {
      return phaseOf(split, &op) == ChunkPhase::Rest;
    });
    if (!anyRest)
      return def.emitError("cell '") << def.getSymName()
                                     << "' computes nothing after its chunk form's core";
    DenseMap<Value, int64_t> ids = chunkwiseIds(def);
    Builder b(def.getContext());
    DenseSet<Value> stop;
    // In the order of the step, for a stable interface.
    SmallVector<Value> ordered(reads.begin(), reads.end());
    llvm::sort(ordered, [&](Value x, Value y) { return ids.lookup(x) < ids.lookup(y); });
    for (Value v : ordered) {
      if (auto arg = dyn_cast<BlockArgument>(v);
          arg && !llvm::is_contained(def.getInputs(), v))
        return def.emitError("the chunk form does not yet give the ops after the core "
                             "a state's value before the step");
      if (llvm::is_contained(yield.getOutputs(), v))
        return def.emitError("the chunk form's epilogue of cell '")
               << def.getSymName() << "' would give an output as it reads it";
      sig.inputs.push_back(v);
      sig.inputNames.push_back(b.getStringAttr("v" + std::to_string(ids.lookup(v))));
      stop.insert(v);
    }
    sig.states.assign(split.postStates.begin(), split.postStates.end());
    for (auto [v, name] : llvm::zip(yield.getOutputs(), def.getOutputNames())) {
      sig.outputs.push_back(v);
      sig.outputNames.push_back(name);
    }
    sig.ops = sliceOf(computed, stop);
    return success();
  }
};

} // namespace
} // namespace mlir::cell
