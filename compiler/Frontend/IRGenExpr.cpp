//===- IRGenExpr.cpp - Building cell IR from expressions -----------------===//
//
// The expressions of a cell: names, element-wise operations with their
// broadcasting, products (matvec, vecmat, per-sample), heads, calls and
// reductions, each with its shape checks, size errors and constant folding.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGenImpl.h"

using namespace cellc;
using namespace cellc::irgen;
using namespace mlir;

std::optional<Val> IRGen::eval(const Expr &expr) {
  switch (expr.kind) {
  case Expr::Kind::Number:
    return Val::ofScalar(expr.number);
  case Expr::Kind::Name:
    return evalName(expr);
  case Expr::Kind::Neg: {
    std::optional<Val> operand = evalElementwise(*expr.operands[0], "'-'");
    if (!operand)
      return std::nullopt;
    if (operand->kind == Val::Kind::Scalar)
      return Val::ofScalar(-operand->scalar);
    Val neg = *operand;
    neg.value = builder.create<cell::NegOp>(loc(expr.opLoc), operand->value);
    return neg;
  }
  case Expr::Kind::Binary:
    return evalBinary(expr);
  case Expr::Kind::Call:
    return evalCall(expr);
  }
  return std::nullopt;
}

Binding *IRGen::use(const Expr &name) {
  auto it = scope.find(name.name);
  if (it == scope.end()) {
    diag.error(name.range.Start, "unknown name '" + name.name + "'", name.range);
    return nullptr;
  }
  it->second.used = true;
  return &it->second;
}

std::optional<Val> IRGen::evalName(const Expr &expr) {
  // A size that a declaration uses is a constant, as in `k / sqrt(K)`.
  if (!scope.count(expr.name)) {
    auto it = sizes.find(expr.name);
    if (it != sizes.end()) {
      usedSizes.insert(expr.name);
      return Val::ofScalar(double(it->second));
    }
  }
  if (Binding *binding = use(expr))
    return binding->current;
  return std::nullopt;
}

std::optional<Val> IRGen::evalElementwise(const Expr &expr,
                                          llvm::StringRef what) {
  std::optional<Val> val = eval(expr);
  if (val && val->kind == Val::Kind::Matrix) {
    diag.error(expr.range.Start,
               "param '" + expr.name + "' is a " +
                   (val->blocks ? "block-diagonal matrix" : "matrix") +
                   (val->blocks ? "; it can only be the left operand of '@', not an operand of "
                                : "; it can only be an operand of '@', not an operand of ") +
                   what,
               expr.range);
    return std::nullopt;
  }
  return val;
}

std::optional<Val> IRGen::evalBinary(const Expr &expr) {
  if (expr.binaryOp == Expr::BinaryOp::Matvec)
    return evalMatvec(expr);
  return evalElementwise2(expr, ("'" + spell(expr.binaryOp) + "'").str());
}

std::optional<Val> IRGen::evalElementwise2(const Expr &expr,
                                           const std::string &what) {
  std::optional<Val> lhs = evalElementwise(*expr.operands[0], what);
  if (!lhs)
    return std::nullopt;
  std::optional<Val> rhs = evalElementwise(*expr.operands[1], what);
  if (!rhs)
    return std::nullopt;
  return elementwise(expr, *lhs, *rhs, what);
}

