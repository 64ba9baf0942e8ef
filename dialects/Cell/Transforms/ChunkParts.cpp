//===- ChunkParts.cpp - A cell's chunk form prologue as a cell ------------===//
//
// cell-chunk-part: the prologue of the chunkwise form (LinearRecurrence.h)
// as a cell of its own, so that the pipeline compiles it, derives its
// backward and plans its saves as it does any cell's. cellc._chunkwise runs
// it over the whole sequence before the core.
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

struct ChunkPart : public impl::CellChunkPartBase<ChunkPart> {
  using CellChunkPartBase::CellChunkPartBase;

  void runOnOperation() override {
    if (part != "prologue") {
      getOperation().emitError("cell-chunk-part: unknown part '")
          << part << "'; expected prologue";
      return signalPassFailure();
    }
    for (DefOp def : llvm::to_vector(getOperation().getOps<DefOp>()))
      if (failed(replace(def)))
        return signalPassFailure();
  }

  LogicalResult replace(DefOp def) {
    ChunkwiseSplit split = analyzeChunkwise(def);
    if (!split.qualifies())
      return def.emitError("cell '")
             << def.getSymName()
             << "' has no chunkwise form (cellc --emit=chunkwise says why)";
    Block &body = def.getBody().front();
    unsigned n = def.getStates().size();
    // The states stepped before the core: all but the linear ones and those
    // computed after them.
    llvm::SmallBitVector before(n, true);
    for (const LinearState &s : split.states)
      if (s.reason.empty())
        before.reset(s.index);
    for (unsigned i : split.postStates)
      before.reset(i);
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
    SmallVector<Value> outputs;
    SmallVector<Attribute> outputNames;
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
      outputs.push_back(v);
      outputNames.push_back(b.getStringAttr("v" + std::to_string(ids.lookup(v))));
    }
    if (outputs.empty())
      return def.emitError("the chunk form's prologue of cell '")
             << def.getSymName() << "' gives the core nothing that varies by row";
    YieldOp yield = def.getYield();
    SmallVector<Value> stateYields;
    SmallVector<Attribute> stateNames;
    SmallVector<Type> argTypes;
    SmallVector<Location> argLocs;
    for (Value in : def.getInputs()) {
      argTypes.push_back(in.getType());
      argLocs.push_back(in.getLoc());
    }
    NamedAttrList dims;
    auto stateDims = def->getAttrOfType<DictionaryAttr>("state_dims");
    for (unsigned i : before.set_bits()) {
      Value s = def.getStates()[i];
      argTypes.push_back(s.getType());
      argLocs.push_back(s.getLoc());
      stateYields.push_back(yield.getStates()[i]);
      stateNames.push_back(def.getStateNames()[i]);
      if (stateDims)
        if (Attribute d = stateDims.get(cast<StringAttr>(def.getStateNames()[i])))
          dims.append(cast<StringAttr>(def.getStateNames()[i]), d);
    }

    // The ops that the outputs and the states' next values are computed by,
    // in the step's order.
    llvm::SetVector<Operation *> needed;
    SmallVector<Value> work(outputs.begin(), outputs.end());
    work.append(stateYields.begin(), stateYields.end());
    while (!work.empty()) {
      Operation *op = work.pop_back_val().getDefiningOp();
      if (!op || !needed.insert(op))
        continue;
      work.append(op->getOperands().begin(), op->getOperands().end());
    }

    // A cell has a state: where the prologue has none, one element that
    // stays as it is (the caller runs such a prologue as one step over all
    // T * B rows).
    bool carried = before.none();
    if (carried) {
      auto type = RankedTensorType::get(
          {1}, cast<ShapedType>(outputs.front().getType()).getElementType());
      argTypes.push_back(type);
      argLocs.push_back(def.getLoc());
      // Named apart from the cell's inputs, states and params.
      llvm::StringSet<> taken;
      for (Attribute n : llvm::concat<const Attribute>(def.getInputNames().getValue(),
                                                       def.getStateNames().getValue()))
        taken.insert(cast<StringAttr>(n).getValue());
      def.walk([&](ParamOp p) { taken.insert(p.getName()); });
      std::string name = "unused";
      while (taken.contains(name))
        name += "_";
      stateNames.push_back(b.getStringAttr(name));
    }

    OpBuilder builder(def);
    auto partDef = builder.create<DefOp>(
        def.getLoc(), builder.getStringAttr(def.getSymName() + "_prologue"),
        def.getInputNames(), builder.getArrayAttr(stateNames),
        builder.getArrayAttr(outputNames), def.getSizesAttr());
    for (NamedAttribute attr : def->getDiscardableAttrs())
      partDef->setAttr(attr.getName(), attr.getValue());
    if (stateDims)
      partDef->setAttr("state_dims", dims.getDictionary(def.getContext()));
    Block *block = new Block();
    partDef.getBody().push_back(block);
    IRMapping map;
    SmallVector<Value> args(def.getInputs().begin(), def.getInputs().end());
    for (unsigned i : before.set_bits())
      args.push_back(def.getStates()[i]);
    for (auto [arg, type, loc] : llvm::zip(args, argTypes, argLocs))
      map.map(arg, block->addArgument(type, loc));
    if (carried)
      block->addArgument(argTypes.back(), argLocs.back());
    builder.setInsertionPointToEnd(block);
    for (Operation &op : body.without_terminator())
      if (needed.contains(&op))
        builder.clone(op, map);
    SmallVector<Value> mappedStates, mappedOutputs;
    for (Value v : stateYields)
      mappedStates.push_back(map.lookupOrDefault(v));
    if (carried)
      mappedStates.push_back(block->getArguments().back());
    for (Value v : outputs)
      mappedOutputs.push_back(map.lookup(v));
    builder.create<YieldOp>(yield.getLoc(), mappedStates, mappedOutputs);
    def.erase();
    return success();
  }
};

} // namespace
} // namespace mlir::cell
