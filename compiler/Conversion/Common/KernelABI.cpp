//===- KernelABI.cpp - The argument lists the sequence kernels share ------===//

#include "compiler/Conversion/Common/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

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

unsigned KernelSignature::add(MLIRContext *ctx, Type type, StringRef kind,
                              StringRef name, ArrayRef<NamedAttribute> extra) {
  types.push_back(type);
  Builder b(ctx);
  SmallVector<NamedAttribute> attrs = {
      b.getNamedAttr("kind", b.getStringAttr(kind)),
      b.getNamedAttr("name", b.getStringAttr(name))};
  llvm::append_range(attrs, extra);
  info.push_back(b.getDictionaryAttr(attrs));
  return types.size() - 1;
}

unsigned KernelSignature::addPerState(DefOp def, StringRef kind, bool perStep) {
  unsigned first = types.size();
  for (auto [name, arg] : llvm::zip(
           def.getStateNames().getAsValueRange<StringAttr>(), def.getStates()))
    add(def.getContext(), sequenceType(arg.getType(), perStep), kind, name);
  return first;
}

unsigned KernelSignature::addPerOutput(DefOp def, StringRef kind) {
  unsigned first = types.size();
  for (auto [name, out] :
       llvm::zip(def.getOutputNames().getAsValueRange<StringAttr>(),
                 def.getYield().getOutputs()))
    add(def.getContext(), sequenceType(out.getType(), true), kind, name);
  return first;
}

void KernelSignature::addBatchRange(MLIRContext *ctx) {
  Builder b(ctx);
  add(ctx, b.getIndexType(), "batch_begin", "b_begin");
  add(ctx, b.getIndexType(), "batch_end", "b_end");
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

/// Common arguments: inputs, projections, resets, initial and start states,
/// params.
static void addCommonArgs(DefOp def, KernelSignature &sig, ForwardArgs &args) {
  MLIRContext *ctx = def.getContext();
  args.numInputs = def.getInputNames().size();
  for (auto [name, arg] :
       llvm::zip(def.getInputNames().getAsValueRange<StringAttr>(), def.getInputs()))
    sig.add(ctx, sequenceType(arg.getType(), true), "input", name);
  SmallVector<ProjectionOp> projections = projectionsOf(def);
  args.numProjections = projections.size();
  Builder b(ctx);
  for (ProjectionOp p : projections) {
    // What the runtime's GEMM computes: weight @ input + biases.
    SmallVector<Attribute> biases;
    for (Value bias : p.getBiases())
      biases.push_back(bias.getDefiningOp<ParamOp>().getNameAttr());
    auto input = cast<BlockArgument>(p.getVector());
    sig.add(ctx, sequenceType(p.getType(), true), "projection",
            p.getWeight().getDefiningOp<ParamOp>().getName(),
            {b.getNamedAttr("input", def.getInputNames()[input.getArgNumber()]),
             b.getNamedAttr("biases", b.getArrayAttr(biases))});
  }
  args.resets = sig.add(
      ctx,
      MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic},
                      IntegerType::get(ctx, 8)),
      "resets", "resets");
  args.firstInit = sig.addPerState(def, "initial_state", false);
  args.firstStart = sig.addPerState(def, "start_state", false);
  args.firstParam = sig.types.size();
  for (ParamOp param : def.getBody().getOps<ParamOp>()) {
    auto type = cast<RankedTensorType>(param.getType());
    sig.add(ctx, MemRefType::get(type.getShape(), type.getElementType()),
            "param", param.getName());
  }
}

KernelSignature forwardSignature(DefOp def, ForwardArgs &args) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  addCommonArgs(def, sig, args);
  args.firstOutput = sig.addPerOutput(def, "output");
  args.firstHistory = sig.addPerState(def, "state_history", true);
  args.gates = sig.add(ctx, gatesType(def), "gates", "gates");
  sig.addBatchRange(ctx);
  return sig;
}

FailureOr<KernelSignature> backwardSignature(DefOp def, func::FuncOp grad,
                                             BackwardArgs &args) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  addCommonArgs(def, sig, args);
  args.firstHistory = sig.addPerState(def, "state_history", true);
  args.gates = sig.add(ctx, gatesType(def), "gates", "gates");
  args.firstDOut = sig.addPerOutput(def, "output_grad");
  args.firstDFinal = sig.addPerState(def, "final_state_grad", false);

  // One buffer per result of the backward step.
  auto resultInfo = grad->getAttrOfType<ArrayAttr>("cell.grad_results");
  auto resultTypes = grad.getFunctionType().getResults();
  if (!resultInfo || resultInfo.size() != resultTypes.size())
    return grad.emitOpError("expects cell.grad_results for every result");
  args.firstResult = sig.types.size();
  args.kinds.clear();
  Operation *ret = grad.getBody().front().getTerminator();
  Builder b(ctx);
  for (auto [r, attr, type] : llvm::enumerate(resultInfo, resultTypes)) {
    auto dict = cast<DictionaryAttr>(attr);
    StringRef kind = dict.getAs<StringAttr>("kind").getValue();
    args.kinds.push_back(kind);
    auto nameAttr = dict.getAs<StringAttr>("name");
    StringRef name = nameAttr ? nameAttr.getValue()
                              : dict.getAs<StringAttr>("weight").getValue();
    bool perStep = kind != "state" && kind != "param";
    StringRef argKind = kind == "state"        ? "initial_state_grad"
                        : kind == "param"      ? "param_grad"
                        : kind == "input"      ? "input_grad"
                        : kind == "projection" ? "projection_grad"
                                               : kind;
    // A per-step result that repeats an earlier one (the gradient of a projection and
    // of a recurrent product both are the gate pre-activations' in an LSTM)
    // names it, so that the caller can pass one buffer for both; a result
    // that is zero says so.
    SmallVector<NamedAttribute> extra;
    Value value = ret->getOperand(r);
    for (unsigned earlier = 0; perStep && earlier < r; ++earlier)
      if (ret->getOperand(earlier) == value &&
          args.kinds[earlier] != "state" && args.kinds[earlier] != "param") {
        extra.push_back(b.getNamedAttr(
            "same_as", b.getI64IntegerAttr(args.firstResult + earlier)));
        break;
      }
    if (auto c = value.getDefiningOp<ConstantOp>(); c && c.getValue().isZero())
      extra.push_back(b.getNamedAttr("zero", b.getUnitAttr()));
    sig.add(ctx, sequenceType(type, perStep), argKind, name, extra);
  }
  args.firstStartGrad = sig.addPerState(def, "start_state_grad", false);
  sig.addBatchRange(ctx);
  return sig;
}

Value splat(OpBuilder &builder, Location loc, VectorType type, double value) {
  auto attr = FloatAttr::get(type.getElementType(), value);
  return builder.create<arith::ConstantOp>(
      loc, type, SplatElementsAttr::get(type, ArrayRef<Attribute>(attr)));
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
      .Default([](Operation *) { return Value(); });
}

} // namespace mlir::cell