std::optional<Val> IRGen::elementwise(const Expr &expr, const Val &lhs,
                                      const Val &rhs, llvm::StringRef what) {
  bool isCall = expr.kind == Expr::Kind::Call;
  Fn fn = isCall ? lookupFn(expr.name) : Fn::Unknown;
  Expr::BinaryOp op = expr.binaryOp;
  if (lhs.kind == Val::Kind::Scalar && rhs.kind == Val::Kind::Scalar) {
    double a = lhs.scalar, b = rhs.scalar;
    if (isCall) {
      assert((fn == Fn::Max || fn == Fn::Min || fn == Fn::Pow) &&
             "binary calls are max, min and pow");
      if (fn == Fn::Pow)
        return Val::ofScalar(std::pow(a, b));
      return Val::ofScalar(fn == Fn::Max ? std::max(a, b) : std::min(a, b));
    }
    // Every operator is listed: a new one is a compile error here, not a
    // silent division.
    switch (op) {
#define CELLC_BINARY_OP(E, cellOp, value)                                      \
  case Expr::BinaryOp::E:                                                      \
    return Val::ofScalar(value);
#define CELLC_COMPARISON(E, value)                                             \
  case Expr::BinaryOp::E:                                                      \
    return Val::ofScalar((value) ? 1.0 : 0.0);
#include "compiler/Frontend/Functions.def"
    case Expr::BinaryOp::Matvec:
      break;
    }
    llvm_unreachable("'@' is not element-wise");
  }
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  std::optional<std::pair<Val, Val>> matched = broadcastHeads(expr, lhs, rhs, what);
  if (!matched)
    return std::nullopt;
  const auto &[left, right] = *matched;
  // A vector operand gives the result's size; otherwise the result is one
  // value per sample.
  bool vector = left.kind == Val::Kind::Vector || right.kind == Val::Kind::Vector;
  int64_t size = left.kind == Val::Kind::Vector ? left.size
                 : right.kind == Val::Kind::Vector ? right.size
                                                   : 1;
  SmallVector<int64_t, 2> dims = left.kind == Val::Kind::Vector && !left.dims.empty()
                                     ? left.dims
                                     : right.dims;
  Value a = spread(left, size, lhsExpr.range.Start);
  Value b = spread(right, size, rhsExpr.range.Start);
  Location l = loc(expr.opLoc);
  Value result;
  // An integer power is products: exact for any base, a negative one
  // included.
  std::optional<int64_t> whole;
  if (op == Expr::BinaryOp::Pow && right.kind == Val::Kind::Scalar &&
      std::fabs(right.scalar) <= 64 && right.scalar == std::trunc(right.scalar))
    whole = int64_t(right.scalar);
  if (isCall) {
    if (fn == Fn::Max)
      result = builder.create<cell::MaxOp>(l, a, b);
    else if (fn == Fn::Min)
      result = builder.create<cell::MinOp>(l, a, b);
    else if (whole)
      result = integerPower(a, *whole, expr.opLoc);
    else
      result = builder.create<cell::PowOp>(l, a, b);
  } else if (whole) {
    result = integerPower(a, *whole, expr.opLoc);
  } else {
    auto greater = [&](Value x, Value y) -> Value {
      return builder.create<cell::GreaterOp>(l, x, y);
    };
    auto oneMinus = [&](Value x) -> Value {
      return builder.create<cell::SubOp>(l, spread(Val::ofScalar(1.0), size, expr.opLoc),
                                         x);
    };
    switch (op) {
#define CELLC_BINARY_OP(E, cellOp, value)                                      \
  case Expr::BinaryOp::E:                                                      \
    result = builder.create<cell::cellOp>(l, a, b);                            \
    break;
#include "compiler/Frontend/Functions.def"
    case Expr::BinaryOp::Less:
      result = greater(b, a);
      break;
    case Expr::BinaryOp::LessEqual:
      result = oneMinus(greater(a, b));
      break;
    case Expr::BinaryOp::Greater:
      result = greater(a, b);
      break;
    case Expr::BinaryOp::GreaterEqual:
      result = oneMinus(greater(b, a));
      break;
    case Expr::BinaryOp::Equal:
      result = oneMinus(builder.create<cell::AddOp>(l, greater(a, b), greater(b, a)));
      break;
    case Expr::BinaryOp::NotEqual:
      result = builder.create<cell::AddOp>(l, greater(a, b), greater(b, a));
      break;
    case Expr::BinaryOp::Matvec:
      llvm_unreachable("'@' is not element-wise");
    }
  }
  if (!vector)
    return Val::ofPerSample(result);
  Val out = Val::ofVector(result, size);
  out.dims = dims;
  // Column gates combined with each other or with scalars stay column gates.
  out.columns = (left.columns || right.columns) &&
                (left.columns || left.kind != Val::Kind::Vector) &&
                (right.columns || right.kind != Val::Kind::Vector);
  return out;
}

