//===- CellDerivatives.cpp - The backward of each differentiable op -------===//
//
// Each op's DifferentiableOpInterface method: from the gradients of its results
// it builds the gradients of its operands, as cell ops. Where an op is not
// smooth, the subgradient chosen is documented at the op.
//
//===----------------------------------------------------------------------===//

#include "dialects/Cell/IR/CellOps.h"

#include <cmath>

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

/// d a^b = b a^(b - 1) and a^b log(a); the exponent's is 0 where a = 0
/// and b >= 0 (there the power is 0 or 1 whatever log(a) is), as in
/// PyTorch.
SmallVector<Value> PowOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value()};
  GradBuilder gb(b, *this);
  Type type = getType();
  Value base = getLhs(), power = getRhs(), y = getResult();
  Value one = gb.constant(1.0, type), zero = gb.constant(0.0, type);
  Value dBase =
      gb.mul(g, gb.mul(power, b.create<PowOp>(gb.loc, base, gb.sub(power, one))));
  // base == 0 and power >= 0: 1 - (base > 0) - (0 > base) - (0 > power), > 0.
  Value baseZero = gb.sub(gb.oneMinus(gb.greater(base, zero)), gb.greater(zero, base));
  Value flat = gb.mul(baseZero, gb.oneMinus(gb.greater(zero, power)));
  Value dPower = b.create<SelectOp>(gb.loc, flat, zero,
                                    gb.mul(g, gb.mul(y, b.create<LogOp>(gb.loc, base))));
  return {dBase, dPower};
}

/// The gradient goes to the selected operand; the condition has none.
SmallVector<Value> SelectOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value(), Value(), Value()};
  GradBuilder gb(b, *this);
  Value zero = gb.constant(0.0, getType());
  return {Value(), b.create<SelectOp>(gb.loc, getCond(), g, zero),
          b.create<SelectOp>(gb.loc, getCond(), zero, g)};
}

/// d rsqrt(x) = -r^3 / 2, from the result r.
SmallVector<Value> RsqrtOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value r = getResult();
  Value cube = gb.mul(r, gb.mul(r, r));
  return {gb.mul(g, gb.mul(gb.constant(-0.5, getType()), cube))};
}

/// d log1p(x) = 1 / (1 + x).
SmallVector<Value> Log1pOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  return {gb.div(g, gb.add(gb.constant(1.0, getType()), getOperand()))};
}

SmallVector<Value> SinOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  return {gb.mul(g, b.create<CosOp>(gb.loc, getOperand()))};
}

SmallVector<Value> CosOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  return {gb.neg(gb.mul(g, b.create<SinOp>(gb.loc, getOperand())))};
}

/// d erf(x) = 2 / sqrt(pi) exp(-x^2).
SmallVector<Value> ErfOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value x = getOperand();
  Value bell = b.create<ExpOp>(gb.loc, gb.neg(gb.mul(x, x)));
  return {gb.mul(g, gb.mul(gb.constant(M_2_SQRTPI, getType()), bell))};
}

/// d silu(x) = s + y (1 - s), with s = sigmoid(x), from the result y.
SmallVector<Value> SiluOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Value s = b.create<SigmoidOp>(gb.loc, getOperand());
  return {gb.mul(g, gb.add(s, gb.mul(getResult(), gb.oneMinus(s))))};
}

/// d gelu(x) = Phi(x) + x phi(x): the normal distribution's CDF and density.
SmallVector<Value> GeluOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Type type = getType();
  Value x = getOperand();
  Value cdf = gb.mul(gb.constant(0.5, type),
                     gb.add(gb.constant(1.0, type),
                            b.create<ErfOp>(gb.loc, gb.mul(x, gb.constant(M_SQRT1_2, type)))));
  Value density = gb.mul(gb.constant(0.5 * M_2_SQRTPI * M_SQRT1_2, type),
                         b.create<ExpOp>(gb.loc, gb.mul(gb.constant(-0.5, type),
                                                        gb.mul(x, x))));
  return {gb.mul(g, gb.add(cdf, gb.mul(x, density)))};
}

/// With t = tanh(u), u = c (x + a x^3): d = (1 + t) / 2 + x (1 - t^2) c (1 + 3 a x^2) / 2.
SmallVector<Value> GeluTanhOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Type type = getType();
  Value x = getOperand();
  Value xx = gb.mul(x, x);
  const double c = 0.7978845608028654, a = 0.044715;
  Value u = gb.mul(gb.constant(c, type),
                   gb.add(x, gb.mul(gb.constant(a, type), gb.mul(xx, x))));
  Value t = b.create<TanhOp>(gb.loc, u);
  Value half = gb.constant(0.5, type);
  Value du = gb.mul(gb.constant(c, type),
                    gb.add(gb.constant(1.0, type), gb.mul(gb.constant(3 * a, type), xx)));
  Value d = gb.add(gb.mul(half, gb.add(gb.constant(1.0, type), t)),
                   gb.mul(half, gb.mul(x, gb.mul(gb.oneMinus(gb.mul(t, t)), du))));
  return {gb.mul(g, d)};
}

/// d elu(x) = 1 for x > 0, else exp(x) = y + 1 (PyTorch's at 0: 1 either way).
SmallVector<Value> EluOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  GradBuilder gb(b, *this);
  Type type = getType();
  Value positive = gb.greater(getOperand(), gb.constant(0.0, type));
  Value below = gb.add(getResult(), gb.constant(1.0, type));
  return {gb.mul(g, gb.add(positive, gb.mul(gb.oneMinus(positive), below)))};
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
/// A sum's gradient repeats along the summed dims. A max's (or min's) goes
/// to the elements equal to the result, split evenly among ties:
/// mask = (x == expand(r)), g_x = mask * expand(g / reduce_sum(mask)).
SmallVector<Value> ReduceOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  Type wide = getInput().getType();
  auto expand = [&](Value v) -> Value {
    return b.create<ExpandOp>(getLoc(), wide, v, getShapeAttr(), getKeptAttr());
  };
  if (getCombineKind() == Combine::Sum)
    return {expand(g)};
  GradBuilder gb(b, *this);
  Value x = getInput(), r = expand(getResult());
  Value mask = gb.oneMinus(gb.add(gb.greater(x, r), gb.greater(r, x)));
  Value ties = b.create<ReduceOp>(getLoc(), getType(), mask, getShapeAttr(), getKeptAttr(),
                                  b.getStringAttr("sum"));
  return {gb.mul(mask, expand(gb.div(g, ties)))};
}

/// The one value feeds every element: its gradient sums theirs.
SmallVector<Value> BroadcastOp::buildGradients(OpBuilder &b, ValueRange grads) {
  Value g = single(grads);
  if (!g)
    return {Value()};
  return {b.create<SumOp>(getLoc(), getInput().getType(), g)};
}
