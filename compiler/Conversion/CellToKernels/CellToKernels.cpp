//===- CellToKernels.cpp - Build the sequence kernels of each cell --------===//

#include "compiler/Conversion/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTCELLTOKERNELS
#include "compiler/Conversion/Passes.h.inc"

namespace {

VectorType vectorOf(Type tensor) {
  auto type = cast<RankedTensorType>(tensor);
  return VectorType::get(type.getShape(), type.getElementType());
}

/// A memref `[?, ?, n]` (time, batch, features) or `[?, n]` (batch, features).
MemRefType sequenceType(Type tensor, bool perStep) {
  auto type = cast<RankedTensorType>(tensor);
  SmallVector<int64_t> shape;
  if (perStep)
    shape.push_back(ShapedType::kDynamic);
  shape.push_back(ShapedType::kDynamic);
  shape.push_back(type.getDimSize(0));
  return MemRefType::get(shape, type.getElementType());
}

/// Collects kernel arguments with their descriptions.
struct KernelSignature {
  SmallVector<Type> types;
  SmallVector<Attribute> info;

  unsigned add(MLIRContext *ctx, Type type, StringRef kind, StringRef name,
               ArrayRef<NamedAttribute> extra = {}) {
    types.push_back(type);
    Builder b(ctx);
    SmallVector<NamedAttribute> attrs = {
        b.getNamedAttr("kind", b.getStringAttr(kind)),
        b.getNamedAttr("name", b.getStringAttr(name))};
    llvm::append_range(attrs, extra);
    info.push_back(b.getDictionaryAttr(attrs));
    return types.size() - 1;
  }

  /// One buffer per state of `def`; returns the first one's index.
  unsigned addPerState(DefOp def, StringRef kind, bool perStep) {
    unsigned first = types.size();
    for (auto [name, arg] : llvm::zip(
             def.getStateNames().getAsValueRange<StringAttr>(), def.getStates()))
      add(def.getContext(), sequenceType(arg.getType(), perStep), kind, name);
    return first;
  }

  /// One `[T, B, n]` buffer per output of `def`; returns the first's index.
  unsigned addPerOutput(DefOp def, StringRef kind) {
    unsigned first = types.size();
    for (auto [name, out] :
         llvm::zip(def.getOutputNames().getAsValueRange<StringAttr>(),
                   def.getYield().getOutputs()))
      add(def.getContext(), sequenceType(out.getType(), true), kind, name);
    return first;
  }
};

/// Lowers the ops of one step (forward or backward) to vector code, for the
/// sample `b` at time `t`.
class StepLowering {
public:
  StepLowering(func::FuncOp kernel, Value saveGates) : saveGates(saveGates) {
    entry = OpBuilder::atBlockBegin(&kernel.getBody().front());
  }

  /// The memrefs and indices a step reads from.
  DenseMap<StringRef, Value> params;
  SmallVector<Value> projections;
  Value gates, t, b;
  /// Lowered values of the cell values seen so far.
  DenseMap<Value, Value> map;

  /// Lowers the ops of `block` up to its terminator.
  LogicalResult lowerBlock(OpBuilder &builder, Block &block);
  Value lookup(Value v) { return map.lookup(v); }

  /// Offsets of the saved values in the gate buffer.
  SmallVector<int64_t> gateOffsets(TypeRange types) {
    SmallVector<int64_t> offsets;
    int64_t offset = 0;
    for (Type type : types) {
      offsets.push_back(offset);
      offset += cast<RankedTensorType>(type).getDimSize(0);
    }
    return offsets;
  }

private:
  LogicalResult lower(OpBuilder &builder, Operation *op);
  Value constant(OpBuilder &builder, Location loc, VectorType type, double v) {
    auto attr = FloatAttr::get(type.getElementType(), v);
    return builder.create<arith::ConstantOp>(
        loc, type, SplatElementsAttr::get(type, ArrayRef<Attribute>(attr)));
  }
  Value index(OpBuilder &builder, Location loc, int64_t v) {
    return builder.create<arith::ConstantIndexOp>(loc, v);
  }
  /// A scratch buffer allocated once at kernel entry.
  Value scratch(Location loc, int64_t size, Type element) {
    return entry.create<memref::AllocaOp>(loc,
                                          MemRefType::get({size}, element));
  }