/// The operands of an elementwise op over vectors, made to match:
/// - equal shapes, or a plain vector and one with heads of its size, as they
///   are (the result has the heads);
/// - one shape the start of the other's (`[NH]` and `[NH, K]`): the shorter
///   repeated along the longer's other dims (cell.expand).
std::optional<std::pair<Val, Val>> IRGen::broadcastHeads(const Expr &expr, const Val &lhs,
                                                        const Val &rhs, llvm::StringRef what) {
  if (lhs.kind != Val::Kind::Vector || rhs.kind != Val::Kind::Vector)
    return std::make_pair(lhs, rhs);
  SmallVector<int64_t, 2> ls = lhs.shape(), rs = rhs.shape();
  if (lhs.columns != rhs.columns) {
    // `cols(g)`, g [..., N], meets a matrix [..., M, N]: g along its last
    // dim, repeated over M.
    const Val &gate = lhs.columns ? lhs : rhs, &matrix = lhs.columns ? rhs : lhs;
    ArrayRef<int64_t> gs = lhs.columns ? ls : rs, ms = lhs.columns ? rs : ls;
    if (ms.size() != gs.size() + 1 || ms.take_front(gs.size() - 1) != gs.drop_back() ||
        ms.back() != gs.back()) {
      shapeMismatch(expr, what, ls, rs,
                    "cols(g), g [..., N], scales the columns of a matrix [..., M, N] with the "
                    "same heads");
      return std::nullopt;
    }
    SmallVector<int64_t> kept = leadingDims(gs.size() - 1);
    kept.push_back(ms.size() - 1);
    Val spread = matrix;
    spread.value = this->expand(gate.value, ms, kept, expr.opLoc);
    return lhs.columns ? std::make_pair(spread, rhs) : std::make_pair(lhs, spread);
  }
  if (ls == rs || (lhs.size == rhs.size && (lhs.dims.empty() || rhs.dims.empty())))
    return std::make_pair(lhs, rhs);
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  auto startsWith = [](ArrayRef<int64_t> whole, ArrayRef<int64_t> start) {
    return start.size() < whole.size() && whole.take_front(start.size()) == start;
  };
  auto expand = [&](const Val &small, const Val &large) {
    Val out = large;
    out.value = this->expand(small.value, large.shape(),
                             leadingDims(small.shape().size()), expr.opLoc);
    return out;
  };
  if (!lhs.dims.empty() || !rhs.dims.empty()) {
    if (startsWith(rs, ls))
      return std::make_pair(expand(lhs, rhs), rhs);
    if (startsWith(ls, rs))
      return std::make_pair(lhs, expand(rhs, lhs));
    shapeMismatch(expr, what, ls, rs,
                  "a value broadcasts over another whose shape starts with its own");
    return std::nullopt;
  }
  diag.error(expr.opLoc,
             "size mismatch in " + what + ": the left operand has size " +
                 llvm::Twine(lhs.size) + ", the right has size " + llvm::Twine(rhs.size),
             {lhsExpr.range, rhsExpr.range});
  return std::nullopt;
}

std::optional<Val> IRGen::evalHeads(const Expr &expr) {
  const Expr &vecExpr = *expr.operands[0], &countExpr = *expr.operands[1];
  std::optional<Val> v = evalElementwise(vecExpr, "'heads'");
  if (!v)
    return std::nullopt;
  if (v->kind != Val::Kind::Vector || !v->dims.empty()) {
    diag.error(vecExpr.range.Start,
               llvm::Twine("'heads' splits a vector into heads; found ") +
                   (v->kind == Val::Kind::Vector ? "a value with heads already"
                                                 : v->describe()),
               vecExpr.range);
    return std::nullopt;
  }
  std::optional<int64_t> count;
  if (countExpr.kind == Expr::Kind::Number && countExpr.isInteger)
    count = int64_t(countExpr.number);
  else if (countExpr.kind == Expr::Kind::Name && !scope.count(countExpr.name)) {
    auto it = sizes.find(countExpr.name);
    if (it != sizes.end()) {
      usedSizes.insert(countExpr.name);
      count = it->second;
    }
  }
  if (!count || *count < 1) {
    std::string what = countExpr.kind == Expr::Kind::Name
                           ? "'" + countExpr.name + "' is not a bound size: the"
                           : "the";
    diag.error(countExpr.range.Start,
               what + " head count of 'heads' must be a size that a declaration uses, or "
                      "a positive integer literal",
               countExpr.range);
    return std::nullopt;
  }
  if (v->size % *count != 0) {
    diag.error(expr.opLoc,
               "'heads' splits a vector of size " + llvm::Twine(v->size) + " into " +
                   llvm::Twine(*count) + " heads, which does not divide it",
               expr.range);
    return std::nullopt;
  }
  v->dims = {*count, v->size / *count};
  return v;
}

