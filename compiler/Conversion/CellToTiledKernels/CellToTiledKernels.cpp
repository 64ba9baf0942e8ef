//===- CellToTiledKernels.cpp - Batch-tiled sequence kernels for GPUs -----===//
//
// One program (a CTA on CUDA) runs all T steps for a tile of batch rows. Its
// threads split the hidden units: thread `tid` computes elements `tid`,
// `tid + ntid`, ... of every vector, each element as a `vector<BT>` holding
// it for the BT rows of the tile. Values that a thread needs at other
// elements than its own (the vector of a matvec, a value read at another
// offset through `chunk` after a barrier) live in workgroup memory; the rest
// of the step is computed per element, in registers.
//
// The step is split into phases separated by barriers. A value that must be
// in workgroup memory is written in the phase after the last workgroup value
// it reads; the new states, outputs, saved gates and gradients are written in
// the phase where they can be computed. A value needed by two phases is kept
// in workgroup memory rather than computed twice.
//
// This file is the pass: the options, each kernel's signature and launch
// structure, and the forward and backward time loops. The budget is
// TilePlan.cpp's, the emitter TiledBuilder.cpp's, and what differs between
// a CTA per tile and the persistent strategy BatchTiled.cpp's and
// Persistent.cpp's.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/Passes.h"

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"
#include "compiler/Conversion/KnobOptions.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTCELLTOTILEDKERNELS
#include "compiler/Conversion/Passes.h.inc"

namespace {

/// What the forward and backward time loops of a tile read.
struct TileLoop {
  DefOp def;
  /// The step: the cell's body, or its backward step's.
  Block &body;
  const BackwardArgs &args;
  TiledBuilder &tb;
  Block *entry;
  Value c0, c1, c2, steps, resets, zeroByte;
  /// The `[2, n, BT]` buffers of the states (or, in backward, of their
  /// gradients), one slot per parity of the step.
  SmallVector<Value> stateBufs;

  Value arg(unsigned i) const { return entry->getArgument(i); }
  /// Which rows of the tile restart from their initial state at step `t`.
  Value resetMask(Value t) const {
    OpBuilder &builder = tb.builder;
    Location loc = tb.loc;
    return tb.laneMask([&](Value row) {
      Value flag = builder.create<memref::LoadOp>(loc, resets, ValueRange{t, row});
      return builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, flag,
                                           zeroByte);
    });
  }
};

