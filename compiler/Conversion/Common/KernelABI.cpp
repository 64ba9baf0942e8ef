//===- KernelABI.cpp - The argument lists the sequence kernels share ------===//

#include "compiler/Conversion/Common/KernelABI.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

namespace mlir::cell {

VectorType vectorOf(Type tensor) {
  auto type = cast<RankedTensorType>(tensor);
  return VectorType::get(type.getShape(), type.getElementType());
}

MemRefType sequenceType(Type tensor, bool perStep) {
  auto type = cast<RankedTensorType>(tensor);
  SmallVector<int64_t> shape;
  if (perStep)
    shape.push_back(ShapedType::kDynamic);
  shape.push_back(ShapedType::kDynamic);
  shape.push_back(type.getDimSize(0));
  return MemRefType::get(shape, type.getElementType());
}

SmallVector<int64_t> packedOffsets(TypeRange types) {
  SmallVector<int64_t> offsets;
  int64_t offset = 0;
  for (Type type : types) {
    offsets.push_back(offset);
    offset += cast<RankedTensorType>(type).getDimSize(0);
  }
  return offsets;
}

MemRefType gatesType(DefOp def) {
  int64_t size = 0;
  for (SaveOp save : def.getBody().getOps<SaveOp>())
    for (Type type : save.getValues().getTypes())
      size += cast<RankedTensorType>(type).getDimSize(0);
  Type element = cast<RankedTensorType>(def.getStates()[0].getType())
                     .getElementType();
  return MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic, size},
                         element);
}

unsigned KernelSignature::add(Type type, KernelArgAttr arg) {
  types.push_back(type);
  info.push_back(arg);
  return types.size() - 1;
}

unsigned KernelSignature::add(MLIRContext *ctx, Type type, cellc::ArgKind kind,
                              StringRef name) {
  return add(type, KernelArgAttr::get(ctx, kind, name, "", {}, -1, false));
}

unsigned KernelSignature::addPerState(DefOp def, cellc::ArgKind kind, bool perStep) {
  unsigned first = types.size();
  for (auto [name, arg] : llvm::zip(
           def.getStateNames().getAsValueRange<StringAttr>(), def.getStates()))
    add(def.getContext(), sequenceType(arg.getType(), perStep), kind, name);
  return first;
}

unsigned KernelSignature::addPerOutput(DefOp def, cellc::ArgKind kind) {
  unsigned first = types.size();
  for (auto [name, out] :
       llvm::zip(def.getOutputNames().getAsValueRange<StringAttr>(),
                 def.getYield().getOutputs()))
    add(def.getContext(), sequenceType(out.getType(), true), kind, name);
  return first;
}

SmallVector<KernelArgAttr> kernelArgsOf(Operation *kernel) {
  SmallVector<KernelArgAttr> args;
  if (auto info = kernel->getAttrOfType<ArrayAttr>("cell.kernel_args"))
    for (Attribute a : info)
      args.push_back(cast<KernelArgAttr>(a));
  return args;
}

SmallVector<GradResultAttr> gradResultsOf(func::FuncOp grad) {
  SmallVector<GradResultAttr> results;
  if (auto info = grad->getAttrOfType<ArrayAttr>("cell.grad_results"))
    for (Attribute a : info)
      results.push_back(cast<GradResultAttr>(a));
  return results;
}

bool isZeroConstant(Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  return c && c.getValue().isZero();
}

void KernelSignature::addBatchRange(MLIRContext *ctx) {
  Builder b(ctx);
  add(ctx, b.getIndexType(), cellc::ArgKind::BatchBegin, "b_begin");
  add(ctx, b.getIndexType(), cellc::ArgKind::BatchEnd, "b_end");
}

func::FuncOp backwardStepOf(DefOp def) {
  auto module = def->getParentOfType<ModuleOp>();
  auto grad = module.lookupSymbol<func::FuncOp>((def.getSymName() + "_grad").str());
  if (!grad)
    def.emitOpError("has no backward step; run cell-autodiff first");
  return grad;
}

SmallVector<ProjectionOp> projectionsOf(DefOp def) {
  SmallVector<ProjectionOp> projections;
  def.walk([&](ProjectionOp p) { projections.push_back(p); });
  return projections;
}

