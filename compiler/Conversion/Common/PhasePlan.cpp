//===- PhasePlan.cpp - The phases of a step over a batch tile -------------===//

#include "compiler/Conversion/Common/PhasePlan.h"

#include "compiler/Conversion/Common/KernelABI.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::cell {

int64_t sizeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getDimSize(0);
}

ProductBlocks productBlocks(Operation *product) {
  auto weight = cast<RankedTensorType>(product->getOperand(0).getType());
  ProductBlocks b;
  b.diagonal = weight.getRank() == 3;
  b.blocks = b.diagonal ? weight.getDimSize(0) : 1;
  b.outs = sizeOf(product->getResult(0)) / b.blocks;
  b.ins = sizeOf(product->getOperand(1)) / b.blocks;
  return b;
}

bool PhasePlan::isCrossUnit(Operation *op) {
  return isa<MatvecOp, VecmatOp, SumOp, ExpandOp, ReduceOp>(op);
}

bool PhasePlan::isProduct(Operation *op) { return isa<MatvecOp, VecmatOp>(op); }

Value PhasePlan::wholeOperand(Operation *op) {
  if (auto m = dyn_cast<MatvecOp>(op))
    return m.getVector();
  if (auto m = dyn_cast<VecmatOp>(op))
    return m.getVector();
  if (auto sum = dyn_cast<SumOp>(op))
    return sum.getInput();
  if (auto expand = dyn_cast<ExpandOp>(op))
    return expand.getInput();
  if (auto reduce = dyn_cast<ReduceOp>(op))
    return reduce.getInput();
  return {};
}

PhasePlan::PhasePlan(Block &block, ArrayRef<Value> roots,
                     std::function<bool(Value)> isLeaf,
                     std::function<bool(Value)> isWhole, Options options)
    : block(block), isLeaf(std::move(isLeaf)), isWhole(std::move(isWhole)),
      options(options) {
  // A reduce that keeps the last dim (or any, with reducesAnyDimInPlace),
  // of an operand computed element by element (which a reduce in place
  // evaluates at the elements it sums).
  auto inPlace = [&](ReduceOp reduce) {
    Operation *op = reduce.getInput().getDefiningOp();
    return op && !isCrossUnit(op) && !isView(reduce.getInput()) &&
           !isa<RestoreOp, ConcatOp, ProjectionOp, ParamOp, ConstantOp>(op) &&
           (options.reducesAnyDimInPlace ||
            // A reduce over every dim keeps none (max(s)): not the last.
            (!reduce.getKept().empty() &&
             reduce.getKept().back() == int64_t(reduce.getShape().size()) - 1));
  };
  block.walk([&](Operation *op) {
    if (!isCrossUnit(op))
      return;
    Value vec = wholeOperand(op);
    auto reduce = dyn_cast<ReduceOp>(op);
    if (options.reducesInPlace && reduce && inPlace(reduce))
      return;
    if (!this->isWhole(vec))
      materialized.insert(vec);
  });
  if (options.materializeConcats) {
    // A root or a saved value is written part by part; any other reader
    // reads the concat from its buffer.
    block.walk([&](ConcatOp concat) {
      if (llvm::any_of(concat->getUsers(), [](Operation *user) {
            return !user->hasTrait<OpTrait::IsTerminator>() && !isa<SaveOp>(user);
          }))
        materialized.insert(concat.getResult());
    });
  }
  // Grow the set until no value is computed in two phases.
  while (true) {
    levels.clear();
    numPhases = 0;
    for (Value v : roots)
      numPhases = std::max(numPhases, level(v));
    for (Value v : materialized)
      numPhases = std::max(numPhases, level(v));
    // Walk each phase's items depth first, outermost value first. The
    // first value met by two phases is materialized, which removes its
    // operands from the later walk; then everything is walked again.
    DenseMap<Value, unsigned> firstPhase;
    Value twice;
    auto visitFrom = [&](Value item) {
      unsigned phase = level(item);
      DenseSet<Value> seen;
      SmallVector<Value> stack = {item};
      while (!stack.empty() && !twice) {
        Value v = stack.pop_back_val();
        if (!seen.insert(v).second)
          continue;
        if (v != item && (materialized.contains(v) || this->isLeaf(v) ||
                          (options.expandsInPlace && v.getDefiningOp<ExpandOp>()) ||
                          isCheap(v, kCheapDepth)))
          continue;
        if (!isView(v) && v != item) {
          auto [it, fresh] = firstPhase.try_emplace(v, phase);
          if (!fresh && it->second != phase) {
            twice = v;
            break;
          }
        }
        SmallVector<Value> operands = inlineOperands(v);
        for (Value operand : llvm::reverse(operands))
          stack.push_back(operand);
      }
    };
    SmallVector<Value> items(roots.begin(), roots.end());
    llvm::append_range(items, materialized);
    llvm::stable_sort(items, [&](Value a, Value b) { return level(a) < level(b); });
    for (Value v : items)
      if (!twice)
        visitFrom(v);
    if (!twice)
      break;
    materialized.insert(twice);
  }
}

