//===- CellToBatchedKernels.cpp - CPU kernels: phases over a batch tile ---===//
//
// A kernel runs its rows in tiles; a tile runs every step as the phases of a
// `PhasePlan`. Element phases loop over the rows of the tile and, within a
// row, over `vector-width` units at a time, so that each lane vector is a
// contiguous piece of a row in every buffer: the `[T, B, n]` sequences, the
// `[tile, n]` buffers of the tile, the packed weights. Product phases are
// register-blocked matrix products over the tile (Products.h).
//
// The `slices` threads of a group run the same rows together, each its slice
// of the units: of every element loop, of every product's panels (and of
// the packing, so that a thread's panels stay in its cache), of a sum's
// rows. The group's buffers are views of its part of the workspace, and a
// phase ends with a spinning barrier on the group's barrier words. With one
// slice the barriers are skipped.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/Passes.h"

#include "compiler/Conversion/CellToBatchedKernels/BatchedBuilder.h"
#include "compiler/Conversion/CellToBatchedKernels/Products.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/Common/StepEmitter.h"
#include "compiler/Conversion/KnobOptions.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTCELLTOBATCHEDKERNELS
#include "compiler/Conversion/Passes.h.inc"

namespace {

using batched::BatchedBuilder;

struct ConvertCellToBatchedKernels
    : public impl::ConvertCellToBatchedKernelsBase<ConvertCellToBatchedKernels> {
  using ConvertCellToBatchedKernelsBase::ConvertCellToBatchedKernelsBase;
  ConvertCellToBatchedKernels(const ConvertCellToBatchedKernels &other)
      : ConvertCellToBatchedKernelsBase(other) {}
  ConvertCellToBatchedKernels(const cellc::Knobs &knobs,
                              ConvertCellToBatchedKernelsOptions options)
      : ConvertCellToBatchedKernelsBase(std::move(options)) {
    setKnobs(knobs);
  }

#define CELLC_KNOB_PASS ::cellc::KnobBatched
#include "compiler/Conversion/KnobOptions.inc"

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (batchTile < 0 || vectorWidth < 0 || productRows < 1 || productVectors < 1 ||
        (vectorBits != 256 && vectorBits != 512)) {
      module.emitError("convert-cell-to-batched-kernels: product-rows and "
                       "product-vectors must be >= 1, batch-tile and "
                       "vector-width >= 0 and vector-bits 256 or 512");
      return signalPassFailure();
    }
    if (failed(replaceCellsByKernels(module, [&](DefOp def, func::FuncOp grad) {
          return success(succeeded(buildForward(def)) &&
                         succeeded(buildBackward(def, grad)));
        })))
      return signalPassFailure();
  }

  BlockShape blockShape(Type element) const {
    BlockShape shape;
    int64_t bits = element.getIntOrFloatBitWidth();
    shape.lanes = vectorWidth > 0 ? int64_t(vectorWidth) : vectorBits / bits;
    shape.rows = productRows;
    shape.vectors = productVectors;
    return shape;
  }

  /// The rows of a tile: `batch-tile` (0: 64), or one where the step has no
  /// product. A tile's rows share the products' packed weights and nothing
  /// else; without products a row runs alone, and its buffers stay in cache
  /// through the step (gated DeltaNet at K = V = 64 keeps 64 KiB of state per
  /// row, and 16 rows' buffers missed the L2).
  int64_t tileOf(DefOp def) const {
    bool products = def.getBody()
                        .walk([](Operation *op) {
                          return PhasePlan::isProduct(op) ? WalkResult::interrupt()
                                                          : WalkResult::advance();
                        })
                        .wasInterrupted();
    return !products ? 1 : batchTile > 0 ? int64_t(batchTile) : 64;
  }

  LogicalResult buildForward(DefOp def);
  LogicalResult buildBackward(DefOp def, func::FuncOp grad);
};

/// The arguments after `b_begin` and `b_end`: the workspace, the barrier
/// words, the group, slice and slices of the call, whether the weights are
/// packed already, and whether the per-step results go past the caches.
constexpr unsigned kGroupArgs = 7;