std::optional<unsigned> projectionIndexOf(ArrayRef<ProjectionOp> forward, ProjectionOp p) {
  // A projection's weight and biases are params and its vector an input
  // (cell-split-projections makes no other); anything else matches none.
  auto nameOf = [](Value v) -> std::optional<StringRef> {
    if (auto param = v.getDefiningOp<ParamOp>())
      return param.getName();
    return std::nullopt;
  };
  auto key = [&](ProjectionOp q)
      -> std::optional<std::tuple<StringRef, unsigned, SmallVector<StringRef>>> {
    auto input = dyn_cast<BlockArgument>(q.getVector());
    std::optional<StringRef> weight = nameOf(q.getWeight());
    if (!input || !weight)
      return std::nullopt;
    SmallVector<StringRef> biases;
    for (Value b : q.getBiases()) {
      std::optional<StringRef> bias = nameOf(b);
      if (!bias)
        return std::nullopt;
      biases.push_back(*bias);
    }
    return std::make_tuple(*weight, input.getArgNumber(), biases);
  };
  auto wanted = key(p);
  if (!wanted)
    return std::nullopt;
  for (auto [i, f] : llvm::enumerate(forward))
    if (key(f) == wanted)
      return unsigned(i);
  return std::nullopt;
}

LogicalResult bindReplayProjections(DefOp def, Block &body,
                                    function_ref<void(ProjectionOp, unsigned)> bind) {
  SmallVector<ProjectionOp> forward = projectionsOf(def);
  LogicalResult matched = success();
  body.walk([&](ProjectionOp p) {
    if (std::optional<unsigned> i = projectionIndexOf(forward, p))
      bind(p, *i);
    else
      matched = p.emitOpError("internal error: the replay's projection is not the step's");
  });
  return matched;
}

/// Common arguments: inputs, projections, resets, initial and start states,
/// params.
static void addCommonArgs(DefOp def, KernelSignature &sig, ForwardArgs &args) {
  MLIRContext *ctx = def.getContext();
  args.numInputs = def.getInputNames().size();
  for (auto [name, arg] :
       llvm::zip(def.getInputNames().getAsValueRange<StringAttr>(), def.getInputs()))
    sig.add(ctx, sequenceType(arg.getType(), true), cellc::ArgKind::Input, name);
  SmallVector<ProjectionOp> projections = projectionsOf(def);
  args.numProjections = projections.size();
  for (ProjectionOp p : projections) {
    // What the runtime's GEMM computes: weight @ input + biases.
    SmallVector<StringAttr> biases;
    for (Value bias : p.getBiases())
      biases.push_back(bias.getDefiningOp<ParamOp>().getNameAttr());
    auto input = cast<BlockArgument>(p.getVector());
    sig.add(sequenceType(p.getType(), true),
            KernelArgAttr::get(ctx, cellc::ArgKind::Projection,
                               p.getWeight().getDefiningOp<ParamOp>().getName(),
                               cast<StringAttr>(def.getInputNames()[input.getArgNumber()]),
                               biases, -1, false));
  }
  args.resets = sig.add(
      ctx,
      MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic},
                      IntegerType::get(ctx, 8)),
      cellc::ArgKind::Resets, "resets");
  args.firstInit = sig.addPerState(def, cellc::ArgKind::InitialState, false);
  args.firstStart = sig.addPerState(def, cellc::ArgKind::StartState, false);
  args.firstParam = sig.types.size();
  for (ParamOp param : def.getBody().getOps<ParamOp>()) {
    auto type = cast<RankedTensorType>(param.getType());
    sig.add(ctx, MemRefType::get(type.getShape(), type.getElementType()),
            cellc::ArgKind::Param, param.getName());
  }
}

KernelSignature forwardSignature(DefOp def, ForwardArgs &args, bool endStates) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  addCommonArgs(def, sig, args);
  args.firstOutput = sig.addPerOutput(def, cellc::ArgKind::Output);
  args.firstHistory = sig.addPerState(def, cellc::ArgKind::StateHistory, true);
  args.gates = sig.add(ctx, gatesType(def), cellc::ArgKind::Gates, "gates");
  if (endStates)
    args.firstEnd = sig.addPerState(def, cellc::ArgKind::EndState, false);
  sig.addBatchRange(ctx);
  return sig;
}

