//===- Specialize.cpp - Fix the SAVE_GATES flag of the kernels ------------===//

#include "dialects/Cell/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CELLSPECIALIZE
#include "dialects/Cell/Transforms/Passes.h.inc"

namespace {

struct Specialize : public impl::CellSpecializeBase<Specialize> {
  using CellSpecializeBase::CellSpecializeBase;

  void runOnOperation() override {
    getOperation().walk([&](SaveGatesOp flag) {
      OpBuilder builder(flag);
      Value constant = builder.create<arith::ConstantOp>(
          flag.getLoc(), builder.getBoolAttr(saveGates));
      flag.replaceAllUsesWith(constant);
      flag->erase();
    });
  }
};

} // namespace
} // namespace mlir::cell