  Value saveGates;
  OpBuilder entry = OpBuilder(static_cast<MLIRContext *>(nullptr));
  unsigned nextProjection = 0;
};

LogicalResult StepLowering::lowerBlock(OpBuilder &builder, Block &block) {
  nextProjection = 0;
  for (Operation &op : block.without_terminator())
    if (failed(lower(builder, &op)))
      return failure();
  return success();
}

LogicalResult StepLowering::lower(OpBuilder &builder, Operation *op) {
  Location loc = op->getLoc();
  auto operand = [&](unsigned i) { return map.lookup(op->getOperand(i)); };
  auto result = [&](Value v) {
    map[op->getResult(0)] = v;
    return success();
  };
  VectorType type =
      op->getNumResults() == 1 && isa<RankedTensorType>(op->getResult(0).getType())
          ? dyn_cast<VectorType>(vectorOf(op->getResult(0).getType()))
          : VectorType();

  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](ParamOp param) -> LogicalResult {
        Value memref = params.lookup(param.getName());
        if (!memref)
          return param.emitOpError("has no kernel argument");
        if (cast<RankedTensorType>(param.getType()).getRank() == 2)
          return result(memref);
        // Vector params are loaded once, at kernel entry.
        Value zero = entry.create<arith::ConstantIndexOp>(loc, 0);
        return result(entry.create<vector::LoadOp>(loc, type, memref,
                                                   ValueRange{zero}));
      })
      .Case([&](ConstantOp c) -> LogicalResult {
        return result(constant(builder, loc, type,
                               c.getValue().convertToDouble()));
      })
      .Case([&](AddOp) -> LogicalResult {
        return result(builder.create<arith::AddFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](SubOp) -> LogicalResult {
        return result(builder.create<arith::SubFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](MulOp) -> LogicalResult {
        return result(builder.create<arith::MulFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](DivOp) -> LogicalResult {
        return result(builder.create<arith::DivFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](MaxOp) -> LogicalResult {
        return result(
            builder.create<arith::MaximumFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](MinOp) -> LogicalResult {
        return result(
            builder.create<arith::MinimumFOp>(loc, operand(0), operand(1)));
      })
      .Case([&](GreaterOp) -> LogicalResult {
        Value gt = builder.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT,
                                                 operand(0), operand(1));
        return result(builder.create<arith::SelectOp>(
            loc, gt, constant(builder, loc, type, 1.0),
            constant(builder, loc, type, 0.0)));
      })
      .Case([&](NegOp) -> LogicalResult {
        return result(builder.create<arith::NegFOp>(loc, operand(0)));
      })
      .Case([&](SigmoidOp) -> LogicalResult {
        // 1 / (1 + exp(-x))
        Value e = builder.create<math::ExpOp>(
            loc, builder.create<arith::NegFOp>(loc, operand(0)));
        Value one = constant(builder, loc, type, 1.0);
        return result(builder.create<arith::DivFOp>(
            loc, one, builder.create<arith::AddFOp>(loc, one, e)));
      })
      .Case([&](TanhOp) -> LogicalResult {
        return result(builder.create<math::TanhOp>(loc, operand(0)));
      })
      .Case([&](ExpOp) -> LogicalResult {
        return result(builder.create<math::ExpOp>(loc, operand(0)));
      })
      .Case([&](LogOp) -> LogicalResult {
        return result(builder.create<math::LogOp>(loc, operand(0)));
      })
      .Case([&](ReluOp) -> LogicalResult {
        return result(builder.create<arith::MaximumFOp>(
            loc, operand(0), constant(builder, loc, type, 0.0)));
      })
      .Case([&](SoftplusOp) -> LogicalResult {
        // max(x, 0) + log1p(exp(-|x|)) does not overflow for large x.
        Value x = operand(0);
        Value pos = builder.create<arith::MaximumFOp>(
            loc, x, constant(builder, loc, type, 0.0));
        Value negAbs = builder.create<arith::NegFOp>(
            loc, builder.create<math::AbsFOp>(loc, x));
        Value tail = builder.create<math::Log1pOp>(
            loc, builder.create<math::ExpOp>(loc, negAbs));
        return result(builder.create<arith::AddFOp>(loc, pos, tail));
      })
      .Case([&](AbsOp) -> LogicalResult {
        return result(builder.create<math::AbsFOp>(loc, operand(0)));
      })
      .Case([&](SqrtOp) -> LogicalResult {
        return result(builder.create<math::SqrtOp>(loc, operand(0)));
      })
      .Case([&](ChunkOp chunk) -> LogicalResult {
        int64_t part = cast<RankedTensorType>(chunk.getResult(0).getType())
                           .getDimSize(0);
        for (auto [k, r] : llvm::enumerate(chunk.getResults()))
          map[r] = builder.create<vector::ExtractStridedSliceOp>(
              loc, operand(0), ArrayRef<int64_t>{int64_t(k) * part},
              ArrayRef<int64_t>{part}, ArrayRef<int64_t>{1});
        return success();
      })
      .Case([&](ConcatOp concat) -> LogicalResult {
        Value acc = constant(builder, loc, type, 0.0);
        int64_t offset = 0;
        for (Value input : concat.getInputs()) {
          acc = builder.create<vector::InsertStridedSliceOp>(
              loc, map.lookup(input), acc, ArrayRef<int64_t>{offset},
              ArrayRef<int64_t>{1});
          offset += cast<RankedTensorType>(input.getType()).getDimSize(0);
        }
        return result(acc);
      })
      .Case([&](MatvecOp matvec) -> LogicalResult {
        // result[i] = dot(W[i, :], v), one row at a time, through scratch.
        auto weightType = cast<RankedTensorType>(matvec.getWeight().getType());
        int64_t rows = weightType.getDimSize(0), cols = weightType.getDimSize(1);
        Type element = weightType.getElementType();
        Value buffer = scratch(loc, rows, element);
        Value weight = operand(0), vec = operand(1);
        auto rowType = VectorType::get({cols}, element);
        builder.create<scf::ForOp>(
            loc, index(builder, loc, 0), index(builder, loc, rows),
            index(builder, loc, 1), ValueRange(),
            [&](OpBuilder &nb, Location l, Value i, ValueRange) {
              Value zero = nb.create<arith::ConstantIndexOp>(l, 0);
              Value row = nb.create<vector::LoadOp>(l, rowType, weight,
                                                    ValueRange{i, zero});
              Value prod = nb.create<arith::MulFOp>(l, row, vec);
              Value dot = nb.create<vector::ReductionOp>(
                  l, vector::CombiningKind::ADD, prod,
                  arith::FastMathFlags::reassoc);
              nb.create<memref::StoreOp>(l, dot, buffer, ValueRange{i});
              nb.create<scf::YieldOp>(l);
            });
        return result(builder.create<vector::LoadOp>(
            loc, type, buffer, ValueRange{index(builder, loc, 0)}));
      })
      .Case([&](VecmatOp vecmat) -> LogicalResult {
        // result = sum_i W[i, :] * g[i], with g read back through scratch.
        auto weightType = cast<RankedTensorType>(vecmat.getWeight().getType());
        int64_t rows = weightType.getDimSize(0);
        Type element = weightType.getElementType();
        Value buffer = scratch(loc, rows, element);
        Value weight = operand(0);
        builder.create<vector::StoreOp>(loc, operand(1), buffer,
                                        ValueRange{index(builder, loc, 0)});
        auto loop = builder.create<scf::ForOp>(
            loc, index(builder, loc, 0), index(builder, loc, rows),
            index(builder, loc, 1), ValueRange{constant(builder, loc, type, 0.0)},
            [&](OpBuilder &nb, Location l, Value i, ValueRange acc) {
              Value zero = nb.create<arith::ConstantIndexOp>(l, 0);
              Value gi = nb.create<memref::LoadOp>(l, buffer, ValueRange{i});
              Value row = nb.create<vector::LoadOp>(l, type, weight,
                                                    ValueRange{i, zero});
              Value splat = nb.create<vector::BroadcastOp>(l, type, gi);
              Value next = nb.create<vector::FMAOp>(l, row, splat, acc[0]);
              nb.create<scf::YieldOp>(l, next);
            });
        return result(loop.getResult(0));
      })
      .Case([&](ProjectionOp) -> LogicalResult {
        if (nextProjection >= projections.size())
          return op->emitOpError("has no projection buffer");
        Value buffer = projections[nextProjection++];
        return result(builder.create<vector::LoadOp>(
            loc, type, buffer, ValueRange{t, b, index(builder, loc, 0)}));
      })
      .Case([&](SaveOp save) -> LogicalResult {
        if (save.getValues().empty())
          return success();
        SmallVector<int64_t> offsets =
            gateOffsets(save.getValues().getTypes());
        builder.create<scf::IfOp>(
            loc, saveGates, [&](OpBuilder &nb, Location l) {
              for (auto [value, offset] : llvm::zip(save.getValues(), offsets)) {
                Value at = nb.create<arith::ConstantIndexOp>(l, offset);
                nb.create<vector::StoreOp>(l, map.lookup(value), gates,
                                           ValueRange{t, b, at});
              }
              nb.create<scf::YieldOp>(l);
            });
        return success();
      })
      .Case([&](RestoreOp restore) -> LogicalResult {
        if (restore.getNumResults() == 0)
          return success();
        SmallVector<int64_t> offsets = gateOffsets(restore.getResultTypes());
        LogicalResult status = success();
        auto ifOp = builder.create<scf::IfOp>(
            loc, saveGates,
            [&](OpBuilder &nb, Location l) {
              SmallVector<Value> loaded;
              for (auto [r, offset] : llvm::zip(restore.getResults(), offsets)) {
                Value at = nb.create<arith::ConstantIndexOp>(l, offset);
                loaded.push_back(nb.create<vector::LoadOp>(
                    l, vectorOf(r.getType()), gates, ValueRange{t, b, at}));
              }
              nb.create<scf::YieldOp>(l, loaded);
            },
            [&](OpBuilder &nb, Location l) {
              Block &body = restore.getBody().front();
              unsigned saved = nextProjection;
              status = lowerBlock(nb, body);
              nextProjection = saved;
              SmallVector<Value> replayed;
              for (Value v : body.getTerminator()->getOperands())
                replayed.push_back(map.lookup(v));
              nb.create<scf::YieldOp>(l, replayed);
            });
        if (failed(status))
          return failure();
        for (auto [r, v] : llvm::zip(restore.getResults(), ifOp.getResults()))
          map[r] = v;
        return success();
      })
      .Default([&](Operation *other) -> LogicalResult {
        return other->emitOpError("cannot be lowered to a sequence kernel");
      });
}

struct ConvertCellToKernels
    : public impl::ConvertCellToKernelsBase<ConvertCellToKernels> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (DefOp def : llvm::to_vector(module.getOps<DefOp>())) {
      auto grad = module.lookupSymbol<func::FuncOp>(
          (def.getSymName() + "_grad").str());
      if (!grad) {
        def.emitOpError("has no backward step; run cell-autodiff first");
        return signalPassFailure();
      }
      if (failed(buildForward(def)) || failed(buildBackward(def, grad)))
        return signalPassFailure();
      grad->erase();
      def->erase();
    }
  }

  /// Common arguments: inputs, projections, resets, initial states, params.
  void addCommonArgs(DefOp def, KernelSignature &sig,
                     SmallVectorImpl<ProjectionOp> &projections);
  LogicalResult buildForward(DefOp def);
  LogicalResult buildBackward(DefOp def, func::FuncOp grad);
  func::FuncOp createKernel(DefOp def, StringRef suffix, KernelSignature &sig);
};

void ConvertCellToKernels::addCommonArgs(
    DefOp def, KernelSignature &sig, SmallVectorImpl<ProjectionOp> &projections) {
  MLIRContext *ctx = def.getContext();
  for (auto [name, arg] :
       llvm::zip(def.getInputNames().getAsValueRange<StringAttr>(), def.getInputs()))
    sig.add(ctx, sequenceType(arg.getType(), true), "input", name);
  def.walk([&](ProjectionOp p) { projections.push_back(p); });
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
  sig.add(ctx,
          MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic},
                          IntegerType::get(ctx, 8)),
          "resets", "resets");
  sig.addPerState(def, "initial_state", false);
  sig.addPerState(def, "start_state", false);
  for (ParamOp param : def.getBody().getOps<ParamOp>()) {
    auto type = cast<RankedTensorType>(param.getType());
    sig.add(ctx, MemRefType::get(type.getShape(), type.getElementType()),
            "param", param.getName());
  }
}

