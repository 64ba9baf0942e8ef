//===- CellDialect.cpp - The cell dialect ---------------------------------===//

#include "dialects/Cell/IR/CellDialect.h"
#include "dialects/Cell/IR/CellAttrs.h"
#include "dialects/Cell/IR/CellOps.h"

using namespace mlir;
using namespace mlir::cell;

#include "dialects/Cell/IR/CellDialect.cpp.inc"

void CellDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/Cell/IR/CellOps.cpp.inc"
      >();
}

Operation *CellDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                            Type type, Location loc) {
  auto splat = dyn_cast<SplatElementsAttr>(value);
  auto vectorType = dyn_cast<RankedTensorType>(type);
  if (!splat || !vectorType || vectorType.getRank() != 1)
    return nullptr;
  double v = splat.getSplatValue<APFloat>().convertToDouble();
  return builder.create<ConstantOp>(loc, vectorType, builder.getF64FloatAttr(v));
}
