//===- PhasePlan.cpp - The phases of a step over a batch tile -------------===//

#include "compiler/Conversion/Common/PhasePlan.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::cell {

int64_t sizeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getDimSize(0);
}

bool PhasePlan::isCrossUnit(Operation *op) {
  return isa<MatvecOp, VecmatOp>(op);
}

Value PhasePlan::wholeOperand(Operation *op) {
  if (auto m = dyn_cast<MatvecOp>(op))
    return m.getVector();
  if (auto m = dyn_cast<VecmatOp>(op))
    return m.getVector();
  return {};
}

PhasePlan::PhasePlan(Block &block, ArrayRef<Value> roots,
                     std::function<bool(Value)> isLeaf,
                     std::function<bool(Value)> isWhole, Options options)
    : block(block), isLeaf(std::move(isLeaf)), isWhole(std::move(isWhole)) {
  block.walk([&](Operation *op) {
    if (!isCrossUnit(op))
      return;
    Value vec = wholeOperand(op);
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
        if (v != item && (materialized.contains(v) || this->isLeaf(v)))
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

unsigned PhasePlan::level(Value v) {
  auto it = levels.find(v);
  if (it != levels.end())
    return it->second;
  levels[v] = 1; // Cycles cannot happen in SSA; this guards the recursion.
  unsigned deepest = 0;
  DenseSet<Value> seen;
  SmallVector<Value> stack(inlineOperands(v));
  while (!stack.empty()) {
    Value u = stack.pop_back_val();
    if (!seen.insert(u).second)
      continue;
    if (materialized.contains(u)) {
      deepest = std::max(deepest, level(u));
      continue;
    }
    if (isLeaf(u))
      continue;
    for (Value operand : inlineOperands(u))
      stack.push_back(operand);
  }
  return levels[v] = deepest + 1;
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
                      function_ref<std::string(Value)> nameOf) {
  auto describe = [&](Value v) -> std::string {
    std::string name = nameOf(v);
    if (!name.empty())
      return name;
    std::string text;
    llvm::raw_string_ostream s(text);
    if (Operation *op = v.getDefiningOp()) {
      s << op->getName().stripDialect();
      if (auto param = dyn_cast<ParamOp>(op))
        s << " " << param.getName();
    } else {
      s << "arg" << cast<BlockArgument>(v).getArgNumber();
    }
    s << "[" << sizeOf(v) << "]";
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
      os << "    " << op->getName().stripDialect() << " "
         << describe(op->getOperand(0)) << " @ " << describe(wholeOperand(op))
         << " -> [" << sizeOf(op->getResult(0)) << "]"
         << (op->getParentOfType<RestoreOp>() ? " (replay)" : "") << "\n";
    }
    for (Value m : materialized)
      if (level(m) == p)
        os << "    buffer " << describe(m) << "\n";
    for (Value r : roots)
      if (level(r) == p)
        os << "    write " << describe(r) << "\n";
  }
}

} // namespace mlir::cell