func::FuncOp ConvertCellToKernels::createKernel(DefOp def, StringRef suffix,
                                                KernelSignature &sig) {
  MLIRContext *ctx = def.getContext();
  OpBuilder builder(def);
  sig.add(ctx, builder.getIndexType(), "batch_begin", "b_begin");
  sig.add(ctx, builder.getIndexType(), "batch_end", "b_end");
  auto kernel = builder.create<func::FuncOp>(
      def.getLoc(), (def.getSymName() + suffix).str(),
      builder.getFunctionType(sig.types, {}));
  kernel->setAttr("cell.kernel_args", builder.getArrayAttr(sig.info));
  kernel.addEntryBlock();
  return kernel;
}

/// The gate buffer type of a cell: `[T, B, sum of the saved sizes]`.
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

/// What both kernels start with: the SAVE_GATES flag, the step lowering bound
/// to the kernel's params, projections and gates, and the loop bounds.
struct KernelFrame {
  KernelFrame(func::FuncOp kernel, DefOp def, unsigned numProjections,
              unsigned gatesArg)
      : entry(kernel.getBody().front()),
        builder(OpBuilder::atBlockEnd(&entry)), loc(def.getLoc()),
        step(kernel, builder.create<SaveGatesOp>(loc, builder.getI1Type())) {
    unsigned numInputs = def.getInputNames().size();
    unsigned resetsArg = numInputs + numProjections;
    unsigned numStates = def.getStateNames().size();
    firstInit = resetsArg + 1;
    firstStart = firstInit + numStates;
    unsigned firstParam = firstStart + numStates;
    for (auto [i, param] : llvm::enumerate(def.getBody().getOps<ParamOp>()))
      step.params[param.getName()] = entry.getArgument(firstParam + i);
    for (unsigned p = 0; p < numProjections; ++p)
      step.projections.push_back(entry.getArgument(numInputs + p));
    step.gates = entry.getArgument(gatesArg);
    c0 = builder.create<arith::ConstantIndexOp>(loc, 0);
    c1 = builder.create<arith::ConstantIndexOp>(loc, 1);
    resets = entry.getArgument(resetsArg);
    steps = builder.create<memref::DimOp>(loc, resets, 0);
    zeroByte = builder.create<arith::ConstantIntOp>(loc, 0, 8);
    bBegin = entry.getArgument(entry.getNumArguments() - 2);
    bEnd = entry.getArgument(entry.getNumArguments() - 1);
  }

