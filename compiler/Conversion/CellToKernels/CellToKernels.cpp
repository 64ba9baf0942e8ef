//===- CellToKernels.cpp - Build the sequence kernels of each cell --------===//

#include "compiler/Conversion/Passes.h"

#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/KnobOptions.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTCELLTOKERNELS
#include "compiler/Conversion/Passes.h.inc"

namespace {

/// Lowers the ops of one step (forward or backward) to vector code, for the
/// sample `b` at time `t`.
class StepLowering {
public:
  StepLowering(func::FuncOp kernel, Value saveGates) : saveGates(saveGates) {
    entry = OpBuilder::atBlockBegin(&kernel.getBody().front());
  }

  /// The recurrent matvec's shape: `width` lanes per FMA (0: the whole row)
  /// and `unroll` rows per iteration. Both divide the weight's dimensions;
  /// the pass checks that.
  int64_t matvecWidth = 0, matvecUnroll = 1;

  /// The memrefs and indices a step reads from.
  DenseMap<StringRef, Value> params;
  SmallVector<Value> projections;
  /// The step's projections, in the order of `projections`' buffers: a
  /// projection op reads the buffer of the one it computes again.
  SmallVector<ProjectionOp> forwardProjections;
  Value gates, t, b;
  /// Lowered values of the cell values seen so far.
  DenseMap<Value, Value> map;

