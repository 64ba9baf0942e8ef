//===- SplitProjections.cpp - Hoist matvecs on inputs out of the step -----===//

#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CELLSPLITPROJECTIONS
#include "dialects/Cell/Transforms/Passes.h.inc"

namespace {

/// Whether `matvec` can become a projection: a matrix param times an input.
bool isHoistable(DefOp def, MatvecOp matvec) {
  auto arg = dyn_cast<BlockArgument>(matvec.getVector());
  return matvec.getWeight().getDefiningOp<ParamOp>() && arg &&
         arg.getOwner() == &def.getBody().front() &&
         arg.getArgNumber() < def.getInputNames().size();
}

/// The single cell.add that uses `value`, if that is its only use.
AddOp soleAddUser(Value value) {
  if (!value.hasOneUse())
    return nullptr;
  return dyn_cast<AddOp>(*value.getUsers().begin());
}

/// A sum of terms: the root value and the adds inside it.
struct Sum {
  Value root;
  SmallVector<Value> terms;
  SmallVector<AddOp> adds;
};

/// The largest sum of cell.adds that contains `value` as a term, where every
/// add but the root has one use.
Sum collectSum(Value value) {
  Value root = value;
  while (AddOp add = soleAddUser(root))
    root = add.getResult();
  Sum sum;
  sum.root = root;
  // An explicit stack: a sum written by hand may be long.
  SmallVector<Value> stack = {root};
  while (!stack.empty()) {
    Value v = stack.pop_back_val();
    auto add = v.getDefiningOp<AddOp>();
    bool inner = add && (v == root || v.hasOneUse());
    if (!inner) {
      sum.terms.push_back(v);
      continue;
    }
    sum.adds.push_back(add);
    // Reverse order keeps the terms in source order.
    stack.push_back(add.getRhs());
    stack.push_back(add.getLhs());
  }
  return sum;
}

struct SplitProjections
    : public impl::CellSplitProjectionsBase<SplitProjections> {
  void runOnOperation() override {
    for (DefOp def : getOperation().getOps<DefOp>())
      splitDef(def);
  }

  void splitDef(DefOp def) {
    SmallVector<MatvecOp> candidates;
    def.walk([&](MatvecOp matvec) {
      if (isHoistable(def, matvec))
        candidates.push_back(matvec);
    });
    llvm::SmallPtrSet<Operation *, 8> rewritten;
    for (MatvecOp matvec : candidates)
      if (!rewritten.contains(matvec))
        rewriteSum(matvec, rewritten);
  }

  /// Rebuilds the sum that holds `seed` as projections plus the other terms.
  void rewriteSum(MatvecOp seed, llvm::SmallPtrSetImpl<Operation *> &done) {
    DefOp def = seed->getParentOfType<DefOp>();
    Sum sum = collectSum(seed.getResult());
    SmallVector<MatvecOp> matvecs;
    SmallVector<Value> biases, rest;
    for (Value term : sum.terms) {
      auto matvec = term.getDefiningOp<MatvecOp>();
      if (matvec && isHoistable(def, matvec))
        matvecs.push_back(matvec);
      else if (auto param = term.getDefiningOp<ParamOp>())
        biases.push_back(term);
      else
        rest.push_back(term);
    }

    Operation *rootOp = sum.root.getDefiningOp();
    OpBuilder builder(rootOp);
    SmallVector<Value> terms;
    for (auto [i, matvec] : llvm::enumerate(matvecs)) {
      // All biases go to the first projection: one bias-gradient sum each.
      ValueRange own = i == 0 ? ValueRange(biases) : ValueRange();
      terms.push_back(builder.create<ProjectionOp>(
          matvec.getLoc(), matvec.getType(), matvec.getWeight(),
          matvec.getVector(), own));
    }
    llvm::append_range(terms, rest);
    Value result = terms.front();
    for (Value term : llvm::drop_begin(terms))
      result = builder.create<AddOp>(rootOp->getLoc(), result, term);
    sum.root.replaceAllUsesWith(result);

    // The old adds (root first) and matvecs are dead now.
    for (AddOp add : sum.adds)
      add->erase();
    for (MatvecOp matvec : matvecs) {
      done.insert(matvec);
      matvec->erase();
    }
  }
};

} // namespace
} // namespace mlir::cell
