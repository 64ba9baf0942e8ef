//===- IRGen.cpp - Building cell IR from the syntax tree ------------------===//
//
// One recursive walk of the syntax tree: declarations, statements, and
// expressions with their shape checks, size errors and constant folding.
// It is over 800 lines because the walk's cases share its bindings and
// diagnostics; split, each part would take them all as arguments.
//
//===----------------------------------------------------------------------===//

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

namespace {

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

llvm::StringRef spell(const Binding &binding) {
  return binding.decl ? spell(*binding.decl) : "local";
}

enum class Fn {
  Unknown,
#define CELLC_UNARY_FN(E, name, op, value) E,
#include "compiler/Frontend/Functions.def"
  LogSigmoid,
  Heads,
  Outer,
  Cols,
  Max,
  Min,
  Sum,
  Mean,
  Chunk
};

Fn lookupFn(llvm::StringRef name) {
  return llvm::StringSwitch<Fn>(name)
#define CELLC_UNARY_FN(E, text, op, value) .Case(text, Fn::E)
#include "compiler/Frontend/Functions.def"
      .Case("logsigmoid", Fn::LogSigmoid)
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
std::string shapeText(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    text += (i ? ", " : "") + std::to_string(d);
  return text + "]";
}

/// `0, 1, ..., n - 1`: the leading dims that an expand or a reduce keeps.
SmallVector<int64_t> leadingDims(int64_t n) {
  SmallVector<int64_t> dims;
  for (int64_t d = 0; d < n; ++d)
    dims.push_back(d);
  return dims;
}

/// The functions, for messages: "sigmoid, tanh, ..., min and chunk".
std::string functionNames() {
  std::string names;
#define CELLC_UNARY_FN(E, text, op, value) names += text ", ";
#include "compiler/Frontend/Functions.def"
  return names + "logsigmoid, heads, outer, cols, max, min, sum, mean and chunk";
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
  bool assign(const Stmt &stmt);
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
  /// The sums of `large`, of `shape`, over the dims that `kept` leaves out.
  Value reduce(Value large, ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
               llvm::SMLoc at);
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
  std::optional<Val> evalReduction(const Expr &expr, Fn fn);
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

} // namespace

Location IRGen::loc(llvm::SMLoc at) {
  auto [line, col] = diag.getSourceMgr().getLineAndColumn(at, bufferId);
  return FileLineColLoc::get(fileName, line, col);
}

bool IRGen::declare(const Decl &decl, std::vector<int64_t> &shape) {
  auto [it, inserted] = scope.try_emplace(decl.ident.name);
  if (!inserted) {
    diag.error(decl.ident.range.Start,
               "'" + decl.ident.name + "' is already declared",
               decl.ident.range);
    diag.note(it->second.ident.range.Start, "first declared here",
              it->second.ident.range);
    return false;
  }
  for (const SizeExpr &size : decl.shape) {
    for (const SizeExpr::Term &term : size.terms)
      for (const Ident &symbol : term.symbols)
        usedSizes.insert(symbol.name);
    std::optional<int64_t> value = evaluateSize(size, sizes, diag);
    if (!value)
      return false;
    shape.push_back(*value);
  }
  // Each size is bounded (kMaxSize); their product, the elements, must also
  // count in int64 bytes where the plan and the runtime count them.
  std::optional<int64_t> elements = checkedProduct(shape);
  if (!elements || !checkedMul(*elements, 8)) {
    std::string dims;
    for (int64_t d : shape)
      dims += (dims.empty() ? "" : " x ") + std::to_string(d);
    diag.error(decl.ident.range.Start,
               "'" + decl.ident.name + "' has " + dims +
                   " elements, more than int64 counts in bytes",
               decl.range);
    return false;
  }
  if (decl.kind == DeclKind::Input && shape.size() != 1) {
    diag.error(decl.ident.range.Start,
               "input '" + decl.ident.name +
                   "' must be a vector [n]; only params and states can have more dims",
               decl.range);
    return false;
  }
  if (shape.size() == 3 && shape[0] == 0) {
    diag.error(decl.ident.range.Start,
               "param '" + decl.ident.name + "' has no blocks: [G, M, N] needs G >= 1",
               decl.range);
    return false;
  }
  Binding &binding = it->second;
  binding.ident = decl.ident;
  binding.decl = decl.kind;
  switch (decl.kind) {
  case DeclKind::Input:
    inputs.push_back(decl.ident.name);
    break;
  case DeclKind::State:
    states.push_back(decl.ident.name);
    break;
  case DeclKind::Param:
    params.push_back(decl.ident.name);
    break;
  }
  return true;
}

OwningOpRef<ModuleOp> IRGen::build(const CellAST &cell) {
  llvm::SourceMgr &sm = diag.getSourceMgr();
  bufferId = sm.FindBufferContainingLoc(cell.ident.range.Start);
  if (bufferId == 0)
    bufferId = sm.getMainFileID();
  fileName = builder.getStringAttr(
      sm.getMemoryBuffer(bufferId)->getBufferIdentifier());

  // Declarations, with their sizes bound.
  llvm::StringMap<std::vector<int64_t>> shapes;
  for (const Decl &decl : cell.decls) {
    std::vector<int64_t> shape;
    if (!declare(decl, shape))
      return nullptr;
    shapes[decl.ident.name] = std::move(shape);
  }
  if (states.empty()) {
    diag.error(cell.ident.range.Start,
               "cell '" + cell.ident.name +
                   "' declares no state; a recurrent cell needs at least one "
                   "'state'",
               cell.ident.range);
    return nullptr;
  }

  OwningOpRef<ModuleOp> module = ModuleOp::create(loc(cell.ident.range.Start));
  builder.setInsertionPointToEnd(module->getBody());
  auto strings = [&](const std::vector<std::string> &names) {
    SmallVector<StringRef> refs(names.begin(), names.end());
    return builder.getStrArrayAttr(refs);
  };
  SmallVector<NamedAttribute> sizeAttrs;
  for (const auto &[name, value] : sizes)
    sizeAttrs.push_back(builder.getNamedAttr(name, builder.getI64IntegerAttr(value)));
  auto def = builder.create<cell::DefOp>(
      loc(cell.ident.range.Start), cell.ident.name, strings(inputs),
      strings(states), builder.getStrArrayAttr({}),
      builder.getDictionaryAttr(sizeAttrs));
  // The declared dims of each state of several: a package's caller passes
  // and gets back such a state in them (kernels.json's "state_dims").
  SmallVector<NamedAttribute> stateDims;
  for (const std::string &name : states)
    if (shapes[name].size() > 1)
      stateDims.push_back(
          builder.getNamedAttr(name, builder.getDenseI64ArrayAttr(shapes[name])));
  if (!stateDims.empty())
    def->setAttr("state_dims", builder.getDictionaryAttr(stateDims));
  Block *body = builder.createBlock(&def.getBody());
  // A state of several dims, [NH, K, V], is the vector of its elements in
  // row-major order, with those dims (docs/matrix-states.md).
  for (const std::string &name : llvm::concat<const std::string>(inputs, states)) {
    Binding &binding = scope[name];
    const std::vector<int64_t> &shape = shapes[name];
    int64_t size = 1;
    for (int64_t d : shape)
      size *= d;
    binding.current = ofShape(
        body->addArgument(vectorType(size), loc(binding.ident.range.Start)), shape);
  }
  builder.setInsertionPointToStart(body);
  for (const std::string &name : params) {
    Binding &binding = scope[name];
    const std::vector<int64_t> &shape = shapes[name];
    auto type = RankedTensorType::get(shape, elementType);
    Value value = builder.create<cell::ParamOp>(loc(binding.ident.range.Start),
                                                type, name);
    if (shape.size() >= 2) {
      bool blocked = shape.size() == 3;
      binding.current.kind = Val::Kind::Matrix;
      binding.current.value = value;
      binding.current.blocks = blocked ? shape[0] : 0;
      binding.current.size = shape[blocked ? 1 : 0];
      binding.current.cols = shape[blocked ? 2 : 1];
    } else {
      binding.current = Val::ofVector(value, shape[0]);
    }
  }

  // Statements, in order.
  for (const Stmt &stmt : cell.stmts) {
    if (outputStmt) {
      diag.error(stmt.range.Start, "'output' must be the last statement",
                 stmt.range);
      diag.note(outputStmt->range.Start, "'output' is here");
      return nullptr;
    }
    bool ok = stmt.kind == Stmt::Kind::Output ? output(stmt) : assign(stmt);
    if (!ok)
      return nullptr;
  }

  SmallVector<Value> nextStates;
  for (const std::string &name : states) {
    Binding &binding = scope[name];
    if (!binding.assigned) {
      diag.error(binding.ident.range.Start,
                 "state '" + name +
                     "' is never assigned; give it its next value, as in '" +
                     name + " = ...'",
                 binding.ident.range);
      return nullptr;
    }
    nextStates.push_back(binding.current.value);
  }
  if (!outputStmt)
    outputs.emplace_back(states.front(), nextStates.front());

  std::vector<std::string> outputNames;
  SmallVector<Value> outputValues;
  for (auto &[name, value] : outputs) {
    outputNames.push_back(name);
    outputValues.push_back(value);
  }
  def.setOutputNamesAttr(strings(outputNames));
  llvm::SMLoc endLoc =
      outputStmt ? outputStmt->range.Start : cell.ident.range.Start;
  builder.create<cell::YieldOp>(loc(endLoc), nextStates, outputValues);

  // Warnings for declarations and locals that nothing reads.
  auto warnUnused = [&](const std::vector<std::string> &names) {
    for (const std::string &name : names) {
      const Binding &binding = scope[name];
      if (!binding.used)
        diag.warning(binding.ident.range.Start,
                     spell(binding) + " '" + name + "' is never used",
                     binding.ident.range);
    }
  };
  warnUnused(inputs);
  warnUnused(params);
  warnUnused(locals);
  for (const auto &[name, value] : sizes)
    if (!usedSizes.contains(name))
      diag.warning(cell.ident.range.Start,
                   "the size " + name + " = " + std::to_string(value) +
                       " is bound but cell '" + cell.ident.name + "' uses no size " + name,
                   cell.ident.range);

  // A verifier failure here is a front-end bug, but it is still reported at
  // the user's text rather than crashing.
  SourceMgrDiagnosticHandler handler(diag.getSourceMgr(), &context,
                                     diag.getStream());
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

bool IRGen::assign(const Stmt &stmt) {
  const Expr &value = *stmt.value;
  if (value.kind == Expr::Kind::Call && lookupFn(value.name) == Fn::Chunk)
    return assignChunk(stmt);
  if (stmt.names.size() > 1) {
    diag.error(stmt.names[1].range.Start,
               "assigning to " + llvm::Twine(stmt.names.size()) +
                   " names needs 'chunk(v, " + llvm::Twine(stmt.names.size()) +
                   ")' on the right",
               value.range);
    return false;
  }
  std::optional<Val> val = eval(value);
  if (!val)
    return false;
  if (val->kind == Val::Kind::Matrix) {
    diag.error(value.range.Start,
               "a matrix param can only be an operand of '@'",
               value.range);
    return false;
  }
  return bind(stmt.names[0], *val, value.range);
}

bool IRGen::assignChunk(const Stmt &stmt) {
  const Expr &call = *stmt.value;
  if (call.operands.size() != 2) {
    diag.error(call.opLoc,
               "'chunk' takes a vector and a part count, as in chunk(v, 4); "
               "found " +
                   llvm::Twine(call.operands.size()) + " arguments",
               call.range);
    return false;
  }
  const Expr &countExpr = *call.operands[1];
  if (countExpr.kind != Expr::Kind::Number || !countExpr.isInteger ||
      countExpr.number < 1 || countExpr.number > kMaxSize) {
    diag.error(countExpr.range.Start,
               "the part count of 'chunk' must be a positive integer literal",
               countExpr.range);
    return false;
  }
  int64_t count = static_cast<int64_t>(countExpr.number);
  if (count != static_cast<int64_t>(stmt.names.size())) {
    diag.error(call.opLoc,
               "'chunk' splits into " + llvm::Twine(count) + " parts but " +
                   llvm::Twine(stmt.names.size()) +
                   (stmt.names.size() == 1 ? " name is" : " names are") +
                   " assigned",
               stmt.range);
    return false;
  }
  std::optional<Val> input = evalElementwise(*call.operands[0], "'chunk'");
  if (!input)
    return false;
  if (input->kind != Val::Kind::Vector) {
    diag.error(call.operands[0]->range.Start,
               llvm::Twine("'chunk' needs a vector, found ") + input->describe(),
               call.operands[0]->range);
    return false;
  }
  if (input->size % count != 0) {
    diag.sizeError(call.opLoc,
               "cannot chunk a vector of size " + llvm::Twine(input->size) +
                   " into " + llvm::Twine(count) + " equal parts",
               call.range);
    return false;
  }
  int64_t part = input->size / count;
  SmallVector<Type> types(count, vectorType(part));
  auto chunk = builder.create<cell::ChunkOp>(loc(call.opLoc), types,
                                             input->value);
  for (auto [name, result] : llvm::zip(stmt.names, chunk.getResults()))
    if (!bind(name, Val::ofVector(result, part), call.range))
      return false;
  return true;
}

bool IRGen::bind(const Ident &ident, Val val, llvm::SMRange valueRange) {
  auto it = scope.find(ident.name);
  if (it == scope.end()) {
    Binding &binding = scope[ident.name];
    binding.ident = ident;
    binding.current = val;
    locals.push_back(ident.name);
    return true;
  }
  Binding &binding = it->second;
  if (!binding.decl) {
    diag.error(ident.range.Start,
               "'" + ident.name +
                   "' is already assigned; a local is assigned once",
               ident.range);
    diag.note(binding.ident.range.Start, "first assigned here",
              binding.ident.range);
    return false;
  }
  switch (*binding.decl) {
  case DeclKind::Input:
  case DeclKind::Param:
    diag.error(ident.range.Start,
               "cannot assign to " + spell(binding) + " '" + ident.name + "'",
               ident.range);
    diag.note(binding.ident.range.Start, "declared here", binding.ident.range);
    return false;
  case DeclKind::State:
    break;
  }
  if (binding.assigned) {
    diag.error(ident.range.Start,
               "state '" + ident.name + "' is assigned twice in one step",
               ident.range);
    diag.note(binding.assignedAt.Start, "first assigned here",
              binding.assignedAt);
    return false;
  }
  int64_t size = binding.current.size;
  const SmallVector<int64_t, 2> &dims = binding.current.dims;
  if (val.kind == Val::Kind::Scalar || val.kind == Val::Kind::PerSample) {
    val = Val::ofVector(spread(val, size, valueRange.Start), size);
  } else if (val.size != size ||
             (!dims.empty() && !val.dims.empty() && val.dims != dims)) {
    bool shaped = !dims.empty() || !val.dims.empty();
    diag.error(ident.range.Start,
               (shaped ? "shape mismatch: state '" + ident.name + "' is " +
                             shapeText(binding.current.shape()) + " but the value is " +
                             shapeText(val.shape())
                       : "size mismatch: state '" + ident.name + "' has size " +
                             llvm::Twine(size) + " but the value has size " +
                             llvm::Twine(val.size))
                   .str(),
               {ident.range, valueRange});
    return false;
  }
  // A state with dims keeps them; a plain one takes the value's. A state is
  // a value, not a column gate, whatever was assigned.
  if (!dims.empty())
    val.dims = dims;
  val.columns = false;
  binding.current = val;
  binding.assigned = true;
  binding.assignedAt = ident.range;
  return true;
}

bool IRGen::output(const Stmt &stmt) {
  for (const Ident &name : stmt.names) {
    auto it = scope.find(name.name);
    if (it == scope.end()) {
      diag.error(name.range.Start, "unknown name '" + name.name + "'",
                 name.range);
      return false;
    }
    Binding &binding = it->second;
    binding.used = true;
    if (binding.current.kind != Val::Kind::Vector) {
      diag.error(name.range.Start,
                 "output '" + name.name + "' must be a vector, found " +
                     binding.current.describe(),
                 name.range);
      return false;
    }
    outputs.emplace_back(name.name, binding.current.value);
  }
  outputStmt = &stmt;
  return true;
}

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
      assert((fn == Fn::Max || fn == Fn::Min) && "binary calls are max and min");
      return Val::ofScalar(fn == Fn::Max ? std::max(a, b) : std::min(a, b));
    }
    // Every operator is listed: a new one is a compile error here, not a
    // silent division.
    switch (op) {
#define CELLC_BINARY_OP(E, cellOp, value)                                      \
  case Expr::BinaryOp::E:                                                      \
    return Val::ofScalar(value);
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
  if (isCall) {
    if (fn == Fn::Max)
      result = builder.create<cell::MaxOp>(l, a, b);
    else
      result = builder.create<cell::MinOp>(l, a, b);
  } else {
    switch (op) {
#define CELLC_BINARY_OP(E, cellOp, value)                                      \
  case Expr::BinaryOp::E:                                                      \
    result = builder.create<cell::cellOp>(l, a, b);                            \
    break;
#include "compiler/Frontend/Functions.def"
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
                    llvm::SMLoc at) {
  int64_t size = 1;
  for (int64_t d : kept)
    size *= shape[d];
  return builder.create<cell::ReduceOp>(loc(at), vectorType(size), large,
                                        builder.getDenseI64ArrayAttr(shape),
                                        builder.getDenseI64ArrayAttr(kept));
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
    diag.error(expr.opLoc,
               "unknown function '" + expr.name + "'; the functions are " +
                   functionNames(),
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
  size_t arity = (fn == Fn::Max || fn == Fn::Min || fn == Fn::Heads || fn == Fn::Outer) ? 2 : 1;
  if (expr.operands.size() != arity) {
    diag.error(expr.opLoc,
               "'" + expr.name + "' takes " + llvm::Twine(arity) +
                   (arity == 1 ? " argument" : " arguments") + ", found " +
                   llvm::Twine(expr.operands.size()),
               expr.range);
    return std::nullopt;
  }
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
  if (arity == 2)
    return evalElementwise2(expr, what);
  if (fn == Fn::Sum || fn == Fn::Mean)
    return evalReduction(expr, fn);

  std::optional<Val> arg = evalElementwise(*expr.operands[0], what);
  if (!arg)
    return std::nullopt;
  return applyUnary(fn, *arg, loc(expr.opLoc));
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
  if (!arg->dims.empty()) {
    // Over each head's part: the last dim.
    ArrayRef<int64_t> kept = ArrayRef(arg->dims).drop_back();
    int64_t last = arg->dims.back(), count = arg->size / last;
    Value sums = reduce(arg->value, arg->dims, leadingDims(kept.size()), expr.opLoc);
    if (fn == Fn::Mean)
      sums = builder.create<cell::MulOp>(l, sums,
                                         constant(1.0 / double(last), count, expr.opLoc));
    return ofShape(sums, kept);
  }
  Value sum = builder.create<cell::SumOp>(l, vectorType(1), arg->value);
  if (fn == Fn::Mean)
    sum = builder.create<cell::MulOp>(
        l, sum, constant(1.0 / double(arg->size), 1, expr.opLoc));
  return Val::ofPerSample(sum);
}

OwningOpRef<ModuleOp> cellc::buildCellIR(MLIRContext &context,
                                         const CellAST &cell,
                                         const SizeBindings &sizes,
                                         FloatType elementType,
                                         CellDiagnostics &diag) {
  loadFrontendDialects(context);
  return IRGen(context, sizes, elementType, diag).build(cell);
}

std::string cellc::cellWarnings(llvm::StringRef source, llvm::StringRef fileName,
                               const SizeBindings &sizes) {
  MLIRContext context;
  CellSource src(source, fileName);
  OwningOpRef<ModuleOp> module =
      compileCellSource(context, sizes, Float32Type::get(&context), src.diag);
  if (!module || src.diag.getNumWarnings() == 0)
    return "";
  return src.diagnostics();
}

OwningOpRef<ModuleOp> cellc::compileCellSource(MLIRContext &context,
                                               const SizeBindings &sizes,
                                               FloatType elementType,
                                               CellDiagnostics &diag) {
  llvm::SourceMgr &sm = diag.getSourceMgr();
  llvm::StringRef buffer = sm.getMemoryBuffer(sm.getMainFileID())->getBuffer();
  Parser parser(buffer, diag);
  std::unique_ptr<CellAST> cell = parser.parseCell();
  if (!cell)
    return nullptr;
  return buildCellIR(context, *cell, sizes, elementType, diag);
}

void cellc::loadFrontendDialects(MLIRContext &context) {
  context.getOrLoadDialect<cell::CellDialect>();
}

FloatType cellc::parseElementType(MLIRContext &context, llvm::StringRef dtype) {
  Builder b(&context);
  return llvm::StringSwitch<FloatType>(dtype)
      .Case("f32", b.getF32Type())
      .Case("f64", b.getF64Type())
      .Case("f16", b.getF16Type())
      .Case("bf16", b.getBF16Type())
      .Default(FloatType());
}
