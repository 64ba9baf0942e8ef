//===- CellInterfaces.h - The cell dialect's interfaces ---------*- C++ -*-===//

#ifndef CELLC_DIALECTS_CELL_IR_CELLINTERFACES_H
#define CELLC_DIALECTS_CELL_IR_CELLINTERFACES_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"
#include "llvm/ADT/SmallVector.h"

#include "dialects/Cell/IR/CellInterfaces.h.inc"

#endif // CELLC_DIALECTS_CELL_IR_CELLINTERFACES_H