/// The forward's time loop: the states start from the start states, each
/// step resets rows and writes the next states, the outputs, the history and
/// (when SAVE_GATES) the saved gates.
LogicalResult buildForwardSteps(TileLoop &tl) {
  TiledBuilder &tb = tl.tb;
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  DefOp def = tl.def;
  const BackwardArgs &args = tl.args;
  auto arg = [&](unsigned i) { return tl.arg(i); };
  auto resetMask = [&](Value t) { return tl.resetMask(t); };
  ArrayRef<Value> stateBufs = tl.stateBufs;
  Value c0 = tl.c0, c1 = tl.c1, c2 = tl.c2, steps = tl.steps;

  // Slot 0 starts with the start states.
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      tb.storeShared(tb.gather(arg(args.firstStart + k), false, j),
                     stateBufs[k], c0, j);
    });
  tb.barrier();
  auto loop = builder.create<scf::ForOp>(loc, c0, steps, c1);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(loop.getBody());
  Value t = loop.getInductionVar();
  tb.t = t;
  Value slot = builder.create<arith::RemUIOp>(loc, t, c2);
  Value next = builder.create<arith::SubIOp>(loc, c1, slot);
  // Resets, in place. Branching on whether any row resets would save
  // a few loads per element beside the matvec's hundreds, and tips the
  // LSTM forward at H=256 into spills on sm_90 (ptxas -v), so it does not.
  Value reset = resetMask(t);
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      Value cur = tb.loadShared(stateBufs[k], slot, j);
      Value init = tb.gather(arg(args.firstInit + k), false, j);
      tb.storeShared(builder.create<arith::SelectOp>(loc, reset, init, cur),
                     stateBufs[k], slot, j);
    });
  tb.barrier();
  tb.sources.clear();
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.sources[s] = {Source::Shared, stateBufs[k], slot};
  for (auto [k, x] : llvm::enumerate(def.getInputs()))
    tb.sources[x] = {Source::PerStep, arg(k), {}};
  // Items: next states (workgroup slot and history), outputs, gates.
  SmallVector<Item> items;
  YieldOp yield = def.getYield();
  auto global = [&](Value buffer, bool perStep) -> Sink {
    return [&tb, buffer, perStep](OpBuilder &, Location, Value v, Value j,
                                  int64_t offset) {
      tb.scatter(v, buffer, perStep, tb.shifted(j, offset));
    };
  };
  for (auto [k, s] : llvm::enumerate(yield.getStates())) {
    Item item;
    item.value = s;
    Value buf = stateBufs[k];
    item.sinks.push_back({[&tb, buf, next](OpBuilder &, Location, Value v,
                                           Value j, int64_t offset) {
                            tb.storeShared(v, buf, next,
                                           tb.shifted(j, offset));
                          },
                          0});
    item.sinks.push_back({global(arg(args.firstHistory + k), true), 0});
    items.push_back(item);
  }
  for (auto [k, o] : llvm::enumerate(yield.getOutputs()))
    items.push_back({o, {{global(arg(args.firstOutput + k), true), 0}}, {}});
  for (SaveOp save : def.getBody().getOps<SaveOp>()) {
    SmallVector<int64_t> offsets = packedOffsets(save.getValues().getTypes());
    for (auto [v, offset] : llvm::zip(save.getValues(), offsets))
      items.push_back({v, {{global(tb.gates, true), offset}}, tb.saveGates});
  }
  if (failed(tb.emitPhases(items)))
    return failure();

  // After the last step, each state as the next launch starts from it: in
  // the cell's type, where the history may be stored narrower (bf16), so
  // that the state carried from launch to launch is the state carried from
  // step to step. The last step left it in slot `steps % 2`.
  builder.setInsertionPointAfter(loop);
  tb.barrier();
  Value last = builder.create<arith::RemUIOp>(loc, steps, c2);
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      tb.scatter(tb.loadShared(stateBufs[k], last, j), arg(args.firstEnd + k), false, j);
    });
  return success();
}

/// The backward's time loop, from the last step to the first: the state
/// gradients start from the final states' and carry back through the
/// replayed (or saved) step; resets route a row's gradient to its initial
/// state; the param gradients and the initial and start states' gradients
/// accumulate in the tile's buffers and are written once at the end.
/// Stores the states before step t into `prev`: the start state at t = 0,
/// the history otherwise, the initial state in the rows that reset.
void loadStatesBefore(TileLoop &tl, ArrayRef<Value> prev, Value reset, Value isFirst) {
  TiledBuilder &tb = tl.tb;
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  const BackwardArgs &args = tl.args;
  Value t = tb.t;
  Value anyReset = tb.any(reset);
  for (auto [k, s] : llvm::enumerate(tl.def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      Value before = tb.choose(
          isFirst, [&] { return tb.gather(tl.arg(args.firstStart + k), false, j); },
          [&] {
            Value tm1 = builder.create<arith::SubIOp>(loc, t, tl.c1);
            return tb.gather(tl.arg(args.firstHistory + k), true, j, tm1);
          });
      Value value = tb.choose(
          anyReset,
          [&]() -> Value {
            Value init = tb.gather(tl.arg(args.firstInit + k), false, j);
            return builder.create<arith::SelectOp>(loc, reset, init, before);
          },
          [&] { return before; });
      tb.storeShared(value, prev[k], Value(), j);
    });
}

