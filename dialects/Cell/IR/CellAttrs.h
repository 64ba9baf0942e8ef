//===- CellAttrs.h - The cell dialect's attributes --------------*- C++ -*-===//

#ifndef CELLC_DIALECTS_CELL_IR_CELLATTRS_H
#define CELLC_DIALECTS_CELL_IR_CELLATTRS_H

#include "dialects/Cell/IR/KernelInterface.h"

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#define GET_ATTRDEF_CLASSES
#include "dialects/Cell/IR/CellAttrs.h.inc"

#endif // CELLC_DIALECTS_CELL_IR_CELLATTRS_H
