//===- CellDialect.h - The cell dialect -------------------------*- C++ -*-===//

#ifndef CELLC_DIALECTS_CELL_IR_CELLDIALECT_H
#define CELLC_DIALECTS_CELL_IR_CELLDIALECT_H

#include "mlir/IR/Dialect.h"

#include "dialects/Cell/IR/CellDialect.h.inc"

#endif // CELLC_DIALECTS_CELL_IR_CELLDIALECT_H