/// What both kernels start with: the function, its emitter, the tile loop.
struct Kernel {
  Kernel(DefOp def, StringRef suffix, KernelSignature sig, int64_t tile,
         const BlockShape &shape, const ForwardArgs &args, bool profile)
      : loc(def.getLoc()), builder(def) {
    element = cast<RankedTensorType>(def.getStates()[0].getType()).getElementType();
    MLIRContext *ctx = builder.getContext();
    sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, element), cellc::ArgKind::Workspace,
            "workspace");
    sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, builder.getI32Type()),
            cellc::ArgKind::GridBarrier, "barrier");
    sig.add(ctx, builder.getIndexType(), cellc::ArgKind::Group, "group");
    sig.add(ctx, builder.getIndexType(), cellc::ArgKind::Slice, "slice");
    sig.add(ctx, builder.getIndexType(), cellc::ArgKind::Slices, "slices");
    sig.add(ctx, builder.getIndexType(), cellc::ArgKind::Packed, "packed");
    sig.add(ctx, builder.getIndexType(), cellc::ArgKind::Stream, "stream");
    func = builder.create<func::FuncOp>(loc, (def.getSymName() + suffix).str(),
                                        builder.getFunctionType(sig.types, {}));
    func->setAttr("cell.kernel_args", builder.getArrayAttr(sig.info));
    func->setAttr("cell.batch_tile", builder.getI64IntegerAttr(tile));
    entry = func.addEntryBlock();
    builder.setInsertionPointToEnd(entry);
    emitter = std::make_unique<BatchedBuilder>(builder, loc, element, entry, tile,
                                               shape);
    BatchedBuilder &e = *emitter;
    unsigned last = entry->getNumArguments() - kGroupArgs;
    e.workspace = arg(last);
    e.barrierWords = arg(last + 1);
    e.group = arg(last + 2);
    e.slice = arg(last + 3);
    e.slices = arg(last + 4);
    e.packedAlready = arg(last + 5);
    e.streaming = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, arg(last + 6),
                                                e.index(0));
    e.groupWords = builder.create<arith::ConstantIndexOp>(loc, 0);
    e.profile = profile;
    if (profile)
      e.startClock();
    e.partSize = builder.create<arith::ConstantIndexOp>(loc, 0);
    e.partBase = builder.create<arith::MulIOp>(loc, e.group, e.partSize);
    for (auto [i, param] : llvm::enumerate(def.getBody().getOps<ParamOp>()))
      e.params[param.getName()] = arg(args.firstParam + i);
    e.gates = arg(args.gates);
    e.saveGates = builder.create<SaveGatesOp>(loc, builder.getI1Type());
    resets = arg(args.resets);
    steps = builder.create<memref::DimOp>(loc, resets, 0);
  }

  Value arg(unsigned i) { return entry->getArgument(i); }
  Value index(int64_t v) { return builder.create<arith::ConstantIndexOp>(loc, v); }

  /// Runs `body` for each tile of the rows `[b_begin, b_end)`, then records
  /// the workspace that the buffers took.
  void forEachTile(function_ref<void()> body) {
    BatchedBuilder &e = *emitter;
    Value bBegin = arg(entry->getNumArguments() - kGroupArgs - 2);
    Value bEnd = arg(entry->getNumArguments() - kGroupArgs - 1);
    builder.create<scf::ForOp>(
        loc, bBegin, bEnd, index(e.tile), ValueRange(),
        [&](OpBuilder &b, Location l, Value b0, ValueRange) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPoint(b.create<scf::YieldOp>(l));
          e.b0 = b0;
          e.rows = builder.create<arith::MinUIOp>(
              loc, builder.create<arith::SubIOp>(loc, bEnd, b0), index(e.tile));
          body();
        });
    builder.create<func::ReturnOp>(loc);
    int64_t bytes = e.finishWorkspace() * element.getIntOrFloatBitWidth() / 8;
    func->setAttr("cell.workspace_bytes", builder.getI64IntegerAttr(bytes));
    func->setAttr("cell.barrier_words", builder.getI64IntegerAttr(e.finishBarrierWords()));
    if (e.profile) {
      SmallVector<Attribute> sites;
      for (const std::string &site : e.profileSites)
        sites.push_back(builder.getStringAttr(site));
      func->setAttr("cell.profile_sites", builder.getArrayAttr(sites));
      func->setAttr("cell.profile_slices",
                    builder.getI64IntegerAttr(BatchedBuilder::kProfileSlices));
      func->setAttr("cell.profile_shift",
                    builder.getI64IntegerAttr(BatchedBuilder::kClockShift));
    }
  }

  /// Whether row `batchRow` restarts at step `t`.
  Value isReset(Value t) {
    BatchedBuilder &e = *emitter;
    Value flag = builder.create<memref::LoadOp>(loc, resets, ValueRange{t, e.batchRow});
    return builder.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::ne, flag,
        builder.create<arith::ConstantIntOp>(loc, 0, 8));
  }

  Location loc;
  OpBuilder builder;
  func::FuncOp func;
  Block *entry;
  Type element;
  std::unique_ptr<BatchedBuilder> emitter;
  Value resets, steps;
};

