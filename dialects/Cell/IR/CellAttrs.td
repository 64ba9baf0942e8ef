//===- CellAttrs.td - The cell dialect's attributes -------*- tablegen -*-===//

#ifndef CELL_ATTRS_TD
#define CELL_ATTRS_TD

include "dialects/Cell/IR/CellDialect.td"
include "mlir/IR/AttrTypeBase.td"

class Cell_Attr<string name, string attrMnemonic>
    : AttrDef<Cell_Dialect, name> {
  let mnemonic = attrMnemonic;
}

def Cell_KernelArgAttr : Cell_Attr<"KernelArg", "arg"> {
  let summary = "What one argument of a sequence kernel is";
  let description = [{
    An entry of a kernel's `cell.kernel_args`, one per argument in order: its
    kind (`cellc::ArgKind`, the words of `KernelInterface.def`) and the name of
    the input, state, param or output it belongs to. A `projection` names the
    input it multiplies and the biases added to it. A backward result that
    repeats an earlier one names that argument (`same_as`), so that a caller
    may pass one buffer for both; a result that is zero says so (`zero`).

    Example:

    ```mlir
    #cell.arg<projection "W_ih", input = "x", biases = ["b_ih", "b_hh"]>
    #cell.arg<weight_rows "W_hh", same_as = 16>
    #cell.arg<input_grad "x", zero>
    ```
  }];
  let parameters = (ins
    "::cellc::ArgKind":$kind,
    StringRefParameter<"the input, state, param or output">:$name,
    StringRefParameter<"the input a projection multiplies", "\"\"">:$input,
    OptionalArrayRefParameter<"::mlir::StringAttr">:$biases,
    DefaultValuedParameter<"int64_t", "-1">:$sameAs,
    DefaultValuedParameter<"bool", "false">:$zero
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Cell_GradResultAttr : Cell_Attr<"GradResult", "grad"> {
  let summary = "What one result of a backward step is";
  let description = [{
    An entry of a backward step's `cell.grad_results` (cell-autodiff), one per
    result in order: its kind (`cellc::GradKind`) and the state, input or
    param it is the gradient of, or the weight whose product it belongs to.
    A `projection` result names the input and biases of the projection.

    Example:

    ```mlir
    #cell.grad<state "h">
    #cell.grad<projection "W_ih", input = "x", biases = ["b_ih"]>
    ```
  }];
  let parameters = (ins
    "::cellc::GradKind":$kind,
    StringRefParameter<"the state, input, param or weight">:$name,
    StringRefParameter<"the input a projection multiplies", "\"\"">:$input,
    OptionalArrayRefParameter<"::mlir::StringAttr">:$biases
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

#endif // CELL_ATTRS_TD
