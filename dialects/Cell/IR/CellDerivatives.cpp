//===- CellDerivatives.cpp - The backward of each differentiable op -------===//
//
// Each op's DifferentiableOpInterface method: from the gradients of its results
// it builds the gradients of its operands, as cell ops. Where an op is not
// smooth, the subgradient chosen is documented at the op.
//
//===----------------------------------------------------------------------===//

#include "dialects/Cell/IR/CellOps.h"

using namespace mlir;
using namespace mlir::cell;

namespace {
/// Builds cell ops at one location, for readable derivative formulas.
struct GradBuilder {
  GradBuilder(OpBuilder &b, Operation *op) : b(b), loc(op->getLoc()) {}

  Value add(Value x, Value y) { return b.create<AddOp>(loc, x, y); }
  Value sub(Value x, Value y) { return b.create<SubOp>(loc, x, y); }
  Value mul(Value x, Value y) { return b.create<MulOp>(loc, x, y); }
  Value div(Value x, Value y) { return b.create<DivOp>(loc, x, y); }
  Value neg(Value x) { return b.create<NegOp>(loc, x); }
  Value greater(Value x, Value y) { return b.create<GreaterOp>(loc, x, y); }
  Value constant(double v, Type type) {
    return b.create<ConstantOp>(loc, type, b.getF64FloatAttr(v));
  }
  Value oneMinus(Value x) { return sub(constant(1.0, x.getType()), x); }

  OpBuilder &b;
  Location loc;
};
} // namespace

/// For ops with one result: the result's gradient, or null.
static Value single(ValueRange resultGrads) { return resultGrads.front(); }

SmallVector<Value> NegOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {GradBuilder(b, *this).neg(g)};
}

/// d sigmoid(x) = s (1 - s), from the result s.
SmallVector<Value> SigmoidOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value s = getResult();
  return {gb.mul(g, gb.mul(s, gb.oneMinus(s)))};
}

/// d tanh(x) = 1 - t^2, from the result t.
SmallVector<Value> TanhOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value t = getResult();
  return {gb.mul(g, gb.oneMinus(gb.mul(t, t)))};
}

SmallVector<Value> ExpOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {GradBuilder(b, *this).mul(g, getResult())};
}

SmallVector<Value> LogOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {GradBuilder(b, *this).div(g, getOperand())};
}

/// The subgradient at 0 is 0, as in PyTorch.
SmallVector<Value> ReluOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value zero = gb.constant(0.0, getType());
  return {gb.mul(g, gb.greater(getOperand(), zero))};
}

/// d softplus(x) = sigmoid(x).
SmallVector<Value> SoftplusOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value s = b.create<SigmoidOp>(gb.loc, getOperand());
  return {gb.mul(g, s)};
}

/// d |x| = sign(x), with the subgradient 0 at 0, as in PyTorch.
SmallVector<Value> AbsOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value x = getOperand();
  Value zero = gb.constant(0.0, getType());
  Value positive = gb.greater(x, zero);
  Value negative = gb.greater(zero, x);
  Value sign = gb.sub(positive, negative);
  return {gb.mul(g, sign)};
}

/// d sqrt(x) = 1 / (2 r), from the result r.
SmallVector<Value> SqrtOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value twice = gb.mul(gb.constant(2.0, getType()), getResult());
  return {gb.div(g, twice)};
}

SmallVector<Value> AddOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  return {g, g};
}

SmallVector<Value> SubOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  return {g, GradBuilder(b, *this).neg(g)};
}

SmallVector<Value> MulOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  GradBuilder gb(b, *this);
  return {gb.mul(g, getRhs()), gb.mul(g, getLhs())};
}

/// d (a / b) = (1 / b, -r / b), from the result r.
SmallVector<Value> DivOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  GradBuilder gb(b, *this);
  Value da = gb.div(g, getRhs());
  return {da, gb.neg(gb.mul(da, getResult()))};
}

/// Where lhs and rhs tie, the whole gradient goes to lhs.
SmallVector<Value> MaxOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  GradBuilder gb(b, *this);
  Value toRhs = gb.greater(getRhs(), getLhs());
  return {gb.mul(g, gb.oneMinus(toRhs)), gb.mul(g, toRhs)};
}

/// Where lhs and rhs tie, the whole gradient goes to lhs.
SmallVector<Value> MinOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  GradBuilder gb(b, *this);
  Value toRhs = gb.greater(getLhs(), getRhs());
  return {gb.mul(g, gb.oneMinus(toRhs)), gb.mul(g, toRhs)};
}

/// A step function: its gradient is zero almost everywhere.
SmallVector<Value> GreaterOp::buildGradients(OpBuilder &, ValueRange) {
  return {Value(), Value()};
}

/// The vector's gradient is the transposed product. The weight's gradient is
/// left to cell-autodiff, which emits rows for a weight-gradient GEMM.
SmallVector<Value> MatvecOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  Value dv = b.create<VecmatOp>(getLoc(), getVector().getType(), getWeight(), g);
  return {Value(), dv};
}

/// The transpose of the matvec's: the vector's gradient is the product with
/// the weight, and cell-autodiff emits the weight's rows (the vector) for the
/// weight-gradient GEMM.
SmallVector<Value> VecmatOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  Value dv = b.create<MatvecOp>(getLoc(), getVector().getType(), getWeight(), g);
  return {Value(), dv};
}

/// Nothing flows through a projection inside the step: cell-autodiff hands its
/// result's gradient to the GEMMs that compute the weight, bias and input
/// gradients.
SmallVector<Value> ProjectionOp::buildGradients(OpBuilder &, ValueRange) {
  return SmallVector<Value>(getNumOperands(), Value());
}

/// The parts' gradients, joined; a part nothing depends on contributes zeros.
SmallVector<Value> ChunkOp::buildGradients(OpBuilder &b, ValueRange grads) {
  if (llvm::all_of(grads, [](Value g) { return !g; }))
    return {Value()};
  GradBuilder gb(b, *this);
  SmallVector<Value> parts;
  for (auto [g, result] : llvm::zip(grads, getResults()))
    parts.push_back(g ? g : gb.constant(0.0, result.getType()));
  return {b.create<ConcatOp>(getLoc(), getInput().getType(), parts)};
}

SmallVector<Value> ConcatOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return SmallVector<Value>(getNumOperands(), Value());
  auto chunk = b.create<ChunkOp>(getLoc(), getInputs().getTypes(), g);
  return SmallVector<Value>(chunk.getResults());
}

/// Each element of the input adds to the sum: its gradient is the result's,
/// spread over the units.
SmallVector<Value> SumOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {b.create<BroadcastOp>(getLoc(), getInput().getType(), g)};
}

/// Each input element feeds the result's elements along the other dims: its
/// gradient sums theirs.
SmallVector<Value> ExpandOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {b.create<ReduceOp>(getLoc(), getInput().getType(), g, getShapeAttr(),
                             getKeptAttr())};
}

/// Each input element adds to one result element: its gradient is that one's.
SmallVector<Value> ReduceOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {b.create<ExpandOp>(getLoc(), getInput().getType(), g, getShapeAttr(),
                             getKeptAttr())};
}

/// The one value feeds every element: its gradient sums theirs.
SmallVector<Value> BroadcastOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {b.create<SumOp>(getLoc(), getInput().getType(), g)};
}
