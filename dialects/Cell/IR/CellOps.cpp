//===- CellOps.cpp - The cell dialect's operations ------------------------===//

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::cell;

//===----------------------------------------------------------------------===//
// Custom directives
//===----------------------------------------------------------------------===//

/// `: T` for ops whose operands and result share the type T.
static ParseResult parseSameType(OpAsmParser &parser, Type &lhs, Type &rhs,
                                 Type &result) {
  if (parser.parseType(result))
    return failure();
  lhs = rhs = result;
  return success();
}

static void printSameType(OpAsmPrinter &printer, Operation *, Type, Type,
                          Type result) {
  printer << result;
}

#define GET_OP_CLASSES
#include "dialects/Cell/IR/CellOps.cpp.inc"

//===----------------------------------------------------------------------===//
// DefOp
//===----------------------------------------------------------------------===//

/// Parses `name(%a : T, ...)` and appends the arguments and their names.
static ParseResult
parseNamedArgs(OpAsmParser &parser, StringRef keyword,
               SmallVectorImpl<OpAsmParser::Argument> &args,
               SmallVectorImpl<Attribute> &names) {
  if (parser.parseKeyword(keyword))
    return failure();
  size_t first = args.size();
  if (parser.parseArgumentList(args, OpAsmParser::Delimiter::Paren,
                               /*allowType=*/true))
    return failure();
  for (auto &arg : llvm::drop_begin(args, first))
    names.push_back(
        parser.getBuilder().getStringAttr(arg.ssaName.name.drop_front()));
  return success();
}

ParseResult DefOp::parse(OpAsmParser &parser, OperationState &result) {
  Builder &builder = parser.getBuilder();
  StringAttr name;
  if (parser.parseSymbolName(name, SymbolTable::getSymbolAttrName(),
                             result.attributes))
    return failure();

  SmallVector<OpAsmParser::Argument> args;
  SmallVector<Attribute> inputNames, stateNames, outputNames;
  if (parseNamedArgs(parser, "inputs", args, inputNames) ||
      parseNamedArgs(parser, "states", args, stateNames))
    return failure();

  if (parser.parseKeyword("outputs") || parser.parseLParen())
    return failure();
  if (failed(parser.parseOptionalRParen())) {
    do {
      std::string out;
      if (parser.parseString(&out))
        return failure();
      outputNames.push_back(builder.getStringAttr(out));
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseRParen())
      return failure();
  }

  result.addAttribute(getInputNamesAttrName(result.name),
                      builder.getArrayAttr(inputNames));
  result.addAttribute(getStateNamesAttrName(result.name),
                      builder.getArrayAttr(stateNames));
  result.addAttribute(getOutputNamesAttrName(result.name),
                      builder.getArrayAttr(outputNames));
  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  return parser.parseRegion(*result.addRegion(), args);
}

void DefOp::print(OpAsmPrinter &p) {
  p << ' ';
  p.printSymbolName(getSymName());
  auto printArgs = [&](StringRef keyword, Block::BlockArgListType args) {
    p << ' ' << keyword << '(';
    llvm::interleaveComma(args, p, [&](BlockArgument arg) {
      p.printRegionArgument(arg);
    });
    p << ')';
  };
  printArgs("inputs", getInputs());
  printArgs("states", getStates());
  p << " outputs(";
  llvm::interleaveComma(getOutputNames().getAsValueRange<StringAttr>(), p,
                        [&](StringRef name) { p.printString(name); });
  p << ')';
  p.printOptionalAttrDictWithKeyword(
      (*this)->getAttrs(),
      {getSymNameAttrName(), getInputNamesAttrName(), getStateNamesAttrName(),
       getOutputNamesAttrName()});
  p << ' ';
  p.printRegion(getBody(), /*printEntryBlockArgs=*/false);
}

void DefOp::getAsmBlockArgumentNames(Region &region,
                                     OpAsmSetValueNameFn setNameFn) {
  if (region.empty())
    return;
  auto args = region.front().getArguments();
  SmallVector<StringRef> names(getInputNames().getAsValueRange<StringAttr>());
  llvm::append_range(names, getStateNames().getAsValueRange<StringAttr>());
  for (auto [arg, name] : llvm::zip(args, names))
    setNameFn(arg, name);
}