  Value arg(unsigned i) { return entry.getArgument(i); }
  /// Whether the state at (t, b) restarts from its initial value.
  Value isReset(OpBuilder &b, Location l, Value t, Value batch) {
    Value flagByte = b.create<memref::LoadOp>(l, resets, ValueRange{t, batch});
    return b.create<arith::CmpIOp>(l, arith::CmpIPredicate::ne, flagByte,
                                   zeroByte);
  }

  Block &entry;
  OpBuilder builder;
  Location loc;
  StepLowering step;
  /// The first initial state (the value at a reset) and the first start
  /// state (the value before step 0 of this call; the previous chunk's last
  /// state when a sequence runs in chunks).
  unsigned firstInit, firstStart;
  Value c0, c1, resets, steps, zeroByte, bBegin, bEnd;
};

LogicalResult ConvertCellToKernels::buildForward(DefOp def) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  SmallVector<ProjectionOp> projections;
  addCommonArgs(def, sig, projections);
  YieldOp yield = def.getYield();
  unsigned firstOutput = sig.addPerOutput(def, "output");
  unsigned firstHistory = sig.addPerState(def, "state_history", true);
  unsigned gatesArg = sig.add(ctx, gatesType(def), "gates", "gates");

  func::FuncOp kernel = createKernel(def, "_fwd", sig);
  KernelFrame frame(kernel, def, projections.size(), gatesArg);
  Block &entry = frame.entry;
  OpBuilder &builder = frame.builder;
  StepLowering &step = frame.step;
  Location loc = frame.loc;
  Value c0 = frame.c0, c1 = frame.c1, steps = frame.steps;
  unsigned firstInit = frame.firstInit;
  LogicalResult status = success();

  builder.create<scf::ForOp>(
      loc, frame.bBegin, frame.bEnd, c1, ValueRange(),
      [&](OpBuilder &bb, Location l, Value b, ValueRange) {
        SmallVector<Value> initial, start;
        for (auto [i, arg] : llvm::enumerate(def.getStates())) {
          initial.push_back(bb.create<vector::LoadOp>(
              l, vectorOf(arg.getType()), entry.getArgument(firstInit + i),
              ValueRange{b, c0}));
          start.push_back(bb.create<vector::LoadOp>(
              l, vectorOf(arg.getType()), frame.arg(frame.firstStart + i),
              ValueRange{b, c0}));
        }
        bb.create<scf::ForOp>(
            l, c0, steps, c1, start,
            [&](OpBuilder &tb, Location l2, Value t, ValueRange states) {
              step.t = t;
              step.b = b;
              Value isReset = frame.isReset(tb, l2, t, b);
              for (auto [i, arg] : llvm::enumerate(def.getStates()))
                step.map[arg] = tb.create<arith::SelectOp>(l2, isReset, initial[i],
                                                           states[i]);
              for (auto [i, arg] : llvm::enumerate(def.getInputs()))
                step.map[arg] = tb.create<vector::LoadOp>(
                    l2, vectorOf(arg.getType()), entry.getArgument(i),
                    ValueRange{t, b, c0});
              if (failed(step.lowerBlock(tb, def.getBody().front()))) {
                status = failure();
                tb.create<scf::YieldOp>(l2, states);
                return;
              }
              for (auto [i, out] : llvm::enumerate(yield.getOutputs()))
                tb.create<vector::StoreOp>(l2, step.lookup(out),
                                           entry.getArgument(firstOutput + i),
                                           ValueRange{t, b, c0});
              SmallVector<Value> next;
              for (auto [i, s] : llvm::enumerate(yield.getStates())) {
                next.push_back(step.lookup(s));
                tb.create<vector::StoreOp>(l2, next.back(),
                                           entry.getArgument(firstHistory + i),
                                           ValueRange{t, b, c0});
              }
              tb.create<scf::YieldOp>(l2, next);
            });
        bb.create<scf::YieldOp>(l);
      });
  builder.create<func::ReturnOp>(loc);
  return status;
}