std::optional<Val> IRGen::evalMatvec(const Expr &expr) {
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  if (rhsExpr.kind == Expr::Kind::Name) {
    auto it = scope.find(rhsExpr.name);
    if (it != scope.end() && it->second.current.kind == Val::Kind::Matrix)
      return evalVecmat(expr);
  }
  const Binding *weight = nullptr;
  if (lhsExpr.kind == Expr::Kind::Name) {
    Binding *binding = use(lhsExpr);
    if (!binding)
      return std::nullopt;
    if (binding->current.kind == Val::Kind::Matrix)
      weight = binding;
  }
  if (!weight) {
    // A per-sample matrix (a value with dims) times a vector, either way.
    std::optional<Val> lhs = eval(lhsExpr);
    if (!lhs)
      return std::nullopt;
    if (lhs->kind == Val::Kind::Vector) {
      std::optional<Val> rhs = evalElementwise(rhsExpr, "'@'");
      if (!rhs)
        return std::nullopt;
      if (rhs->kind == Val::Kind::Vector &&
          (!lhs->dims.empty() || !rhs->dims.empty()))
        return evalSampleProduct(expr, *lhs, *rhs);
    }
    std::string found = "an expression";
    if (lhsExpr.kind == Expr::Kind::Name) {
      const Binding &b = scope.find(lhsExpr.name)->second;
      found = (spell(b) + " '" + lhsExpr.name + "'").str();
      if (b.decl == DeclKind::Param)
        found = "vector param '" + lhsExpr.name + "'";
    } else if (lhsExpr.kind == Expr::Kind::Number) {
      found = "a number";
    }
    diag.error(lhsExpr.range.Start,
               "the left operand of '@' must be a matrix param or a value with "
               "dims (a matrix state, an outer product), found " +
                   found,
               lhsExpr.range);
    return std::nullopt;
  }
  std::optional<Val> rhs = eval(rhsExpr);
  if (!rhs)
    return std::nullopt;
  if (rhs->kind != Val::Kind::Vector) {
    diag.error(rhsExpr.range.Start,
               llvm::Twine("the right operand of '@' must be a vector, found ") +
                   rhs->describe(),
               rhsExpr.range);
    return std::nullopt;
  }
  const Val &w = weight->current;
  if (w.blocks) {
    // Block g of the result is block g of the weight times the g-th part.
    if (rhs->size != w.blocks * w.cols) {
      diag.error(expr.opLoc,
                 "size mismatch in '@': '" + lhsExpr.name + "' is block-diagonal, " +
                     llvm::Twine(w.blocks) + " blocks of [" + llvm::Twine(w.size) + ", " +
                     llvm::Twine(w.cols) + "], so the right operand must have size " +
                     llvm::Twine(w.blocks) + " * " + llvm::Twine(w.cols) + " = " +
                     llvm::Twine(w.blocks * w.cols) + "; found " + llvm::Twine(rhs->size),
                 {lhsExpr.range, rhsExpr.range});
      return std::nullopt;
    }
    Value result = builder.create<cell::MatvecOp>(
        loc(expr.opLoc), vectorType(w.blocks * w.size), w.value, rhs->value);
    return Val::ofVector(result, w.blocks * w.size);
  }
  if (rhs->size != w.cols) {
    diag.error(expr.opLoc,
               "size mismatch in '@': '" + lhsExpr.name + "' is [" +
                   llvm::Twine(w.size) + ", " + llvm::Twine(w.cols) +
                   "] but the right operand has size " +
                   llvm::Twine(rhs->size),
               {lhsExpr.range, rhsExpr.range});
    return std::nullopt;
  }
  Value result = builder.create<cell::MatvecOp>(
      loc(expr.opLoc), vectorType(w.size), w.value, rhs->value);
  return Val::ofVector(result, w.size);
}