LogicalResult ConvertCellToBatchedKernels::buildForward(DefOp def) {
  ForwardArgs args;
  KernelSignature sig = forwardSignature(def, args);
  Type element = cast<RankedTensorType>(def.getStates()[0].getType()).getElementType();
  Kernel k(def, "_fwd", sig, tileOf(def), blockShape(element), args, profilePhases);
  BatchedBuilder &e = *k.emitter;
  OpBuilder &b = k.builder;
  Block &body = def.getBody().front();
  YieldOp yield = def.getYield();
  PhasePlan plan = planForward(def, PhasePlan::Options::alongUnits());
  e.plan = &plan;
  SmallVector<ProjectionOp> projections = projectionsOf(def);
  for (auto [i, p] : llvm::enumerate(projections))
    e.projectionBuffers[p] = k.arg(args.numInputs + i);

  e.packWeights(body);
  SmallVector<Value> stateBufs;
  for (Value s : def.getStates())
    stateBufs.push_back(e.buffer({2, sizeOf(s)}));

  LogicalResult status = success();
  k.forEachTile([&] {
    Value c0 = k.index(0), c1 = k.index(1), c2 = k.index(2);
    // Slot 0 starts with the start states.
    e.forEachRow([&] {
      for (auto [i, s] : llvm::enumerate(def.getStates()))
        e.copyRow(sizeOf(s), k.arg(args.firstStart + i),
                  [&](Value j) { return SmallVector<Value>{e.batchRow, j}; },
                  stateBufs[i],
                  [&](Value j) { return SmallVector<Value>{c0, e.row, j}; });
    });
    auto loop = b.create<scf::ForOp>(k.loc, c0, k.steps, c1);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value t = loop.getInductionVar();
    e.t = t;
    Value slot = b.create<arith::RemUIOp>(k.loc, t, c2);
    Value next = b.create<arith::SubIOp>(k.loc, c1, slot);
    // Rows that restart take their initial states.
    e.forEachRow([&] {
      auto ifOp = b.create<scf::IfOp>(k.loc, k.isReset(t), false);
      OpBuilder::InsertionGuard inner(b);
      b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
      for (auto [i, s] : llvm::enumerate(def.getStates()))
        e.copyRow(sizeOf(s), k.arg(args.firstInit + i),
                  [&](Value j) { return SmallVector<Value>{e.batchRow, j}; },
                  stateBufs[i],
                  [&](Value j) { return SmallVector<Value>{slot, e.row, j}; });
    });
    // The products read whole rows of the states that each slice copied.
    e.ending = "states";
    e.barrier();
    e.sources.clear();
    for (auto [i, s] : llvm::enumerate(def.getStates()))
      e.sources[s] = {Source::Shared, stateBufs[i], slot};
    for (auto [i, x] : llvm::enumerate(def.getInputs()))
      e.sources[x] = {Source::PerStep, k.arg(i), {}};

    auto perStep = [&e](Value buffer, bool stream = false) -> Sink {
      return [&e, buffer, stream](OpBuilder &, Location, Value v, Value j, int64_t offset) {
        SmallVector<Value> at{e.t, e.batchRow, e.shifted(j, offset)};
        if (stream)
          e.streamAt(v, buffer, at);
        else
          e.storeAt(v, buffer, at);
      };
    };
    SmallVector<Item> items;
    for (auto [i, s] : llvm::enumerate(yield.getStates())) {
      Value buf = stateBufs[i];
      Item item;
      item.value = s;
      item.sinks.push_back({[&e, buf, next](OpBuilder &, Location, Value v,
                                            Value j, int64_t offset) {
                              e.store(v, buf, next, e.shifted(j, offset));
                            },
                            0});
      item.sinks.push_back({perStep(k.arg(args.firstHistory + i), /*stream=*/true), 0});
      items.push_back(item);
    }
    for (auto [i, o] : llvm::enumerate(yield.getOutputs())) {
      Value out = k.arg(args.firstOutput + i);
      // An output that is a state may be that state's history too (the
      // driver keeps it so when the caller keeps the output): then the
      // history's store, past the caches, writes it. A plain store to the
      // same line besides cost a third of an LSTM's training forward.
      Value guard;
      for (auto [h, s] : llvm::enumerate(yield.getStates()))
        if (s == o) {
          Value history = k.arg(args.firstHistory + h);
          auto pointer = [&](Value buf) {
            return b.create<memref::ExtractAlignedPointerAsIndexOp>(k.loc, buf);
          };
          guard = b.create<arith::CmpIOp>(k.loc, arith::CmpIPredicate::ne, pointer(out),
                                          pointer(history));
          break;
        }
      items.push_back({o, {{perStep(out), 0}}, guard});
    }
    // The saved gates, past the caches too: the backward reads them after
    // the sequence, and a plain store that misses reads its line first. An
    // LSTM's five saved vectors were a third of its element phase
    // (bench/cpu: 'phase 1 elements').
    for (SaveOp save : def.getBody().getOps<SaveOp>()) {
      SmallVector<int64_t> offsets = packedOffsets(save.getValues().getTypes());
      for (auto [v, offset] : llvm::zip(save.getValues(), offsets))
        items.push_back({v, {{perStep(e.gates, /*stream=*/true), offset}}, e.saveGates});
    }
    status = e.emitPhases(items);
  });
  return status;
}