FailureOr<KernelSignature> backwardSignature(DefOp def, func::FuncOp grad,
                                             BackwardArgs &args) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  addCommonArgs(def, sig, args);
  args.firstHistory = sig.addPerState(def, cellc::ArgKind::StateHistory, true);
  args.gates = sig.add(ctx, gatesType(def), cellc::ArgKind::Gates, "gates");
  args.firstDOut = sig.addPerOutput(def, cellc::ArgKind::OutputGrad);
  args.firstDFinal = sig.addPerState(def, cellc::ArgKind::FinalStateGrad, false);

  // One buffer per result of the backward step.
  SmallVector<GradResultAttr> resultInfo = gradResultsOf(grad);
  auto resultTypes = grad.getFunctionType().getResults();
  if (resultInfo.size() != resultTypes.size())
    return grad.emitOpError("expects cell.grad_results for every result");
  args.firstResult = sig.types.size();
  args.kinds.clear();
  args.sameAs.clear();
  Operation *ret = grad.getBody().front().getTerminator();
  for (auto [r, result, type] : llvm::enumerate(resultInfo, resultTypes)) {
    cellc::GradKind kind = result.getKind();
    args.kinds.push_back(kind);
    bool perStep = kind != cellc::GradKind::State && kind != cellc::GradKind::Param;
    // A per-step result that repeats an earlier one (the gradient of a
    // projection and of a recurrent product both are the gate pre-
    // activations' in an LSTM) names it, so that the caller can pass one
    // buffer for both; a result that is zero says so.
    int64_t sameAs = -1;
    Value value = ret->getOperand(r);
    for (unsigned earlier = 0; perStep && earlier < r; ++earlier)
      if (ret->getOperand(earlier) == value &&
          args.kinds[earlier] != cellc::GradKind::State &&
          args.kinds[earlier] != cellc::GradKind::Param) {
        sameAs = earlier;
        break;
      }
    args.sameAs.push_back(sameAs);
    bool zero = isZeroConstant(value);
    sig.add(sequenceType(type, perStep),
            KernelArgAttr::get(ctx, cellc::argKindOf(kind), result.getName(), "", {},
                               sameAs < 0 ? -1 : args.firstResult + sameAs, zero));
  }
  args.firstStartGrad = sig.addPerState(def, cellc::ArgKind::StartStateGrad, false);
  sig.addBatchRange(ctx);
  return sig;
}

StepOrigin StepOrigin::of(OpBuilder &builder, Location loc, Value reset, Value isFirst) {
  Value ones;
  if (auto mask = dyn_cast<VectorType>(reset.getType()))
    ones = builder.create<arith::ConstantOp>(loc, mask, DenseElementsAttr::get(mask, true));
  else
    ones = builder.create<arith::ConstantIntOp>(loc, 1, 1);
  Value notReset = builder.create<arith::XOrIOp>(loc, reset, ones);
  return {reset, builder.create<arith::AndIOp>(loc, isFirst, notReset),
          builder.create<arith::OrIOp>(loc, reset, isFirst)};
}

StateGradRoute routeStateGrad(OpBuilder &builder, Location loc, const StepOrigin &origin,
                              Value grad, Value zeros) {
  return {builder.create<arith::SelectOp>(loc, origin.reset, grad, zeros),
          builder.create<arith::SelectOp>(loc, origin.fromStart, grad, zeros),
          builder.create<arith::SelectOp>(loc, origin.fromOutside, zeros, grad)};
}

Value splat(OpBuilder &builder, Location loc, VectorType type, double value) {
  auto attr = FloatAttr::get(type.getElementType(), value);
  return builder.create<arith::ConstantOp>(
      loc, type, SplatElementsAttr::get(type, ArrayRef<Attribute>(attr)));
}

Value blockOf(OpBuilder &builder, Location loc, Value weight, int64_t g) {
  auto type = cast<MemRefType>(weight.getType());
  int64_t rows = type.getDimSize(1), cols = type.getDimSize(2);
  SmallVector<OpFoldResult> offsets = {builder.getIndexAttr(g), builder.getIndexAttr(0),
                                       builder.getIndexAttr(0)};
  SmallVector<OpFoldResult> sizes = {builder.getIndexAttr(1), builder.getIndexAttr(rows),
                                     builder.getIndexAttr(cols)};
  SmallVector<OpFoldResult> strides(3, builder.getIndexAttr(1));
  auto view = cast<MemRefType>(memref::SubViewOp::inferRankReducedResultType(
      {rows, cols}, type, offsets, sizes, strides));
  return builder.create<memref::SubViewOp>(loc, view, weight, offsets, sizes, strides);
}

double ReduceCombine::identity() const {
  switch (kind) {
  case Combine::Sum:
    return 0.0;
  case Combine::Max:
    return -std::numeric_limits<double>::infinity();
  case Combine::Min:
    return std::numeric_limits<double>::infinity();
  }
  llvm_unreachable("a reduction combines by sum, max or min");
}