std::optional<Val> IRGen::evalSampleProduct(const Expr &expr, const Val &lhs,
                                             const Val &rhs) {
  // The matrix is the operand with one dim more than the other, or with two
  // against a plain vector that every row (or column) shares.
  SmallVector<int64_t, 2> ls = lhs.shape(), rs = rhs.shape();
  bool matvec = ls.size() >= 2 && ls.size() > rs.size() &&
                (rs.size() == 1 || rs.size() + 1 == ls.size());
  bool vecmat = rs.size() >= 2 && rs.size() > ls.size() &&
                (ls.size() == 1 || ls.size() + 1 == rs.size());
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  ArrayRef<int64_t> as = matvec ? ls : rs, bs = matvec ? rs : ls;
  int64_t rank = as.size();
  ArrayRef<int64_t> lead = as.drop_back(2), bLead = bs.drop_back();
  // `A @ b` contracts A's last dim, `b @ A` its last but one.
  int64_t contracted = matvec ? rank - 1 : rank - 2;
  if ((matvec || vecmat) && (!bLead.empty() && bLead != lead))
    matvec = vecmat = false;
  if (!matvec && !vecmat) {
    shapeMismatch(expr, "'@'", ls, rs,
                  "a per-sample matrix [..., M, N] multiplies a vector [..., N] on its right "
                  "or [..., M] on its left, with the same heads or none");
    return std::nullopt;
  }
  if (bs.back() != as[contracted]) {
    diag.error(expr.opLoc,
               "size mismatch in '@': the " + llvm::Twine(matvec ? "left" : "right") +
                   " operand is the matrix " + shapeText(as) + ", so the vector needs " +
                   llvm::Twine(as[contracted]) + " elements in its last dim; found " +
                   shapeText(bs),
               {lhsExpr.range, rhsExpr.range});
    return std::nullopt;
  }
  const Val &a = matvec ? lhs : rhs, &b = matvec ? rhs : lhs;
  SmallVector<int64_t> bKept = bLead.empty() ? SmallVector<int64_t>{}
                                             : leadingDims(lead.size());
  bKept.push_back(contracted);
  SmallVector<int64_t> kept = leadingDims(rank - 2);
  kept.push_back(matvec ? rank - 2 : rank - 1);
  Location l = loc(expr.opLoc);
  Value product = builder.create<cell::MulOp>(
      l, a.value, expand(b.value, as, bKept, expr.opLoc));
  SmallVector<int64_t> shape(lead);
  shape.push_back(as[matvec ? rank - 2 : rank - 1]);
  return ofShape(reduce(product, as, kept, expr.opLoc), shape);
}

