//===- CellInterfaces.td - The cell dialect's interfaces --*- tablegen -*-===//

#ifndef CELL_INTERFACES_TD
#define CELL_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Cell_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let description = [{
    An op whose backward `cell-autodiff` can build. Given the gradients of the
    op's results (a null value for a result nothing depends on), the op builds
    the gradients of its operands with `builder`, at the builder's insertion
    point, and returns one value per operand: null where no gradient flows to
    that operand. The forward op's operands and results may be used: the
    backward step replays or reloads them.

    Gradients of matrix params (matvec weights) and of hoisted projections are
    not built here: `cell-autodiff` turns them into rows for the weight-gradient
    GEMMs.
  }];
  let cppNamespace = "::mlir::cell";
  let methods = [
    InterfaceMethod<[{
        Builds the gradients of the operands from `resultGrads`, one value per
        result, null for results with no gradient. Returns one value per
        operand, null for operands that get no gradient.
      }],
      "::llvm::SmallVector<::mlir::Value>", "buildGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ValueRange":$resultGrads)>
  ];
}

#endif // CELL_INTERFACES_TD
