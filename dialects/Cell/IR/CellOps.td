//===- CellOps.td - The cell dialect's operations ---------*- tablegen -*-===//

#ifndef CELL_OPS_TD
#define CELL_OPS_TD

include "dialects/Cell/IR/CellDialect.td"
include "dialects/Cell/IR/CellInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/IR/RegionKindInterface.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Cell_Vector : RankedTensorOf<[AnyFloat],
    [HasStaticShapePred, HasAnyRankOfPred<[1]>], "static 1-D float tensor">;
def Cell_Matrix : RankedTensorOf<[AnyFloat],
    [HasStaticShapePred, HasAnyRankOfPred<[2]>], "static 2-D float tensor">;
def Cell_Value : RankedTensorOf<[AnyFloat],
    [HasStaticShapePred, HasAnyRankOfPred<[1, 2, 3]>],
    "static 1-D, 2-D or 3-D float tensor">;

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Cell_DefOp : Cell_Op<"def", [
    IsolatedFromAbove, Symbol, SingleBlock,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "One time step of a recurrent cell";
  let description = [{
    Defines a cell. The body is one time step for one sample. Its block
    arguments are the per-step inputs followed by the recurrent states, as they
    are before the step. The body ends in a `cell.yield` that gives the states'
    next values and the step's outputs.

    `input_names`, `state_names` and `output_names` keep the names the user
    wrote; the printer uses them as SSA names of the block arguments and the
    parser reads them back from there. `sizes` optionally records the bound
    symbolic sizes.

    The verifier rejects a body whose arguments are not static 1-D float
    tensors of one element type, a `cell.yield` whose states do not match the
    state arguments' types, and an output count that differs from
    `output_names`.

    Example:

    ```mlir
    cell.def @elman inputs(%x : tensor<3xf32>) states(%h : tensor<4xf32>) outputs("h") {
      %w = cell.param "W" : tensor<4x3xf32>
      %u = cell.param "U" : tensor<4x4xf32>
      %0 = cell.matvec %w, %x : tensor<4x3xf32>, tensor<3xf32> -> tensor<4xf32>
      %1 = cell.matvec %u, %h : tensor<4x4xf32>, tensor<4xf32> -> tensor<4xf32>
      %2 = cell.add %0, %1 : tensor<4xf32>
      %3 = cell.tanh %2 : tensor<4xf32>
      cell.yield states(%3 : tensor<4xf32>) outputs(%3 : tensor<4xf32>)
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       StrArrayAttr:$input_names,
                       StrArrayAttr:$state_names,
                       StrArrayAttr:$output_names,
                       OptionalAttr<DictionaryAttr>:$sizes);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The block arguments that are per-step inputs.
    ::mlir::Block::BlockArgListType getInputs() {
      return getBody().front().getArguments().take_front(getInputNames().size());
    }
    /// The block arguments that are the states before the step.
    ::mlir::Block::BlockArgListType getStates() {
      return getBody().front().getArguments().drop_front(getInputNames().size());
    }
    /// The terminator of the body.
    YieldOp getYield();
  }];
}

def Cell_YieldOp : Cell_Op<"yield", [
    Pure, Terminator, ReturnLike, HasParent<"DefOp">, AttrSizedOperandSegments]> {
  let summary = "Gives the next states and the outputs of a step";
  let description = [{
    Terminates a `cell.def` body. `states` are the states' values after the
    step, in the order of the cell's state arguments; `outputs` are the step's
    outputs, in the order of `output_names`. The parent's verifier checks the
    counts and types.

    Example:

    ```mlir
    cell.yield states(%h, %c : tensor<4xf32>, tensor<4xf32>) outputs(%h : tensor<4xf32>)
    ```
  }];
  let arguments = (ins Variadic<Cell_Vector>:$states,
                       Variadic<Cell_Vector>:$outputs);
  let assemblyFormat = [{
    (`states` `(` $states^ `:` type($states) `)`)?
    (`outputs` `(` $outputs^ `:` type($outputs) `)`)? attr-dict
  }];
}

//===----------------------------------------------------------------------===//
// Leaves
//===----------------------------------------------------------------------===//

def Cell_ParamOp : Cell_Op<"param", [Pure]> {
  let summary = "A learnable parameter of the cell";
  let description = [{
    Reads the learnable parameter `name`: a vector `[n]`, a matrix
    `[rows, cols]`, or a block-diagonal matrix `[G, rows, cols]` of `G` blocks
    (the products read it block by block). Parameters are the same at every
    time step and for every sample. The verifier rejects an empty name and a
    result that is not a static 1-D, 2-D or 3-D float tensor.

    Example:

    ```mlir
    %w = cell.param "W_hh" : tensor<16x4xf32>
    ```
  }];
  let arguments = (ins StrAttr:$name);
  let results = (outs Cell_Value:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Cell_ConstantOp : Cell_Op<"constant", [Pure, ConstantLike]> {
  let summary = "A vector whose elements all hold one value";
  let description = [{
    A vector whose every element is `value`. The language's numeric literals
    become constants of the size of the vector they meet.

    Example:

    ```mlir
    %one = cell.constant 1.0 : tensor<4xf32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def Cell_MatvecOp : Cell_Op<"matvec", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Matrix-vector product of a matrix and a vector";
  let description = [{
    Computes `result[i] = sum_j weight[i, j] * vector[j]`. `weight` is a
    static 2-D tensor `[M, N]`, `vector` a static 1-D tensor `[N]`, and the
    result `[M]`; all share one element type. A 3-D `weight` `[G, M, N]` is
    block-diagonal: `vector` is `[G*N]`, the result `[G*M]`, and block `g`
    of the result is `weight[g] @ vector[g*N : (g+1)*N]`. The verifier
    rejects other shapes.

    Example:

    ```mlir
    %y = cell.matvec %w, %x : tensor<16x3xf32>, tensor<3xf32> -> tensor<16xf32>
    ```
  }];
  let arguments = (ins Cell_Value:$weight, Cell_Value:$vector);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = [{
    $weight `,` $vector attr-dict `:` type($weight) `,` type($vector) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Cell_ChunkOp : Cell_Op<"chunk", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Splits a vector into equal consecutive parts";
  let description = [{
    Splits `input` of size `N` into `K` results of size `N / K`; result `k`
    holds elements `[k * N / K, (k + 1) * N / K)`. The verifier rejects zero
    results, results of different types, and sizes that do not add up to the
    input's.

    Example:

    ```mlir
    %i, %f = cell.chunk %v : tensor<8xf32> -> tensor<4xf32>, tensor<4xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$input);
  let results = (outs Variadic<Cell_Vector>:$results);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Reductions over the units of a sample
//===----------------------------------------------------------------------===//

def Cell_SumOp : Cell_Op<"sum", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "The sum of a vector's elements: one value per sample";
  let description = [{
    Computes `result[0] = sum_j input[j]`, one value per sample, held as a
    vector of size 1. The language's `sum(v)` builds it, and `mean(v)` is
    `sum(v)` times `1 / n`; `cell.broadcast` spreads the value over the units
    where it meets a vector. Its gradient broadcasts back. In a kernel over a
    batch tile it reads its operand whole, so it ends a phase, like a product.
    The verifier rejects a result that is not a vector of size 1 of the
    input's element type.

    Example:

    ```mlir
    %s = cell.sum %v : tensor<16xf32> -> tensor<1xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$input);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Cell_BroadcastOp : Cell_Op<"broadcast", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "One value per sample, spread over the units";
  let description = [{
    Gives a vector whose every element is `input[0]`: a per-sample value
    (a `cell.sum` and what is computed from it) where it meets a vector in an
    elementwise op. Its gradient is the sum of the result's gradient. The
    verifier rejects an input that is not of size 1 and a result of another
    element type.

    Example:

    ```mlir
    %m = cell.broadcast %s : tensor<1xf32> -> tensor<16xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$input);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Cell_ExpandOp : Cell_Op<"expand", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "A value of some dims of a shape, repeated along the others";
  let description = [{
    A sample's values are vectors; a matrix state, or a stack of a head's
    matrices, is the vector of its elements in row-major order. `shape`
    gives such a result's dims (`[NH, K, V]`), and `kept` the dims that the
    input has, in order (`[0, 1]`: the input is `[NH, K]`). Each element of
    the result is the input's element at the kept dims' indices:

      result[i_0, ..., i_n] = input[i_kept[0], ..., i_kept[m]]

    With `cell.reduce` and the elementwise ops it builds the products of a
    matrix state: an outer product `k v^T` per head is
    `expand(k, [0, 1]) * expand(v, [0, 2])` over `[NH, K, V]`, and `C q` is
    `reduce(C * expand(q, [0, 2]), [0, 1])`. Its gradient is `cell.reduce`
    with the same shape and dims. `cell.broadcast` is the case of one dim
    and none kept. In a kernel over a batch tile it reads its input across
    units, so it ends a phase, like a product. The verifier checks that
    `kept` increases within the shape and that the sizes are the products
    of the dims.

    Example:

    ```mlir
    %e = cell.expand %k {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 1>} : tensor<6xf32> -> tensor<24xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$input, DenseI64ArrayAttr:$shape,
                       DenseI64ArrayAttr:$kept);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Cell_ReduceOp : Cell_Op<"reduce", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "The sums over some dims of a value of a shape";
  let description = [{
    The input holds a value of `shape` in row-major order; the result keeps
    the dims `kept` and sums over the others:

      result[i_kept[0], ..., i_kept[m]] = sum over the other dims of input[i_0, ..., i_n]

    `cell.reduce %C {shape = [NH, K, V], kept = [0, 1]}` sums each row of
    each head's matrix; `kept = [0]` over `[NH, K]` gives one sum per head.
    Its gradient is `cell.expand` with the same shape and dims; `cell.sum`
    is the case of one dim and none kept. It reads its input across units,
    so it ends a phase in a kernel over a batch tile. The verifier checks
    what `cell.expand`'s does.

    `combine = "max"` (or `"min"`) takes the largest (smallest) of the
    elements instead of their sum: the language's `max(v)` and `min(v)` over
    a vector's units, and softmax's stabilising max. Its gradient goes to the
    elements equal to the result, split evenly among ties.

    Example:

    ```mlir
    %r = cell.reduce %c {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 1>} : tensor<24xf32> -> tensor<6xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$input, DenseI64ArrayAttr:$shape,
                       DenseI64ArrayAttr:$kept,
                       DefaultValuedStrAttr<StrAttr, "sum">:$combine);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// `combine` as a word: sum, max or min (checked by the verifier).
    ::mlir::cell::Combine getCombineKind();
  }];
}

//===----------------------------------------------------------------------===//
// Elementwise operations
//===----------------------------------------------------------------------===//

class Cell_UnaryOp<string mnemonic, string formula>
    : Cell_Op<mnemonic, [Pure, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Elementwise " # formula;
  let description = [{
    Computes `}] # formula # [{` for each element of `operand`. The result has
    the operand's type.

    Example:

    ```mlir
    %y = cell.}] # mnemonic # [{ %x : tensor<4xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$operand);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$operand attr-dict `:` type($result)";
}

def Cell_NegOp : Cell_UnaryOp<"neg", "-x">;
def Cell_SigmoidOp : Cell_UnaryOp<"sigmoid", "1 / (1 + exp(-x))">;
def Cell_TanhOp : Cell_UnaryOp<"tanh", "tanh(x)">;
def Cell_ExpOp : Cell_UnaryOp<"exp", "exp(x)">;
def Cell_LogOp : Cell_UnaryOp<"log", "log(x)">;
def Cell_ReluOp : Cell_UnaryOp<"relu", "max(x, 0)">;
def Cell_SoftplusOp : Cell_UnaryOp<"softplus", "log(1 + exp(x))">;
def Cell_AbsOp : Cell_UnaryOp<"abs", "|x|">;
def Cell_SqrtOp : Cell_UnaryOp<"sqrt", "sqrt(x)">;
def Cell_RsqrtOp : Cell_UnaryOp<"rsqrt", "1 / sqrt(x)">;
def Cell_Log1pOp : Cell_UnaryOp<"log1p", "log(1 + x)">;
def Cell_SinOp : Cell_UnaryOp<"sin", "sin(x)">;
def Cell_CosOp : Cell_UnaryOp<"cos", "cos(x)">;
def Cell_ErfOp : Cell_UnaryOp<"erf", "erf(x)">;
def Cell_SiluOp : Cell_UnaryOp<"silu", "x / (1 + exp(-x))">;
def Cell_GeluOp : Cell_UnaryOp<"gelu", "x (1 + erf(x / sqrt(2))) / 2">;
def Cell_GeluTanhOp : Cell_UnaryOp<"gelu_tanh",
    "x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2">;
def Cell_EluOp : Cell_UnaryOp<"elu", "x > 0 ? x : exp(x) - 1">;

class Cell_BinaryOp<string mnemonic, string formula>
    : Cell_Op<mnemonic, [Pure,
        DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Elementwise " # formula;
  let description = [{
    Computes `}] # formula # [{` for each pair of elements of `lhs` and `rhs`.
    The verifier rejects operands and a result that do not all have one type.

    Example:

    ```mlir
    %z = cell.}] # mnemonic # [{ %x, %y : tensor<4xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$lhs, Cell_Vector:$rhs);
  let results = (outs Cell_Vector:$result);
  // The pretty form takes one type; errors.mlir spells mismatches in the
  // generic form.
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` custom<SameType>(type($lhs), type($rhs), type($result))
  }];
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state, lhs.getType(), lhs, rhs);
    }]>
  ];
}