YieldOp DefOp::getYield() {
  return dyn_cast<YieldOp>(getBody().front().getTerminator());
}

/// Whether `type` is a static 1-D float tensor.
static bool isVector(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && tensor.hasStaticShape() && tensor.getRank() == 1 &&
         isa<FloatType>(tensor.getElementType());
}

LogicalResult DefOp::verify() {
  Block &body = getBody().front();
  size_t numInputs = getInputNames().size();
  size_t numStates = getStateNames().size();
  if (body.getNumArguments() != numInputs + numStates)
    return emitOpError("expects ")
           << numInputs + numStates
           << " body arguments (input_names then state_names), got "
           << body.getNumArguments();
  if (numStates == 0)
    return emitOpError("expects at least one state");

  Type elementType;
  for (BlockArgument arg : body.getArguments()) {
    if (!isVector(arg.getType()))
      return emitOpError("expects body argument #")
             << arg.getArgNumber() << " to be a static 1-D float tensor, got "
             << arg.getType();
    Type argElement = cast<RankedTensorType>(arg.getType()).getElementType();
    if (!elementType)
      elementType = argElement;
    else if (argElement != elementType)
      return emitOpError("expects all body arguments to have element type ")
             << elementType << ", got " << argElement << " for argument #"
             << arg.getArgNumber();
  }

  YieldOp yield = getYield();
  if (!yield)
    return emitOpError("expects the body to end in 'cell.yield'");
  if (yield.getStates().size() != numStates)
    return yield.emitOpError("expects ")
           << numStates << " states, got " << yield.getStates().size();
  for (auto [i, next, prev] :
       llvm::enumerate(yield.getStates(), getStates())) {
    if (next.getType() != prev.getType())
      return yield.emitOpError("expects state #")
             << i << " ('"
             << cast<StringAttr>(getStateNames()[i]).getValue()
             << "') to have type " << prev.getType() << ", got "
             << next.getType();
  }
  if (yield.getOutputs().size() != getOutputNames().size())
    return yield.emitOpError("expects ")
           << getOutputNames().size() << " outputs (output_names), got "
           << yield.getOutputs().size();
  return success();
}

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (getName().empty())
    return emitOpError("expects a non-empty name");
  return success();
}

//===----------------------------------------------------------------------===//
// ConstantOp
//===----------------------------------------------------------------------===//

OpFoldResult ConstantOp::fold(FoldAdaptor) {
  auto type = cast<RankedTensorType>(getType());
  auto element = FloatAttr::get(type.getElementType(), getValue());
  return SplatElementsAttr::get(type, ArrayRef<Attribute>(element));
}

//===----------------------------------------------------------------------===//
// MatvecOp
//===----------------------------------------------------------------------===//

/// Checks `weight @ vector -> result`, transposed when `transpose` is set. A
/// 3-D weight `[G, M, N]` is block-diagonal: the vector and the result hold
/// G parts, one a block.
static LogicalResult verifyMatrixProduct(Operation *op, Value weightValue,
                                         Value vectorValue, Value resultValue,
                                         bool transpose) {
  auto weight = cast<RankedTensorType>(weightValue.getType());
  auto vector = cast<RankedTensorType>(vectorValue.getType());
  auto result = cast<RankedTensorType>(resultValue.getType());
  if (weight.getRank() != 2 && weight.getRank() != 3)
    return op->emitOpError("expects weight to be a matrix, got ") << weight;
  if (vector.getRank() != 1)
    return op->emitOpError("expects vector to be 1-D, got ") << vector;
  int64_t rank = weight.getRank();
  int64_t blocks = rank == 3 ? weight.getDimSize(0) : 1;
  int64_t rows = weight.getDimSize(rank - 2), cols = weight.getDimSize(rank - 1);
  int64_t in = blocks * (transpose ? rows : cols);
  int64_t out = blocks * (transpose ? cols : rows);
  std::string of = rank == 3 ? "weight's " + std::to_string(blocks) + " blocks"
                             : std::string("weight");
  StringRef inName = transpose ? "rows" : "columns";
  StringRef outName = transpose ? "columns" : "rows";
  if (in != vector.getDimSize(0))
    return op->emitOpError("expects the ")
           << inName << " of " << of << " (" << in << ") to equal the size of vector ("
           << vector.getDimSize(0) << ")";
  if (out != result.getDimSize(0))
    return op->emitOpError("expects the size of result (")
           << result.getDimSize(0) << ") to equal the " << outName << " of " << of
           << " (" << out << ")";
  if (weight.getElementType() != vector.getElementType() ||
      weight.getElementType() != result.getElementType())
    return op->emitOpError("expects weight, vector and result to share an "
                           "element type, got ")
           << weight.getElementType() << ", " << vector.getElementType()
           << " and " << result.getElementType();
  return success();
}

