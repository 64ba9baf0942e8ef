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

#define GEN_PASS_REGISTRATION
#include "dialects/Cell/Transforms/Passes.h.inc"

} // namespace mlir::cell

#endif // CELLC_DIALECTS_CELL_TRANSFORMS_PASSES_H
