//===- IRGenCall.cpp - Building cell IR from calls ------------------------===//
//
// The calls of a cell's expressions: the functions of one argument (folded
// on constants), integer powers, the reductions over units, where, clamp,
// and the nearest known name for an unknown one.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGenImpl.h"

using namespace cellc;
using namespace cellc::irgen;
using namespace mlir;

std::optional<Val> IRGen::evalCall(const Expr &expr) {
  Fn fn = lookupFn(expr.name);
  if (fn == Fn::Unknown) {
    std::string nearest = nearestFunction(expr.name);
    diag.error(expr.opLoc,
               "unknown function '" + expr.name + "'" +
                   (nearest.empty() ? "" : "; did you mean '" + nearest + "'?") +
                   " The functions are " + functionNames(),
               expr.range);
    return std::nullopt;
  }
  if (fn == Fn::Chunk) {
    diag.error(expr.opLoc,
               "'chunk' can only stand alone on the right of an assignment, "
               "as in 'a, b = chunk(v, 2)'",
               expr.range);
    return std::nullopt;
  }
  // max and min: of two operands element by element, or over a vector's
  // units.
  size_t arity = (fn == Fn::Pow || fn == Fn::Heads || fn == Fn::Outer) ? 2
                 : (fn == Fn::Where || fn == Fn::Clamp)                ? 3
                                                                       : 1;
  bool either = fn == Fn::Max || fn == Fn::Min;
  if (either ? expr.operands.size() != 1 && expr.operands.size() != 2
             : expr.operands.size() != arity) {
    diag.error(expr.opLoc,
               "'" + expr.name + "' takes " +
                   (either ? llvm::Twine("1 argument (over a vector's units) or 2 (element "
                                         "by element)")
                           : llvm::Twine(arity) + (arity == 1 ? " argument" : " arguments")) +
                   ", found " + llvm::Twine(expr.operands.size()),
               expr.range);
    return std::nullopt;
  }
  if (either)
    arity = expr.operands.size();
  std::string what = "'" + expr.name + "'";
  if (fn == Fn::Heads)
    return evalHeads(expr);
  if (fn == Fn::Outer)
    return evalOuter(expr);
  if (fn == Fn::Cols) {
    std::optional<Val> g = evalElementwise(*expr.operands[0], what);
    if (g && g->kind != Val::Kind::Vector) {
      diag.error(expr.operands[0]->range.Start,
                 llvm::Twine("'cols' marks a vector that scales a matrix's columns; found ") +
                     g->describe(),
                 expr.operands[0]->range);
      return std::nullopt;
    }
    if (g)
      g->columns = true;
    return g;
  }
  if (fn == Fn::Where)
    return evalWhere(expr);
  if (fn == Fn::Clamp)
    return evalClamp(expr);
  if (arity == 2)
    return evalElementwise2(expr, what);
  if (fn == Fn::Sum || fn == Fn::Mean || fn == Fn::Max || fn == Fn::Min ||
      fn == Fn::Softmax || fn == Fn::LogSumExp)
    return evalReduction(expr, fn);

  std::optional<Val> arg = evalElementwise(*expr.operands[0], what);
  if (!arg)
    return std::nullopt;
  return applyUnary(fn, *arg, loc(expr.opLoc));
}

Value IRGen::integerPower(Value x, int64_t n, llvm::SMLoc at) {
  // Square and multiply; a negative power is the reciprocal.
  Location l = loc(at);
  int64_t size = cast<RankedTensorType>(x.getType()).getDimSize(0);
  Value result, square = x;
  for (int64_t m = n < 0 ? -n : n; m > 0; m /= 2) {
    if (m % 2)
      result = result ? builder.create<cell::MulOp>(l, result, square).getResult() : square;
    if (m > 1)
      square = builder.create<cell::MulOp>(l, square, square);
  }
  if (!result)
    return constant(1.0, size, at);
  if (n < 0)
    result = builder.create<cell::DivOp>(l, constant(1.0, size, at), result);
  return result;
}