bool PhasePlan::isCheap(Value v, unsigned depth) {
  Operation *op = v.getDefiningOp();
  if (!options.recomputesCheap || !op || isCrossUnit(op) || isView(v) ||
      isa<ConcatOp, RestoreOp, BroadcastOp, ProjectionOp, ParamOp, ConstantOp>(op))
    return false;
  return llvm::all_of(op->getOperands(), [&](Value u) {
    return isLeaf(u) || u.getDefiningOp<ParamOp>() || u.getDefiningOp<ConstantOp>() ||
           (options.expandsInPlace && u.getDefiningOp<ExpandOp>()) ||
           (depth > 1 && isCheap(u, depth - 1));
  });
}

unsigned PhasePlan::level(Value v) {
  auto it = levels.find(v);
  if (it != levels.end())
    return it->second;
  levels[v] = 1; // Cycles cannot happen in SSA; this guards the recursion.
  // Whether reading an operand of `w` reads it at `w`'s own element (a
  // broadcast reads its one value at every element).
  auto keepsElement = [](Value w) {
    Operation *op = w.getDefiningOp();
    return op && !isView(w) && !isa<ConcatOp, BroadcastOp>(op) && !isCrossUnit(op);
  };
  // A buffered value is read in the phase after the one that writes it, or
  // in the same one where it is read at its own element and that is allowed.
  unsigned phase = 1;
  DenseSet<std::pair<Value, unsigned>> seen;
  SmallVector<std::pair<Value, bool>> stack;
  for (Value operand : inlineOperands(v))
    stack.push_back({operand, keepsElement(v)});
  while (!stack.empty()) {
    auto [u, aligned] = stack.pop_back_val();
    if (!seen.insert({u, unsigned(aligned)}).second)
      continue;
    if (materialized.contains(u)) {
      // A concat is evaluated from its parts in the phase that writes it,
      // which would choose a part within a vector: it is read back from its
      // buffer in the next phase (as with an elementwise op after a reduction,
      // `dx + broadcast(dmean)`, where dx is a concat of gate gradients).
      bool samePhase = aligned && options.readAlignedInPhase && !u.getDefiningOp<ConcatOp>();
      phase = std::max(phase, level(u) + (samePhase ? 0 : 1));
      continue;
    }
    if (isLeaf(u))
      continue;
    bool next = aligned && keepsElement(u);
    for (Value operand : inlineOperands(u))
      stack.push_back({operand, next});
  }
  return levels[v] = phase;
}

unsigned PhasePlan::startPhase(Operation *op) {
  Value vec = wholeOperand(op);
  if (isWhole(vec) || !materialized.contains(vec))
    return 1;
  return level(vec) + 1;
}

SmallVector<Value> PhasePlan::inlineOperands(Value v) {
  Operation *op = v.getDefiningOp();
  if (!op)
    return {};
  if (isCrossUnit(op))
    return {wholeOperand(op)};
  if (auto restore = dyn_cast<RestoreOp>(op))
    return llvm::to_vector(
        restore.getBody().front().getTerminator()->getOperands());
  if (isa<ParamOp, ConstantOp, ProjectionOp>(op))
    return {};
  return llvm::to_vector(op->getOperands());
}

bool PhasePlan::isView(Value v) { return v.getDefiningOp<ChunkOp>() != nullptr; }