LogicalResult buildBackwardSteps(TileLoop &tl) {
  TiledBuilder &tb = tl.tb;
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  DefOp def = tl.def;
  Block &body = tl.body;
  const BackwardArgs &args = tl.args;
  auto arg = [&](unsigned i) { return tl.arg(i); };
  ArrayRef<Value> stateBufs = tl.stateBufs;
  Value c0 = tl.c0;
  Operation *ret = body.getTerminator();
  BackwardBuffers buffers(tb, def, args, ret, /*withSlots=*/false);
  Value zero = splat(builder, loc, tb.lane, 0.0);
  // The state gradients start from the final-state gradients.
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      tb.storeShared(tb.gather(arg(args.firstDFinal + k), false, j), stateBufs[k], c0, j);
      tb.storeShared(zero, buffers.accInit[k], Value(), j);
      tb.storeShared(zero, buffers.accStart[k], Value(), j);
    });
  for (auto [r, buf] : buffers.accParam) {
    Value b = buf;
    tb.forEachElement(sizeOf(ret->getOperand(r)),
                      [&](Value j) { tb.storeShared(zero, b, Value(), j); });
  }
  tb.barrier();
  {
    OpBuilder::InsertionGuard guard(builder);
    ReverseSteps reverse = buildReverseSteps(builder, loc, tl.steps, c0, tl.c1, tl.c2);
    tb.t = reverse.t;
    auto maskType = VectorType::get({tb.tile}, builder.getI1Type());
    Value reset = tl.resetMask(reverse.t);
    Value first = builder.create<vector::BroadcastOp>(loc, maskType, reverse.isFirst);
    StepOrigin origin = StepOrigin::of(builder, loc, reset, first);
    loadStatesBefore(tl, buffers.prev, reset, reverse.isFirst);
    tb.barrier();
    tb.bindBackwardStep(body, arg, def.getInputNames().size(), def.getOutputNames().size(),
                        args.firstDOut, buffers.prev, stateBufs, reverse.slot);
    SmallVector<Item> items = backwardItems(
        tb, args, ret, buffers, stateBufs, reverse.next, [origin] { return origin; }, zero,
        [&](unsigned r) -> Sink {
          Value buffer = arg(args.firstResult + r);
          return [&tb, buffer](OpBuilder &, Location, Value v, Value j, int64_t offset) {
            tb.scatter(v, buffer, true, tb.shifted(j, offset));
          };
        });
    if (failed(tb.emitPhases(items)))
      return failure();
  }
  // The accumulated gradients, written once.
  for (auto [k, s] : llvm::enumerate(def.getStates()))
    tb.forEachElement(sizeOf(s), [&](Value j) {
      tb.scatter(tb.loadShared(buffers.accInit[k], Value(), j), arg(args.firstResult + k),
                 false, j);
      tb.scatter(tb.loadShared(buffers.accStart[k], Value(), j),
                 arg(args.firstStartGrad + k), false, j);
    });
  for (auto [r, buf] : buffers.accParam) {
    Value b = buf;
    unsigned result = r;
    tb.forEachElement(sizeOf(ret->getOperand(r)), [&](Value j) {
      tb.scatter(tb.loadShared(b, Value(), j), arg(args.firstResult + result), false, j);
    });
  }
  return success();
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct ConvertCellToTiledKernels
    : public impl::ConvertCellToTiledKernelsBase<ConvertCellToTiledKernels> {
  using ConvertCellToTiledKernelsBase::ConvertCellToTiledKernelsBase;
  ConvertCellToTiledKernels(const ConvertCellToTiledKernels &other)
      : ConvertCellToTiledKernelsBase(other) {}
  ConvertCellToTiledKernels(const cellc::Knobs &knobs,
                            ConvertCellToTiledKernelsOptions options)
      : ConvertCellToTiledKernelsBase(std::move(options)) {
    setKnobs(knobs);
  }

#define CELLC_KNOB_PASS ::cellc::KnobCuda
#include "compiler/Conversion/KnobOptions.inc"

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The options, each through its word list's one parse function.
    auto word = [&](auto parsed, StringRef option, StringRef value,
                    std::string expected) {
      if (!parsed)
        module.emitError("convert-cell-to-tiled-kernels: unknown ")
            << option << " '" << value << "'; expected " << expected;
      return parsed.has_value();
    };
    // A knob's word where none is named: the pass's default.
    auto parse = [](StringRef value, auto fallback) {
      return value.empty() ? std::optional(fallback)
                           : cellc::parse<decltype(fallback)>(value);
    };
    std::optional<cellc::Target> parsedTarget = cellc::parse<cellc::Target>(target);
    std::optional<cellc::Precision> parsedPrecision =
        parse(precision, cellc::Precision::Ieee);
    std::optional<cellc::Storage> parsedStorage = parse(storage, cellc::Storage::F32);
    std::optional<cellc::Strategy> parsedStrategy =
        parse(strategy, cellc::Strategy::BatchTiled);
    if (!word(parsedTarget, "target", target, cellc::Words<cellc::Target>::expected()) ||
        !word(parsedPrecision, "precision", precision,
              cellc::Words<cellc::Precision>::expected()) ||
        !word(parsedStorage, "storage", storage,
              cellc::Words<cellc::Storage>::expected()))
      return signalPassFailure();
    if (!parsedStrategy || (*parsedStrategy != cellc::Strategy::BatchTiled &&
                            *parsedStrategy != cellc::Strategy::Persistent)) {
      module.emitError("convert-cell-to-tiled-kernels: unknown strategy '")
          << strategy << "'; expected " << cellc::name(cellc::Strategy::BatchTiled)
          << " or " << cellc::name(cellc::Strategy::Persistent);
      return signalPassFailure();
    }
    config.precision = *parsedPrecision;
    config.storage = *parsedStorage;
    config.persistent = *parsedStrategy == cellc::Strategy::Persistent;
    bool gpu = *parsedTarget == cellc::Target::Cuda;
    config.gpu = gpu;
    config.batchTile = batchTile;
    config.threads = threads;
    config.sharedLimit = sharedLimit;
    config.ctas = ctas;
    config.maxCtas = maxCtas;
    config.maxRegisters = maxRegisters;
    if (config.precision != cellc::Precision::Ieee && !gpu) {
      module.emitError("convert-cell-to-tiled-kernels: precision=")
          << precision << " needs tensor cores, so target=cuda";
      return signalPassFailure();
    }
    if (config.storage != cellc::Storage::F32 && !gpu) {
      module.emitError("convert-cell-to-tiled-kernels: storage=")
          << storage << " is for target=cuda";
      return signalPassFailure();
    }
    if (gpu && threads % 32 != 0) {
      module.emitError("convert-cell-to-tiled-kernels: cta-threads=")
          << int64_t(threads) << " is not a whole number of warps";
      return signalPassFailure();
    }
    OpBuilder builder(module.getBodyRegion());
    gpu::GPUModuleOp gpuModule;
    if (gpu) {
      module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                      builder.getUnitAttr());
      builder.setInsertionPointToEnd(module.getBody());
      gpuModule = builder.create<gpu::GPUModuleOp>(module.getLoc(), "cellc_kernels");
    }
    if (failed(replaceCellsByKernels(module, [&](DefOp def, func::FuncOp grad) {
          return success(
              succeeded(buildKernel(def, grad, /*backward=*/false, gpuModule)) &&
              succeeded(buildKernel(def, grad, /*backward=*/true, gpuModule)));
        })))
      return signalPassFailure();
  }

  LogicalResult buildKernel(DefOp def, func::FuncOp grad, bool backward,
                            gpu::GPUModuleOp gpuModule);

  /// The options, parsed.
  TiledOptions config;
};

