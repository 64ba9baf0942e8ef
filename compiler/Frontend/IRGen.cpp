//===- IRGen.cpp - Building cell IR from the syntax tree ------------------===//
//
// The walk of the syntax tree, its declarations and statements: the cell's
// bindings, assignments, chunks and outputs, and the cell.def they build.
// Expressions are IRGenExpr.cpp's and IRGenCall.cpp's.
//
//===----------------------------------------------------------------------===//

#include "compiler/Frontend/IRGenImpl.h"

using namespace cellc;
using namespace cellc::irgen;
using namespace mlir;

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
    bool ok = stmt.kind == Stmt::Kind::Output ? output(stmt) : assignment(stmt);
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

bool IRGen::assignment(const Stmt &stmt) {
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