LogicalResult MatvecOp::verify() {
  return verifyMatrixProduct(*this, getWeight(), getVector(), getResult(),
                             /*transpose=*/false);
}

//===----------------------------------------------------------------------===//
// ChunkOp
//===----------------------------------------------------------------------===//

LogicalResult ChunkOp::verify() {
  auto input = cast<RankedTensorType>(getInput().getType());
  if (getResults().empty())
    return emitOpError("expects at least one result");
  Type first = getResults().front().getType();
  for (Value result : getResults())
    if (result.getType() != first)
      return emitOpError("expects all results to have one type, got ")
             << first << " and " << result.getType();
  auto part = cast<RankedTensorType>(first);
  if (part.getElementType() != input.getElementType())
    return emitOpError("expects results to have the element type of input (")
           << input.getElementType() << "), got " << part.getElementType();
  int64_t count = getResults().size();
  if (part.getDimSize(0) * count != input.getDimSize(0))
    return emitOpError("expects ")
           << count << " results of size " << part.getDimSize(0)
           << " to cover input of size " << input.getDimSize(0);
  return success();
}

//===----------------------------------------------------------------------===//
// SumOp and BroadcastOp
//===----------------------------------------------------------------------===//

/// Checks that `from` and `to` share an element type and that `single` (one
/// of them) has size 1.
static LogicalResult verifyPerSample(Operation *op, Value single, StringRef what) {
  auto from = cast<RankedTensorType>(op->getOperand(0).getType());
  auto to = cast<RankedTensorType>(op->getResult(0).getType());
  if (from.getElementType() != to.getElementType())
    return op->emitOpError("expects input and result to share an element type, got ")
           << from.getElementType() << " and " << to.getElementType();
  if (cast<RankedTensorType>(single.getType()).getDimSize(0) != 1)
    return op->emitOpError("expects ")
           << what << " to hold one value per sample (size 1), got "
           << single.getType();
  return success();
}

LogicalResult SumOp::verify() { return verifyPerSample(*this, getResult(), "the result"); }

LogicalResult BroadcastOp::verify() {
  return verifyPerSample(*this, getInput(), "the input");
}

/// Checks an expand's or a reduce's `shape` and `kept` against its `full`
/// (the shape's) and `part` (the kept dims') values.
static LogicalResult verifyShapeAndKept(Operation *op, ArrayRef<int64_t> shape,
                                        ArrayRef<int64_t> kept, Value full, Value part) {
  auto from = cast<RankedTensorType>(op->getOperand(0).getType());
  auto to = cast<RankedTensorType>(op->getResult(0).getType());
  if (from.getElementType() != to.getElementType())
    return op->emitOpError("expects input and result to share an element type, got ")
           << from.getElementType() << " and " << to.getElementType();
  if (shape.empty())
    return op->emitOpError("expects a shape of at least one dim");
  int64_t whole = 1, keptElements = 1;
  for (int64_t d : shape) {
    if (d < 1)
      return op->emitOpError("expects dims of at least 1, got ") << d;
    whole *= d;
  }
  int64_t previous = -1;
  for (int64_t k : kept) {
    if (k <= previous || k >= int64_t(shape.size()))
      return op->emitOpError("expects kept dims increasing within the shape's ")
             << shape.size() << " dims";
    previous = k;
    keptElements *= shape[k];
  }
  int64_t fullSize = cast<RankedTensorType>(full.getType()).getDimSize(0);
  int64_t partSize = cast<RankedTensorType>(part.getType()).getDimSize(0);
  if (fullSize != whole)
    return op->emitOpError("expects the shape's ") << whole << " elements, got " << fullSize;
  if (partSize != keptElements)
    return op->emitOpError("expects the kept dims' ")
           << keptElements << " elements, got " << partSize;
  return success();
}