/// bf16 storage: the per-step sequences ([T, B, n]: inputs, projections,
/// outputs, state history, gates and their gradients) are bf16 in memory;
/// states, params (a block-diagonal one is rank 3 too) and their gradients
/// stay in the cell's type.
void storeSequencesAsBf16(KernelSignature &sig, Type element) {
  for (auto [type, info] : llvm::zip(sig.types, sig.info)) {
    auto arg = dyn_cast<KernelArgAttr>(info);
    auto memref = dyn_cast<MemRefType>(type);
    if (memref && memref.getRank() == 3 && memref.getElementType() == element && arg &&
        arg.getKind() != cellc::ArgKind::Param)
      type = MemRefType::get(memref.getShape(), BFloat16Type::get(element.getContext()));
  }
}

/// A tiled kernel: a `gpu.func` in `gpuModule` (the GPU), or a `func.func`
/// beside `def` (its host emulation).
struct TiledKernelOp {
  Operation *op;
  Block *entry;
  gpu::GPUFuncOp gpuFunc;
};

/// Creates the kernel `name` of signature `sig`, with the attributes that the
/// package and the runtime read: its arguments, tile, threads, storage,
/// strategy, CTAs and workspace (persistent), and shared memory.
TiledKernelOp createTiledKernel(DefOp def, gpu::GPUModuleOp gpuModule, StringRef name,
                                const KernelSignature &sig, const TilePlan &plan,
                                const TiledOptions &config) {
  Location loc = def.getLoc();
  bool gpu = static_cast<bool>(gpuModule);
  OpBuilder outer(def);
  TiledKernelOp kernel;
  if (gpu) {
    outer.setInsertionPoint(gpuModule.getBody()->getTerminator());
    kernel.gpuFunc =
        outer.create<gpu::GPUFuncOp>(loc, name, outer.getFunctionType(sig.types, {}));
    kernel.gpuFunc->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), outer.getUnitAttr());
    kernel.gpuFunc.setKnownBlockSize(ArrayRef<int32_t>{int32_t(config.threads), 1, 1});
    if (config.maxRegisters > 0)
      kernel.gpuFunc->setAttr(NVVM::NVVMDialect::getMaxnregAttrName(),
                              outer.getI32IntegerAttr(config.maxRegisters));
    kernel.op = kernel.gpuFunc;
    kernel.entry = &kernel.gpuFunc.getBody().front();
  } else {
    auto func = outer.create<func::FuncOp>(loc, name, outer.getFunctionType(sig.types, {}));
    func.addEntryBlock();
    kernel.op = func;
    kernel.entry = &func.getBody().front();
  }
  Operation *op = kernel.op;
  bool persistent = config.persistent;
  op->setAttr("cell.kernel_args", outer.getArrayAttr(sig.info));
  op->setAttr("cell.batch_tile", outer.getI64IntegerAttr(plan.tile));
  op->setAttr("cell.threads", outer.getI64IntegerAttr(gpu ? config.threads : 1));
  op->setAttr("cell.storage", outer.getStringAttr(cellc::name(config.storage)));
  op->setAttr("cell.strategy",
              outer.getStringAttr(cellc::name(persistent ? cellc::Strategy::Persistent
                                                         : cellc::Strategy::BatchTiled)));
  if (persistent) {
    op->setAttr("cell.ctas", outer.getI64IntegerAttr(plan.slices));
    if (!plan.uncached.empty())
      op->setAttr("cell.global_weights",
                  outer.getI64IntegerAttr(int64_t(plan.uncached.size())));
    op->setAttr("cell.workspace_bytes", outer.getI64IntegerAttr(plan.workspaceBytes(gpu)));
    if (gpu)
      op->setAttr("cell.barrier_words",
                  outer.getI64IntegerAttr(cellc::kPersistentBarrierWords));
  }
  // Split by heads: the CTAs of a tile do not wait for each other, and
  // launch as any grid does.
  if (plan.heads > 0)
    op->setAttr("cell.heads", outer.getI64IntegerAttr(plan.heads));
  op->setAttr("cell.workgroup_bytes", outer.getI64IntegerAttr(plan.workgroupBytes()));
  // The bytes of dynamic shared memory a launch must give the kernel.
  op->setAttr("cell.dynamic_shared_bytes",
              outer.getI64IntegerAttr(gpu ? plan.dynamicSharedBytes : 0));
  return kernel;
}