def Cell_AddOp : Cell_BinaryOp<"add", "lhs + rhs">;
def Cell_SubOp : Cell_BinaryOp<"sub", "lhs - rhs">;
def Cell_MulOp : Cell_BinaryOp<"mul", "lhs * rhs">;
def Cell_DivOp : Cell_BinaryOp<"div", "lhs / rhs">;
def Cell_MaxOp : Cell_BinaryOp<"max", "max(lhs, rhs)">;
def Cell_MinOp : Cell_BinaryOp<"min", "min(lhs, rhs)">;

def Cell_GreaterOp : Cell_BinaryOp<"greater", "lhs > rhs ? 1 : 0">;
def Cell_PowOp : Cell_BinaryOp<"pow", "lhs ^ rhs">;

def Cell_SelectOp : Cell_Op<"select", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Elementwise cond != 0 ? lhs : rhs";
  let description = [{
    Computes `cond != 0 ? lhs : rhs` for each element: the language's
    `where(c, a, b)`, whose condition is a mask (a comparison's 1 and 0).
    The unselected operand is not read into the result, so a NaN or an
    infinity there does not reach it. The gradient goes to the selected
    operand only; the condition has none. Its operands and result have one
    type.

    Example:

    ```mlir
    %z = cell.select %c, %x, %y : tensor<4xf32>
    ```
  }];
  let arguments = (ins Cell_Vector:$cond, Cell_Vector:$lhs, Cell_Vector:$rhs);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$cond `,` $lhs `,` $rhs attr-dict `:` type($result)";
  let builders = [
    OpBuilder<(ins "::mlir::Value":$cond, "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state, lhs.getType(), cond, lhs, rhs);
    }]>
  ];
}

