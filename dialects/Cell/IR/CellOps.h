//===- CellOps.h - The cell dialect's operations ----------------*- C++ -*-===//

#ifndef CELLC_DIALECTS_CELL_IR_CELLOPS_H
#define CELLC_DIALECTS_CELL_IR_CELLOPS_H

#include "dialects/Cell/IR/CellAttrs.h"
#include "dialects/Cell/IR/CellDialect.h"
#include "dialects/Cell/IR/CellInterfaces.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::cell {
/// How a `cell.reduce` combines the elements it reduces.
enum class Combine { Sum, Max, Min };
} // namespace mlir::cell

#define GET_OP_CLASSES
#include "dialects/Cell/IR/CellOps.h.inc"

namespace mlir::cell {
/// For element `flat` of a row-major value of `shape`, the index into the
/// value of the `kept` dims (`cell.expand` reads it, `cell.reduce` adds
/// into it).
int64_t keptIndex(ArrayRef<int64_t> shape, ArrayRef<int64_t> kept, int64_t flat);
} // namespace mlir::cell

#endif // CELLC_DIALECTS_CELL_IR_CELLOPS_H
