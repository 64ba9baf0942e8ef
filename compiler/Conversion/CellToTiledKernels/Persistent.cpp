//===- Persistent.cpp - A tile split over CTAs that keep the weights -------===//
//
// The persistent strategy: the `slices` CTAs of a tile (grid x; tiles along
// y) split every element loop and every product's rows. Before the time
// loop each CTA copies its slice of each recurrent weight into dynamic
// shared memory, so that the weights are read from global memory once per
// sequence, not once per step. The step's buffers are in the global
// workspace, and a phase ends with a barrier across the tile's CTAs. On the
// CPU the CTAs of a tile run one after the other in a loop, which the tests
// use to check the slicing without a GPU.
//
// On CUDA, a step that keeps its heads apart (a matrix state's,
// `TilePlan::heads`) is split by whole heads instead: a CTA's slice of every
// value is its heads' part, which no other CTA reads. Its part of the row
// buffers, the states' among them, stays in its dynamic shared memory for
// the whole sequence, and a phase ends with the CTA's own barrier. The CTAs
// of a tile never wait for each other, so they need not be resident
// together.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace mlir::cell {

namespace {

class Persistent : public TileStrategy {
public:
  using TileStrategy::TileStrategy;

  void addArguments(KernelSignature &sig, MLIRContext *ctx) override {
    if (!tb.gpu)
      return;
    sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, tb.element),
            cellc::ArgKind::Workspace, "workspace");
    sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, IntegerType::get(ctx, 32)),
            cellc::ArgKind::GridBarrier, "grid_barrier");
  }

  /// The workspace, `plan.tileElements()` elements per tile: an argument on
  /// CUDA, one buffer for the tiles in turn on the CPU.
  void beginKernel(Block *entry, unsigned extraArgs, gpu::GPUFuncOp) override {
    this->entry = entry;
    if (tb.gpu) {
      workspace = entry->getArgument(extraArgs);
      barrierWords = entry->getArgument(extraArgs + 1);
      return;
    }
    OpBuilder at = OpBuilder::atBlockBegin(entry);
    workspace = at.create<memref::AllocOp>(
        tb.loc, MemRefType::get({std::max<int64_t>(plan.tileElements(), 1)},
                                tb.element));
    ownsWorkspace = true;
  }

  /// The tiles of this grid row, in turn: the row's CTAs run each tile
  /// together and meet at the row's barrier words.
  std::pair<Value, Value> launchTiles() override {
    OpBuilder &builder = tb.builder;
    gridRow = builder.create<gpu::BlockIdOp>(tb.loc, gpu::Dimension::y);
    cta = builder.create<gpu::BlockIdOp>(tb.loc, gpu::Dimension::x);
    // The partial products; a step split by heads has no products.
    if (plan.heads == 0)
      partials = allocDynamic({tb.ntidStatic, tb.tile}, tb.element);
    return {gridRow, builder.create<gpu::GridDimOp>(tb.loc, gpu::Dimension::y)};
  }

  /// The weights are cached once, for every tile the CTA runs.
  void beforeTiles(Block &step) override { cacheWeights(step); }

  void endKernel() override {
    if (ownsWorkspace)
      tb.builder.create<memref::DeallocOp>(tb.loc, workspace);
    // In the order they were made: the kernel's text, which keys the kernel
    // cache, must not depend on where ops happen to be in memory.
    for (Value cache : cacheOrder)
      tb.builder.create<memref::DeallocOp>(tb.loc, cache);
  }

  int64_t dynamicSharedUsed() const override { return dynamicUsed; }

  Value localIndex(Value buffer, Value j) override {
    Value first = firstElement.lookup(buffer);
    return first ? tb.builder.create<arith::SubIOp>(tb.loc, j, first).getResult() : j;
  }

  /// A view of this tile's part of the workspace; split by heads on CUDA,
  /// this CTA's part in its dynamic shared memory.
  Value rowBuffer(ArrayRef<int64_t> full) override {
    OpBuilder &builder = tb.builder;
    if (tb.gpu && plan.heads > 0) {
      // `[slots..., n, BT]`: this CTA's elements of each slot.
      SmallVector<int64_t> local(full.begin(), full.end());
      int64_t &n = local[local.size() - 2];
      n = sliceOf(n);
      Value buffer = allocDynamic(local, tb.element, /*pad=*/false);
      firstElement[buffer] =
          builder.create<arith::MulIOp>(tb.loc, cta, tb.index(n)).getResult();
      return buffer;
    }
    SmallVector<int64_t> strides(full.size(), 1);
    for (int64_t d = int64_t(full.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * full[d + 1];
    // On CUDA a grid row's part, which its tiles use in turn (the runtime
    // gives a part to each row of the grid); on the CPU one for the tiles
    // in turn.
    Value part = tb.gpu ? gridRow : tb.tileIndex;
    Value offset = builder.create<arith::AddIOp>(
        tb.loc,
        builder.create<arith::MulIOp>(tb.loc, part, tb.index(plan.tileElements())),
        tb.index(workspaceUsed));
    workspaceUsed += strides[0] * full[0];
    auto type = MemRefType::get(
        full, tb.element,
        StridedLayoutAttr::get(builder.getContext(), ShapedType::kDynamic, strides));
    SmallVector<OpFoldResult> sizes, steps;
    for (auto [n, st] : llvm::zip(full, strides)) {
      sizes.push_back(builder.getIndexAttr(n));
      steps.push_back(builder.getIndexAttr(st));
    }
    return builder.create<memref::ReinterpretCastOp>(tb.loc, type, workspace,
                                                     OpFoldResult(offset), sizes,
                                                     steps);
  }

  /// A loop over this CTA's slice of the elements `[0, n)`.
  void forEachElement(int64_t n, function_ref<void(Value j)> body) override {
    forEachCta([&] {
      OpBuilder &builder = tb.builder;
      Value begin = tb.tid, end = tb.index(n);
      Value first = builder.create<arith::MulIOp>(tb.loc, cta, tb.index(sliceOf(n)));
      begin = builder.create<arith::AddIOp>(tb.loc, first, tb.tid);
      end = builder.create<arith::MinUIOp>(tb.loc, tb.shifted(first, sliceOf(n)),
                                           tb.index(n));
      tb.forRange(begin, end, tb.ntid, body);
    });
  }

  int64_t elementsPerCta(int64_t n) const override { return sliceOf(n); }

  /// A CTA's partials, then the next CTA's.
  void forEachPartial(int64_t n, function_ref<Value(Value j)> term,
                      function_ref<void(Value slot, Value partial)> sink) override {
    forEachCta([&] {
      OpBuilder &builder = tb.builder;
      Value first = builder.create<arith::MulIOp>(tb.loc, cta, tb.index(sliceOf(n)));
      Value begin = builder.create<arith::AddIOp>(tb.loc, first, tb.tid);
      Value end = builder.create<arith::MinUIOp>(tb.loc, tb.shifted(first, sliceOf(n)),
                                                 tb.index(n));
      Value firstSlot =
          builder.create<arith::MulIOp>(tb.loc, cta, tb.index(tb.partialsPerCta()));
      tb.sinkPartial(firstSlot, tb.sumRange(begin, end, tb.ntid, term), sink);
    });
  }
  int64_t partialSlots() const override { return plan.slices * tb.partialsPerCta(); }

  void barrier() override {
    if (tb.gpu && plan.heads > 0)
      tb.builder.create<gpu::BarrierOp>(tb.loc);
    else if (tb.gpu)
      gridBarrier();
  }
  /// Block-diagonal products are computed element by element, the weight
  /// read from global memory, not from a CTA's cache.
  bool computesProduct(Operation *op) override { return !productBlocks(op).diagonal; }
  void emitProduct(Operation *op, Value out) override { emitSlicedProduct(op, out); }

private:
  /// The rows of a CTA's slice of `n`.
  int64_t sliceOf(int64_t n) const { return (n + plan.slices - 1) / plan.slices; }
  /// The element type of a CTA's copy of the weight of `op`: bf16 when bf16
  /// tensor cores read it, which round it to bf16 anyway.
  Type cachedType(Operation *op) const {
    if (tb.gpu && tb.precision == cellc::Precision::Bf16 &&
        onTensorCores(op, tb.precision))
      return BFloat16Type::get(tb.builder.getContext());
    return tb.element;
  }
  /// The rows of a CTA's slice of the product of `op`: whole 16-row MMA
  /// tiles when it runs on tensor cores.
  int64_t productSliceOf(Operation *op) const {
    int64_t slice = sliceOf(sizeOf(op->getResult(0)));
    return onTensorCores(op, tb.precision) ? (slice + 15) / 16 * 16 : slice;
  }

  /// A loop over the CTAs of a tile, on the CPU; on CUDA, the body once for
  /// this CTA.
  void forEachCta(function_ref<void()> body) {
    if (tb.gpu) {
      body();
      return;
    }
    tb.forRange(tb.index(0), tb.index(plan.slices), tb.index(1), [&](Value c) {
      cta = c;
      body();
    });
  }

  /// A `[shape...]` view of `type` in the dynamic shared memory, which may
  /// exceed the 48 KiB of static shared memory (up to `shared-limit`; the
  /// runtime raises the kernel's limit). With `pad`, the next view starts
  /// 16 bytes aligned; row buffers split by heads are whole tiles of rows,
  /// so each starts aligned for its lanes, and their plan counts no pad.
  Value allocDynamic(ArrayRef<int64_t> shape, Type type, bool pad = true);
  /// A CTA's copy of a weight slice: dynamic shared memory on CUDA, the
  /// heap on the CPU.
  Value allocCache(ArrayRef<int64_t> shape, Type type);
  /// A barrier across the CTAs of a grid row (a tile's): every CTA arrives
  /// at the row's count and waits until the last one bumps the row's
  /// generation (kernelinterface's `kPersistentBarrierWords` a row; the
  /// count and the generation each on its own 128-byte line). The count
  /// goes back to 0, so the words need zeroing once, not per launch. The
  /// PTX memory model's orders are spelled in the PTX itself: the
  /// generation is read with `ld.acquire.gpu` before the arrival (an
  /// `atom.acq_rel.gpu`, which publishes this CTA's writes and, for the
  /// last, acquires the others'), the last bumps the generation with a
  /// `.release` after resetting the count, and waiters spin on
  /// `ld.acquire.gpu` with `nanosleep` between reads. (LLVM 19's NVPTX
  /// emits an atomicrmw's ordering as a relaxed `atom`, with no fence.)
  void gridBarrier();
  /// The address of the barrier word `word`, as a 64-bit integer for
  /// inline PTX.
  Value barrierWordAddress(Value word);
  /// Fills `weightCache` with this CTA's slice of every recurrent weight
  /// the step reads, before the time loop.
  void cacheWeights(Block &step);
  /// Computes this CTA's slice of the rows of `op` into `out` from the
  /// weights in `weightCache`.
  void emitSlicedProduct(Operation *op, Value out);
  /// The same for a product whose weights stay in global memory
  /// (`plan.uncached`), read so that a warp's lanes touch adjacent words: a
  /// matvec's rows a warp at a time, its lanes along the depth and summed
  /// by shuffles; a vecmat's columns 32 at a time, a lane each, the warps
  /// splitting the depth and their partials summed through shared memory.
  void emitGlobalProduct(Operation *op, Value out, Value vecBuffer, Value slot);

  Block *entry = nullptr;
  Value workspace, barrierWords, cta, gridRow, partials, dynamicShared;
  bool ownsWorkspace = false;
  int64_t workspaceUsed = 0, dynamicUsed = 0;
  DenseMap<Operation *, Value> weightCache;
  /// Split by heads: the first element of each row buffer's part.
  DenseMap<Value, Value> firstElement;
  SmallVector<Value> cacheOrder;
};

Value Persistent::allocDynamic(ArrayRef<int64_t> shape, Type type, bool pad) {
  Location loc = tb.loc;
  auto memSpace = gpu::AddressSpaceAttr::get(tb.builder.getContext(),
                                             gpu::AddressSpace::Workgroup);
  OpBuilder at = OpBuilder::atBlockBegin(entry);
  if (!dynamicShared)
    dynamicShared = at.create<gpu::DynamicSharedMemoryOp>(
        loc, MemRefType::get({ShapedType::kDynamic}, at.getI8Type(),
                             MemRefLayoutAttrInterface(), memSpace));
  at.setInsertionPointAfterValue(dynamicShared);
  int64_t n = type.getIntOrFloatBitWidth() / 8;
  for (int64_t d : shape)
    n *= d;
  Value view = at.create<memref::ViewOp>(
      loc, MemRefType::get(shape, type, MemRefLayoutAttrInterface(), memSpace),
      dynamicShared, at.create<arith::ConstantIndexOp>(loc, dynamicUsed),
      ValueRange());
  dynamicUsed += pad ? (n + 15) / 16 * 16 : n;
  return view;
}

Value Persistent::allocCache(ArrayRef<int64_t> shape, Type type) {
  if (tb.gpu)
    return allocDynamic(shape, type);
  OpBuilder at = OpBuilder::atBlockBegin(entry);
  return at.create<memref::AllocOp>(tb.loc, MemRefType::get(shape, type));
}

Value Persistent::barrierWordAddress(Value word) {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  auto meta = builder.create<memref::ExtractStridedMetadataOp>(loc, barrierWords);
  Value base = builder.create<memref::ExtractAlignedPointerAsIndexOp>(loc, barrierWords);
  Value element = builder.create<arith::AddIOp>(loc, meta.getOffset(), word);
  Value address = builder.create<arith::AddIOp>(
      loc, base, builder.create<arith::MulIOp>(loc, element, tb.index(4)));
  return builder.create<arith::IndexCastUIOp>(loc, builder.getI64Type(), address);
}

void Persistent::gridBarrier() {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  Type i32 = builder.getI32Type();
  builder.create<gpu::BarrierOp>(loc);
  // One PTX instruction, its operands bound by `constraints`.
  auto ptx = [&](TypeRange results, ValueRange operands, StringRef text,
                 StringRef constraints) -> Value {
    auto op = builder.create<LLVM::InlineAsmOp>(
        loc, results, operands, text, constraints, /*has_side_effects=*/true,
        /*is_align_stack=*/false, LLVM::AsmDialectAttr(), ArrayAttr());
    return results.empty() ? Value() : op.getResult(0);
  };
  auto constant = [&](int64_t value) {
    return builder.create<arith::ConstantIntOp>(loc, value, 32).getResult();
  };
  Value first = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                              tb.tid, tb.index(0));
  auto leader = builder.create<scf::IfOp>(loc, first, false);
  {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(leader.thenBlock()->getTerminator());
    Value row = builder.create<arith::MulIOp>(
        loc, gridRow, tb.index(cellc::kPersistentBarrierWords));
    Value count = barrierWordAddress(row);
    Value generation =
        barrierWordAddress(tb.shifted(row, cellc::kPersistentBarrierWords / 2));
    Value seen = ptx(i32, generation, "ld.acquire.gpu.u32 $0, [$1];", "=r,l");
    Value arrived = ptx(i32, ValueRange{count, constant(1)},
                        "atom.add.acq_rel.gpu.u32 $0, [$1], $2;", "=r,l,r");
    Value last = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, arrived,
                                               constant(plan.slices - 1));
    auto ifLast = builder.create<scf::IfOp>(loc, last, true);
    builder.setInsertionPoint(ifLast.thenBlock()->getTerminator());
    ptx({}, ValueRange{count, constant(0)}, "st.relaxed.gpu.u32 [$0], $1;", "l,r");
    ptx({}, ValueRange{generation, constant(1)}, "red.release.gpu.add.u32 [$0], $1;", "l,r");
    builder.setInsertionPoint(ifLast.elseBlock()->getTerminator());
    auto spin = builder.create<scf::WhileOp>(loc, TypeRange(), ValueRange());
    builder.createBlock(&spin.getBefore());
    Value now = ptx(i32, generation, "ld.acquire.gpu.u32 $0, [$1];", "=r,l");
    builder.create<scf::ConditionOp>(
        loc, builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, now, seen),
        ValueRange());
    builder.createBlock(&spin.getAfter());
    ptx({}, {}, "nanosleep.u32 32;", "");
    builder.create<scf::YieldOp>(loc);
  }
  builder.create<gpu::BarrierOp>(loc);
}