  /// Lowers the ops of `block` up to its terminator (but those that
  /// lowerLeadingMatvecs lowered).
  LogicalResult lowerBlock(OpBuilder &builder, Block &block);
  /// Lowers first the matvecs of `block` whose vector is one that the step
  /// starts with (an input or a state: an argument of `block`), each into
  /// its scratch, all in one order or, where `descending` (i1), in the
  /// opposite one: the matvecs from the last, each from its last row. A
  /// kernel that turns the order around at every step and call (a snake)
  /// finds at the start of each the rows it read last still in the L2. The
  /// results do not depend on the order: each is one row's dot product.
  void lowerLeadingMatvecs(OpBuilder &builder, Block &block, Value descending);
  /// Those matvecs of `block`, in its order.
  SmallVector<MatvecOp> leadingMatvecs(Block &block);
  Value lookup(Value v) { return map.lookup(v); }

private:
  LogicalResult lower(OpBuilder &builder, Operation *op);
  /// The gate stores of a `cell.save`, under SAVE_GATES.
  void lowerSave(OpBuilder &builder, SaveOp save);
  /// A `cell.restore`: its values loaded under SAVE_GATES, its region
  /// replayed otherwise.
  LogicalResult lowerRestore(OpBuilder &builder, RestoreOp restore);
  Value lowerProduct(OpBuilder &builder, Location loc, Value weight, Value v,
                     VectorType type, bool transposed);
  Value lowerMatvec(OpBuilder &builder, Location loc, Value weight, Value v,
                    VectorType type);
  /// `buffer[i] = dot(weight[i, :], v)` for every row, from the last row
  /// down when `descending`.
  void emitMatvec(OpBuilder &builder, Location loc, Value weight, Value v, Value buffer,
                  bool descending);
  Value lowerVecmat(OpBuilder &builder, Location loc, Value weight, Value g,
                    VectorType type);
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
  /// The ops lowerLeadingMatvecs lowered, which lowerBlock skips.
  llvm::SmallPtrSet<Operation *, 4> leading;
};

LogicalResult StepLowering::lowerBlock(OpBuilder &builder, Block &block) {
  for (Operation &op : block.without_terminator())
    if (!leading.contains(&op) && failed(lower(builder, &op)))
      return failure();
  return success();
}

SmallVector<MatvecOp> StepLowering::leadingMatvecs(Block &block) {
  SmallVector<MatvecOp> group;
  for (MatvecOp matvec : block.getOps<MatvecOp>()) {
    auto param = matvec.getWeight().getDefiningOp<ParamOp>();
    auto vector = dyn_cast<BlockArgument>(matvec->getOperand(1));
    if (param && cast<RankedTensorType>(param.getType()).getRank() == 2 && vector &&
        vector.getOwner() == &block && params.lookup(param.getName()))
      group.push_back(matvec);
  }
  return group;
}

void StepLowering::lowerLeadingMatvecs(OpBuilder &builder, Block &block, Value descending) {
  SmallVector<MatvecOp> group = leadingMatvecs(block);
  if (group.empty())
    return;
  Location loc = group.front().getLoc();
  SmallVector<Value> buffers;
  for (MatvecOp matvec : group) {
    auto type = cast<RankedTensorType>(matvec.getType());
    buffers.push_back(scratch(matvec.getLoc(), type.getDimSize(0), type.getElementType()));
  }
  auto emit = [&](OpBuilder &b, Location l, bool down) {
    for (size_t k = 0; k < group.size(); ++k) {
      size_t i = down ? group.size() - 1 - k : k;
      Value weight = params.lookup(group[i].getWeight().getDefiningOp<ParamOp>().getName());
      emitMatvec(b, l, weight, map.lookup(group[i]->getOperand(1)), buffers[i], down);
    }
    b.create<scf::YieldOp>(l);
  };
  builder.create<scf::IfOp>(
      loc, descending, [&](OpBuilder &b, Location l) { emit(b, l, true); },
      [&](OpBuilder &b, Location l) { emit(b, l, false); });
  for (auto [matvec, buffer] : llvm::zip(group, buffers)) {
    map[matvec.getResult()] =
        builder.create<vector::LoadOp>(loc, vectorOf(matvec.getType()), buffer,
                                       ValueRange{index(builder, loc, 0)});
    leading.insert(matvec);
  }
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

  if (type)
    if (Value v = buildElementwise(builder, op,
                                   llvm::map_to_vector(op->getOperands(), [&](Value x) {
                                     return map.lookup(x);
                                   }),
                                   type))
      return result(v);
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](ParamOp param) -> LogicalResult {
        Value memref = params.lookup(param.getName());
        if (!memref)
          return param.emitOpError("has no kernel argument");
        if (cast<RankedTensorType>(param.getType()).getRank() >= 2)
          return result(memref);
        // Vector params are loaded once, at kernel entry.
        Value zero = entry.create<arith::ConstantIndexOp>(loc, 0);
        return result(entry.create<vector::LoadOp>(loc, type, memref,
                                                   ValueRange{zero}));
      })
      .Case([&](ConstantOp c) -> LogicalResult {
        return result(splat(builder, loc, type,
                               c.getValue().convertToDouble()));
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
      .Case([&](SumOp) -> LogicalResult {
        Value total = builder.create<vector::ReductionOp>(
            loc, vector::CombiningKind::ADD, operand(0));
        return result(builder.create<vector::BroadcastOp>(loc, type, total));
      })
      .Case([&](BroadcastOp) -> LogicalResult {
        Value one = builder.create<vector::ExtractOp>(loc, operand(0),
                                                      ArrayRef<int64_t>{0});
        return result(builder.create<vector::BroadcastOp>(loc, type, one));
      })
      // A sample's value is one vector here: an expand picks each element's
      // kept one; a reduce adds, for each combination of the summed dims,
      // the elements picked at it.
      .Case([&](ExpandOp e) -> LogicalResult {
        SmallVector<int64_t> mask;
        for (int64_t f = 0, n = type.getNumElements(); f < n; ++f)
          mask.push_back(keptIndex(e.getShape(), e.getKept(), f));
        return result(builder.create<vector::ShuffleOp>(loc, operand(0), operand(0), mask));
      })
      .Case([&](ReduceOp r) -> LogicalResult {
        int64_t kept = type.getNumElements();
        int64_t whole = cast<VectorType>(operand(0).getType()).getNumElements();
        // picks[j][k]: the j-th element that adds into k.
        SmallVector<SmallVector<int64_t>> picks(whole / kept, SmallVector<int64_t>(kept));
        SmallVector<int64_t> seen(kept, 0);
        for (int64_t f = 0; f < whole; ++f) {
          int64_t k = keptIndex(r.getShape(), r.getKept(), f);
          picks[seen[k]++][k] = f;
        }
        ReduceCombine combine{r.getCombineKind()};
        Value acc;
        for (ArrayRef<int64_t> mask : picks) {
          Value part = builder.create<vector::ShuffleOp>(loc, operand(0), operand(0), mask);
          acc = acc ? combine.combine(builder, loc, acc, part) : part;
        }
        return result(acc);
      })
      .Case([&](ConcatOp concat) -> LogicalResult {
        Value acc = splat(builder, loc, type, 0.0);
        int64_t offset = 0;
        for (Value input : concat.getInputs()) {
          acc = builder.create<vector::InsertStridedSliceOp>(
              loc, map.lookup(input), acc, ArrayRef<int64_t>{offset},
              ArrayRef<int64_t>{1});
          offset += cast<RankedTensorType>(input.getType()).getDimSize(0);
        }
        return result(acc);
      })
      .Case([&](MatvecOp) -> LogicalResult {
        return result(lowerProduct(builder, loc, operand(0), operand(1), type,
                                   /*transposed=*/false));
      })
      .Case([&](VecmatOp) -> LogicalResult {
        return result(lowerProduct(builder, loc, operand(0), operand(1), type,
                                   /*transposed=*/true));
      })
      .Case([&](ProjectionOp p) -> LogicalResult {
        std::optional<unsigned> which = projectionIndexOf(forwardProjections, p);
        if (!which || *which >= projections.size())
          return op->emitOpError("has no projection buffer");
        Value buffer = projections[*which];
        return result(builder.create<vector::LoadOp>(
            loc, type, buffer, ValueRange{t, b, index(builder, loc, 0)}));
      })
      .Case([&](SaveOp save) -> LogicalResult {
        lowerSave(builder, save);
        return success();
      })
      .Case([&](RestoreOp restore) { return lowerRestore(builder, restore); })
      .Default([&](Operation *other) -> LogicalResult {
        return other->emitOpError("cannot be lowered to a sequence kernel");
      });
}

void StepLowering::lowerSave(OpBuilder &builder, SaveOp save) {
  if (save.getValues().empty())
    return;
  SmallVector<int64_t> offsets = packedOffsets(save.getValues().getTypes());
  builder.create<scf::IfOp>(save.getLoc(), saveGates, [&](OpBuilder &nb, Location l) {
    for (auto [value, offset] : llvm::zip(save.getValues(), offsets)) {
      Value at = nb.create<arith::ConstantIndexOp>(l, offset);
      nb.create<vector::StoreOp>(l, map.lookup(value), gates, ValueRange{t, b, at});
    }
    nb.create<scf::YieldOp>(l);
  });
}

LogicalResult StepLowering::lowerRestore(OpBuilder &builder, RestoreOp restore) {
  if (restore.getNumResults() == 0)
    return success();
  SmallVector<int64_t> offsets = packedOffsets(restore.getResultTypes());
  LogicalResult status = success();
  auto ifOp = builder.create<scf::IfOp>(
      restore.getLoc(), saveGates,
      [&](OpBuilder &nb, Location l) {
        SmallVector<Value> loaded;
        for (auto [r, offset] : llvm::zip(restore.getResults(), offsets)) {
          Value at = nb.create<arith::ConstantIndexOp>(l, offset);
          loaded.push_back(
              nb.create<vector::LoadOp>(l, vectorOf(r.getType()), gates, ValueRange{t, b, at}));
        }
        nb.create<scf::YieldOp>(l, loaded);
      },
      [&](OpBuilder &nb, Location l) {
        Block &body = restore.getBody().front();
        status = lowerBlock(nb, body);
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
}

/// `weight @ v` (`v @ weight` when `transposed`) into a vector of `type`; a
/// block-diagonal `[G, M, N]` weight block by block, each block a product
/// on its view of the weight and its part of `v`.
Value StepLowering::lowerProduct(OpBuilder &builder, Location loc, Value weight, Value v,
                                 VectorType type, bool transposed) {
  auto weightType = cast<MemRefType>(weight.getType());
  int64_t rank = weightType.getRank();
  if (rank == 2)
    return transposed ? lowerVecmat(builder, loc, weight, v, type)
                      : lowerMatvec(builder, loc, weight, v, type);
  int64_t blocks = weightType.getDimSize(0), rows = weightType.getDimSize(1),
          cols = weightType.getDimSize(2);
  int64_t in = transposed ? rows : cols, out = transposed ? cols : rows;
  Type element = weightType.getElementType();
  auto partType = VectorType::get({out}, element);
  Value acc = splat(builder, loc, type, 0.0);
  for (int64_t g = 0; g < blocks; ++g) {
    Value view = blockOf(builder, loc, weight, g);
    Value part = builder.create<vector::ExtractStridedSliceOp>(
        loc, v, ArrayRef<int64_t>{g * in}, ArrayRef<int64_t>{in}, ArrayRef<int64_t>{1});
    Value r = transposed ? lowerVecmat(builder, loc, view, part, partType)
                         : lowerMatvec(builder, loc, view, part, partType);
    acc = builder.create<vector::InsertStridedSliceOp>(loc, r, acc, ArrayRef<int64_t>{g * out},
                                                       ArrayRef<int64_t>{1});
  }
  return acc;
}

Value StepLowering::lowerMatvec(OpBuilder &builder, Location loc, Value weight, Value v,
                                VectorType type) {
  auto weightType = cast<MemRefType>(weight.getType());
  Value buffer = scratch(loc, weightType.getDimSize(0), weightType.getElementType());
  emitMatvec(builder, loc, weight, v, buffer, /*descending=*/false);
  return builder.create<vector::LoadOp>(loc, type, buffer,
                                        ValueRange{index(builder, loc, 0)});
}

// buffer[i] = dot(W[i, :], v): `unroll` rows at a time, each row in
// `width`-lane pieces accumulated by FMA and reduced once. The vector goes
// through scratch so that pieces load at a loop index.
void StepLowering::emitMatvec(OpBuilder &builder, Location loc, Value weight, Value v,
                              Value buffer, bool descending) {
  auto weightType = cast<MemRefType>(weight.getType());
  int64_t rows = weightType.getDimSize(0), cols = weightType.getDimSize(1);
  int64_t width = matvecWidth > 0 ? matvecWidth : cols;
  int64_t unroll = matvecUnroll;
  Type element = weightType.getElementType();
  Value vector = scratch(loc, cols, element);
  builder.create<vector::StoreOp>(loc, v, vector, ValueRange{index(builder, loc, 0)});
  auto pieceType = VectorType::get({width}, element);
  builder.create<scf::ForOp>(
      loc, index(builder, loc, 0), index(builder, loc, rows),
      index(builder, loc, unroll), ValueRange(),
      [&](OpBuilder &nb, Location l, Value i, ValueRange) {
        // Descending: the groups of `unroll` rows from the last.
        if (descending)
          i = nb.create<arith::SubIOp>(l, index(nb, l, rows - unroll), i);
        SmallVector<Value> rowIndex, zeros;
        for (int64_t r = 0; r < unroll; ++r) {
          rowIndex.push_back(
              r == 0 ? i : nb.create<arith::AddIOp>(l, i, index(nb, l, r)).getResult());
          zeros.push_back(splat(nb, l, pieceType, 0.0));
        }
        auto pieces = nb.create<scf::ForOp>(
            l, index(nb, l, 0), index(nb, l, cols), index(nb, l, width), zeros,
            [&](OpBuilder &kb, Location kl, Value k, ValueRange acc) {
              Value x = kb.create<vector::LoadOp>(kl, pieceType, vector, ValueRange{k});
              SmallVector<Value> next;
              for (int64_t r = 0; r < unroll; ++r) {
                Value w = kb.create<vector::LoadOp>(kl, pieceType, weight,
                                                    ValueRange{rowIndex[r], k});
                next.push_back(kb.create<vector::FMAOp>(kl, w, x, acc[r]));
              }
              kb.create<scf::YieldOp>(kl, next);
            });
        for (int64_t r = 0; r < unroll; ++r) {
          Value dot = nb.create<vector::ReductionOp>(l, vector::CombiningKind::ADD,
                                                     pieces.getResult(r),
                                                     arith::FastMathFlags::reassoc);
          nb.create<memref::StoreOp>(l, dot, buffer, ValueRange{rowIndex[r]});
        }
        nb.create<scf::YieldOp>(l);
      });
}

// result = sum_i W[i, :] * g[i], with g read back through scratch.
Value StepLowering::lowerVecmat(OpBuilder &builder, Location loc, Value weight, Value g,
                                VectorType type) {
  auto weightType = cast<MemRefType>(weight.getType());
  int64_t rows = weightType.getDimSize(0);
  Value buffer = scratch(loc, rows, weightType.getElementType());
  builder.create<vector::StoreOp>(loc, g, buffer, ValueRange{index(builder, loc, 0)});
  auto loop = builder.create<scf::ForOp>(
      loc, index(builder, loc, 0), index(builder, loc, rows), index(builder, loc, 1),
      ValueRange{splat(builder, loc, type, 0.0)},
      [&](OpBuilder &nb, Location l, Value i, ValueRange acc) {
        Value zero = nb.create<arith::ConstantIndexOp>(l, 0);
        Value gi = nb.create<memref::LoadOp>(l, buffer, ValueRange{i});
        Value row = nb.create<vector::LoadOp>(l, type, weight, ValueRange{i, zero});
        Value spread = nb.create<vector::BroadcastOp>(l, type, gi);
        Value next = nb.create<vector::FMAOp>(l, row, spread, acc[0]);
        nb.create<scf::YieldOp>(l, next);
      });
  return loop.getResult(0);
}

struct ConvertCellToKernels
    : public impl::ConvertCellToKernelsBase<ConvertCellToKernels> {
  ConvertCellToKernels() = default;
  ConvertCellToKernels(const ConvertCellToKernels &other)
      : ConvertCellToKernelsBase(other) {}
  explicit ConvertCellToKernels(const cellc::Knobs &knobs) { setKnobs(knobs); }

#define CELLC_KNOB_PASS ::cellc::KnobPerRow
#include "compiler/Conversion/KnobOptions.inc"

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (matvecWidth < 0 || matvecUnroll < 1) {
      module.emitError("convert-cell-to-kernels: matvec-width must be >= 0 "
                       "and matvec-unroll >= 1");
      return signalPassFailure();
    }
    // Every matvec's weight must split into whole pieces and row groups.
    WalkResult shapes = module.walk([&](MatvecOp matvec) {
      auto type = cast<RankedTensorType>(matvec.getWeight().getType());
      int64_t rank = type.getRank();
      int64_t rows = type.getDimSize(rank - 2), cols = type.getDimSize(rank - 1);
      if ((matvecWidth > 0 && cols % matvecWidth) || rows % matvecUnroll) {
        matvec.emitError() << "matvec-width=" << int64_t(matvecWidth)
                           << " and matvec-unroll=" << int64_t(matvecUnroll)
                           << " must divide the weight's columns (" << cols
                           << ") and rows (" << rows << ")";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    if (shapes.wasInterrupted())
      return signalPassFailure();
    if (failed(replaceCellsByKernels(module, [&](DefOp def, func::FuncOp grad) {
          return success(succeeded(buildForward(def)) &&
                         succeeded(buildBackward(def, grad)));
        })))
      return signalPassFailure();
  }

  LogicalResult buildForward(DefOp def);
  LogicalResult buildBackward(DefOp def, func::FuncOp grad);
};

func::FuncOp createKernel(DefOp def, StringRef suffix,
                          const KernelSignature &sig) {
  OpBuilder builder(def);
  auto kernel = builder.create<func::FuncOp>(
      def.getLoc(), (def.getSymName() + suffix).str(),
      builder.getFunctionType(sig.types, {}));
  kernel->setAttr("cell.kernel_args", builder.getArrayAttr(sig.info));
  kernel.addEntryBlock();
  return kernel;
}

/// What both kernels start with: the SAVE_GATES flag, the step lowering bound
/// to the kernel's params, projections and gates, and the loop bounds.
struct KernelFrame {
  KernelFrame(func::FuncOp kernel, DefOp def, const ForwardArgs &args,
              int64_t matvecWidth, int64_t matvecUnroll)
      : entry(kernel.getBody().front()),
        builder(OpBuilder::atBlockEnd(&entry)), loc(def.getLoc()),
        step(kernel, builder.create<SaveGatesOp>(loc, builder.getI1Type())) {
    step.matvecWidth = matvecWidth;
    step.matvecUnroll = matvecUnroll;
    for (auto [i, param] : llvm::enumerate(def.getBody().getOps<ParamOp>()))
      step.params[param.getName()] = entry.getArgument(args.firstParam + i);
    for (unsigned p = 0; p < args.numProjections; ++p)
      step.projections.push_back(entry.getArgument(args.numInputs + p));
    step.forwardProjections = projectionsOf(def);
    step.gates = entry.getArgument(args.gates);
    c0 = builder.create<arith::ConstantIndexOp>(loc, 0);
    c1 = builder.create<arith::ConstantIndexOp>(loc, 1);
    resets = entry.getArgument(args.resets);
    steps = builder.create<memref::DimOp>(loc, resets, 0);
    zeroByte = builder.create<arith::ConstantIntOp>(loc, 0, 8);
    bBegin = entry.getArgument(entry.getNumArguments() - 2);
    bEnd = entry.getArgument(entry.getNumArguments() - 1);
  }

  /// Whether the state at (t, b) restarts from its initial value.
  Value isReset(OpBuilder &b, Location l, Value t, Value batch) {
    Value flagByte = b.create<memref::LoadOp>(l, resets, ValueRange{t, batch});
    return b.create<arith::CmpIOp>(l, arith::CmpIPredicate::ne, flagByte,
                                   zeroByte);
  }

  /// Binds the backward step's arguments at (t, b): the inputs, the states
  /// before step t (the initial state at a reset, the start state at t = 0,
  /// the history otherwise), the output gradients and the carried state
  /// gradients.
  void bindBackwardStep(OpBuilder &tb, Location l, DefOp def, Block &gradBody,
                        const BackwardArgs &args, Value t, Value b, Value isReset,
                        Value isFirst, ValueRange initial, ValueRange start,
                        ValueRange carried);

  /// Routes the backward step's results at (t, b): per-step gradients are
  /// stored, a state's gradient goes to the initial state at a reset, to the
  /// start state at t = 0 and on to step t - 1 otherwise (routeStateGrad),
  /// a vector param's accumulates. Returns the next carried values: state
  /// gradients, initial- and start-state sums, param sums.
  SmallVector<Value> routeBackwardResults(OpBuilder &tb, Location l,
                                          const BackwardArgs &args, func::ReturnOp ret,
                                          StepOrigin origin, ValueRange acc,
                                          unsigned numStates, Value t, Value b);

  Block &entry;
  OpBuilder builder;
  Location loc;
  StepLowering step;
  Value c0, c1, resets, steps, zeroByte, bBegin, bEnd;
};

/// Zeros shaped as the vector of `tensor`.
Value zerosLike(OpBuilder &ob, Location l, Type tensor) {
  VectorType type = vectorOf(tensor);
  auto attr = FloatAttr::get(type.getElementType(), 0.0);
  return ob.create<arith::ConstantOp>(l, type,
                                      SplatElementsAttr::get(type, ArrayRef<Attribute>(attr)));
}

void KernelFrame::bindBackwardStep(OpBuilder &tb, Location l2, DefOp def, Block &gradBody,
                                   const BackwardArgs &args, Value t, Value b,
                                   Value isReset, Value isFirst, ValueRange initial,
                                   ValueRange start, ValueRange carried) {
  // The previous step's index, clamped: at t = 0 the state comes from
  // outside anyway.
  Value tm1 = tb.create<arith::SelectOp>(l2, isFirst, c0, tb.create<arith::SubIOp>(l2, t, c1));
  unsigned a = 0;
  for (auto [k, arg] : llvm::enumerate(def.getInputs()))
    step.map[gradBody.getArgument(a++)] = tb.create<vector::LoadOp>(
        l2, vectorOf(arg.getType()), entry.getArgument(k), ValueRange{t, b, c0});
  for (auto [k, arg] : llvm::enumerate(def.getStates())) {
    Value stored =
        tb.create<vector::LoadOp>(l2, vectorOf(arg.getType()),
                                  entry.getArgument(args.firstHistory + k), ValueRange{tm1, b, c0});
    Value before = tb.create<arith::SelectOp>(l2, isFirst, start[k], stored);
    step.map[gradBody.getArgument(a++)] =
        tb.create<arith::SelectOp>(l2, isReset, initial[k], before);
  }
  for (auto [k, out] : llvm::enumerate(def.getYield().getOutputs()))
    step.map[gradBody.getArgument(a++)] =
        tb.create<vector::LoadOp>(l2, vectorOf(out.getType()),
                                  entry.getArgument(args.firstDOut + k), ValueRange{t, b, c0});
  for (Value g : carried)
    step.map[gradBody.getArgument(a++)] = g;
}

SmallVector<Value> KernelFrame::routeBackwardResults(OpBuilder &tb, Location l2,
                                                     const BackwardArgs &args,
                                                     func::ReturnOp ret, StepOrigin origin,
                                                     ValueRange acc, unsigned numStates,
                                                     Value t, Value b) {
  SmallVector<Value> nextDState, nextDInit, nextDStart, nextDParam;
  unsigned p = 0;
  for (auto [r, value] : llvm::enumerate(ret.getOperands())) {
    Value lowered = step.lookup(value);
    cellc::GradKind kind = args.kinds[r];
    if (kind == cellc::GradKind::State) {
      StateGradRoute route =
          routeStateGrad(tb, l2, origin, lowered, zerosLike(tb, l2, value.getType()));
      nextDInit.push_back(tb.create<arith::AddFOp>(l2, acc[numStates + r], route.toInitial));
      nextDStart.push_back(
          tb.create<arith::AddFOp>(l2, acc[2 * numStates + r], route.toStart));
      nextDState.push_back(route.carried);
    } else if (kind == cellc::GradKind::Param) {
      nextDParam.push_back(tb.create<arith::AddFOp>(l2, acc[3 * numStates + p++], lowered));
    } else if (args.sameAs[r] < 0) {
      // A result the same as an earlier one is in that one's buffer.
      tb.create<vector::StoreOp>(l2, lowered, entry.getArgument(args.firstResult + r),
                                 ValueRange{t, b, c0});
    }
  }
  SmallVector<Value> next;
  for (ArrayRef<Value> part : {nextDState, nextDInit, nextDStart, nextDParam})
    llvm::append_range(next, part);
  return next;
}

LogicalResult ConvertCellToKernels::buildForward(DefOp def) {
  ForwardArgs args;
  KernelSignature sig = forwardSignature(def, args);
  YieldOp yield = def.getYield();

  func::FuncOp kernel = createKernel(def, "_fwd", sig);
  KernelFrame frame(kernel, def, args, matvecWidth, matvecUnroll);
  Block &entry = frame.entry;
  OpBuilder &builder = frame.builder;
  StepLowering &step = frame.step;
  Location loc = frame.loc;
  Value c0 = frame.c0, c1 = frame.c1, steps = frame.steps;
  LogicalResult status = success();

  // The kernel's calls, counted in a global of the module: the leading
  // matvecs' order turns around at each step, and each call starts where
  // the last one would have gone on (a streaming step is a call of one
  // step). LSTM H = 256, B = 1: 2 MiB of weights a step and a 1 MiB L2. A
  // C loop over them took 18.1 us in one order and 15.6 us turning around.
  Value calls;
  if (!step.leadingMatvecs(def.getBody().front()).empty()) {
    OpBuilder atModule(def);
    auto counter = MemRefType::get({1}, builder.getI64Type());
    std::string name = (def.getSymName() + "_fwd_calls").str();
    atModule.create<memref::GlobalOp>(
        loc, name, atModule.getStringAttr("private"), counter,
        DenseElementsAttr::get(RankedTensorType::get({1}, builder.getI64Type()),
                               builder.getI64IntegerAttr(0).getValue()),
        /*constant=*/false, /*alignment=*/nullptr);
    Value count = builder.create<memref::GetGlobalOp>(loc, counter, name);
    Value before = builder.create<memref::AtomicRMWOp>(
        loc, arith::AtomicRMWKind::addi, builder.create<arith::ConstantIntOp>(loc, 1, 64),
        count, ValueRange{c0});
    calls = builder.create<arith::IndexCastOp>(loc, builder.getIndexType(), before);
  }

  builder.create<scf::ForOp>(
      loc, frame.bBegin, frame.bEnd, c1, ValueRange(),
      [&](OpBuilder &bb, Location l, Value b, ValueRange) {
        SmallVector<Value> initial, start;
        for (auto [i, arg] : llvm::enumerate(def.getStates())) {
          initial.push_back(bb.create<vector::LoadOp>(
              l, vectorOf(arg.getType()), entry.getArgument(args.firstInit + i),
              ValueRange{b, c0}));
          start.push_back(bb.create<vector::LoadOp>(
              l, vectorOf(arg.getType()), entry.getArgument(args.firstStart + i),
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
              if (calls) {
                Value odd = tb.create<arith::AndIOp>(
                    l2, tb.create<arith::AddIOp>(l2, calls, t), c1);
                step.lowerLeadingMatvecs(
                    tb, def.getBody().front(),
                    tb.create<arith::CmpIOp>(l2, arith::CmpIPredicate::ne, odd, c0));
              }
              if (failed(step.lowerBlock(tb, def.getBody().front()))) {
                status = failure();
                tb.create<scf::YieldOp>(l2, states);
                return;
              }
              for (auto [i, out] : llvm::enumerate(yield.getOutputs()))
                tb.create<vector::StoreOp>(l2, step.lookup(out),
                                           entry.getArgument(args.firstOutput + i),
                                           ValueRange{t, b, c0});
              SmallVector<Value> next;
              for (auto [i, s] : llvm::enumerate(yield.getStates())) {
                next.push_back(step.lookup(s));
                tb.create<vector::StoreOp>(l2, next.back(),
                                           entry.getArgument(args.firstHistory + i),
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
  BackwardArgs args;
  FailureOr<KernelSignature> sig = backwardSignature(def, grad, args);
  if (failed(sig))
    return failure();
  unsigned numStates = def.getStateNames().size();
  auto resultTypes = grad.getFunctionType().getResults();

  KernelFrame frame(createKernel(def, "_bwd", *sig), def, args, matvecWidth, matvecUnroll);
  OpBuilder &builder = frame.builder;
  Location loc = frame.loc;
  auto kernelArg = [&](unsigned i) { return frame.entry.getArgument(i); };
  Value c0 = frame.c0, c1 = frame.c1, steps = frame.steps;
  Value last = builder.create<arith::SubIOp>(loc, steps, c1);
  Block &gradBody = grad.getBody().front();
  auto ret = cast<func::ReturnOp>(gradBody.getTerminator());
  LogicalResult status = success();

  // Accumulators carried over time: the next-state gradients, the initial-
  // and start-state gradients, and the vector-param gradients.
  SmallVector<unsigned> paramResults;
  for (auto [i, kind] : llvm::enumerate(args.kinds))
    if (kind == cellc::GradKind::Param)
      paramResults.push_back(i);

  builder.create<scf::ForOp>(
      loc, frame.bBegin, frame.bEnd, c1, ValueRange(),
      [&](OpBuilder &bb, Location l, Value b, ValueRange) {
        SmallVector<Value> initial, start, carried;
        for (auto [i, arg] : llvm::enumerate(def.getStates())) {
          VectorType type = vectorOf(arg.getType());
          initial.push_back(bb.create<vector::LoadOp>(
              l, type, kernelArg(args.firstInit + i), ValueRange{b, c0}));
          start.push_back(bb.create<vector::LoadOp>(
              l, type, kernelArg(args.firstStart + i), ValueRange{b, c0}));
          carried.push_back(bb.create<vector::LoadOp>(
              l, type, kernelArg(args.firstDFinal + i), ValueRange{b, c0}));
        }
        for (int twice = 0; twice < 2; ++twice)
          for (auto arg : def.getStates())
            carried.push_back(zerosLike(bb, l, arg.getType()));
        for (unsigned r : paramResults)
          carried.push_back(zerosLike(bb, l, resultTypes[r]));

        auto loop = bb.create<scf::ForOp>(
            l, c0, steps, c1, carried,
            [&](OpBuilder &tb, Location l2, Value i, ValueRange acc) {
              Value t = tb.create<arith::SubIOp>(l2, last, i);
              frame.step.t = t;
              frame.step.b = b;
              Value isReset = frame.isReset(tb, l2, t, b);
              Value isFirst = tb.create<arith::CmpIOp>(
                  l2, arith::CmpIPredicate::eq, t, c0);
              StepOrigin origin = StepOrigin::of(tb, l2, isReset, isFirst);
              frame.bindBackwardStep(tb, l2, def, gradBody, args, t, b, isReset, isFirst,
                                     initial, start, acc.take_front(numStates));
              if (failed(frame.step.lowerBlock(tb, gradBody))) {
                status = failure();
                tb.create<scf::YieldOp>(l2, acc);
                return;
              }
              SmallVector<Value> next = frame.routeBackwardResults(
                  tb, l2, args, ret, origin, acc, numStates, t, b);
              tb.create<scf::YieldOp>(l2, next);
            });

        for (unsigned k = 0; k < numStates; ++k) {
          bb.create<vector::StoreOp>(l, loop.getResult(numStates + k),
                                     kernelArg(args.firstResult + k),
                                     ValueRange{b, c0});
          bb.create<vector::StoreOp>(l, loop.getResult(2 * numStates + k),
                                     kernelArg(args.firstStartGrad + k),
                                     ValueRange{b, c0});
        }
        for (auto [p, r] : llvm::enumerate(paramResults))
          bb.create<vector::StoreOp>(l, loop.getResult(3 * numStates + p),
                                     kernelArg(args.firstResult + r),
                                     ValueRange{b, c0});
        bb.create<scf::YieldOp>(l);
      });
  builder.create<func::ReturnOp>(loc);
  return status;
}

} // namespace

std::unique_ptr<Pass> createConvertCellToKernels(const cellc::Knobs &knobs) {
  return std::make_unique<ConvertCellToKernels>(knobs);
}

} // namespace mlir::cell