std::optional<Val> IRGen::evalOuter(const Expr &expr) {
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  std::optional<Val> a = evalElementwise(lhsExpr, "'outer'");
  if (!a)
    return std::nullopt;
  std::optional<Val> b = evalElementwise(rhsExpr, "'outer'");
  if (!b)
    return std::nullopt;
  for (auto [val, operand] : {std::pair(&*a, &lhsExpr), std::pair(&*b, &rhsExpr)})
    if (val->kind != Val::Kind::Vector) {
      diag.error(operand->range.Start,
                 llvm::Twine("'outer' takes two vectors; found ") + val->describe(),
                 operand->range);
      return std::nullopt;
    }
  // a [..., M] and b [..., N] give [..., M, N]: their leading dims (heads)
  // match, or one has none and is shared by every head.
  SmallVector<int64_t, 2> as = a->shape(), bs = b->shape();
  ArrayRef<int64_t> aLead = ArrayRef(as).drop_back(), bLead = ArrayRef(bs).drop_back();
  if (!aLead.empty() && !bLead.empty() && aLead != bLead) {
    shapeMismatch(expr, "'outer'", as, bs,
                  "their heads (all dims but the last) must match, or one must have none");
    return std::nullopt;
  }
  ArrayRef<int64_t> lead = aLead.empty() ? bLead : aLead;
  int64_t rank = lead.size() + 2;
  SmallVector<int64_t> shape(lead);
  shape.append({as.back(), bs.back()});
  SmallVector<int64_t> aKept = aLead.empty() ? SmallVector<int64_t>{}
                                             : leadingDims(lead.size());
  aKept.push_back(rank - 2);
  SmallVector<int64_t> bKept = bLead.empty() ? SmallVector<int64_t>{}
                                             : leadingDims(lead.size());
  bKept.push_back(rank - 1);
  Value left = expand(a->value, shape, aKept, expr.opLoc);
  Value right = expand(b->value, shape, bKept, expr.opLoc);
  Value product = builder.create<cell::MulOp>(loc(expr.opLoc), left, right);
  return ofShape(product, shape);
}

Value IRGen::expand(Value small, ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
                    llvm::SMLoc at) {
  int64_t size = 1;
  for (int64_t d : shape)
    size *= d;
  return builder.create<cell::ExpandOp>(loc(at), vectorType(size), small,
                                        builder.getDenseI64ArrayAttr(shape),
                                        builder.getDenseI64ArrayAttr(kept));
}

Value IRGen::reduce(Value large, ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
                    llvm::SMLoc at, llvm::StringRef combine) {
  int64_t size = 1;
  for (int64_t d : kept)
    size *= shape[d];
  return builder.create<cell::ReduceOp>(loc(at), vectorType(size), large,
                                        builder.getDenseI64ArrayAttr(shape),
                                        builder.getDenseI64ArrayAttr(kept),
                                        builder.getStringAttr(combine));
}

Val IRGen::ofShape(Value value, ArrayRef<int64_t> shape) {
  int64_t size = 1;
  for (int64_t d : shape)
    size *= d;
  Val val = Val::ofVector(value, size);
  if (shape.size() >= 2)
    val.dims.assign(shape.begin(), shape.end());
  return val;
}

std::optional<Val> IRGen::evalVecmat(const Expr &expr) {
  const Expr &lhsExpr = *expr.operands[0], &rhsExpr = *expr.operands[1];
  Binding *weight = use(rhsExpr);
  if (!weight)
    return std::nullopt;
  const Val &w = weight->current;
  if (w.blocks) {
    diag.error(rhsExpr.range.Start,
               "param '" + rhsExpr.name +
                   "' is block-diagonal; only a dense matrix param can be the right "
                   "operand of '@' (v @ W, its transpose times v)",
               rhsExpr.range);
    return std::nullopt;
  }
  std::optional<Val> lhs = eval(lhsExpr);
  if (!lhs)
    return std::nullopt;
  if (lhs->kind != Val::Kind::Vector) {
    diag.error(lhsExpr.range.Start,
               llvm::Twine("the left operand of '@' must be a vector when its right "
                           "operand is a matrix param, found ") +
                   lhs->describe(),
               lhsExpr.range);
    return std::nullopt;
  }
  if (lhs->size != w.size) {
    diag.error(expr.opLoc,
               "size mismatch in '@': '" + rhsExpr.name + "' is [" + llvm::Twine(w.size) +
                   ", " + llvm::Twine(w.cols) + "], so v @ " + rhsExpr.name +
                   " needs a left operand of size " + llvm::Twine(w.size) + "; found " +
                   llvm::Twine(lhs->size),
               {lhsExpr.range, rhsExpr.range});
    return std::nullopt;
  }
  Value result = builder.create<cell::VecmatOp>(loc(expr.opLoc), vectorType(w.cols),
                                                w.value, lhs->value);
  return Val::ofVector(result, w.cols);
}

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
