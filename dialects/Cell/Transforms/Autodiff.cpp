//===- Autodiff.cpp - Derive the backward step of each cell ---------------===//

#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CELLAUTODIFF
#include "dialects/Cell/Transforms/Passes.h.inc"

namespace {

/// The name of the forward argument that `value`, an argument of the backward
/// step, stands for; "" for any other value.
StringRef argName(DefOp def, Value value) {
  auto arg = dyn_cast<BlockArgument>(value);
  if (!arg || !isa<func::FuncOp>(arg.getOwner()->getParentOp()))
    return "";
  size_t i = arg.getArgNumber(), numInputs = def.getInputNames().size();
  size_t numStates = def.getStateNames().size();
  if (i < numInputs)
    return cast<StringAttr>(def.getInputNames()[i]).getValue();
  if (i < numInputs + numStates)
    return cast<StringAttr>(def.getStateNames()[i - numInputs]).getValue();
  return "";
}

/// Builds the backward step of one cell.
class GradBuilder {
public:
  GradBuilder(DefOp def) : def(def), builder(def.getContext()) {}

  func::FuncOp build();

private:
  Value zeros(Type type) {
    return builder.create<ConstantOp>(def.getLoc(), type,
                                      builder.getF64FloatAttr(0.0));
  }
  void accumulate(Value value, Value grad) {
    if (!grad)
      return;
    Value &slot = grads[value];
    slot = slot ? builder.create<AddOp>(grad.getLoc(), slot, grad).getResult()
                : grad;
  }
  Value gradOrZeros(Value value) {
    Value g = grads.lookup(value);
    return g ? g : zeros(value.getType());
  }
  /// What a result of the backward step is.
  GradResultAttr describe(cellc::GradKind kind, StringRef name,
                          StringRef input = "", ArrayRef<StringAttr> biases = {}) {
    return GradResultAttr::get(builder.getContext(), kind, name, input, biases);
  }