void Persistent::cacheWeights(Block &step) {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  bool gpu = tb.gpu;
  step.walk([&](Operation *op) {
    if (!PhasePlan::isProduct(op) || !tb.computesProduct(op) || weightCache.count(op) ||
        plan.uncached.contains(op))
      return;
    bool transposed = isa<VecmatOp>(op);
    int64_t rows = sizeOf(op->getResult(0)), depth = sizeOf(op->getOperand(1));
    int64_t slice = productSliceOf(op);
    // One row more than the depth keeps the threads of a product, which read
    // consecutive rows at the same k, off one bank.
    SmallVector<int64_t> shape = {slice, depth + 1};
    if (!gpu)
      shape.insert(shape.begin(), plan.slices);
    Type cached = cachedType(op);
    Value cache = allocCache(shape, cached);
    weightCache[op] = cache;
    cacheOrder.push_back(cache);
    Value weight =
        tb.params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
    // A replayed product's weights are only needed when the gates were not
    // saved.
    OpBuilder::InsertionGuard guard(builder);
    if (op->getParentOfType<RestoreOp>()) {
      Value replaying = builder.create<arith::XOrIOp>(
          loc, tb.saveGates, builder.create<arith::ConstantIntOp>(loc, 1, 1));
      auto ifOp = builder.create<scf::IfOp>(loc, replaying, false);
      builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    }
    forEachCta([&] {
      Value first = builder.create<arith::MulIOp>(loc, cta, tb.index(slice));
      tb.forRange(tb.tid, tb.index(slice * depth), tb.ntid, [&](Value e) {
        Value local = builder.create<arith::DivUIOp>(loc, e, tb.index(depth));
        Value k = builder.create<arith::RemUIOp>(loc, e, tb.index(depth));
        Value row = builder.create<arith::AddIOp>(loc, first, local);
        Value inside = builder.create<arith::CmpIOp>(
            loc, arith::CmpIPredicate::ult, row, tb.index(rows));
        auto ifOp = builder.create<scf::IfOp>(loc, inside, false);
        builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
        Value w = builder.create<memref::LoadOp>(
            loc, weight, transposed ? ValueRange{k, row} : ValueRange{row, k});
        if (cached != tb.element)
          w = builder.create<arith::TruncFOp>(loc, cached, w);
        SmallVector<Value> at = {local, k};
        if (!gpu)
          at.insert(at.begin(), cta);
        builder.create<memref::StoreOp>(loc, w, cache, at);
      });
    });
  });
  if (gpu)
    builder.create<gpu::BarrierOp>(loc);
}

