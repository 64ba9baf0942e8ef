//===- IRGenImpl.h - What the front end's IR builder shares -----*- C++ -*-===//
//
// The walk of a cell's syntax tree that builds its cell IR: the values it
// evaluates (Val), what a name is bound to (Binding), and the IRGen class
// whose methods are written in IRGen.cpp (declarations, statements, the
// cell), IRGenExpr.cpp (expressions, with their shape checks, size errors
// and folding) and IRGenCall.cpp (calls). Private to compiler/Frontend.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_FRONTEND_IRGENIMPL_H
#define CELLC_COMPILER_FRONTEND_IRGENIMPL_H

#include "compiler/Frontend/IRGen.h"

#include "compiler/Frontend/Parser.h"
#include "dialects/Cell/IR/CellOps.h"
#include "dialects/Cell/IR/Checked.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <cmath>
#include <iterator>

using namespace cellc;
using namespace mlir;

namespace cellc::irgen {

using namespace mlir;

/// What an expression evaluates to while the cell is checked.
struct Val {
  /// PerSample: one value per sample (a reduction, and what is computed
  /// from it), held as a vector of size 1 and broadcast where it meets a
  /// vector.
  enum class Kind { Scalar, Vector, PerSample, Matrix };
  Kind kind = Kind::Scalar;
  /// Scalar: the folded value of a literal expression.
  double scalar = 0;
  /// Vector, PerSample and Matrix: the IR value.
  Value value;
  /// Vector: its size (PerSample: 1). Matrix: rows and cols; of each block
  /// when `blocks` is set (a block-diagonal [G, M, N] param).
  int64_t size = 0, cols = 0, blocks = 0;
  /// Vector: its heads' dims, `[NH, n / NH]` from `heads(v, NH)`, held in
  /// row-major order; empty for a plain vector.
  SmallVector<int64_t, 2> dims;
  /// Vector, from `cols(g)`: g [..., N] scales the columns of the matrix
  /// [..., M, N] it meets, rather than broadcasting over its last dims.
  bool columns = false;

  /// A vector's shape: its dims, or `[size]`.
  SmallVector<int64_t, 2> shape() const {
    return dims.empty() ? SmallVector<int64_t, 2>{size} : dims;
  }