/// A precision or storage other than IEEE f32 needs an f32 cell.
LogicalResult checkElementType(DefOp def, Type element, const TiledOptions &config) {
  cellc::Precision precision = config.precision;
  cellc::Storage storage = config.storage;
  if ((precision == cellc::Precision::Ieee && storage == cellc::Storage::F32) ||
      element.isF32())
    return success();
  return emitError(def.getLoc()) << (precision != cellc::Precision::Ieee
                                         ? std::string("precision=") + cellc::name(precision)
                                         : std::string("storage=") + cellc::name(storage))
                                 << " needs an f32 cell; '" << def.getSymName() << "' is "
                                 << element;
}

/// The step's params, projections (the backward's are in its replay: each
/// reads the buffer of the forward's projection it computes again) and
/// gates, bound to the kernel's arguments.
LogicalResult bindKernelArgs(TiledBuilder &tb, DefOp def, Block &body,
                             const BackwardArgs &args, Block *entry) {
  for (auto [i, param] : llvm::enumerate(def.getBody().getOps<ParamOp>()))
    tb.params[param.getName()] = entry->getArgument(args.firstParam + i);
  tb.gates = entry->getArgument(args.gates);
  return bindReplayProjections(def, body, [&](ProjectionOp p, unsigned k) {
    tb.projectionBuffers[p] = entry->getArgument(args.numInputs + k);
  });
}