/// A function of one argument on `arg`: folded where `arg` is a constant,
/// else its cell op.
Val IRGen::applyUnary(Fn fn, Val arg, Location l) {
  switch (fn) {
#define CELLC_UNARY_FN(E, name, op, folded)                                    \
  case Fn::E:                                                                  \
    if (arg.kind == Val::Kind::Scalar) {                                       \
      double x = arg.scalar;                                                   \
      return Val::ofScalar(folded);                                            \
    }                                                                          \
    arg.value = builder.create<cell::op>(l, arg.value);                        \
    return arg;
#include "compiler/Frontend/Functions.def"
  case Fn::LogSigmoid:
    // log(sigmoid(x)) = -softplus(-x), in softplus's stable form: finite
    // where sigmoid(x) underflows, as xLSTM's and GLA's gates need.
    if (arg.kind == Val::Kind::Scalar) {
      double x = arg.scalar;
      return Val::ofScalar(std::fmin(x, 0.0) - std::log1p(std::exp(-std::fabs(x))));
    }
    arg.value = builder.create<cell::NegOp>(
        l, builder.create<cell::SoftplusOp>(l, builder.create<cell::NegOp>(l, arg.value)));
    return arg;
  case Fn::Unknown:
  case Fn::Pow:
  case Fn::Where:
  case Fn::Clamp:
  case Fn::Softmax:
  case Fn::LogSumExp:
  case Fn::Heads:
  case Fn::Outer:
  case Fn::Cols:
  case Fn::Max:
  case Fn::Min:
  case Fn::Sum:
  case Fn::Mean:
  case Fn::Chunk:
    break;
  }
  llvm_unreachable("not a function of one argument");
}

/// `sum(v)` and `mean(v)`: one value per sample, from a vector.
std::optional<Val> IRGen::evalReduction(const Expr &expr, Fn fn) {
  const Expr &operand = *expr.operands[0];
  std::optional<Val> arg = evalElementwise(operand, "'" + expr.name + "'");
  if (!arg)
    return std::nullopt;
  if (arg->kind != Val::Kind::Vector) {
    diag.error(operand.range.Start,
               "'" + expr.name + "' reduces a vector to one value per sample; found " +
                   arg->describe(),
               operand.range);
    return std::nullopt;
  }
  Location l = loc(expr.opLoc);
  llvm::SMLoc at = expr.opLoc;
  // Over each head's part (the last dim), or over all the units. A sum
  // over all is cell.sum, which the kernels split over their threads.
  SmallVector<int64_t, 2> shape = arg->shape();
  ArrayRef<int64_t> kept = ArrayRef(shape).drop_back();
  int64_t last = shape.back(), count = arg->size / last;
  auto across = [&](Value v, StringRef combine) -> Value {
    if (kept.empty() && combine == "sum")
      return builder.create<cell::SumOp>(l, vectorType(1), v);
    return reduce(v, shape, leadingDims(kept.size()), at, combine);
  };
  auto result = [&](Value v) {
    return kept.empty() ? Val::ofPerSample(v) : ofShape(v, kept);
  };
  auto back = [&](Value v) -> Value {
    return kept.empty() ? builder.create<cell::BroadcastOp>(l, vectorType(arg->size), v)
                               .getResult()
                        : expand(v, shape, leadingDims(kept.size()), at);
  };
  switch (fn) {
  case Fn::Sum:
  case Fn::Mean: {
    Value sums = across(arg->value, "sum");
    if (fn == Fn::Mean)
      sums = builder.create<cell::MulOp>(l, sums, constant(1.0 / double(last), count, at));
    return result(sums);
  }
  case Fn::Max:
    return result(across(arg->value, "max"));
  case Fn::Min:
    return result(across(arg->value, "min"));
  case Fn::Softmax:
  case Fn::LogSumExp: {
    // Stable: the max subtracted before exp, so that no score overflows.
    Value m = across(arg->value, "max");
    Value shifted = builder.create<cell::SubOp>(l, arg->value, back(m));
    Value e = builder.create<cell::ExpOp>(l, shifted);
    Value s = across(e, "sum");
    if (fn == Fn::LogSumExp)
      return result(builder.create<cell::AddOp>(l, m, builder.create<cell::LogOp>(l, s)));
    Val out = *arg;
    out.value = builder.create<cell::DivOp>(l, e, back(s));
    out.columns = false;
    return out;
  }
  default:
    break;
  }
  llvm_unreachable("not a reduction");
}