  static Val ofScalar(double v) {
    Val val;
    val.scalar = v;
    return val;
  }
  static Val ofVector(Value v, int64_t size) {
    Val val;
    val.kind = Kind::Vector;
    val.value = v;
    val.size = size;
    return val;
  }
  static Val ofPerSample(Value v) {
    Val val = ofVector(v, 1);
    val.kind = Kind::PerSample;
    return val;
  }
  /// What the value is, for messages.
  const char *describe() const {
    static constexpr const char *words[] = {
        "a constant", "a vector",
        "one value per sample (from 'sum' or 'mean')", "a matrix"};
    static_assert(std::size(words) == size_t(Kind::Matrix) + 1);
    return words[size_t(kind)];
  }
};

/// A name in the cell's scope.
struct Binding {
  /// How it was declared; none: a local.
  std::optional<DeclKind> decl;
  Ident ident;
  /// Its current value. A state's is the previous step's until assigned.
  Val current;
  bool used = false;
  /// States: whether, and where, the next value was assigned.
  bool assigned = false;
  llvm::SMRange assignedAt;
};

inline llvm::StringRef spell(const Binding &binding) {
  return binding.decl ? spell(*binding.decl) : "local";
}

enum class Fn {
  Unknown,
#define CELLC_UNARY_FN(E, name, op, value) E,
#include "compiler/Frontend/Functions.def"
  LogSigmoid,
  Pow,
  Where,
  Clamp,
  Softmax,
  LogSumExp,
  Heads,
  Outer,
  Cols,
  Max,
  Min,
  Sum,
  Mean,
  Chunk
};

inline Fn lookupFn(llvm::StringRef name) {
  return llvm::StringSwitch<Fn>(name)
#define CELLC_UNARY_FN(E, text, op, value) .Case(text, Fn::E)
#include "compiler/Frontend/Functions.def"
      .Case("logsigmoid", Fn::LogSigmoid)
      .Case("pow", Fn::Pow)
      .Case("where", Fn::Where)
      .Case("clamp", Fn::Clamp)
      .Case("softmax", Fn::Softmax)
      .Case("logsumexp", Fn::LogSumExp)
      .Case("heads", Fn::Heads)
      .Case("outer", Fn::Outer)
      .Case("cols", Fn::Cols)
      .Case("max", Fn::Max)
      .Case("min", Fn::Min)
      .Case("sum", Fn::Sum)
      .Case("mean", Fn::Mean)
      .Case("chunk", Fn::Chunk)
      .Default(Fn::Unknown);
}

/// A shape as messages print it: "[2, 3, 4]".
inline std::string shapeText(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    text += (i ? ", " : "") + std::to_string(d);
  return text + "]";
}

/// `0, 1, ..., n - 1`: the leading dims that an expand or a reduce keeps.
inline SmallVector<int64_t> leadingDims(int64_t n) {
  SmallVector<int64_t> dims;
  for (int64_t d = 0; d < n; ++d)
    dims.push_back(d);
  return dims;
}

/// Every function's name.
inline std::vector<llvm::StringRef> functionList() {
  return {
#define CELLC_UNARY_FN(E, text, op, value) text,
#include "compiler/Frontend/Functions.def"
      "logsigmoid", "pow", "where", "clamp", "softmax", "logsumexp", "heads", "outer",
      "cols", "max", "min", "sum", "mean", "chunk"};
}

/// The functions, for messages: "sigmoid, tanh, ..., min and chunk".
inline std::string functionNames() {
  std::string names;
#define CELLC_UNARY_FN(E, text, op, value) names += text ", ";
#include "compiler/Frontend/Functions.def"
  return names + "logsigmoid, pow, where, clamp, heads, outer, cols, max, min, sum, mean, "
                 "softmax, logsumexp and chunk";
}

class IRGen {
public:
  IRGen(MLIRContext &context, const SizeBindings &sizes, FloatType elementType,
        CellDiagnostics &diag)
      : context(context), builder(&context), sizes(sizes),
        elementType(elementType), diag(diag) {}

  OwningOpRef<ModuleOp> build(const CellAST &cell);

private:
  Location loc(llvm::SMLoc at);
  RankedTensorType vectorType(int64_t size) {
    return RankedTensorType::get({size}, elementType);
  }
  Value constant(double v, int64_t size, llvm::SMLoc at) {
    return builder.create<cell::ConstantOp>(loc(at), vectorType(size),
                                            builder.getF64FloatAttr(v));
  }
  /// `val` (a constant, a vector of `size` or a per-sample value) as a
  /// vector of `size`.
  Value spread(const Val &val, int64_t size, llvm::SMLoc at) {
    switch (val.kind) {
    case Val::Kind::Scalar:
      return constant(val.scalar, size, at);
    case Val::Kind::PerSample:
      if (size == 1)
        return val.value;
      return builder.create<cell::BroadcastOp>(loc(at), vectorType(size), val.value);
    case Val::Kind::Vector:
    case Val::Kind::Matrix:
      break;
    }
    return val.value;
  }

  bool declare(const Decl &decl, std::vector<int64_t> &shape);
  bool assignment(const Stmt &stmt);
  bool assignChunk(const Stmt &stmt);
  bool bind(const Ident &ident, Val val, llvm::SMRange valueRange);
  bool output(const Stmt &stmt);