/// What the kernel allocated must be what the plan counted.
LogicalResult checkAllocations(Location loc, StringRef name, TiledBuilder &tb,
                               const TilePlan &plan, bool gpu) {
  if (tb.sharedElements != plan.tileElements())
    return emitError(loc) << "internal error: " << name << " allocated "
                          << tb.sharedElements << " elements of row buffers, planned "
                          << plan.tileElements();
  if (gpu && tb.strategy->dynamicSharedUsed() != plan.dynamicSharedBytes)
    return emitError(loc) << "internal error: " << name << " uses "
                          << tb.strategy->dynamicSharedUsed()
                          << " bytes of dynamic shared memory, planned "
                          << plan.dynamicSharedBytes;
  return success();
}

LogicalResult ConvertCellToTiledKernels::buildKernel(DefOp def,
                                                     func::FuncOp grad,
                                                     bool backward,
                                                     gpu::GPUModuleOp gpuModule) {
  MLIRContext *ctx = def.getContext();
  Location loc = def.getLoc();
  bool gpu = static_cast<bool>(gpuModule);
  BackwardArgs args;
  KernelSignature sig;
  if (backward) {
    FailureOr<KernelSignature> s = backwardSignature(def, grad, args);
    if (failed(s))
      return failure();
    sig = *s;
  } else {
    sig = forwardSignature(def, args, /*endStates=*/true);
  }
  Type element = cast<RankedTensorType>(def.getStates()[0].getType())
                     .getElementType();
  std::string name = (def.getSymName() + (backward ? "_bwd" : "_fwd")).str();
  cellc::Precision precision = config.precision;
  cellc::Storage storage = config.storage;
  if (failed(checkElementType(def, element, config)))
    return failure();

  // The step's block, its phases, and the tile and memory they take.
  Block &body = backward ? grad.getBody().front() : def.getBody().front();
  PhasePlan::Options options = PhasePlan::Options::acrossRows(def);
  PhasePlan phases =
      backward ? planBackward(def, grad, options) : planForward(def, options);
  FailureOr<TilePlan> planned =
      planTile(def, body, phases, args, backward, element, config);
  if (failed(planned))
    return failure();
  const TilePlan &plan = *planned;
  int64_t tile = plan.tile;
  bool persistent = config.persistent;

  OpBuilder builder(ctx);
  TiledBuilder tb(builder, loc, tile, element, gpu);
  tb.strategy = persistent ? makePersistent(tb, plan) : makeBatchTiled(tb, plan);
  tb.plan = &phases;
  tb.precision = precision;

  if (storage == cellc::Storage::Bf16)
    storeSequencesAsBf16(sig, element);
  unsigned batchBeginArg = sig.types.size() - 2;
  // Batch-tiled on CUDA, a matvec computed element by element has a thread a
  // row: read from W, a warp's lanes would be a row apart, 32 lines a load.
  // The runtime passes a transposed copy instead, made once a call.
  SmallVector<std::pair<StringRef, unsigned>> transposedArgs;
  if (gpu && !persistent) {
    llvm::SetVector<ParamOp> weights;
    body.walk([&](MatvecOp op) {
      if (!productBlocks(op).diagonal && !onTensorCores(op, precision))
        weights.insert(op.getWeight().getDefiningOp<ParamOp>());
    });
    for (ParamOp param : weights) {
      auto type = cast<RankedTensorType>(param.getType());
      transposedArgs.push_back(
          {param.getName(),
           sig.add(ctx, MemRefType::get({type.getDimSize(1), type.getDimSize(0)},
                                        type.getElementType()),
                   cellc::ArgKind::ParamTransposed, param.getName())});
    }
  }
  unsigned extraArgs = sig.types.size();
  tb.strategy->addArguments(sig, ctx);

  // The kernel.
  TiledKernelOp kernel = createTiledKernel(def, gpuModule, name, sig, plan, config);
  Block *entry = kernel.entry;
  gpu::GPUFuncOp gpuFunc = kernel.gpuFunc;

  builder.setInsertionPointToEnd(entry);
  tb.strategy->beginKernel(entry, extraArgs, gpuFunc);
  auto arg = [&](unsigned i) { return entry->getArgument(i); };
  if (failed(bindKernelArgs(tb, def, body, args, entry)))
    return failure();
  for (auto [name, index] : transposedArgs)
    tb.transposedParams[name] = entry->getArgument(index);
  tb.saveGates = builder.create<SaveGatesOp>(loc, builder.getI1Type());
  TileLoop tl{def, body, args, tb, entry, {}, {}, {}, {}, {}, {}, {}};
  tl.c0 = tb.index(0);
  tl.c1 = tb.index(1);
  tl.c2 = tb.index(2);
  tl.resets = arg(args.resets);
  tl.steps = builder.create<memref::DimOp>(loc, tl.resets, 0);
  Value bBegin = arg(batchBeginArg), bEnd = arg(batchBeginArg + 1);
  tl.zeroByte = builder.create<arith::ConstantIntOp>(loc, 0, 8);

  // A tile from row `b0`: its rows (past the batch, the last row, not
  // stored), the strategy's start, the states' buffers, the time loop.
  auto buildTile = [&](Value b0) -> LogicalResult {
    Value last = builder.create<arith::SubIOp>(loc, bEnd, tl.c1);
    tb.rows.clear();
    tb.rowValid.clear();
    for (int64_t s = 0; s < tile; ++s) {
      Value b = builder.create<arith::AddIOp>(loc, b0, tb.index(s));
      tb.rowValid.push_back(builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::slt, b, bEnd));
      tb.rows.push_back(builder.create<arith::MinSIOp>(loc, b, last));
    }
    tl.stateBufs.clear();
    for (Value s : def.getStates())
      tl.stateBufs.push_back(tb.shared({2, sizeOf(s)}));
    bool reduces = false;
    body.walk([&](SumOp) { reduces = true; });
    for (Value &set : tb.partials)
      set = reduces ? tb.shared({tb.strategy->partialSlots()}) : Value();
    return backward ? buildBackwardSteps(tl) : buildForwardSteps(tl);
  };

  // On the GPU, a CTA (or the CTAs of a tile) loops over the tiles from its
  // grid's row, by the grid's rows: a grid need not hold a CTA per tile (a
  // cooperative one holds what the GPU keeps resident at once). A loop over
  // tiles on the CPU.
  LogicalResult status = success();
  if (gpu) {
    tb.tid = builder.create<gpu::ThreadIdOp>(loc, gpu::Dimension::x);
    tb.ntid = tb.index(config.threads);
    tb.ntidStatic = config.threads;
    auto [first, stride] = tb.strategy->launchTiles();
    tb.strategy->beforeTiles(body);
    auto tileAt = [&](Value index) {
      tb.tileIndex = index;
      return buildTile(builder.create<arith::AddIOp>(
          loc, bBegin, builder.create<arith::MulIOp>(loc, index, tb.index(tile))));
    };
    if (!stride) {
      status = tileAt(first);
    } else {
      Value rowsGiven = builder.create<arith::SubIOp>(loc, bEnd, bBegin);
      Value tiles = builder.create<arith::DivUIOp>(
          loc, tb.shifted(rowsGiven, tile - 1), tb.index(tile));
      auto loop = builder.create<scf::ForOp>(loc, first, tiles, stride);
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(loop.getBody());
      status = tileAt(loop.getInductionVar());
      // The row's next tile writes the buffers this one last read.
      tb.barrier();
    }
    builder.create<gpu::ReturnOp>(loc);
  } else {
    tb.tid = tl.c0;
    tb.ntid = tl.c1;
    tb.tileIndex = tl.c0;
    tb.strategy->beforeTiles(body);
    auto tiles = builder.create<scf::ForOp>(loc, bBegin, bEnd, tb.index(tile));
    {
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(tiles.getBody());
      status = buildTile(tiles.getInductionVar());
    }
    tb.strategy->endKernel();
    builder.create<func::ReturnOp>(loc);
  }
  if (failed(status))
    return failure();
  return checkAllocations(loc, name, tb, plan, gpu);
}

} // namespace

std::unique_ptr<Pass>
createConvertCellToTiledKernels(const cellc::Knobs &knobs,
                                ConvertCellToTiledKernelsOptions options) {
  return std::make_unique<ConvertCellToTiledKernels>(knobs, std::move(options));
}

} // namespace mlir::cell
