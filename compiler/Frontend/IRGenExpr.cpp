//===- IRGenExpr.cpp - Building cell IR from expressions -----------------===//
//
// The expressions of a cell: names, element-wise operations with their
// broadcasting, products (matvec, vecmat, per-sample) and heads, each with
// its shape checks, size errors and constant folding (the calls are in
// IRGenCall.cpp).
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