void Persistent::emitSlicedProduct(Operation *op, Value out) {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  bool gpu = tb.gpu;
  int64_t rows = sizeOf(op->getResult(0));
  Value vec = op->getOperand(1), slot;
  int64_t depth = sizeOf(vec);
  Value vecBuffer = tb.bufferOf(vec, slot);
  if (plan.uncached.contains(op))
    return emitGlobalProduct(op, out, vecBuffer, slot);
  Value cache = weightCache.lookup(op);
  int64_t slice = productSliceOf(op);
  if (gpu && onTensorCores(op, tb.precision)) {
    Value first = builder.create<arith::MulIOp>(loc, cta, tb.index(slice));
    tb.emitTensorCoreMatvec(op, out, first, slice, [&](Value local, Value k) -> Value {
      Value w = builder.create<memref::LoadOp>(loc, cache, ValueRange{local, k});
      // A bf16 copy widens here and rounds back, exactly, in the packing.
      if (w.getType() != tb.element)
        w = builder.create<arith::ExtFOp>(loc, tb.element, w);
      return w;
    });
    return;
  }
  // Threads split the slice's rows and, where there are threads to spare,
  // each row's depth into `split` parts, which are then summed.
  int64_t split = 1;
  if (gpu)
    while (split * 2 * slice <= tb.ntidStatic && depth % (split * 2) == 0)
      split *= 2;
  int64_t part = depth / split;
  auto partial = [&](Value local, Value kBegin) -> Value {
    auto loop = builder.create<scf::ForOp>(
        loc, kBegin, builder.create<arith::AddIOp>(loc, kBegin, tb.index(part)),
        tb.index(1), ValueRange{splat(builder, loc, tb.lane, 0.0)},
        [&](OpBuilder &b, Location l, Value k, ValueRange acc) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPointToStart(b.getInsertionBlock());
          SmallVector<Value> at = {local, k};
          if (!gpu)
            at.insert(at.begin(), cta);
          Value w = builder.create<memref::LoadOp>(l, cache, at);
          Value next = builder.create<vector::FMAOp>(
              l, builder.create<vector::BroadcastOp>(l, tb.lane, w),
              tb.loadShared(vecBuffer, slot, k), acc[0]);
          builder.create<scf::YieldOp>(l, next);
        });
    return loop.getResult(0);
  };
  auto when = [&](Value cond, function_ref<void()> body) {
    auto ifOp = builder.create<scf::IfOp>(loc, cond, false);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    body();
  };
  auto ult = [&](Value a, Value b) {
    return builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, a, b);
  };
  forEachCta([&] {
    Value first = builder.create<arith::MulIOp>(loc, cta, tb.index(slice));
    if (!gpu) {
      tb.forRange(tb.index(0), tb.index(slice), tb.index(1), [&](Value local) {
        Value row = builder.create<arith::AddIOp>(loc, first, local);
        when(ult(row, tb.index(rows)), [&] {
          tb.storeShared(partial(local, tb.index(0)), out, Value(), row);
        });
      });
      return;
    }
    Value local = builder.create<arith::DivUIOp>(loc, tb.tid, tb.index(split));
    Value piece = builder.create<arith::RemUIOp>(loc, tb.tid, tb.index(split));
    when(ult(tb.tid, tb.index(slice * split)), [&] {
      Value kBegin = builder.create<arith::MulIOp>(loc, piece, tb.index(part));
      tb.storeShared(partial(local, kBegin), partials, Value(), tb.tid);
    });
    builder.create<gpu::BarrierOp>(loc);
    Value row = builder.create<arith::AddIOp>(loc, first, tb.tid);
    when(builder.create<arith::AndIOp>(loc, ult(tb.tid, tb.index(slice)),
                                       ult(row, tb.index(rows))),
         [&] {
           Value base = builder.create<arith::MulIOp>(loc, tb.tid, tb.index(split));
           Value sum = tb.loadShared(partials, Value(), base);
           for (int64_t p = 1; p < split; ++p)
             sum = builder.create<arith::AddFOp>(
                 loc, sum, tb.loadShared(partials, Value(), tb.shifted(base, p)));
           tb.storeShared(sum, out, Value(), row);
         });
    // The next product of the phase writes the partials again.
    builder.create<gpu::BarrierOp>(loc);
  });
}

