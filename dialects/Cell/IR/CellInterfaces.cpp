//===- CellInterfaces.cpp - The cell dialect's interfaces -----------------===//

#include "dialects/Cell/IR/CellInterfaces.h"

#include "dialects/Cell/IR/CellInterfaces.cpp.inc"