LogicalResult ConvertCellToKernels::buildBackward(DefOp def, func::FuncOp grad) {
  MLIRContext *ctx = def.getContext();
  KernelSignature sig;
  SmallVector<ProjectionOp> projections;
  addCommonArgs(def, sig, projections);
  YieldOp yield = def.getYield();
  unsigned numStates = def.getStateNames().size();
  unsigned numProjections = projections.size();

  unsigned firstHistory = sig.addPerState(def, "state_history", true);
  unsigned gatesArg = sig.add(ctx, gatesType(def), "gates", "gates");
  unsigned firstDOut = sig.addPerOutput(def, "output_grad");
  unsigned firstDFinal = sig.addPerState(def, "final_state_grad", false);

  // One buffer per result of the backward step.
  auto resultInfo = grad->getAttrOfType<ArrayAttr>("cell.grad_results");
  auto resultTypes = grad.getFunctionType().getResults();
  if (!resultInfo || resultInfo.size() != resultTypes.size())
    return grad.emitOpError("expects cell.grad_results for every result");
  unsigned firstResult = sig.types.size();
  SmallVector<StringRef> kinds;
  for (auto [attr, type] : llvm::zip(resultInfo, resultTypes)) {
    auto dict = cast<DictionaryAttr>(attr);
    StringRef kind = dict.getAs<StringAttr>("kind").getValue();
    kinds.push_back(kind);
    auto nameAttr = dict.getAs<StringAttr>("name");
    StringRef name = nameAttr ? nameAttr.getValue()
                              : dict.getAs<StringAttr>("weight").getValue();
    bool perStep = kind != "state" && kind != "param";
    StringRef argKind = kind == "state"   ? "initial_state_grad"
                        : kind == "param" ? "param_grad"
                        : kind == "input" ? "input_grad"
                        : kind == "projection" ? "projection_grad"
                                               : kind;
    sig.add(ctx, sequenceType(type, perStep), argKind, name);
  }
  unsigned firstStartGrad = sig.addPerState(def, "start_state_grad", false);

  func::FuncOp kernel = createKernel(def, "_bwd", sig);
  KernelFrame frame(kernel, def, numProjections, gatesArg);
  Block &entry = frame.entry;
  OpBuilder &builder = frame.builder;
  StepLowering &step = frame.step;
  Location loc = frame.loc;
  Value c0 = frame.c0, c1 = frame.c1, steps = frame.steps;
  unsigned firstInit = frame.firstInit;
  Value last = builder.create<arith::SubIOp>(loc, steps, c1);
  Block &gradBody = grad.getBody().front();
  auto ret = cast<func::ReturnOp>(gradBody.getTerminator());
  LogicalResult status = success();

  // Accumulators carried over time: the next-state gradients, the initial-
  // and start-state gradients, and the vector-param gradients.
  SmallVector<unsigned> paramResults;
  for (auto [i, kind] : llvm::enumerate(kinds))
    if (kind == "param")
      paramResults.push_back(i);

  builder.create<scf::ForOp>(
      loc, frame.bBegin, frame.bEnd, c1, ValueRange(),
      [&](OpBuilder &bb, Location l, Value b, ValueRange) {
        SmallVector<Value> initial, start, carried;
        for (auto [i, arg] : llvm::enumerate(def.getStates())) {
          VectorType type = vectorOf(arg.getType());
          initial.push_back(bb.create<vector::LoadOp>(
              l, type, entry.getArgument(firstInit + i), ValueRange{b, c0}));
          start.push_back(bb.create<vector::LoadOp>(
              l, type, frame.arg(frame.firstStart + i), ValueRange{b, c0}));
          carried.push_back(bb.create<vector::LoadOp>(
              l, type, entry.getArgument(firstDFinal + i), ValueRange{b, c0}));
        }
        auto zerosLike = [&](OpBuilder &ob, Type tensor) -> Value {
          VectorType type = vectorOf(tensor);
          auto attr = FloatAttr::get(type.getElementType(), 0.0);
          return ob.create<arith::ConstantOp>(
              l, type, SplatElementsAttr::get(type, ArrayRef<Attribute>(attr)));
        };
        for (int twice = 0; twice < 2; ++twice)
          for (auto arg : def.getStates())
            carried.push_back(zerosLike(bb, arg.getType()));
        for (unsigned r : paramResults)
          carried.push_back(zerosLike(bb, resultTypes[r]));

        auto loop = bb.create<scf::ForOp>(
            l, c0, steps, c1, carried,
            [&](OpBuilder &tb, Location l2, Value i, ValueRange acc) {
              Value t = tb.create<arith::SubIOp>(l2, last, i);
              step.t = t;
              step.b = b;
              Value isReset = frame.isReset(tb, l2, t, b);
              Value isFirst = tb.create<arith::CmpIOp>(
                  l2, arith::CmpIPredicate::eq, t, c0);
              Value notReset = tb.create<arith::XOrIOp>(
                  l2, isReset, tb.create<arith::ConstantIntOp>(l2, 1, 1));
              Value fromStart = tb.create<arith::AndIOp>(l2, isFirst, notReset);
              Value fromOutside = tb.create<arith::OrIOp>(l2, isReset, isFirst);
              // The previous step's index, clamped: at t = 0 the state comes
              // from outside anyway.
              Value tm1 = tb.create<arith::SelectOp>(
                  l2, isFirst, c0, tb.create<arith::SubIOp>(l2, t, c1));

              // The backward step's arguments: inputs, previous states,
              // output gradients, next-state gradients.
              unsigned a = 0;
              for (auto [k, arg] : llvm::enumerate(def.getInputs()))
                step.map[gradBody.getArgument(a++)] = tb.create<vector::LoadOp>(
                    l2, vectorOf(arg.getType()), entry.getArgument(k),
                    ValueRange{t, b, c0});
              for (auto [k, arg] : llvm::enumerate(def.getStates())) {
                Value stored = tb.create<vector::LoadOp>(
                    l2, vectorOf(arg.getType()),
                    entry.getArgument(firstHistory + k), ValueRange{tm1, b, c0});
                Value before =
                    tb.create<arith::SelectOp>(l2, isFirst, start[k], stored);
                step.map[gradBody.getArgument(a++)] = tb.create<arith::SelectOp>(
                    l2, isReset, initial[k], before);
              }
              for (auto [k, out] : llvm::enumerate(yield.getOutputs()))
                step.map[gradBody.getArgument(a++)] = tb.create<vector::LoadOp>(
                    l2, vectorOf(out.getType()), entry.getArgument(firstDOut + k),
                    ValueRange{t, b, c0});
              for (unsigned k = 0; k < numStates; ++k)
                step.map[gradBody.getArgument(a++)] = acc[k];

              SmallVector<Value> next;
              if (failed(step.lowerBlock(tb, gradBody))) {
                status = failure();
                tb.create<scf::YieldOp>(l2, acc);
                return;
              }
              SmallVector<Value> nextDState, nextDInit, nextDStart, nextDParam;
              unsigned p = 0;
              for (auto [r, value] : llvm::enumerate(ret.getOperands())) {
                Value lowered = step.lookup(value);
                Value buffer = entry.getArgument(firstResult + r);
                StringRef kind = kinds[r];
                if (kind == "state") {
                  // At a reset the gradient goes to the initial state, at
                  // t = 0 to the start state, and otherwise on to step t - 1.
                  Value zero = zerosLike(tb, value.getType());
                  Value accInit = acc[numStates + r];
                  Value accStart = acc[2 * numStates + r];
                  nextDInit.push_back(tb.create<arith::SelectOp>(
                      l2, isReset, tb.create<arith::AddFOp>(l2, accInit, lowered),
                      accInit));
                  nextDStart.push_back(tb.create<arith::SelectOp>(
                      l2, fromStart,
                      tb.create<arith::AddFOp>(l2, accStart, lowered), accStart));
                  nextDState.push_back(
                      tb.create<arith::SelectOp>(l2, fromOutside, zero, lowered));
                } else if (kind == "param") {
                  nextDParam.push_back(tb.create<arith::AddFOp>(
                      l2, acc[3 * numStates + p++], lowered));
                } else {
                  tb.create<vector::StoreOp>(l2, lowered, buffer,
                                             ValueRange{t, b, c0});
                }
              }
              llvm::append_range(next, nextDState);
              llvm::append_range(next, nextDInit);
              llvm::append_range(next, nextDStart);
              llvm::append_range(next, nextDParam);
              tb.create<scf::YieldOp>(l2, next);
            });

        for (unsigned k = 0; k < numStates; ++k) {
          bb.create<vector::StoreOp>(l, loop.getResult(numStates + k),
                                     entry.getArgument(firstResult + k),
                                     ValueRange{b, c0});
          bb.create<vector::StoreOp>(l, loop.getResult(2 * numStates + k),
                                     entry.getArgument(firstStartGrad + k),
                                     ValueRange{b, c0});
        }
        for (auto [p, r] : llvm::enumerate(paramResults))
          bb.create<vector::StoreOp>(l, loop.getResult(3 * numStates + p),
                                     entry.getArgument(firstResult + r),
                                     ValueRange{b, c0});
        bb.create<scf::YieldOp>(l);
      });
  builder.create<func::ReturnOp>(loc);
  return status;
}

} // namespace
} // namespace mlir::cell