  std::optional<Val> eval(const Expr &expr);
  /// The binding of a name expression, marked used; an error if unknown.
  Binding *use(const Expr &name);
  std::optional<Val> evalName(const Expr &expr);
  std::optional<Val> evalBinary(const Expr &expr);
  std::optional<Val> evalMatvec(const Expr &expr);
  /// `v @ W`: the transpose of matrix param W times the vector v.
  std::optional<Val> evalVecmat(const Expr &expr);
  /// `heads(v, NH)`: v seen as NH heads of equal parts.
  std::optional<Val> evalHeads(const Expr &expr);
  /// `outer(a, b)`: the outer product of two vectors, per head.
  std::optional<Val> evalOuter(const Expr &expr);
  /// `A @ b` and `b @ A` with A a per-sample matrix (a value with dims).
  std::optional<Val> evalSampleProduct(const Expr &expr, const Val &lhs, const Val &rhs);
  /// `small` repeated along the dims of `shape` that `kept` leaves out.
  Value expand(Value small, ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
               llvm::SMLoc at);
  /// The sums of `large`, of `shape`, over the dims that `kept` leaves out
  /// (or their max or min: `combine`).
  Value reduce(Value large, ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
               llvm::SMLoc at, llvm::StringRef combine = "sum");
  /// A vector of `shape`: plain for one dim, else with those dims.
  Val ofShape(Value value, ArrayRef<int64_t> shape);
  /// "shape mismatch in `what`: the left operand is [..], the right [..];
  /// `rule`", at the operator of the binary `expr` or call of two.
  void shapeMismatch(const Expr &expr, llvm::StringRef what, ArrayRef<int64_t> lhs,
                     ArrayRef<int64_t> rhs, llvm::StringRef rule) {
    diag.error(expr.opLoc,
               "shape mismatch in " + what + ": the left operand is " + shapeText(lhs) +
                   ", the right " + shapeText(rhs) + "; " + rule,
               {expr.operands[0]->range, expr.operands[1]->range});
  }
  std::optional<Val> evalCall(const Expr &expr);
  Val applyUnary(Fn fn, Val arg, Location l);
  /// `x ** n` for an integer n, as products (exact for any x).
  Value integerPower(Value x, int64_t n, llvm::SMLoc at);
  /// sum, mean, max and min of one argument, softmax and logsumexp: over a
  /// vector's units, or each head's.
  std::optional<Val> evalReduction(const Expr &expr, Fn fn);
  /// `where(c, a, b)`, `clamp(x, lo, hi)`.
  std::optional<Val> evalWhere(const Expr &expr);
  std::optional<Val> evalClamp(const Expr &expr);
  /// A call `name(x, y)` at `call`, standing for two operands of it, for
  /// the messages of the elementwise code that combines them.
  static std::unique_ptr<Expr> pairAt(const Expr &call, const Expr &x, const Expr &y,
                                      llvm::StringRef name);
  /// The function whose name is nearest `name` (a slip of a letter or two),
  /// or nothing.
  static std::string nearestFunction(llvm::StringRef name);
  /// Evaluates an operand of an elementwise operation: a scalar or a vector.
  std::optional<Val> evalElementwise(const Expr &expr, llvm::StringRef what);
  /// Builds an elementwise binary op on two operands, broadcasting literals.
  /// The two operands of `expr`, element-wise, combined by `elementwise`.
  std::optional<Val> evalElementwise2(const Expr &expr, const std::string &what);
  std::optional<std::pair<Val, Val>> broadcastHeads(const Expr &expr, const Val &lhs,
                                                    const Val &rhs, llvm::StringRef what);
  std::optional<Val> elementwise(const Expr &expr, const Val &lhs,
                                 const Val &rhs, llvm::StringRef what);

  MLIRContext &context;
  OpBuilder builder;
  const SizeBindings &sizes;
  /// The sizes that the cell reads: in a declaration, an expression or a
  /// count. A binding that none reads is warned of (a misspelt -D).
  llvm::StringSet<> usedSizes;
  FloatType elementType;
  CellDiagnostics &diag;
  unsigned bufferId = 0;
  StringAttr fileName;

  llvm::StringMap<Binding> scope;
  /// Declarations in order, as keys into `scope`.
  std::vector<std::string> inputs, states, params;
  std::vector<std::string> locals;
  std::vector<std::pair<std::string, Value>> outputs;
  const Stmt *outputStmt = nullptr;
};

} // namespace cellc::irgen

#endif // CELLC_COMPILER_FRONTEND_IRGENIMPL_H
