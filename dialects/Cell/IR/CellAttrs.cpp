//===- CellAttrs.cpp - The cell dialect's attributes ----------------------===//

#include "dialects/Cell/IR/CellAttrs.h"
#include "dialects/Cell/IR/CellDialect.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::cell;

#define GET_ATTRDEF_CLASSES
#include "dialects/Cell/IR/CellAttrs.cpp.inc"

void CellDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/Cell/IR/CellAttrs.cpp.inc"
      >();
}

namespace {

/// One of the words of enum `E`, as a bare keyword.
template <typename E>
FailureOr<E> parseWord(AsmParser &parser, const char *what) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef word;
  if (parser.parseKeyword(&word))
    return failure();
  if (std::optional<E> value = cellc::parse<E>(word.str()))
    return *value;
  return parser.emitError(loc) << "unknown " << what << " '" << word
                               << "'; expected " << cellc::Words<E>::expected();
}

/// The fields after the kind and name: `, input = "x", biases = [...],
/// same_as = N, zero`, each optional, in that order.
struct Fields {
  std::string input;
  SmallVector<std::string> biases;
  int64_t sameAs = -1;
  bool zero = false;
};

ParseResult parseFields(AsmParser &parser, Fields &fields, bool extended) {
  while (succeeded(parser.parseOptionalComma())) {
    StringRef key;
    SMLoc loc = parser.getCurrentLocation();
    if (parser.parseKeyword(&key))
      return failure();
    if (key == "input") {
      if (parser.parseEqual() || parser.parseString(&fields.input))
        return failure();
    } else if (key == "biases") {
      if (parser.parseEqual() ||
          parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
            return parser.parseString(&fields.biases.emplace_back());
          }))
        return failure();
    } else if (extended && key == "same_as") {
      if (parser.parseEqual() || parser.parseInteger(fields.sameAs))
        return failure();
    } else if (extended && key == "zero") {
      fields.zero = true;
    } else {
      return parser.emitError(loc) << "unknown field '" << key << "'";
    }
  }
  return success();
}

void printFields(AsmPrinter &printer, StringRef input, ArrayRef<StringAttr> biases,
                 int64_t sameAs, bool zero) {
  if (!input.empty())
    printer << ", input = \"" << input << "\"";
  if (!biases.empty()) {
    printer << ", biases = [";
    llvm::interleaveComma(biases, printer,
                          [&](StringAttr b) { printer << b; });
    printer << "]";
  }
  if (sameAs >= 0)
    printer << ", same_as = " << sameAs;
  if (zero)
    printer << ", zero";
}

SmallVector<StringAttr> attrs(MLIRContext *ctx, ArrayRef<std::string> strings) {
  return llvm::to_vector(llvm::map_range(strings, [&](const std::string &s) {
    return StringAttr::get(ctx, s);
  }));
}

} // namespace

Attribute KernelArgAttr::parse(AsmParser &parser, Type) {
  std::string name;
  Fields fields;
  FailureOr<cellc::ArgKind> kind = failure();
  if (parser.parseLess() ||
      failed(kind = parseWord<cellc::ArgKind>(parser, "kernel argument kind")) ||
      parser.parseString(&name) || parseFields(parser, fields, true) ||
      parser.parseGreater())
    return {};
  return KernelArgAttr::getChecked(
      [&] { return parser.emitError(parser.getNameLoc()); }, parser.getContext(),
      *kind, name, fields.input, attrs(parser.getContext(), fields.biases), fields.sameAs, fields.zero);
}

void KernelArgAttr::print(AsmPrinter &printer) const {
  printer << "<" << cellc::name(getKind()) << " \"" << getName() << "\"";
  printFields(printer, getInput(), getBiases(), getSameAs(), getZero());
  printer << ">";
}

LogicalResult KernelArgAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                    cellc::ArgKind kind, StringRef name,
                                    StringRef input, ArrayRef<StringAttr> biases,
                                    int64_t sameAs, bool zero) {
  if (name.empty())
    return emitError() << "expects a name";
  if (kind != cellc::ArgKind::Projection && (!input.empty() || !biases.empty()))
    return emitError() << "expects input and biases only on a projection";
  if ((sameAs >= 0 || zero) && !cellc::isBackwardResult(kind))
    return emitError() << "expects same_as and zero only on backward results";
  return success();
}

Attribute GradResultAttr::parse(AsmParser &parser, Type) {
  std::string name;
  Fields fields;
  FailureOr<cellc::GradKind> kind = failure();
  if (parser.parseLess() ||
      failed(kind = parseWord<cellc::GradKind>(parser, "gradient kind")) ||
      parser.parseString(&name) || parseFields(parser, fields, false) ||
      parser.parseGreater())
    return {};
  return GradResultAttr::getChecked(
      [&] { return parser.emitError(parser.getNameLoc()); }, parser.getContext(),
      *kind, name, fields.input, attrs(parser.getContext(), fields.biases));
}

void GradResultAttr::print(AsmPrinter &printer) const {
  printer << "<" << cellc::name(getKind()) << " \"" << getName() << "\"";
  printFields(printer, getInput(), getBiases(), -1, false);
  printer << ">";
}

LogicalResult GradResultAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                     cellc::GradKind kind, StringRef name,
                                     StringRef input, ArrayRef<StringAttr> biases) {
  if (name.empty())
    return emitError() << "expects a name";
  if (kind != cellc::GradKind::Projection && (!input.empty() || !biases.empty()))
    return emitError() << "expects input and biases only on a projection";
  if (kind == cellc::GradKind::Projection && input.empty())
    return emitError() << "expects a projection to name its input";
  return success();
}