//===----------------------------------------------------------------------===//
// Ops that passes introduce
//===----------------------------------------------------------------------===//

def Cell_ProjectionOp : Cell_Op<"projection", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "A matvec on inputs, plus biases, hoisted out of the time loop";
  let description = [{
    Computes `weight @ vector + sum(biases)`, like `cell.matvec` followed by
    `cell.add`s, but marks the value as computed before the recurrence: one
    GEMM over all `T*B` rows, whose result the step kernels read per step.
    `cell-split-projections` creates it for matvecs whose vector depends on
    inputs alone. Its gradient (the gate-gradient rows) leaves the backward
    step for the weight-, bias- and input-gradient GEMMs. The verifier checks
    the matvec shapes and that every bias has the result's type.

    Example:

    ```mlir
    %p = cell.projection %w, %x biases(%b : tensor<16xf32>) : tensor<16x3xf32>, tensor<3xf32> -> tensor<16xf32>
    ```
  }];
  let arguments = (ins Cell_Value:$weight, Cell_Value:$vector,
                       Variadic<Cell_Vector>:$biases);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = [{
    $weight `,` $vector (`biases` `(` $biases^ `:` type($biases) `)`)? attr-dict
    `:` type($weight) `,` type($vector) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Cell_VecmatOp : Cell_Op<"vecmat", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Product of a vector and a matrix: the transposed matvec";
  let description = [{
    Computes `result[j] = sum_i weight[i, j] * vector[i]`, the product with the
    transpose of `weight`: the language's `v @ W`, and what the backward of
    `cell.matvec` needs. `weight` is
    `[M, N]`, `vector` `[M]` and the result `[N]`. The verifier rejects other
    shapes and mixed element types.

    Example:

    ```mlir
    %dh = cell.vecmat %w, %dg : tensor<16x4xf32>, tensor<16xf32> -> tensor<4xf32>
    ```
  }];
  let arguments = (ins Cell_Value:$weight, Cell_Value:$vector);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = [{
    $weight `,` $vector attr-dict `:` type($weight) `,` type($vector) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Cell_ConcatOp : Cell_Op<"concat", [Pure,
    DeclareOpInterfaceMethods<Cell_DifferentiableOpInterface>]> {
  let summary = "Joins vectors end to end: the inverse of cell.chunk";
  let description = [{
    The result holds `inputs` one after the other. The verifier rejects an
    empty input list, inputs of different types, and a result size that is not
    the sum of the inputs' sizes.

    Example:

    ```mlir
    %v = cell.concat %a, %b : tensor<4xf32>, tensor<4xf32> -> tensor<8xf32>
    ```
  }];
  let arguments = (ins Variadic<Cell_Vector>:$inputs);
  let results = (outs Cell_Vector:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Cell_SaveOp : Cell_Op<"save", [HasParent<"DefOp">,
    MemoryEffects<[MemWrite]>]> {
  let summary = "Forward values that backward reads when gates are saved";
  let description = [{
    Marks the values that `cell-plan-saves` chose for the backward step. Value
    `k` goes to slot `k` of the per-step gate buffer; its offset there is the
    sum of the sizes of the values before it. The forward kernel stores them
    only when its `SAVE_GATES` flag is set.

    Example:

    ```mlir
    cell.save %i, %f : tensor<4xf32>, tensor<4xf32>
    ```
  }];
  let arguments = (ins Variadic<Cell_Vector>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

def Cell_RestoreOp : Cell_Op<"restore", [
    SingleBlock, RecursiveMemoryEffects]> {
  let summary = "Saved forward values, or their replay";
  let description = [{
    Gives the forward values that the matching `cell.save` stores, in slot
    order. When gates were saved they are loaded from the gate buffer; when
    not, the body replays the forward step from the step's inputs and previous
    states and yields them with `cell.restore_yield`. The verifier checks that
    the yielded types are the result types.

    Example:

    ```mlir
    %s:2 = cell.restore -> tensor<4xf32>, tensor<4xf32> {
      %a = cell.sigmoid %h : tensor<4xf32>
      %b = cell.tanh %h : tensor<4xf32>
      cell.restore_yield %a, %b : tensor<4xf32>, tensor<4xf32>
    }
    ```
  }];
  let results = (outs Variadic<Cell_Vector>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "(`->` type($results)^)? $body attr-dict";
  let hasVerifier = 1;
}

def Cell_RestoreYieldOp : Cell_Op<"restore_yield", [
    Pure, Terminator, ReturnLike, HasParent<"RestoreOp">]> {
  let summary = "Yields the replayed values of a cell.restore";
  let description = [{
    Terminates the body of `cell.restore` with the replayed values, in slot
    order.

    Example:

    ```mlir
    cell.restore_yield %a : tensor<4xf32>
    ```
  }];
  let arguments = (ins Variadic<Cell_Vector>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

def Cell_SaveGatesOp : Cell_Op<"save_gates", [Pure]> {
  let summary = "The SAVE_GATES flag of a sequence kernel";
  let description = [{
    True when the forward kernel stores the planned values and the backward
    kernel loads them, false when backward replays the step instead.
    `cell-specialize` replaces it with a constant, after which canonicalization
    folds away the branch not taken.

    Example:

    ```mlir
    %save = cell.save_gates : i1
    ```
  }];
  let results = (outs I1:$flag);
  let assemblyFormat = "attr-dict `:` type($flag)";
}

#endif // CELL_OPS_TD