Value ReduceCombine::combine(OpBuilder &builder, Location loc, Value a, Value b) const {
  switch (kind) {
  case Combine::Sum:
    return builder.create<arith::AddFOp>(loc, a, b);
  case Combine::Max:
    return builder.create<arith::MaximumFOp>(loc, a, b);
  case Combine::Min:
    return builder.create<arith::MinimumFOp>(loc, a, b);
  }
  llvm_unreachable("a reduction combines by sum, max or min");
}

vector::CombiningKind ReduceCombine::vectorKind() const {
  switch (kind) {
  case Combine::Sum:
    return vector::CombiningKind::ADD;
  case Combine::Max:
    return vector::CombiningKind::MAXIMUMF;
  case Combine::Min:
    return vector::CombiningKind::MINIMUMF;
  }
  llvm_unreachable("a reduction combines by sum, max or min");
}

Value buildElementwise(OpBuilder &builder, Operation *op, ValueRange operands,
                       VectorType type) {
  Location loc = op->getLoc();
  auto x = [&](unsigned i) { return operands[i]; };
  auto c = [&](double v) { return splat(builder, loc, type, v); };
  return llvm::TypeSwitch<Operation *, Value>(op)
      .Case([&](AddOp) { return builder.create<arith::AddFOp>(loc, x(0), x(1)); })
      .Case([&](SubOp) { return builder.create<arith::SubFOp>(loc, x(0), x(1)); })
      .Case([&](MulOp) { return builder.create<arith::MulFOp>(loc, x(0), x(1)); })
      .Case([&](DivOp) { return builder.create<arith::DivFOp>(loc, x(0), x(1)); })
      .Case([&](MaxOp) {
        return builder.create<arith::MaximumFOp>(loc, x(0), x(1));
      })
      .Case([&](MinOp) {
        return builder.create<arith::MinimumFOp>(loc, x(0), x(1));
      })
      .Case([&](PowOp) {
        // As PyTorch: |a|^b = exp(b log|a|), negated for a < 0 and an odd
        // integer b, NaN for a < 0 and b not an integer; a^0 = 1.
        Value a = x(0), b = x(1);
        Value magnitude = builder.create<math::ExpOp>(
            loc, builder.create<arith::MulFOp>(
                     loc, b, builder.create<math::LogOp>(
                                 loc, builder.create<math::AbsFOp>(loc, a))));
        Value whole = builder.create<arith::CmpFOp>(
            loc, arith::CmpFPredicate::OEQ, builder.create<math::FloorOp>(loc, b), b);
        Value halfFloor = builder.create<math::FloorOp>(
            loc, builder.create<arith::MulFOp>(loc, b, c(0.5)));
        Value odd = builder.create<arith::CmpFOp>(
            loc, arith::CmpFPredicate::ONE, builder.create<arith::MulFOp>(loc, halfFloor, c(2.0)),
            b);
        Value negative = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, a, c(0.0));
        Value signedPower = builder.create<arith::SelectOp>(
            loc, odd, builder.create<arith::NegFOp>(loc, magnitude), magnitude);
        Value ofNegative = builder.create<arith::SelectOp>(
            loc, whole, signedPower, c(std::numeric_limits<double>::quiet_NaN()));
        Value power = builder.create<arith::SelectOp>(loc, negative, ofNegative, magnitude);
        Value zeroPower = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, b, c(0.0));
        return builder.create<arith::SelectOp>(loc, zeroPower, c(1.0), power);
      })
      .Case([&](SelectOp) {
        Value chosen = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNE, x(0),
                                                     c(0.0));
        return builder.create<arith::SelectOp>(loc, chosen, x(1), x(2));
      })
      .Case([&](GreaterOp) {
        Value gt = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT,
                                                 x(0), x(1));
        return builder.create<arith::SelectOp>(loc, gt, c(1.0), c(0.0));
      })
      .Case([&](NegOp) { return builder.create<arith::NegFOp>(loc, x(0)); })
      .Case([&](SigmoidOp) {
        // 1 / (1 + exp(-x))
        Value e = builder.create<math::ExpOp>(
            loc, builder.create<arith::NegFOp>(loc, x(0)));
        Value one = c(1.0);
        return builder.create<arith::DivFOp>(
            loc, one, builder.create<arith::AddFOp>(loc, one, e));
      })
      .Case([&](TanhOp) { return builder.create<math::TanhOp>(loc, x(0)); })
      .Case([&](ExpOp) { return builder.create<math::ExpOp>(loc, x(0)); })
      .Case([&](LogOp) { return builder.create<math::LogOp>(loc, x(0)); })
      .Case([&](ReluOp) {
        return builder.create<arith::MaximumFOp>(loc, x(0), c(0.0));
      })
      .Case([&](SoftplusOp) {
        // max(x, 0) + log1p(exp(-|x|)) does not overflow for large x.
        Value pos = builder.create<arith::MaximumFOp>(loc, x(0), c(0.0));
        Value negAbs = builder.create<arith::NegFOp>(
            loc, builder.create<math::AbsFOp>(loc, x(0)));
        Value tail = builder.create<math::Log1pOp>(
            loc, builder.create<math::ExpOp>(loc, negAbs));
        return builder.create<arith::AddFOp>(loc, pos, tail);
      })
      .Case([&](AbsOp) { return builder.create<math::AbsFOp>(loc, x(0)); })
      .Case([&](SqrtOp) { return builder.create<math::SqrtOp>(loc, x(0)); })
      .Case([&](RsqrtOp) {
        return builder.create<arith::DivFOp>(loc, c(1.0),
                                             builder.create<math::SqrtOp>(loc, x(0)));
      })
      .Case([&](Log1pOp) { return builder.create<math::Log1pOp>(loc, x(0)); })
      .Case([&](SinOp) { return builder.create<math::SinOp>(loc, x(0)); })
      .Case([&](CosOp) { return builder.create<math::CosOp>(loc, x(0)); })
      .Case([&](ErfOp) { return builder.create<math::ErfOp>(loc, x(0)); })
      .Case([&](SiluOp) {
        // x / (1 + exp(-x))
        Value e = builder.create<math::ExpOp>(loc, builder.create<arith::NegFOp>(loc, x(0)));
        return builder.create<arith::DivFOp>(
            loc, x(0), builder.create<arith::AddFOp>(loc, c(1.0), e));
      })
      .Case([&](GeluOp) {
        Value erf = builder.create<math::ErfOp>(
            loc, builder.create<arith::MulFOp>(loc, x(0), c(M_SQRT1_2)));
        Value half = builder.create<arith::MulFOp>(loc, c(0.5), x(0));
        return builder.create<arith::MulFOp>(
            loc, half, builder.create<arith::AddFOp>(loc, c(1.0), erf));
      })
      .Case([&](GeluTanhOp) {
        Value cube = builder.create<arith::MulFOp>(
            loc, x(0), builder.create<arith::MulFOp>(loc, x(0), x(0)));
        Value inner = builder.create<arith::AddFOp>(
            loc, x(0), builder.create<arith::MulFOp>(loc, c(0.044715), cube));
        Value t = builder.create<math::TanhOp>(
            loc, builder.create<arith::MulFOp>(loc, c(0.7978845608028654), inner));
        Value half = builder.create<arith::MulFOp>(loc, c(0.5), x(0));
        return builder.create<arith::MulFOp>(loc, half,
                                             builder.create<arith::AddFOp>(loc, c(1.0), t));
      })
      .Case([&](EluOp) {
        Value positive = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x(0),
                                                       c(0.0));
        return builder.create<arith::SelectOp>(
            loc, positive, x(0), builder.create<math::ExpM1Op>(loc, x(0)));
      })
      .Default([](Operation *) { return Value(); });
}

LogicalResult
replaceCellsByKernels(ModuleOp module,
                      function_ref<LogicalResult(DefOp def, func::FuncOp grad)> build) {
  for (DefOp def : llvm::to_vector(module.getOps<DefOp>())) {
    func::FuncOp grad = backwardStepOf(def);
    if (!grad || failed(build(def, grad)))
      return failure();
    grad->erase();
    def->erase();
  }
  return success();
}

ReverseSteps buildReverseSteps(OpBuilder &builder, Location loc, Value steps,
                               Value c0, Value c1, Value c2) {
  ReverseSteps r;
  Value last = builder.create<arith::SubIOp>(loc, steps, c1);
  r.loop = builder.create<scf::ForOp>(loc, c0, steps, c1);
  builder.setInsertionPointToStart(r.loop.getBody());
  Value iv = r.loop.getInductionVar();
  r.t = builder.create<arith::SubIOp>(loc, last, iv);
  r.slot = builder.create<arith::RemUIOp>(loc, iv, c2);
  r.next = builder.create<arith::SubIOp>(loc, c1, r.slot);
  r.isFirst = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, r.t, c0);
  return r;
}

} // namespace mlir::cell