void PhasePlan::print(raw_ostream &os, ArrayRef<Value> roots,
                      ArrayRef<std::string> rootNames,
                      function_ref<std::string(Value)> nameOf) {
  // A value: its name, or its op, size and place in the cell's source.
  // Each value written out once, with every name it has.
  SmallVector<Value> written;
  DenseMap<Value, std::string> names;
  for (auto [v, n] : llvm::zip(roots, rootNames)) {
    auto [it, fresh] = names.try_emplace(v, n);
    if (fresh)
      written.push_back(v);
    else
      it->second += ", " + n;
  }
  auto describe = [&](Value v) -> std::string {
    if (!isa<BlockArgument>(v) && names.count(v))
      return names.lookup(v);
    std::string name = nameOf(v);
    if (!name.empty())
      return name;
    std::string text;
    llvm::raw_string_ostream s(text);
    Operation *op = v.getDefiningOp();
    if (auto param = dyn_cast_or_null<ParamOp>(op)) {
      s << param.getName() << " [";
      llvm::interleaveComma(cast<RankedTensorType>(param.getType()).getShape(), s);
      s << "]";
      return text;
    }
    if (op) {
      s << op->getName().stripDialect() << " [" << sizeOf(v) << "]";
      if (auto at = dyn_cast<FileLineColLoc>(op->getLoc()))
        s << " at " << at.getLine() << ":" << at.getColumn();
    } else {
      s << "argument " << cast<BlockArgument>(v).getArgNumber();
    }
    return text;
  };
  SmallVector<Operation *> crossUnit;
  block.walk([&](Operation *op) {
    if (isCrossUnit(op))
      crossUnit.push_back(op);
  });
  os << numPhases << (numPhases == 1 ? " phase" : " phases") << "\n";
  for (unsigned p = 1; p <= numPhases; ++p) {
    os << "  phase " << p << "\n";
    for (Operation *op : crossUnit) {
      if (startPhase(op) != p)
        continue;
      os << "    " << op->getName().stripDialect() << " ";
      if (isProduct(op))
        os << describe(op->getOperand(0)) << " @ ";
      os << describe(wholeOperand(op)) << " -> [" << sizeOf(op->getResult(0)) << "]"
         << (op->getParentOfType<RestoreOp>() ? ", replayed" : "") << "\n";
    }
    for (Value m : materialized)
      if (level(m) == p && !names.count(m))
        os << "    buffer " << describe(m) << "\n";
    for (Value r : written) {
      if (level(r) != p)
        continue;
      os << "    write " << names[r];
      if (isa<BlockArgument>(r))
        os << " = " << describe(r);
      if (materialized.contains(r))
        os << ", also to a buffer";
      os << "\n";
    }
  }
}

SmallVector<Value> forwardRoots(DefOp def) {
  SmallVector<Value> roots;
  YieldOp yield = def.getYield();
  llvm::append_range(roots, yield.getStates());
  llvm::append_range(roots, yield.getOutputs());
  for (SaveOp save : def.getBody().getOps<SaveOp>())
    llvm::append_range(roots, save.getValues());
  return roots;
}

namespace {
/// Whether `v` is an argument of `body` numbered in `[begin, end)`.
bool isArgIn(Value v, Block &body, unsigned begin, unsigned end) {
  auto arg = dyn_cast<BlockArgument>(v);
  return arg && arg.getOwner() == &body && arg.getArgNumber() >= begin &&
         arg.getArgNumber() < end;
}
/// Values read from a buffer rather than computed: the step's arguments,
/// params, constants and hoisted projections.
std::function<bool(Value)> leavesOf(Block &body) {
  return [&body](Value v) {
    if (auto arg = dyn_cast<BlockArgument>(v))
      return arg.getOwner() == &body;
    return isa_and_nonnull<ParamOp, ConstantOp, ProjectionOp>(v.getDefiningOp());
  };
}
} // namespace

PhasePlan planForward(DefOp def, PhasePlan::Options options) {
  Block &body = def.getBody().front();
  unsigned inputs = def.getInputNames().size(), states = def.getStateNames().size();
  return PhasePlan(
      body, forwardRoots(def), leavesOf(body),
      [&body, inputs, states](Value v) {
        return isArgIn(v, body, inputs, inputs + states);
      },
      options);
}