  DefOp def;
  OpBuilder builder;
  DenseMap<Value, Value> grads;
};

func::FuncOp GradBuilder::build() {
  Block &body = def.getBody().front();
  YieldOp yield = def.getYield();
  auto inputTypes = ValueRange(def.getInputs()).getTypes();
  auto stateTypes = ValueRange(def.getStates()).getTypes();
  auto outputTypes = yield.getOutputs().getTypes();

  SmallVector<Type> argTypes(inputTypes);
  llvm::append_range(argTypes, stateTypes);
  llvm::append_range(argTypes, outputTypes);
  llvm::append_range(argTypes, stateTypes);

  builder.setInsertionPointAfter(def);
  auto func = builder.create<func::FuncOp>(
      def.getLoc(), (def.getSymName() + "_grad").str(),
      builder.getFunctionType(argTypes, {}));
  Block *entry = func.addEntryBlock();
  builder.setInsertionPointToStart(entry);

  // Params and constants are free in the backward step: clone them first.
  // Every other forward op is replayed inside a cell.restore, whose results
  // are the forward values the backward reads (cell-plan-saves later decides
  // which of them the forward saves).
  IRMapping map;
  unsigned numFwdArgs = body.getNumArguments();
  for (unsigned i = 0; i < numFwdArgs; ++i)
    map.map(body.getArgument(i), entry->getArgument(i));
  SmallVector<ParamOp> params;
  for (Operation &op : body.without_terminator()) {
    if (!isa<ParamOp, ConstantOp>(op))
      continue;
    Operation *clone = builder.clone(op, map);
    if (auto param = dyn_cast<ParamOp>(clone))
      params.push_back(param);
  }
  auto placeholder = builder.create<RestoreOp>(def.getLoc(), TypeRange());
  Block *replayBlock = builder.createBlock(&placeholder.getBody());
  SmallVector<Operation *> replay;
  for (Operation &op : body.without_terminator()) {
    if (isa<SaveOp, ParamOp, ConstantOp>(op))
      continue;
    replay.push_back(builder.clone(op, map));
  }
  builder.setInsertionPointAfter(placeholder);

  // Seed with the gradients of the outputs and of the next states.
  unsigned numOutputs = yield.getOutputs().size();
  for (auto [i, out] : llvm::enumerate(yield.getOutputs()))
    accumulate(map.lookupOrDefault(out), entry->getArgument(numFwdArgs + i));
  for (auto [i, next] : llvm::enumerate(yield.getStates()))
    accumulate(map.lookupOrDefault(next),
               entry->getArgument(numFwdArgs + numOutputs + i));

  // Walk the replay backwards. Projections and matvecs on params hand their
  // result gradients to the GEMMs, in forward order.
  SmallVector<Value> projectionGrads;
  SmallVector<std::pair<Value, Value>> rowGrads;
  SmallVector<Attribute> projectionInfo, rowInfo;
  for (Operation *op : llvm::reverse(replay)) {
    SmallVector<Value> resultGrads;
    for (Value result : op->getResults())
      resultGrads.push_back(grads.lookup(result));

    if (auto projection = dyn_cast<ProjectionOp>(op)) {
      SmallVector<StringAttr> biases;
      for (Value bias : projection.getBiases())
        biases.push_back(bias.getDefiningOp<ParamOp>().getNameAttr());
      projectionGrads.push_back(gradOrZeros(projection.getResult()));
      projectionInfo.push_back(describe(
          cellc::GradKind::Projection,
          projection.getWeight().getDefiningOp<ParamOp>().getName(),
          argName(def, projection.getVector()), biases));
    }
    if (auto matvec = dyn_cast<MatvecOp>(op)) {
      if (auto param = matvec.getWeight().getDefiningOp<ParamOp>()) {
        rowGrads.emplace_back(gradOrZeros(matvec.getResult()), matvec.getVector());
        rowInfo.push_back(describe(cellc::GradKind::WeightRows, param.getName()));
      }
    }
    // v @ W = W^T v: dW = v g^T, so the vector is the rows and the result's
    // gradient the vectors.
    if (auto vecmat = dyn_cast<VecmatOp>(op)) {
      if (auto param = vecmat.getWeight().getDefiningOp<ParamOp>()) {
        rowGrads.emplace_back(vecmat.getVector(), gradOrZeros(vecmat.getResult()));
        rowInfo.push_back(describe(cellc::GradKind::WeightRows, param.getName()));
      }
    }

    auto differentiable = dyn_cast<DifferentiableOpInterface>(op);
    if (!differentiable || llvm::all_of(resultGrads, [](Value g) { return !g; }))
      continue;
    SmallVector<Value> operandGrads =
        differentiable.buildGradients(builder, resultGrads);
    for (auto [operand, grad] : llvm::zip(op->getOperands(), operandGrads))
      accumulate(operand, grad);
  }
  std::reverse(projectionGrads.begin(), projectionGrads.end());
  std::reverse(projectionInfo.begin(), projectionInfo.end());
  std::reverse(rowGrads.begin(), rowGrads.end());
  std::reverse(rowInfo.begin(), rowInfo.end());

  // Results, each described for the kernels and the runtime.
  SmallVector<Value> results;
  SmallVector<Attribute> info;
  unsigned numInputs = def.getInputNames().size();
  for (auto [i, name] : llvm::enumerate(def.getStateNames())) {
    results.push_back(gradOrZeros(entry->getArgument(numInputs + i)));
    info.push_back(describe(cellc::GradKind::State, cast<StringAttr>(name)));
  }
  for (auto [i, name] : llvm::enumerate(def.getInputNames())) {
    results.push_back(gradOrZeros(entry->getArgument(i)));
    info.push_back(describe(cellc::GradKind::Input, cast<StringAttr>(name)));
  }
  llvm::append_range(results, projectionGrads);
  llvm::append_range(info, projectionInfo);
  for (auto [rows, attr] : llvm::zip(rowGrads, rowInfo)) {
    results.push_back(rows.first);
    info.push_back(attr);
    results.push_back(rows.second);
    info.push_back(describe(cellc::GradKind::WeightVectors,
                            cast<GradResultAttr>(attr).getName()));
  }
  // Vector params read in the step; those only added into a projection get
  // their gradient from the projection's rows instead.
  for (ParamOp param : params) {
    if (cast<RankedTensorType>(param.getType()).getRank() != 1)
      continue;
    bool inStep = llvm::any_of(param->getUses(), [](OpOperand &use) {
      return !isa<ProjectionOp>(use.getOwner());
    });
    if (!inStep)
      continue;
    results.push_back(gradOrZeros(param.getResult()));
    info.push_back(describe(cellc::GradKind::Param, param.getName()));
  }

  builder.create<func::ReturnOp>(def.getLoc(), results);
  func.setFunctionType(
      builder.getFunctionType(argTypes, ValueRange(results).getTypes()));
  func->setAttr("cell.grad_of", SymbolRefAttr::get(def.getSymNameAttr()));
  func->setAttr("cell.grad_results", builder.getArrayAttr(info));

  // The restore yields every replayed value that the backward reads.
  SmallVector<Value> used;
  for (Operation &op : *replayBlock)
    for (Value result : op.getResults())
      if (llvm::any_of(result.getUsers(), [&](Operation *user) {
            return !placeholder->isProperAncestor(user);
          }))
        used.push_back(result);
  builder.setInsertionPointToEnd(replayBlock);
  builder.create<RestoreYieldOp>(def.getLoc(), used);
  builder.setInsertionPoint(placeholder);
  auto restore = builder.create<RestoreOp>(def.getLoc(),
                                           ValueRange(used).getTypes());
  restore.getBody().takeBody(placeholder.getBody());
  placeholder->erase();
  for (auto [value, result] : llvm::zip(used, restore.getResults()))
    value.replaceUsesWithIf(result, [&](OpOperand &use) {
      return !restore->isProperAncestor(use.getOwner());
    });

  // Drop adjoint ops nothing reads. The replay stays whole: cell-plan-saves
  // matches it op for op with the forward step.
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(*entry)))
    if (op.use_empty() && isMemoryEffectFree(&op) &&
        !op.hasTrait<OpTrait::IsTerminator>() && !isa<RestoreOp>(op))
      op.erase();
  return func;
}

struct Autodiff : public impl::CellAutodiffBase<Autodiff> {
  void runOnOperation() override {
    for (DefOp def : llvm::to_vector(getOperation().getOps<DefOp>()))
      GradBuilder(def).build();
  }
};

} // namespace
} // namespace mlir::cell