int64_t mlir::cell::keptIndex(ArrayRef<int64_t> shape, ArrayRef<int64_t> kept,
                              int64_t flat) {
  SmallVector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  int64_t at = 0;
  for (int64_t k : kept)
    at = at * shape[k] + index[k];
  return at;
}

LogicalResult ExpandOp::verify() {
  return verifyShapeAndKept(*this, getShape(), getKept(), getResult(), getInput());
}

LogicalResult ReduceOp::verify() {
  StringRef combine = getCombine();
  if (combine != "sum" && combine != "max" && combine != "min")
    return emitOpError("expects combine to be sum, max or min, got '") << combine << "'";
  return verifyShapeAndKept(*this, getShape(), getKept(), getInput(), getResult());
}

Combine ReduceOp::getCombineKind() {
  StringRef combine = getCombine();
  return combine == "max" ? Combine::Max : combine == "min" ? Combine::Min : Combine::Sum;
}

//===----------------------------------------------------------------------===//
// Binary elementwise ops
//===----------------------------------------------------------------------===//

static LogicalResult verifyBinary(Operation *op) {
  Type lhs = op->getOperand(0).getType(), rhs = op->getOperand(1).getType(),
       result = op->getResult(0).getType();
  if (lhs != rhs)
    return op->emitOpError("expects lhs and rhs to have one type, got ")
           << lhs << " and " << rhs;
  if (result != lhs)
    return op->emitOpError("expects result to have the type of lhs and rhs (")
           << lhs << "), got " << result;
  return success();
}

LogicalResult AddOp::verify() { return verifyBinary(*this); }
LogicalResult SubOp::verify() { return verifyBinary(*this); }
LogicalResult MulOp::verify() { return verifyBinary(*this); }
LogicalResult DivOp::verify() { return verifyBinary(*this); }
LogicalResult MaxOp::verify() { return verifyBinary(*this); }
LogicalResult MinOp::verify() { return verifyBinary(*this); }
LogicalResult GreaterOp::verify() { return verifyBinary(*this); }
LogicalResult PowOp::verify() { return verifyBinary(*this); }


//===----------------------------------------------------------------------===//
// ProjectionOp
//===----------------------------------------------------------------------===//

LogicalResult ProjectionOp::verify() {
  if (failed(verifyMatrixProduct(*this, getWeight(), getVector(), getResult(),
                                 /*transpose=*/false)))
    return failure();
  for (auto [i, bias] : llvm::enumerate(getBiases()))
    if (bias.getType() != getType())
      return emitOpError("expects bias #")
             << i << " to have the result's type " << getType() << ", got "
             << bias.getType();
  return success();
}

LogicalResult VecmatOp::verify() {
  return verifyMatrixProduct(*this, getWeight(), getVector(), getResult(),
                             /*transpose=*/true);
}

//===----------------------------------------------------------------------===//
// ConcatOp
//===----------------------------------------------------------------------===//

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("expects at least one input");
  Type first = getInputs().front().getType();
  for (Value input : getInputs())
    if (input.getType() != first)
      return emitOpError("expects all inputs to have one type, got ")
             << first << " and " << input.getType();
  auto part = cast<RankedTensorType>(first);
  auto result = cast<RankedTensorType>(getType());
  int64_t total = part.getDimSize(0) * getInputs().size();
  if (result.getElementType() != part.getElementType() ||
      result.getDimSize(0) != total)
    return emitOpError("expects result type ")
           << RankedTensorType::get({total}, part.getElementType()) << ", got "
           << result;
  return success();
}

//===----------------------------------------------------------------------===//
// RestoreOp
//===----------------------------------------------------------------------===//

LogicalResult RestoreOp::verify() {
  auto yield = dyn_cast<RestoreYieldOp>(getBody().front().getTerminator());
  if (!yield)
    return emitOpError("expects the body to end in 'cell.restore_yield'");
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("expects the body to yield the result types");
  return success();
}
