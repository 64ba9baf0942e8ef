//===- PlanSaves.cpp - Choose the forward values backward reads -----------===//

#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CELLPLANSAVES
#include "dialects/Cell/Transforms/Passes.h.inc"

namespace {

/// Ops that are cheaper to recompute from their operands than to store. A
/// broadcast stores one value per unit where its operand is one per sample;
/// an expand, a head's matrix where its operand is a vector per head.
bool isCheap(Operation *op) {
  return isa<AddOp, SubOp, MulOp, NegOp, BroadcastOp, ExpandOp>(op);
}

/// Forward ops that the backward replays inside its cell.restore.
bool isReplayed(Operation &op) {
  return !isa<ParamOp, ConstantOp, SaveOp, YieldOp>(op);
}

struct PlanSaves : public impl::CellPlanSavesBase<PlanSaves> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (DefOp def : module.getOps<DefOp>()) {
      auto grad = module.lookupSymbol<func::FuncOp>(
          (def.getSymName() + "_grad").str());
      if (!grad) {
        def.emitOpError("has no backward step; run cell-autodiff first");
        return signalPassFailure();
      }
      if (failed(plan(def, grad)))
        return signalPassFailure();
    }
  }

  LogicalResult plan(DefOp def, func::FuncOp grad);
  RestoreOp yieldWhatExpandsRead(RestoreOp restore);
  RestoreOp dropRecomputable(RestoreOp restore);
};

/// Makes the restore also yield the operand of each yielded expand or
/// broadcast that the replay computes, so that dropRecomputable keeps that
/// operand (a vector per head, or one value per sample) and expands it
/// again, rather than keeping the expanded value (a matrix per head, or a
/// value per unit). Returns the restore that yields them.
RestoreOp PlanSaves::yieldWhatExpandsRead(RestoreOp restore) {
  auto yield = cast<RestoreYieldOp>(restore.getBody().front().getTerminator());
  SmallVector<Value> values(yield.getValues());
  size_t count = values.size();
  for (size_t i = 0; i < count; ++i) {
    Operation *op = values[i].getDefiningOp();
    if (!op || !isa<ExpandOp, BroadcastOp>(op))
      continue;
    Value operand = op->getOperand(0);
    Operation *producer = operand.getDefiningOp();
    if (producer && restore->isAncestor(producer) && !llvm::is_contained(values, operand))
      values.push_back(operand);
  }
  if (values.size() == count)
    return restore;
  OpBuilder builder(restore);
  auto larger = builder.create<RestoreOp>(restore.getLoc(), ValueRange(values).getTypes());
  larger.getBody().takeBody(restore.getBody());
  yield->setOperands(values);
  for (size_t i = 0; i < count; ++i)
    restore.getResult(i).replaceAllUsesWith(larger.getResult(i));
  restore->erase();
  return larger;
}

/// Moves out of the restore each yielded value that one cheap op computes
/// from values the backward has anyway: arguments, params, constants, other
/// yielded values, or values recomputed so. Returns the restore that yields
/// the rest.
RestoreOp PlanSaves::dropRecomputable(RestoreOp restore) {
  auto yield = cast<RestoreYieldOp>(restore.getBody().front().getTerminator());
  SmallVector<Value> values(yield.getValues());
  SmallVector<bool> kept(values.size(), true);
  // What the backward reads for each value: the restore's result, or the
  // value's recomputation.
  SmallVector<Value> read(restore.getResults());
  OpBuilder builder(restore->getContext());

  // Later values first: they are the ones computed from earlier ones (but
  // for the operands of expands that yieldWhatExpandsRead added last).
  for (int i = values.size() - 1; i >= 0; --i) {
    Operation *op = values[i].getDefiningOp();
    if (!op || !isCheap(op))
      continue;
    IRMapping map;
    bool available = true;
    // Right after the restore (values cloned later are mostly read by
    // earlier ones), or after the recomputations it reads.
    Operation *after = restore;
    for (Value operand : op->getOperands()) {
      Operation *producer = operand.getDefiningOp();
      if (!producer || !restore->isAncestor(producer))
        continue;
      auto it = llvm::find(values, operand);
      size_t j = it - values.begin();
      if (it == values.end() || j == static_cast<size_t>(i)) {
        available = false;
        break;
      }
      map.map(operand, read[j]);
      if (!kept[j] && after->isBeforeInBlock(read[j].getDefiningOp()))
        after = read[j].getDefiningOp();
    }
    if (!available)
      continue;
    builder.setInsertionPointAfter(after);
    Operation *clone = builder.clone(*op, map);
    restore.getResult(i).replaceAllUsesWith(clone->getResult(0));
    read[i] = clone->getResult(0);
    kept[i] = false;
  }

  // Rebuild the restore with the values that stay.
  SmallVector<Value> saved;
  for (auto [value, keep] : llvm::zip(values, kept))
    if (keep)
      saved.push_back(value);
  builder.setInsertionPoint(restore);
  auto smaller = builder.create<RestoreOp>(restore.getLoc(),
                                           ValueRange(saved).getTypes());
  smaller.getBody().takeBody(restore.getBody());
  yield->setOperands(saved);
  unsigned next = 0;
  for (auto [i, keep] : llvm::enumerate(kept))
    if (keep)
      restore.getResult(i).replaceAllUsesWith(smaller.getResult(next++));
  restore->erase();
  return smaller;
}

