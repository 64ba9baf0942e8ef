//===- KernelABI.h - The argument lists the sequence kernels share -*- C++ -*-===//
//
// Every strategy (the CPU's per-sample kernels, the batch-tiled kernels for
// CUDA and their CPU emulation) takes the same arguments in the same order,
// described by `cell.kernel_args`, so one runtime calling convention serves
// them all. The elementwise ops also lower the same way everywhere.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_COMMON_KERNELABI_H
#define CELLC_COMPILER_CONVERSION_COMMON_KERNELABI_H

#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

namespace mlir::cell {

/// The vector type of a static 1-D or 2-D cell tensor type.
VectorType vectorOf(Type tensor);

/// A memref `[?, ?, n]` (time, batch, features) or `[?, n]` (batch, features).
MemRefType sequenceType(Type tensor, bool perStep);

/// The gate buffer type of a cell: `[T, B, sum of the saved sizes]`.
MemRefType gatesType(DefOp def);

/// Offsets of values of `types`, laid end to end.
SmallVector<int64_t> packedOffsets(TypeRange types);

/// Collects kernel arguments with their descriptions (`#cell.arg`).
struct KernelSignature {
  SmallVector<Type> types;
  SmallVector<Attribute> info;

  unsigned add(Type type, KernelArgAttr arg);
  unsigned add(MLIRContext *ctx, Type type, cellc::ArgKind kind, StringRef name);
  /// One buffer per state of `def`; returns the first one's index.
  unsigned addPerState(DefOp def, cellc::ArgKind kind, bool perStep);
  /// One `[T, B, n]` buffer per output of `def`; returns the first's index.
  unsigned addPerOutput(DefOp def, cellc::ArgKind kind);
  /// The trailing `b_begin`, `b_end`.
  void addBatchRange(MLIRContext *ctx);
};

/// Where the arguments of a forward kernel are.
struct ForwardArgs {
  unsigned numInputs = 0, numProjections = 0;
  unsigned resets = 0, firstInit = 0, firstStart = 0, firstParam = 0;
  unsigned firstOutput = 0, firstHistory = 0, gates = 0;
  /// The end states (forwardSignature with `endStates`), or 0: none.
  unsigned firstEnd = 0;
};

/// Where the arguments of a backward kernel are. `kinds` has the kind of
/// each result of the backward step (`cell.grad_results`).
struct BackwardArgs : ForwardArgs {
  unsigned firstDOut = 0, firstDFinal = 0, firstResult = 0, firstStartGrad = 0;
  SmallVector<cellc::GradKind> kinds;
  /// Each result's earlier per-step result with the same values (its
  /// argument's `same_as`, one buffer), or -1.
  SmallVector<int64_t> sameAs;
};

/// The arguments of a kernel, from its `cell.kernel_args`.
SmallVector<KernelArgAttr> kernelArgsOf(Operation *kernel);
/// The results of a backward step, from its `cell.grad_results`.
SmallVector<GradResultAttr> gradResultsOf(func::FuncOp grad);
/// Whether `v` is a `cell.constant` zero: a backward step's result that says
/// so in its argument (`zero`) and that an input's gradient does not write.
bool isZeroConstant(Value v);

/// The forward kernel's signature, `b_begin` and `b_end` included; with
/// `endStates`, each state after the launch's last step too (in the cell's
/// type, where the history may be narrower: the state the next launch
/// starts from).
KernelSignature forwardSignature(DefOp def, ForwardArgs &args, bool endStates = false);
/// The backward kernel's signature, `b_begin` and `b_end` included.
FailureOr<KernelSignature> backwardSignature(DefOp def, func::FuncOp grad,
                                             BackwardArgs &args);

/// The backward step `@<cell>_grad` that cell-autodiff built for `def`; null,
/// with an error on `def`, when there is none.
func::FuncOp backwardStepOf(DefOp def);

/// Replaces each cell of `module`, and its backward step, by the kernels that
/// `build` makes from them; stops at the first failure.
LogicalResult
replaceCellsByKernels(ModuleOp module,
                      function_ref<LogicalResult(DefOp def, func::FuncOp grad)> build);

/// The projections of `def`, in the order their buffers are passed.
SmallVector<ProjectionOp> projectionsOf(DefOp def);

/// The place among `forward` (projectionsOf) of the projection that `p`
/// computes (a projection of the step, or of the backward step's replay):
/// the one with the same weight, input and biases. A replay need not hold
/// every projection, nor in order: one whose values nothing in the
/// backward reads is not replayed.
std::optional<unsigned> projectionIndexOf(ArrayRef<ProjectionOp> forward, ProjectionOp p);

/// Calls `bind(p, i)` for each projection `p` of the backward step's `body`
/// (its replay) with its place `i` among `def`'s projections (whose buffer
/// it reads); an error at `p` where it is none of them.
LogicalResult bindReplayProjections(DefOp def, Block &body,
                                    function_ref<void(ProjectionOp, unsigned)> bind);

/// How a `cell.reduce` combines, in kernels: its identity, two values
/// combined, and a vector's elements combined.
struct ReduceCombine {
  Combine kind = Combine::Sum;
  double identity() const;
  Value combine(OpBuilder &builder, Location loc, Value a, Value b) const;
  vector::CombiningKind vectorKind() const;
};

/// Builds an elementwise cell op (add, tanh, max, ...) on operands of
/// `type`, a vector of the element type. Returns null for other ops.
Value buildElementwise(OpBuilder &builder, Operation *op, ValueRange operands,
                       VectorType type);

/// The backward kernels' time loop, over t = steps - 1 down to 0.
struct ReverseSteps {
  scf::ForOp loop;
  /// The step; whether it is the first (t = 0).
  Value t, isFirst;
  /// The ping-pong slot of the carried gradients that step t reads (iv % 2),
  /// and the one it writes for step t - 1.
  Value slot, next;
};
/// Builds the loop and leaves `builder` at the start of its body, after the
/// values of `ReverseSteps`.
ReverseSteps buildReverseSteps(OpBuilder &builder, Location loc, Value steps,
                               Value c0, Value c1, Value c2);

/// Where a backward step's states came from, as i1 values (scalars, or
/// masks over a tile's rows): a row that resets (the initial state), the
/// first step of the run in a row that does not reset (the start state), or
/// either (not step t - 1).
struct StepOrigin {
  Value reset, fromStart, fromOutside;
  /// From the row's reset flag and whether the step is the first (of the
  /// same type as `reset`).
  static StepOrigin of(OpBuilder &builder, Location loc, Value reset, Value isFirst);
};

/// The gradient `grad` of a state before a step, routed by its origin: the
/// part that goes to the initial state's gradient (at a reset), the part
/// that goes to the start state's (at the first step), and what carries on
/// to step t - 1 (zero where the state came from outside). Every strategy
/// routes the state gradients through this.
struct StateGradRoute {
  Value toInitial, toStart, carried;
};
StateGradRoute routeStateGrad(OpBuilder &builder, Location loc, const StepOrigin &origin,
                              Value grad, Value zeros);

/// A splat constant of `type`.
Value splat(OpBuilder &builder, Location loc, VectorType type, double value);

/// Block `g` of a block-diagonal weight `[G, M, N]`: a `[M, N]` view.
Value blockOf(OpBuilder &builder, Location loc, Value weight, int64_t g);

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_COMMON_KERNELABI_H