/// Stores the states before step t into `prev`: the start state at t = 0,
/// the history otherwise, the initial state in the rows that restart.
void loadStatesBefore(Kernel &k, DefOp def, const BackwardArgs &args,
                      ArrayRef<Value> prev, Value isFirst, Value c1) {
  BatchedBuilder &e = *k.emitter;
  OpBuilder &b = k.builder;
  Location loc = k.loc;
  Value t = e.t;
  e.forEachRow([&] {
    Value reset = k.isReset(t);
    for (auto [i, s] : llvm::enumerate(def.getStates())) {
      Value initial = k.arg(args.firstInit + i);
      Value start = k.arg(args.firstStart + i);
      Value history = k.arg(args.firstHistory + i);
      e.forEachUnit(sizeOf(s), [&](Value j) {
        auto choose = [&](Value cond, function_ref<Value()> then,
                          function_ref<Value()> otherwise) {
          auto ifOp = b.create<scf::IfOp>(loc, TypeRange{e.lane}, cond, true, true);
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(ifOp.thenBlock());
          b.create<scf::YieldOp>(loc, then());
          b.setInsertionPointToStart(ifOp.elseBlock());
          b.create<scf::YieldOp>(loc, otherwise());
          return ifOp.getResult(0);
        };
        Value v = choose(
            reset, [&] { return e.loadAt(initial, {e.batchRow, j}); },
            [&] {
              return choose(
                  isFirst, [&] { return e.loadAt(start, {e.batchRow, j}); },
                  [&] {
                    Value tm1 = b.create<arith::SubIOp>(loc, t, c1);
                    return e.loadAt(history, {tm1, e.batchRow, j});
                  });
            });
        e.store(v, prev[i], Value(), j);
      });
    }
  });
}

