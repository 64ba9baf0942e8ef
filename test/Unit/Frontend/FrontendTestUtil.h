//===- FrontendTestUtil.h - Shared setup for front-end unit tests -*- C++ -*-===//

#ifndef CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H
#define CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H

#include "compiler/Frontend/Diagnostics.h"
#include "compiler/Frontend/IRGen.h"
#include "compiler/Frontend/Parser.h"


#include <memory>
#include <string>

namespace cellc::testing {

/// A source buffer named `test.cell`, with its diagnostics collected.
struct Source : CellSource {
  explicit Source(llvm::StringRef text) : CellSource(text, "test.cell") {}

  llvm::StringRef buffer() const { return text(); }

  std::unique_ptr<CellAST> parse() {
    Parser parser(text(), diag);
    return parser.parseCell();
  }

  /// Parses the cell and builds its IR at `sizes` (null after an error).
  mlir::OwningOpRef<mlir::ModuleOp> build(mlir::MLIRContext &context,
                                          const SizeBindings &sizes, mlir::FloatType type) {
    std::unique_ptr<CellAST> cell = parse();
    if (!cell)
      return nullptr;
    return buildCellIR(context, *cell, sizes, type, diag);
  }
};

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_FRONTEND_FRONTENDTESTUTIL_H