std::optional<Val> IRGen::evalWhere(const Expr &expr) {
  // where(c, a, b): a and b made to match, then c and them; a select of the
  // three (the unselected side is not read into the result).
  std::string what = "'where'";
  std::optional<Val> c = evalElementwise(*expr.operands[0], what);
  std::optional<Val> a = c ? evalElementwise(*expr.operands[1], what) : std::nullopt;
  std::optional<Val> b = a ? evalElementwise(*expr.operands[2], what) : std::nullopt;
  if (!b)
    return std::nullopt;
  if (c->kind == Val::Kind::Scalar && a->kind == Val::Kind::Scalar &&
      b->kind == Val::Kind::Scalar)
    return Val::ofScalar(c->scalar != 0 ? a->scalar : b->scalar);
  if (c->kind == Val::Kind::Scalar)
    return c->scalar != 0 ? *a : *b;
  auto pair = [&](const Expr &x, const Expr &y) { return pairAt(expr, x, y, "where"); };
  auto ab = broadcastHeads(*pair(*expr.operands[1], *expr.operands[2]), *a, *b, what);
  if (!ab)
    return std::nullopt;
  // The operand that carries the shape of a and b, against c's.
  bool aShapes = ab->first.kind == Val::Kind::Vector;
  const Val &carrier = aShapes ? ab->first : ab->second;
  auto ca = broadcastHeads(*pair(*expr.operands[0], *expr.operands[aShapes ? 1 : 2]), *c,
                           carrier, what);
  if (!ca)
    return std::nullopt;
  auto cb = broadcastHeads(*pair(*expr.operands[0], *expr.operands[aShapes ? 2 : 1]),
                           ca->first, aShapes ? ab->second : ab->first, what);
  if (!cb)
    return std::nullopt;
  Val shaped = ca->second.kind == Val::Kind::Vector ? ca->second
               : cb->second.kind == Val::Kind::Vector ? cb->second
                                                      : cb->first;
  bool vector = shaped.kind == Val::Kind::Vector || cb->first.kind == Val::Kind::Vector;
  if (cb->first.kind == Val::Kind::Vector)
    shaped = cb->first;
  int64_t size = vector ? shaped.size : 1;
  Value cv = spread(cb->first, size, expr.operands[0]->range.Start);
  Value av = spread(aShapes ? ca->second : cb->second, size, expr.operands[1]->range.Start);
  Value bv = spread(aShapes ? cb->second : ca->second, size, expr.operands[2]->range.Start);
  Value picked = builder.create<cell::SelectOp>(loc(expr.opLoc), cv, av, bv);
  if (!vector)
    return Val::ofPerSample(picked);
  Val out = Val::ofVector(picked, size);
  out.dims = shaped.dims;
  return out;
}

std::optional<Val> IRGen::evalClamp(const Expr &expr) {
  // clamp(x, lo, hi) = min(max(x, lo), hi), element by element.
  std::string what = "'clamp'";
  std::optional<Val> x = evalElementwise(*expr.operands[0], what);
  std::optional<Val> lo = x ? evalElementwise(*expr.operands[1], what) : std::nullopt;
  std::optional<Val> hi = lo ? evalElementwise(*expr.operands[2], what) : std::nullopt;
  if (!hi)
    return std::nullopt;
  std::optional<Val> low =
      elementwise(*pairAt(expr, *expr.operands[0], *expr.operands[1], "max"), *x, *lo, what);
  if (!low)
    return std::nullopt;
  return elementwise(*pairAt(expr, *expr.operands[0], *expr.operands[2], "min"), *low, *hi,
                     what);
}

std::unique_ptr<Expr> IRGen::pairAt(const Expr &call, const Expr &x, const Expr &y,
                                    llvm::StringRef name) {
  auto pair = std::make_unique<Expr>(Expr::Kind::Call, call.range);
  pair->name = name.str();
  pair->opLoc = call.opLoc;
  for (const Expr *operand : {&x, &y})
    pair->operands.push_back(std::make_unique<Expr>(Expr::Kind::Number, operand->range));
  return pair;
}

std::string IRGen::nearestFunction(llvm::StringRef name) {
  // The known name fewest edits away, where it is a plausible slip.
  std::string best;
  unsigned fewest = std::max<unsigned>(2, name.size() / 3) + 1;
  for (llvm::StringRef known : functionList()) {
    unsigned edits = name.lower() == known ? 0 : name.edit_distance(known, true, fewest);
    if (edits < fewest) {
      fewest = edits;
      best = known.str();
    }
  }
  return best;
}