LogicalResult ConvertCellToBatchedKernels::buildBackward(DefOp def,
                                                         func::FuncOp grad) {
  BackwardArgs args;
  FailureOr<KernelSignature> sig = backwardSignature(def, grad, args);
  if (failed(sig))
    return failure();
  Type element = cast<RankedTensorType>(def.getStates()[0].getType()).getElementType();
  Kernel k(def, "_bwd", *sig, tileOf(def), blockShape(element), args, profilePhases);
  BatchedBuilder &e = *k.emitter;
  OpBuilder &b = k.builder;
  Location loc = k.loc;
  Block &body = grad.getBody().front();
  Operation *ret = body.getTerminator();
  unsigned numInputs = def.getInputNames().size();
  unsigned numOutputs = def.getOutputNames().size();

  PhasePlan plan = planBackward(def, grad, PhasePlan::Options::alongUnits());
  e.plan = &plan;
  // The backward step's projections are in its replay: each reads the
  // buffer of the forward's projection it computes again.
  if (failed(bindReplayProjections(def, body, [&](ProjectionOp p, unsigned i) {
        e.projectionBuffers[p] = k.arg(args.numInputs + i);
      })))
    return failure();

  e.packWeights(body);
  BackwardBuffers buffers(e, def, args, ret, /*withSlots=*/true);
  SmallVector<Value> &gradBufs = buffers.grad, &prevBufs = buffers.prev,
                     &accInit = buffers.accInit, &accStart = buffers.accStart;
  DenseMap<unsigned, Value> &accParam = buffers.accParam;

  LogicalResult status = success();
  k.forEachTile([&] {
    Value c0 = k.index(0), c1 = k.index(1), c2 = k.index(2);
    auto zero = [&] { return splat(b, loc, e.lane, 0.0); };
    auto tileAt = [&](Value slot) {
      return [&e, slot](Value j) { return e.indices(slot, e.row, j); };
    };
    auto batchAt = [&e](Value j) { return SmallVector<Value>{e.batchRow, j}; };
    // The state gradients start from the final-state gradients; the
    // accumulators from zero.
    e.forEachRow([&] {
      for (auto [i, s] : llvm::enumerate(def.getStates())) {
        e.copyRow(sizeOf(s), k.arg(args.firstDFinal + i), batchAt, gradBufs[i],
                  tileAt(c0));
        e.forEachUnit(sizeOf(s), [&](Value j) {
          e.store(zero(), accInit[i], Value(), j);
          e.store(zero(), accStart[i], Value(), j);
        });
      }
      for (auto &[r, buf] : accParam) {
        Value acc = buf;
        e.forEachUnit(sizeOf(ret->getOperand(r)),
                      [&](Value j) { e.store(zero(), acc, Value(), j); });
      }
    });
    {
      OpBuilder::InsertionGuard guard(b);
      ReverseSteps steps = buildReverseSteps(b, loc, k.steps, c0, c1, c2);
      e.t = steps.t;
      loadStatesBefore(k, def, args, prevBufs, steps.isFirst, c1);
      e.ending = "states";
      e.barrier();
      e.bindBackwardStep(
          body, [&](unsigned i) { return k.arg(i); }, numInputs, numOutputs,
          args.firstDOut, prevBufs, gradBufs, steps.slot);

      // A state's gradient routed by where each row's step t starts.
      Value t = steps.t, isFirst = steps.isFirst;
      SmallVector<Item> items = backwardItems(
          e, args, ret, buffers, gradBufs, steps.next,
          [&k, t, isFirst] {
            return StepOrigin::of(k.emitter->builder, k.emitter->loc, k.isReset(t), isFirst);
          },
          Value(), [&](unsigned r) -> Sink {
            Value result = k.arg(args.firstResult + r);
            // Past the caches: the GEMMs that fold a piece's results read
            // them once, and a store that misses reads its line first. LSTM
            // 64 x 100 on two threads, where the backward's element phase
            // is bound by memory, trained 2% to 3% faster (59.9 against
            // 61.2 ms, 5 rounds); on one thread it did not move.
            return [&e, result](OpBuilder &, Location, Value v, Value j, int64_t offset) {
              e.streamAt(v, result, ValueRange{e.t, e.batchRow, e.shifted(j, offset)});
            };
          });
      status = e.emitPhases(items);
    }
    // The accumulated gradients, written once per tile.
    e.forEachRow([&] {
      for (auto [i, s] : llvm::enumerate(def.getStates())) {
        e.copyRow(sizeOf(s), accInit[i], tileAt(Value()),
                  k.arg(args.firstResult + i), batchAt);
        e.copyRow(sizeOf(s), accStart[i], tileAt(Value()),
                  k.arg(args.firstStartGrad + i), batchAt);
      }
      for (auto &[r, buf] : accParam)
        e.copyRow(sizeOf(ret->getOperand(r)), buf, tileAt(Value()),
                  k.arg(args.firstResult + r), batchAt);
    });
  });
  return status;
}

} // namespace

std::unique_ptr<Pass>
createConvertCellToBatchedKernels(const cellc::Knobs &knobs,
                                  ConvertCellToBatchedKernelsOptions options) {
  return std::make_unique<ConvertCellToBatchedKernels>(knobs, std::move(options));
}

} // namespace mlir::cell
