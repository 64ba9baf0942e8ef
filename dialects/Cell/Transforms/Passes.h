//===- Passes.h - The cell dialect's passes ---------------------*- C++ -*-===//

#ifndef CELLC_DIALECTS_CELL_TRANSFORMS_PASSES_H
#define CELLC_DIALECTS_CELL_TRANSFORMS_PASSES_H

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::cell {

#define GEN_PASS_DECL
#include "dialects/Cell/Transforms/Passes.h.inc"

/// `file:line:col` of a location (the file's name without its directory),
/// or "?": how the passes' reports place an op.
std::string describeLoc(Location loc);

/// Prints what cell-plan-saves chose for each cell in `module`, and the bytes
/// per step and sample that each recompute mode keeps.
void printSavePlan(ModuleOp module, llvm::raw_ostream &os);

#define GEN_PASS_REGISTRATION
#include "dialects/Cell/Transforms/Passes.h.inc"

} // namespace mlir::cell

#endif // CELLC_DIALECTS_CELL_TRANSFORMS_PASSES_H
