//===- IRGen.h - Building cell IR from the syntax tree ----------*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_IRGEN_H
#define CELLC_COMPILER_FRONTEND_IRGEN_H

#include "compiler/Frontend/AST.h"
#include "compiler/Frontend/Diagnostics.h"
#include "compiler/Frontend/Sizes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace cellc {

/// Checks `cell` under the size bindings and builds a module holding one
/// `cell.def` whose values have `elementType`. Every value carries the
/// FileLineColLoc of the text it came from. Reports the first error (and any
/// warnings) through `diag` and returns null on error. The module is verified.
mlir::OwningOpRef<mlir::ModuleOp> buildCellIR(mlir::MLIRContext &context,
                                              const CellAST &cell,
                                              const SizeBindings &sizes,
                                              mlir::FloatType elementType,
                                              CellDiagnostics &diag);

/// Parses the main buffer of `diag`'s source manager and builds its cell IR.
/// Null on error, after reporting it.
mlir::OwningOpRef<mlir::ModuleOp> compileCellSource(mlir::MLIRContext &context,
                                                    const SizeBindings &sizes,
                                                    mlir::FloatType elementType,
                                                    CellDiagnostics &diag);

/// The front end's warnings about the cell in `source` at `sizes` (a
/// declaration nothing reads, a size bound that the cell does not use), as
/// `file:line:col: warning: ...` text: what a tool prints before the work
/// it does with the cell. Empty where there are none, or where the cell does
/// not compile (the tool's own compile reports that).
std::string cellWarnings(llvm::StringRef source, llvm::StringRef fileName,
                         const SizeBindings &sizes);

/// Registers the dialects the front end builds.
void loadFrontendDialects(mlir::MLIRContext &context);

/// The element type for a dtype name (`f32`, `f64`, `f16`, `bf16`), or null.
mlir::FloatType parseElementType(mlir::MLIRContext &context,
                                 llvm::StringRef dtype);

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_IRGEN_H
