//===- CellDialect.td - The cell dialect ------------------*- tablegen -*-===//

#ifndef CELL_DIALECT_TD
#define CELL_DIALECT_TD

include "mlir/IR/OpBase.td"

def Cell_Dialect : Dialect {
  let name = "cell";
  let summary = "One time step of a recurrent cell, for one sample";
  let description = [{
    The `cell` dialect describes the gate math of one time step of a recurrent
    cell (an LSTM, a GRU, or a cell nobody has written kernels for) for a single
    sample. Values are statically shaped 1-D tensors (vectors) or 2-D tensors
    (matrix params); all symbolic sizes are bound before IR is built. The
    sequence kernels over `[T, B]` are built from this step by later passes.
  }];
  let cppNamespace = "::mlir::cell";
  let hasConstantMaterializer = 1;
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
}

class Cell_Op<string mnemonic, list<Trait> traits = []>
    : Op<Cell_Dialect, mnemonic, traits>;

#endif // CELL_DIALECT_TD