void Persistent::emitGlobalProduct(Operation *op, Value out, Value vecBuffer, Value slot) {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  bool transposed = isa<VecmatOp>(op);
  int64_t rows = sizeOf(op->getResult(0)), depth = sizeOf(op->getOperand(1));
  int64_t slice = sliceOf(rows);
  Value weight = tb.params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
  Value first = builder.create<arith::MulIOp>(loc, cta, tb.index(slice));
  auto term = [&](Value row, Value k) -> Value {
    Value w = builder.create<memref::LoadOp>(
        loc, weight, transposed ? ValueRange{k, row} : ValueRange{row, k});
    return builder.create<arith::MulFOp>(
        loc, builder.create<vector::BroadcastOp>(loc, tb.lane, w),
        tb.loadShared(vecBuffer, slot, k));
  };
  auto inside = [&](Value row) {
    return builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, row,
                                         tb.index(rows));
  };
  auto when = [&](Value cond, function_ref<void()> body) {
    auto ifOp = builder.create<scf::IfOp>(loc, cond, false);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    body();
  };
  Value warp = builder.create<arith::DivUIOp>(loc, tb.tid, tb.index(32));
  Value lane = builder.create<arith::RemUIOp>(loc, tb.tid, tb.index(32));
  int64_t warps = tb.ntidStatic / 32;
  if (transposed) {
    // 32 columns at a time, a lane each (adjacent words of W's rows); the
    // warps split the depth, and the first warp sums their partials.
    tb.forRange(tb.index(0), tb.index(slice), tb.index(32), [&](Value base) {
      Value local = builder.create<arith::AddIOp>(loc, base, lane);
      Value row = builder.create<arith::AddIOp>(loc, first, local);
      Value valid = builder.create<arith::AndIOp>(
          loc, inside(row),
          builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, local,
                                        tb.index(slice)));
      Value zero = splat(builder, loc, tb.lane, 0.0);
      Value partial = tb.choose(
          valid,
          [&] {
            return tb.sumRange(warp, tb.index(depth), tb.index(warps),
                               [&](Value k) { return term(row, k); });
          },
          [&] { return zero; });
      tb.storeShared(partial, partials, Value(), tb.tid);
      builder.create<gpu::BarrierOp>(loc);
      Value leader = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, warp,
                                                   tb.index(0));
      when(builder.create<arith::AndIOp>(loc, leader, valid), [&] {
        Value sum = tb.loadShared(partials, Value(), lane);
        for (int64_t w = 1; w < warps; ++w)
          sum = builder.create<arith::AddFOp>(
              loc, sum, tb.loadShared(partials, Value(), tb.shifted(lane, 32 * w)));
        tb.storeShared(sum, out, Value(), row);
      });
      // The next columns write the partials again.
      builder.create<gpu::BarrierOp>(loc);
    });
    return;
  }
  tb.forRange(warp, tb.index(slice), tb.index(warps), [&](Value local) {
    Value row = builder.create<arith::AddIOp>(loc, first, local);
    // The same for every lane of the warp: its shuffles meet.
    when(inside(row), [&] {
      Value partial = tb.sumRange(lane, tb.index(depth), tb.index(32),
                                  [&](Value k) { return term(row, k); });
      tb.sinkPartial(tb.index(0), partial, [&](Value, Value sum) {
        tb.storeShared(sum, out, Value(), row);
      });
    });
  });
}

} // namespace

std::unique_ptr<TileStrategy> makePersistent(TiledBuilder &tb, const TilePlan &plan) {
  return std::make_unique<Persistent>(tb, plan);
}

} // namespace mlir::cell
