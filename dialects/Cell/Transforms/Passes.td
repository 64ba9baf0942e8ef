//===- Passes.td - The cell dialect's passes --------------*- tablegen -*-===//

#ifndef CELL_TRANSFORMS_PASSES_TD
#define CELL_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def CellSplitProjections : Pass<"cell-split-projections", "::mlir::ModuleOp"> {
  let summary = "Hoists matvecs on inputs, with their biases, out of the step";
  let description = [{
    Rewrites every `cell.matvec` whose weight is a matrix param and whose
    vector is a per-step input into a `cell.projection`, which the sequence
    kernels read from one GEMM over all `T*B` rows instead of computing per
    step. The bias params added to the matvec in the same sum (the sum's other
    terms, through any nesting of `cell.add`) join the projection; the sum is
    rebuilt from the projections and the terms that stay. Floating-point
    addition is reassociated to do so.

    Left alone: matvecs whose vector reads a state or any value computed from
    one (MGU's `U @ (f * h)`), which must stay in the recurrence, and matvecs
    on values computed from inputs alone, which need a prologue kernel that
    does not exist yet. A cell with several inputs gets one projection per
    input matvec; a cell with no matvec on an input is unchanged.

    Runs on the cell IR the front end builds, before `cell-autodiff`.
  }];
  let dependentDialects = ["::mlir::cell::CellDialect"];
}

def CellChunkPart : Pass<"cell-chunk-part", "::mlir::ModuleOp"> {
  let summary = "Replaces a cell by the prologue or the epilogue of its chunkwise form";
  let description = [{
    For the chunkwise-parallel form (cellc._chunkwise, `--emit=chunkwise`):
    replaces each `cell.def @c` whose matrix states have a chunk form by
    `cell.def @c_prologue`, the part of the step that runs before the core
    over every step and row. Its inputs are the cell's; its states are those
    computed before the linear ones (mLSTM's stabiliser m, and any state
    the linear ones do not feed); its outputs are the values the core and
    the rest of the step read from it that vary by row: the log-gates (an
    exp's operand), keys, values, queries, their scales, the delta rule's
    key, target and beta, and what the ops after the core use. Each output
    is named `v<id>`, the value's id in `describeChunkwise`'s numbering
    (the inputs, the states, then each op's results). Values of params and
    constants alone stay out: the caller computes them once.

    With `part=epilogue`, the cell is replaced by `@c_epilogue`, the rest
    of the step after the core: its inputs are the core's reads and the
    row-varying values before the core that the rest reads (named v<id>),
    its states those computed after the core, its outputs the cell's;
    values of params and constants alone it computes itself.

    The rest of the pipeline (autodiff, saves, kernels) takes either part
    as any cell. A cell with no chunk form, or nothing after its core for
    the epilogue, is an error at its location. Runs after
    `cell-split-projections`.
  }];
  let options = [
    Option<"part", "part", "std::string", /*default=*/"\"prologue\"",
           "The part of the chunk form the cell is replaced by: prologue or epilogue">,
  ];
  let dependentDialects = ["::mlir::cell::CellDialect"];
}

def CellAutodiff : Pass<"cell-autodiff", "::mlir::ModuleOp"> {
  let summary = "Derives the backward step of every cell";
  let description = [{
    For each `cell.def @c`, builds `func.func @c_grad`, the backward of one
    step for one sample. Its arguments are the step's inputs, the previous
    states, the gradients of the outputs and the gradients of the next
    states. Its body first replays the forward step, then runs each op's
    `DifferentiableOpInterface` backward in reverse order, summing the
    gradients of values used more than once.

    It returns, in order: the gradients of the previous states and of the
    inputs (used directly in the step; zero where unused); the gradient of
    each `cell.projection` (the rows of the weight-, bias- and input-gradient
    GEMMs); for each `cell.matvec` on a matrix param, the gradient of its
    result and its vector (the rows of the weight-gradient GEMM); and the
    gradient of each vector param used in the step, which the kernels sum over
    batch and time. `cell.grad_results` on the function names each result.

    The forward `cell.def` is left as it is. Runs after
    `cell-split-projections`.
  }];
  let dependentDialects = ["::mlir::cell::CellDialect", "::mlir::func::FuncDialect"];
}

def CellPlanSaves : Pass<"cell-plan-saves", "::mlir::ModuleOp"> {
  let summary = "Chooses the forward values the backward step reads";
  let description = [{
    For each cell and its `_grad` function, finds the forward values the
    backward uses, drops those it always has (inputs, previous states, params,
    constants) and those that one cheap elementwise op recomputes from the
    rest (`1 - z` from `z`), and plans the remainder as the step's saved
    values: for an LSTM the four activated gates and `tanh(c)`.

    The forward `cell.def` gets a `cell.save` of those values before its
    yield. In the `_grad` function the replay that produces them moves into
    the region of a `cell.restore`, whose results replace them: loaded from the
    gate buffer with `SAVE_GATES=1`, replayed with `SAVE_GATES=0`. The
    `cell.save` is the plan: `cellc --emit=plan` reports it in bytes per step
    for each recompute mode.

    Runs after `cell-autodiff`.
  }];
  let dependentDialects = ["::mlir::cell::CellDialect"];
}

def CellSpecialize : Pass<"cell-specialize", "::mlir::ModuleOp"> {
  let summary = "Fixes the SAVE_GATES flag of the sequence kernels";
  let description = [{
    Replaces every `cell.save_gates` with the constant `save-gates`. The
    canonicalizer then folds the branches on it: with `save-gates=0` the
    forward kernel's gate stores and the backward kernel's gate loads
    disappear; with `save-gates=1` the backward kernel's replay of the step
    does. Sizes and dtype are bound earlier, by the front end.

    Runs after `convert-cell-to-kernels`.
  }];
  let options = [
    Option<"saveGates", "save-gates", "bool", /*default=*/"true",
           "Whether the forward kernel stores the planned values">
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

#endif // CELL_TRANSFORMS_PASSES_TD