LogicalResult PlanSaves::plan(DefOp def, func::FuncOp grad) {
  SmallVector<RestoreOp> restores =
      llvm::to_vector(grad.getBody().getOps<RestoreOp>());
  if (restores.size() != 1)
    return grad.emitOpError("expects one cell.restore, found ")
           << restores.size();
  if (!def.getBody().getOps<SaveOp>().empty())
    return def.emitOpError("already has a cell.save; the plan is made once");
  RestoreOp restore = restores.front();

  // The replay is the forward step, op for op: map its values back.
  SmallVector<Operation *> forward, replayed;
  for (Operation &op : def.getBody().front())
    if (isReplayed(op))
      forward.push_back(&op);
  for (Operation &op : restore.getBody().front().without_terminator())
    replayed.push_back(&op);
  if (forward.size() != replayed.size())
    return grad.emitOpError("replays ")
           << replayed.size() << " ops but @" << def.getSymName() << " has "
           << forward.size();
  DenseMap<Value, Value> toForward;
  for (auto [fwd, rep] : llvm::zip(forward, replayed)) {
    if (fwd->getName() != rep->getName())
      return rep->emitOpError("does not match the forward op ")
             << fwd->getName() << " it replays";
    for (auto [f, r] : llvm::zip(fwd->getResults(), rep->getResults()))
      toForward[r] = f;
  }

  restore = dropRecomputable(yieldWhatExpandsRead(restore));

  // The forward step saves what the restore still yields.
  auto yield = cast<RestoreYieldOp>(restore.getBody().front().getTerminator());
  SmallVector<Value> saved;
  for (Value value : yield.getValues())
    saved.push_back(toForward.lookup(value));
  OpBuilder builder(def.getYield());
  builder.create<SaveOp>(def.getLoc(), saved);

  // The replay keeps only what produces the saved values.
  Block &body = restore.getBody().front();
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
    if (op.use_empty() && isMemoryEffectFree(&op) &&
        !op.hasTrait<OpTrait::IsTerminator>())
      op.erase();
  return success();
}

} // namespace
} // namespace mlir::cell

namespace mlir::cell {

std::string describeLoc(Location loc) {
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return (llvm::sys::path::filename(file.getFilename().getValue()) + ":" +
            llvm::Twine(file.getLine()) + ":" + llvm::Twine(file.getColumn()))
        .str();
  return "?";
}

void printSavePlan(ModuleOp module, llvm::raw_ostream &os) {
  for (DefOp def : module.getOps<DefOp>()) {
    auto saves = llvm::to_vector(def.getBody().getOps<SaveOp>());
    Type element =
        cast<RankedTensorType>(def.getStates()[0].getType()).getElementType();
    int64_t bytes = element.getIntOrFloatBitWidth() / 8;
    os << "cell @" << def.getSymName()
       << ": what one sample keeps per step between forward and backward ("
       << element << ", " << bytes << " bytes)\n";
    int64_t stateElems = 0;
    os << "  states, always kept:\n";
    for (auto [name, arg] : llvm::zip(
             def.getStateNames().getAsValueRange<StringAttr>(), def.getStates())) {
      int64_t size = cast<RankedTensorType>(arg.getType()).getDimSize(0);
      stateElems += size;
      os << llvm::formatv("    {0,-12} {1,6}  {2}\n", name, size,
                          describeLoc(arg.getLoc()));
    }
    int64_t savedElems = 0;
    os << "  saved with SAVE_GATES=1:\n";
    if (saves.empty() || saves.front().getValues().empty())
      os << "    nothing\n";
    for (SaveOp save : saves) {
      for (auto [slot, value] : llvm::enumerate(save.getValues())) {
        int64_t size = cast<RankedTensorType>(value.getType()).getDimSize(0);
        Operation *producer = value.getDefiningOp();
        os << llvm::formatv("    slot {0,-7} {1,6}  {2,-14} {3}\n", slot, size,
                            producer ? producer->getName().getStringRef()
                                     : StringRef("argument"),
                            describeLoc(value.getLoc()));
        savedElems += size;
      }
    }
    int64_t none = (stateElems + savedElems) * bytes;
    int64_t full = stateElems * bytes;
    auto percent = [&](double part) {
      return none ? llvm::formatv("{0:F1}% of none", 100.0 * part / none).str()
                  : std::string();
    };
    os << "  bytes per step and sample:\n";
    os << llvm::formatv("    none      {0,8}  states and saved values\n", none);
    os << llvm::formatv("    full      {0,8}  states only ({1}); backward "
                        "replays every step\n",
                        full, percent(full));
    for (int k : {8, 32})
      os << llvm::formatv(
          "    chunk:{0,-3} {1,8}  states every {0} steps ({2}); backward "
          "replays {0} steps at a time and holds {3} bytes of saved values for "
          "them\n",
          k, llvm::formatv("{0:F1}", double(full) / k).str(),
          percent(double(full) / k), k * savedElems * bytes);
  }
}

} // namespace mlir::cell