PhasePlan planBackward(DefOp def, func::FuncOp grad, PhasePlan::Options options) {
  // Arguments: inputs, previous states, output gradients, next-state
  // gradients.
  Block &body = grad.getBody().front();
  unsigned inputs = def.getInputNames().size(), states = def.getStateNames().size();
  unsigned outputs = def.getOutputNames().size();
  SmallVector<Value> roots(body.getTerminator()->getOperands());
  return PhasePlan(
      body, roots, leavesOf(body),
      [&body, inputs, states, outputs](Value v) {
        return isArgIn(v, body, inputs, inputs + states) ||
               isArgIn(v, body, inputs + states + outputs, ~0u);
      },
      options);
}

PhasePlan::Options PhasePlan::Options::acrossRows(DefOp def) {
  Options o;
  if (def->getAttrOfType<DictionaryAttr>("state_dims"))
    o.expandsInPlace = o.reducesInPlace = o.reducesAnyDimInPlace = o.recomputesCheap = true;
  return o;
}

void printPhases(ModuleOp module, raw_ostream &os,
                 function_ref<PhasePlan::Options(DefOp)> optionsOf) {
  for (DefOp def : module.getOps<DefOp>()) {
    PhasePlan::Options options = optionsOf(def);
    auto names = [](ArrayAttr a) {
      return llvm::to_vector(llvm::map_range(
          a, [](Attribute n) { return cast<StringAttr>(n).getValue(); }));
    };
    SmallVector<StringRef> inputs = names(def.getInputNames());
    SmallVector<StringRef> states = names(def.getStateNames());
    SmallVector<StringRef> outputs = names(def.getOutputNames());
    // Forward: arguments are the inputs and states, roots the next states,
    // the outputs and the saved values.
    {
      Block &body = def.getBody().front();
      DenseMap<Value, std::string> label;
      for (auto [i, arg] : llvm::enumerate(def.getInputs()))
        label[arg] = ("input " + inputs[i]).str();
      for (auto [i, arg] : llvm::enumerate(def.getStates()))
        label[arg] = ("state " + states[i]).str();
      SmallVector<Value> roots = forwardRoots(def);
      SmallVector<std::string> rootNames;
      YieldOp yield = def.getYield();
      for (StringRef n : states)
        rootNames.push_back(("next " + n).str());
      for (StringRef n : outputs)
        rootNames.push_back(("output " + n).str());
      for (SaveOp save : body.getOps<SaveOp>())
        for (unsigned k = 0; k < save.getValues().size(); ++k)
          rootNames.push_back("saved " + std::to_string(k));
      (void)yield;
      PhasePlan plan = planForward(def, options);
      os << "@" << def.getSymName() << " forward: ";
      plan.print(os, roots, rootNames, [&](Value v) { return label.lookup(v); });
    }
    // Backward: arguments are the inputs, the previous states, the output
    // gradients and the next-state gradients; roots its results.
    auto module = def->getParentOfType<ModuleOp>();
    auto grad = module.lookupSymbol<func::FuncOp>((def.getSymName() + "_grad").str());
    if (!grad)
      continue;
    Block &body = grad.getBody().front();
    DenseMap<Value, std::string> label;
    unsigned a = 0;
    for (StringRef n : inputs)
      label[body.getArgument(a++)] = ("input " + n).str();
    for (StringRef n : states)
      label[body.getArgument(a++)] = ("state " + n).str();
    for (StringRef n : outputs)
      label[body.getArgument(a++)] = ("d output " + n).str();
    for (StringRef n : states)
      label[body.getArgument(a++)] = ("d next " + n).str();
    SmallVector<Value> roots(body.getTerminator()->getOperands());
    SmallVector<std::string> rootNames;
    for (GradResultAttr result : gradResultsOf(grad)) {
      cellc::GradKind kind = result.getKind();
      bool of = kind == cellc::GradKind::State || kind == cellc::GradKind::Input ||
                kind == cellc::GradKind::Param;
      rootNames.push_back((of ? "d " : std::string(cellc::name(kind)) + " ") +
                          result.getName().str());
    }
    PhasePlan plan = planBackward(def, grad, options);
    os << "@" << def.getSymName() << " backward: ";
    plan.print(os, roots, rootNames, [&](Value v) { return label.lookup(v); });
  }
}

} // namespace mlir::cell
