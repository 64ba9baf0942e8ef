//===- BatchedBuilder.h - The batched CPU kernels' step emitter -*- C++ -*-===//
//
// The step emitter of the batched CPU kernels (CellToBatchedKernels.cpp): a
// lane is a piece of `lanes` units of a row of the tile; element phases loop
// over the tile's rows and their units, products are the register-blocked
// matrix products of Products.h, and a phase ends at the group's barrier
// when its threads split the units. Private to the pass.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_BATCHEDBUILDER_H
#define CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_BATCHEDBUILDER_H

#include "compiler/Conversion/CellToBatchedKernels/Products.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/Common/StepEmitter.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::cell::batched {

/// The step emitter of the batched CPU kernels: a lane is `lanes` units of
/// the row `row` of the tile that starts at batch row `b0`.
class BatchedBuilder : public StepEmitter {
public:
  BatchedBuilder(OpBuilder &builder, Location loc, Type element, Block *entry,
                 int64_t tile, const BlockShape &shape)
      : StepEmitter(builder, loc, element,
                    VectorType::get({shape.lanes}, element)),
        entry(entry), tile(tile), shape(shape), lanes(shape.lanes) {}

  /// The kernel's entry block, where buffers are allocated, and the tile.
  Block *entry;
  int64_t tile;
  BlockShape shape;
  int64_t lanes;
  /// The tile's first batch row and its number of rows; the row being
  /// computed and its batch row.
  Value b0, rows, row, batchRow;
  /// The packed weight of each product: one a block of a block-diagonal
  /// weight.
  DenseMap<Operation *, SmallVector<Value>> packed;
  /// The workspace (every group's part) and barrier words, and this
  /// thread's group, slice and the group's slices.
  Value workspace, barrierWords, group, slice, slices;
  /// Nonzero when the group's workspace holds the weights packed already
  /// (a streaming step's earlier launch, with the same params).
  Value packedAlready;
  /// True where the launch's per-step histories and results are read only
  /// after its sequence: streamAt stores them past the caches.
  Value streaming;
  /// The first element of the group's part of the workspace, and the
  /// elements of a part (a constant set once every buffer is laid out).
  Value partBase;
  arith::ConstantIndexOp partSize;
  int64_t workspaceUsed = 0;

  /// Barrier words per group: a cache line, so that groups do not share one.
  static constexpr int64_t kBarrierWords = 16;
  /// A group's words: the barrier's, then with `profile` two counters per
  /// barrier site and slice (a constant set once every site is emitted).
  arith::ConstantIndexOp groupWords;

  /// Profiles: each barrier adds the cycles its slice worked since the last
  /// one and the cycles it waited, over 16 (`kClockShift`), to its site's
  /// words `[site][slice][work, wait]` after the group's barrier words, for
  /// the first `kProfileSlices` slices. The driver reads them after a
  /// launch and zeroes them.
  bool profile = false;
  static constexpr int64_t kProfileSlices = 64;
  static constexpr int64_t kClockShift = 4;
  /// The name of each site: `pack`, `states`, `phase N products` ...
  SmallVector<std::string> profileSites;
  /// This slice's last barrier's end (a 0-d i64 buffer).
  Value lastClock;

  /// A `[shape...]` buffer of the group, laid out once, at the kernel's
  /// entry: a view of the workspace at the next 64 bytes.
  Value alloc(ArrayRef<int64_t> shape) {
    OpBuilder at(entry, std::next(partBase.getDefiningOp()->getIterator()));
    SmallVector<int64_t> strides(shape.size(), 1);
    for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * shape[d + 1];
    Value offset = at.create<arith::AddIOp>(
        loc, partBase, at.create<arith::ConstantIndexOp>(loc, workspaceUsed));
    int64_t line = 64 / (element.getIntOrFloatBitWidth() / 8);
    workspaceUsed += (strides[0] * shape[0] + line - 1) / line * line;
    auto type = MemRefType::get(
        shape, element,
        StridedLayoutAttr::get(builder.getContext(), ShapedType::kDynamic, strides));
    SmallVector<OpFoldResult> sizes, steps;
    for (auto [n, st] : llvm::zip(shape, strides)) {
      sizes.push_back(at.getIndexAttr(n));
      steps.push_back(at.getIndexAttr(st));
    }
    return at.create<memref::ReinterpretCastOp>(loc, type, workspace, OpFoldResult(offset),
                                                sizes, steps);
  }
  /// The workspace's elements per group, now that every buffer is laid out.
  int64_t finishWorkspace() {
    int64_t size = std::max<int64_t>(workspaceUsed, 1);
    partSize->setAttr("value", builder.getIndexAttr(size));
    return size;
  }

  /// `[begin, end)` of `count` items split evenly over the slices: this
  /// thread's part.
  std::pair<Value, Value> sliceOf(Value count) {
    auto part = [&](Value s) {
      return builder.create<arith::DivUIOp>(
          loc, builder.create<arith::MulIOp>(loc, s, count), slices);
    };
    return {part(slice), part(builder.create<arith::AddIOp>(loc, slice, index(1)))};
  }
  /// Whether this thread is the group's first (which computes what is not
  /// split).
  Value isFirstSlice() {
    return builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, slice, index(0));
  }
  /// Runs `body` on the first slice only.
  void onFirstSlice(function_ref<void()> body) {
    auto ifOp = builder.create<scf::IfOp>(loc, isFirstSlice(), false);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    body();
  }

  /// `[tile, n]`, or `[2, tile, n]` for `{2, n}`, with rows padded so that
  /// the rows a product reads together do not fall on one cache set.
  Value buffer(ArrayRef<int64_t> shape) override {
    SmallVector<int64_t> full(shape.begin(), shape.end());
    full.back() = paddedRow(full.back());
    full.insert(full.end() - 1, tile);
    return alloc(full);
  }
  /// A row of `n` elements rounded up to 64 bytes, and 64 bytes more where
  /// that is a multiple of 1 KiB: 4 KiB apart, rows of a register block
  /// would evict each other from an 8-way L1.
  int64_t paddedRow(int64_t n) const {
    int64_t bytes = element.getIntOrFloatBitWidth() / 8;
    int64_t line = 64 / bytes;
    int64_t row = (n + line - 1) / line * line;
    if (row * bytes % 1024 == 0)
      row += line;
    return row;
  }
  Value productBuffer(Operation *op) override {
    if (isa<SumOp>(op))
      return buffer({1});
    if (isa<ReduceOp>(op))
      return buffer({sizeOf(op->getResult(0))});
    // Blocks are computed in order, each writing whole panels: block g's last
    // panel runs into block g + 1's columns, which that block then writes.
    ProductBlocks b = productBlocks(op);
    return alloc({tile, paddedRow((b.blocks - 1) * b.outs + shape.panels(b.outs) * shape.panel())});
  }
  SmallVector<Value> indices(Value slot, Value r, Value j) {
    SmallVector<Value> at;
    if (slot)
      at.push_back(slot);
    at.append({r, j});
    return at;
  }
  Value load(Value buf, Value slot, Value j) override {
    return builder.create<vector::LoadOp>(loc, lane, buf, indices(slot, row, j));
  }
  void store(Value v, Value buf, Value slot, Value j) override {
    builder.create<vector::StoreOp>(loc, v, buf, indices(slot, row, j));
  }
  Value loadPerStep(Value buf, Value j) override {
    return loadAt(buf, ValueRange{t, batchRow, j});
  }
  Value loadAt(Value buf, ValueRange at) {
    return builder.create<vector::LoadOp>(loc, lane, buf, at);
  }
  void storeAt(Value v, Value buf, ValueRange at) {
    builder.create<vector::StoreOp>(loc, v, buf, at);
  }
  /// A store past the caches, for what this call does not read again soon
  /// (the states' histories, read by the backward after the whole
  /// sequence): a store that misses the cache reads its line first, so
  /// writing a history cost twice its bytes. A streaming store must be of
  /// a vector at an address that is a multiple of its size (kernels-to-llvm
  /// says so to LLVM); at any other address, with a lane of one, or in a
  /// launch whose results are read next (`streaming` false: a chunk's
  /// replay, a streaming step), this is a plain store. Streamed, chunk:16's
  /// replay at LSTM 8 x 500 on two threads trained in 53 against 46 ms: its
  /// backward read the chunk's history back from memory.
  void streamAt(Value v, Value buf, ValueRange at) {
    auto type = cast<VectorType>(v.getType());
    auto memref = cast<MemRefType>(buf.getType());
    int64_t bytes = type.getNumElements() * memref.getElementTypeBitWidth() / 8;
    if (type.getNumElements() == 1)
      return storeAt(v, buf, at);
    // The memref's layout is the identity: the element's index is the
    // row-major position of `at`.
    Value linear = at[0];
    for (size_t d = 1; d < at.size(); ++d) {
      Value dim = builder.create<memref::DimOp>(loc, buf, d);
      linear = builder.create<arith::AddIOp>(
          loc, builder.create<arith::MulIOp>(loc, linear, dim), at[d]);
    }
    Value address = builder.create<arith::AddIOp>(
        loc, builder.create<memref::ExtractAlignedPointerAsIndexOp>(loc, buf),
        builder.create<arith::MulIOp>(loc, linear, index(bytes / type.getNumElements())));
    Value aligned = builder.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::eq,
        builder.create<arith::AndIOp>(loc, address, index(bytes - 1)), index(0));
    Value past = builder.create<arith::AndIOp>(loc, streaming, aligned);
    auto ifOp = builder.create<scf::IfOp>(loc, past, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    builder.create<vector::StoreOp>(loc, v, buf, at, /*nontemporal=*/true);
    builder.setInsertionPoint(ifOp.elseBlock()->getTerminator());
    storeAt(v, buf, at);
  }
  Value loadParam(Value param, Value j) override {
    return builder.create<vector::LoadOp>(loc, lane, param, ValueRange{j});
  }
  /// For each row of the tile, this slice's units of `[0, n)`: `lanes` at a
  /// time, then the rest one at a time.
  void forEachElement(int64_t n, function_ref<void(Value j)> body) override {
    forEachRow([&] { forEachUnit(n, body); });
  }
  void forEachRow(function_ref<void()> body) { forEachRowIn(index(0), rows, body); }
  void forEachRowIn(Value begin, Value end, function_ref<void()> body) {
    builder.create<scf::ForOp>(
        loc, begin, end, index(1), ValueRange(),
        [&](OpBuilder &b, Location l, Value r, ValueRange) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPoint(b.create<scf::YieldOp>(l));
          row = r;
          batchRow = builder.create<arith::AddIOp>(loc, b0, r);
          body();
        });
  }
  /// This slice's units of `[0, n)`: its share of the whole vectors, and the
  /// units past the last whole vector on the last slice. Every loop over a
  /// value of n units splits them alike, so a slice reads back in a later
  /// phase what it wrote, without a barrier.
  void forEachUnit(int64_t n, function_ref<void(Value j)> body) {
    int64_t main = n / lanes * lanes;
    auto loop = [&](Value begin, Value end, int64_t step) {
      builder.create<scf::ForOp>(
          loc, begin, end, index(step), ValueRange(),
          [&](OpBuilder &b, Location l, Value j, ValueRange) {
            OpBuilder::InsertionGuard guard(builder);
            builder.setInsertionPoint(b.create<scf::YieldOp>(l));
            body(j);
          });
    };
    if (main > 0) {
      auto [first, last] = sliceOf(index(main / lanes));
      loop(builder.create<arith::MulIOp>(loc, first, index(lanes)),
           builder.create<arith::MulIOp>(loc, last, index(lanes)), lanes);
    }
    if (main < n) {
      VectorType wide = lane;
      lane = VectorType::get({1}, element);
      Value isLast = builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::eq, builder.create<arith::AddIOp>(loc, slice, index(1)),
          slices);
      loop(builder.create<arith::SelectOp>(loc, isLast, index(main), index(n)), index(n), 1);
      lane = wide;
    }
  }
  /// A barrier among the group's slices (none with one slice): each arrives
  /// at its count word and waits until the last bumps the generation word;
  /// the count goes back to 0, so the words need zeroing once. A waiter
  /// spins, then yields its core (slices may share cores).
  void barrier() override {
    Value arrived = profile ? readClock() : Value();
    synchronize();
    if (profile)
      recordSite(arrived);
  }
  /// The host's cycle counter.
  Value readClock() {
    return builder
        .create<LLVM::CallIntrinsicOp>(loc, builder.getI64Type(), "llvm.readcyclecounter",
                                       ValueRange())
        .getResult(0);
  }
  /// Starts this slice's clock: the first barrier's work counts from here.
  void startClock() {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(entry);
    lastClock = builder.create<memref::AllocaOp>(
        loc, MemRefType::get({}, builder.getI64Type()));
    builder.create<memref::StoreOp>(loc, readClock(), lastClock, ValueRange());
  }
  /// Adds this slice's work since its last barrier, up to `arrived`, and
  /// its wait since, to the next site's words.
  void recordSite(Value arrived) {
    int64_t site = profileSites.size();
    profileSites.push_back(phase ? llvm::formatv("phase {0} {1}", phase, ending).str()
                                 : ending.str());
    Value left = readClock();
    Value last = builder.create<memref::LoadOp>(loc, lastClock, ValueRange());
    builder.create<memref::StoreOp>(loc, left, lastClock, ValueRange());
    Value profiled = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, slice,
                                                   index(kProfileSlices));
    auto ifOp = builder.create<scf::IfOp>(loc, profiled, false);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    Value first = builder.create<arith::AddIOp>(
        loc, builder.create<arith::MulIOp>(loc, group, groupWords),
        index(kBarrierWords + site * kProfileSlices * 2));
    Value word = builder.create<arith::AddIOp>(
        loc, first, builder.create<arith::MulIOp>(loc, slice, index(2)));
    Value shift = builder.create<arith::ConstantIntOp>(loc, kClockShift, 64);
    for (auto [k, from, to] : {std::tuple(0, last, arrived), std::tuple(1, arrived, left)}) {
      Value cycles = builder.create<arith::ShRUIOp>(
          loc, builder.create<arith::SubIOp>(loc, to, from), shift);
      Value at = builder.create<arith::AddIOp>(loc, word, index(k));
      Value sum = builder.create<arith::AddIOp>(
          loc, builder.create<memref::LoadOp>(loc, barrierWords, at),
          builder.create<arith::TruncIOp>(loc, builder.getI32Type(), cycles));
      builder.create<memref::StoreOp>(loc, sum, barrierWords, at);
    }
  }
  /// The group's words, now that every barrier is emitted.
  int64_t finishBarrierWords() {
    int64_t words = kBarrierWords + int64_t(profileSites.size()) * kProfileSlices * 2;
    groupWords->setAttr("value", builder.getIndexAttr(words));
    return words;
  }

  /// Waits for the group's other slices.
  void synchronize() {
    Value several =
        builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ugt, slices, index(1));
    auto ifOp = builder.create<scf::IfOp>(loc, several, false);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    Value count = builder.create<arith::MulIOp>(loc, group, groupWords);
    Value generation = builder.create<arith::AddIOp>(loc, count, index(kBarrierWords / 2));
    auto rmw = [&](OpBuilder &b, arith::AtomicRMWKind kind, int64_t value, Value word) {
      Value v = b.create<arith::ConstantIntOp>(loc, value, 32);
      return b.create<memref::AtomicRMWOp>(loc, kind, v, barrierWords, ValueRange{word})
          .getResult();
    };
    // An atomic add of 0 reads a word, ordered with the other slices' adds.
    Value seen = rmw(builder, arith::AtomicRMWKind::addi, 0, generation);
    Value arrived = rmw(builder, arith::AtomicRMWKind::addi, 1, count);
    Value slices32 = builder.create<arith::IndexCastOp>(loc, builder.getI32Type(), slices);
    Value last = builder.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::eq,
        builder.create<arith::AddIOp>(loc, arrived,
                                      builder.create<arith::ConstantIntOp>(loc, 1, 32)),
        slices32);
    auto ifLast = builder.create<scf::IfOp>(loc, last, true);
    builder.setInsertionPoint(ifLast.thenBlock()->getTerminator());
    rmw(builder, arith::AtomicRMWKind::assign, 0, count);
    rmw(builder, arith::AtomicRMWKind::addi, 1, generation);
    builder.setInsertionPoint(ifLast.elseBlock()->getTerminator());
    Value zero = builder.create<arith::ConstantIntOp>(loc, 0, 32);
    auto spin = builder.create<scf::WhileOp>(loc, TypeRange{builder.getI32Type()},
                                             ValueRange{zero});
    {
      OpBuilder::InsertionGuard inner(builder);
      Block *before = builder.createBlock(&spin.getBefore(), {}, {builder.getI32Type()}, {loc});
      Value now = rmw(builder, arith::AtomicRMWKind::addi, 0, generation);
      Value waiting = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, now, seen);
      builder.create<scf::ConditionOp>(loc, waiting, before->getArgument(0));
      Block *after = builder.createBlock(&spin.getAfter(), {}, {builder.getI32Type()}, {loc});
      Value spins = after->getArgument(0);
      Value tired = builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::uge, spins,
          builder.create<arith::ConstantIntOp>(loc, kSpinsBeforeYield, 32));
      auto yield = builder.create<scf::IfOp>(loc, tired, false);
      {
        OpBuilder::InsertionGuard g(builder);
        builder.setInsertionPoint(yield.thenBlock()->getTerminator());
        builder.create<func::CallOp>(loc, yieldCore(), ValueRange());
      }
      builder.create<scf::YieldOp>(
          loc, ValueRange{builder.create<arith::AddIOp>(
                   loc, spins, builder.create<arith::ConstantIntOp>(loc, 1, 32))});
    }
  }
  /// Spins on the generation word before a waiter yields its core.
  static constexpr int64_t kSpinsBeforeYield = 4000;
  /// `sched_yield`, declared in the kernel's module.
  func::FuncOp yieldCore() {
    auto module = entry->getParentOp()->getParentOfType<ModuleOp>();
    if (auto f = module.lookupSymbol<func::FuncOp>("sched_yield"))
      return f;
    OpBuilder at = OpBuilder::atBlockBegin(module.getBody());
    auto f = at.create<func::FuncOp>(loc, "sched_yield",
                                     at.getFunctionType({}, {at.getI32Type()}));
    f.setPrivate();
    return f;
  }
  /// An expand is not computed whole: it is read in place where it is used
  /// (evalProduct), so an outer product or `C q` writes no matrix of copies.
  bool computesProduct(Operation *op) override {
    if (isa<ExpandOp>(op))
      return false;
    // A reduce whose operand the plan left unwritten sums it in place.
    if (isa<ReduceOp>(op) && !plan->materialized.contains(PhasePlan::wholeOperand(op)))
      return false;
    return PhasePlan::isCrossUnit(op);
  }
  /// A lane of an expand, from its input's buffer at the kept index of each
  /// unit: where the lane lies within one run of the last dim, the kept
  /// values of its units are in a row (the last dim kept: one load) or are
  /// one value (dropped: one load, spread); otherwise unit by unit.
  Value evalProduct(Operation *op, const Index &i) override {
    if (auto reduce = dyn_cast<ReduceOp>(op))
      return evalReduce(reduce, i);
    auto expand = dyn_cast<ExpandOp>(op);
    if (!expand)
      return StepEmitter::evalProduct(op, i);
    ArrayRef<int64_t> shape = expand.getShape(), kept = expand.getKept();
    int64_t dims = shape.size();
    Value slot, buf = bufferOf(expand.getInput(), slot);
    auto keptIndex = [&](Value f) {
      SmallVector<Value> at(dims);
      for (int64_t d = dims - 1; d >= 0; --d) {
        at[d] = builder.create<arith::RemUIOp>(loc, f, index(shape[d]));
        f = builder.create<arith::DivUIOp>(loc, f, index(shape[d]));
      }
      Value from = index(0);
      for (int64_t k : kept)
        from = builder.create<arith::AddIOp>(
            loc, builder.create<arith::MulIOp>(loc, from, index(shape[k])), at[k]);
      return from;
    };
    VectorType one = VectorType::get({1}, element);
    auto scalarAt = [&](Value k) {
      Value x = builder.create<vector::LoadOp>(loc, one, buf, indices(slot, row, k));
      return builder.create<vector::ExtractOp>(loc, x, ArrayRef<int64_t>{0}).getResult();
    };
    int64_t width = lane.getNumElements();
    if (shape.back() % width == 0 && i.offset % width == 0) {
      Value k = keptIndex(at(i));
      // An expand of a value that keeps no dim (max(s)) repeats one scalar.
      if (!kept.empty() && kept.back() == dims - 1)
        return load(buf, slot, k);
      return builder.create<vector::BroadcastOp>(loc, lane, scalarAt(k));
    }
    Value v = splat(builder, loc, lane, 0.0);
    for (int64_t e = 0; e < width; ++e)
      v = builder.create<vector::InsertOp>(loc, scalarAt(keptIndex(shifted(at(i), e))), v,
                                           ArrayRef<int64_t>{e});
    return v;
  }
  /// A lane holds units of one row: the per-sample value is evaluated alone
  /// and spread over the lane.
  Value evalBroadcast(Value one) override {
    VectorType wide = lane;
    lane = VectorType::get({1}, element);
    scopes.emplace_back();
    Value v = eval(one, {index(0), 0, 1});
    scopes.pop_back();
    lane = wide;
    Value scalar = builder.create<vector::ExtractOp>(loc, v, ArrayRef<int64_t>{0});
    return builder.create<vector::BroadcastOp>(loc, lane, scalar);
  }
  /// A lane of a reduce that keeps the last dim and whose operand is not
  /// written out (PhasePlan::Options::reducesInPlace): the operand evaluated
  /// at each element summed into the lane's units. Where the lane lies in
  /// one run of the last dim (`Cᵀ q`, summing over K), one loop of K vector
  /// multiply-adds; otherwise unit by unit.
  Value evalReduce(ReduceOp reduce, const Index &i) {
    ArrayRef<int64_t> shape = reduce.getShape(), kept = reduce.getKept();
    ReduceCombine combine{reduce.getCombineKind()};
    int64_t dims = shape.size();
    Value vec = reduce.getInput();
    SmallVector<int64_t> stride(dims, 1), others;
    for (int64_t d = dims - 2; d >= 0; --d)
      stride[d] = stride[d + 1] * shape[d + 1];
    int64_t count = 1;
    for (int64_t d = 0; d < dims; ++d)
      if (!llvm::is_contained(kept, d)) {
        others.push_back(d);
        count *= shape[d];
      }
    // The operand's index of `flat`, an index over `over` in row-major order.
    auto spread = [&](Value flat, ArrayRef<int64_t> over) {
      Value at = index(0);
      for (int64_t d : llvm::reverse(over)) {
        Value digit = builder.create<arith::RemUIOp>(loc, flat, index(shape[d]));
        flat = builder.create<arith::DivUIOp>(loc, flat, index(shape[d]));
        at = builder.create<arith::AddIOp>(
            loc, at, builder.create<arith::MulIOp>(loc, digit, index(stride[d])));
      }
      return at;
    };
    // The sum, in vectors of `width`, of the operand at `base` plus each
    // summed element.
    auto sumFrom = [&](Value base, VectorType width) {
      VectorType wide = lane;
      lane = width;
      auto loop = builder.create<scf::ForOp>(
          loc, index(0), index(count), index(1),
          ValueRange{splat(builder, loc, width, combine.identity())},
          [&](OpBuilder &b, Location l, Value s, ValueRange acc) {
            OpBuilder::InsertionGuard guard(builder);
            builder.setInsertionPointToStart(b.getInsertionBlock());
            scopes.emplace_back();
            Value f = builder.create<arith::AddIOp>(loc, base, spread(s, others));
            Value x = eval(vec, {f, 0, sizeOf(vec)});
            scopes.pop_back();
            builder.create<scf::YieldOp>(l, ValueRange{combine.combine(builder, l, acc[0], x)});
          });
      lane = wide;
      return loop.getResult(0);
    };
    int64_t width = lane.getNumElements();
    if (shape.back() % width == 0 && i.offset % width == 0)
      return sumFrom(spread(at(i), kept), lane);
    VectorType one = VectorType::get({1}, element);
    Value result = splat(builder, loc, lane, 0.0);
    for (int64_t e = 0; e < width; ++e) {
      Value sum = sumFrom(spread(shifted(at(i), e), kept), one);
      result = builder.create<vector::InsertOp>(
          loc, builder.create<vector::ExtractOp>(loc, sum, ArrayRef<int64_t>{0}), result,
          ArrayRef<int64_t>{e});
    }
    return result;
  }
  /// The sum of each of this slice's rows: `lanes` units at a time into one
  /// vector, whose elements are added at the end, then the rest one at a
  /// time.
  void emitSum(SumOp sum, Value a, Value slot, Value out) {
    int64_t n = sizeOf(sum.getInput());
    int64_t main = n / lanes * lanes;
    VectorType one = VectorType::get({1}, element);
    auto [first, last] = sliceOf(rows);
    forEachRowIn(first, last, [&] {
      Value acc = splat(builder, loc, lane, 0.0);
      if (main > 0) {
        auto loop = builder.create<scf::ForOp>(
            loc, index(0), index(main), index(lanes), ValueRange{acc},
            [&](OpBuilder &b, Location l, Value j, ValueRange carried) {
              Value x = b.create<vector::LoadOp>(l, lane, a, indices(slot, row, j));
              b.create<scf::YieldOp>(l, ValueRange{b.create<arith::AddFOp>(l, carried[0], x)});
            });
        acc = loop.getResult(0);
      }
      Value total = builder.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, acc);
      for (int64_t j = main; j < n; ++j) {
        Value x = builder.create<vector::LoadOp>(loc, one, a, indices(slot, row, index(j)));
        total = builder.create<arith::AddFOp>(
            loc, total, builder.create<vector::ExtractOp>(loc, x, ArrayRef<int64_t>{0}));
      }
      builder.create<vector::StoreOp>(loc, builder.create<vector::BroadcastOp>(loc, one, total),
                                      out, indices(Value(), row, index(0)));
    });
  }
  /// A loop over `[0, n)` in steps of `step` at the builder, `body` in it.
  void loopTo(int64_t n, int64_t step, function_ref<void(Value i)> body) {
    builder.create<scf::ForOp>(loc, index(0), index(n), index(step), ValueRange(),
                               [&](OpBuilder &b, Location l, Value i, ValueRange) {
                                 OpBuilder::InsertionGuard guard(builder);
                                 builder.setInsertionPoint(b.create<scf::YieldOp>(l));
                                 body(i);
                               });
  }
  /// A `cell.reduce` whose operand is in a buffer (`out[kept index of f] +=
  /// a[f]`), for each of this slice's rows: a loop per dim of the shape.
  /// Along the last dim, `lanes` at a time: added into the kept values where
  /// they run along it too, else summed over the run. (An expand is never
  /// computed whole: see evalProduct.)
  void emitReduce(ReduceOp reduce, Value a, Value slot, Value out) {
    ArrayRef<int64_t> shape = reduce.getShape(), kept = reduce.getKept();
    ReduceCombine combine{reduce.getCombineKind()};
    int64_t dims = shape.size();
    SmallVector<int64_t> fullStride(dims, 1), keptStride(dims, 0);
    for (int64_t d = dims - 2; d >= 0; --d)
      fullStride[d] = fullStride[d + 1] * shape[d + 1];
    int64_t keptSize = 1;
    for (int64_t k : llvm::reverse(kept)) {
      keptStride[k] = keptSize;
      keptSize *= shape[k];
    }
    int64_t inner = shape.back();
    bool innerKept = keptStride[dims - 1] != 0;
    VectorType one = VectorType::get({1}, element);
    auto add = [&](Value x, Value y) { return builder.create<arith::AddIOp>(loc, x, y); };
    auto mul = [&](Value x, int64_t c) { return builder.create<arith::MulIOp>(loc, x, index(c)); };
    // Along the last dim from `full` (in the shape) and `part` (in the kept
    // values), in vectors of `width` units from `begin` to `end`.
    auto run = [&](Value full, Value part, int64_t begin, int64_t end, VectorType width) {
      if (begin >= end)
        return;
      int64_t n = width.getNumElements();
      Value sum;
      if (!innerKept)
        sum = splat(builder, loc, width, combine.identity());
      for (int64_t j = begin; j + n <= end; j += n) {
        Value f = add(full, index(j));
        Value k = innerKept ? add(part, index(j)) : part;
        Value x = builder.create<vector::LoadOp>(loc, width, a, indices(slot, row, f));
        if (!innerKept) {
          sum = combine.combine(builder, loc, sum, x);
          continue;
        }
        Value acc = builder.create<vector::LoadOp>(loc, width, out, indices(Value(), row, k));
        builder.create<vector::StoreOp>(loc, combine.combine(builder, loc, acc, x), out,
                                        indices(Value(), row, k));
      }
      if (innerKept)
        return;
      Value total = builder.create<vector::ReductionOp>(loc, combine.vectorKind(), sum);
      Value acc = builder.create<vector::LoadOp>(loc, one, out, indices(Value(), row, part));
      Value acc0 = builder.create<vector::ExtractOp>(loc, acc, ArrayRef<int64_t>{0});
      builder.create<vector::StoreOp>(
          loc, builder.create<vector::BroadcastOp>(
                   loc, one, combine.combine(builder, loc, acc0, total)),
          out, indices(Value(), row, part));
    };
    std::function<void(int64_t, Value, Value)> nest = [&](int64_t d, Value full, Value part) {
      if (d == dims - 1) {
        int64_t main = inner / lanes * lanes;
        run(full, part, 0, main, lane);
        run(full, part, main, inner, one);
        return;
      }
      loopTo(shape[d], 1, [&](Value i) {
        nest(d + 1, add(full, mul(i, fullStride[d])), add(part, mul(i, keptStride[d])));
      });
    };
    auto [first, last] = sliceOf(rows);
    forEachRowIn(first, last, [&] {
      loopTo(keptSize, 1, [&](Value k) {
        builder.create<vector::StoreOp>(loc, splat(builder, loc, one, combine.identity()), out,
                                        indices(Value(), row, k));
      });
      nest(0, index(0), index(0));
    });
  }
  void emitProduct(Operation *op, Value out) override {
    Value vec = PhasePlan::wholeOperand(op), slot;
    Value a = bufferOf(vec, slot);
    if (auto sum = dyn_cast<SumOp>(op))
      return emitSum(sum, a, slot, out);
    if (auto reduce = dyn_cast<ReduceOp>(op))
      return emitReduce(reduce, a, slot, out);
    ProductBlocks b = productBlocks(op);
    if (b.blocks > 1) {
      // Block g's last panel runs into block g + 1's columns, which block
      // g + 1 then writes: the blocks are computed in order, by one slice.
      onFirstSlice([&] {
        for (int64_t g = 0; g < b.blocks; ++g)
          mlir::cell::emitProduct(builder, loc, a, slot, packed[op][g], out, rows, b.ins,
                                  index(0), index(shape.panels(b.outs)), shape, g * b.ins,
                                  g * b.outs);
      });
      return;
    }
    auto [first, last] = sliceOf(index(shape.panels(b.outs)));
    mlir::cell::emitProduct(builder, loc, a, slot, packed[op][0], out, rows, b.ins, first,
                            last, shape);
  }

  /// Packs this slice's panels of each block of the weight of `op` (every
  /// panel on the first slice, for a block-diagonal weight).
  void packSlice(OpBuilder &b, Operation *op, Value weight, ArrayRef<Value> packs) {
    ProductBlocks blocks = productBlocks(op);
    int64_t size = blocks.outs, depth = blocks.ins;
    bool transposed = isa<VecmatOp>(op);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(b.getInsertionBlock(), b.getInsertionPoint());
    auto blockAt = [&](int64_t g) {
      return blocks.diagonal ? blockOf(builder, loc, weight, g) : weight;
    };
    if (blocks.blocks > 1) {
      onFirstSlice([&] {
        for (int64_t g = 0; g < blocks.blocks; ++g)
          packWeightInto(builder, loc, blockAt(g), packs[g], transposed, size, depth,
                         index(0), index(shape.panels(size)), shape);
      });
      return;
    }
    auto [first, last] = sliceOf(index(shape.panels(size)));
    packWeightInto(builder, loc, blockAt(0), packs[0], transposed, size, depth, first, last,
                   shape);
  }

  /// Packs the weight of every product in `step` (each block of a
  /// block-diagonal one), at the kernel's entry, unless the launch says the
  /// workspace holds them packed; a replayed product's only when the gates
  /// were not saved. The packed weights are the group's: each slice packs
  /// its panels, and a barrier follows.
  void packWeights(Block &step) {
    OpBuilder::InsertionGuard guard(builder);
    Value repack = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                                 packedAlready, index(0));
    auto ifRepack = builder.create<scf::IfOp>(loc, repack, false);
    builder.setInsertionPoint(ifRepack.thenBlock()->getTerminator());
    step.walk([&](Operation *op) {
      if (!PhasePlan::isProduct(op))
        return;
      Value weight =
          params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
      ProductBlocks blocks = productBlocks(op);
      SmallVector<Value> &packs = packed[op];
      // Laid out either way, filled when replaying.
      for (int64_t g = 0; g < blocks.blocks; ++g)
        packs.push_back(alloc({shape.panels(blocks.outs), blocks.ins, shape.panel()}));
      if (!op->getParentOfType<RestoreOp>())
        return packSlice(builder, op, weight, packs);
      Value replaying = builder.create<arith::XOrIOp>(
          loc, saveGates, builder.create<arith::ConstantIntOp>(loc, 1, 1));
      auto ifOp = builder.create<scf::IfOp>(loc, replaying, false);
      OpBuilder inside(ifOp.thenBlock()->getTerminator());
      packSlice(inside, op, weight, packs);
    });
    builder.setInsertionPointAfter(ifRepack);
    ending = "pack";
    barrier();
  }

  /// Copies `n` units of a row between buffers, at the indices given.
  void copyRow(int64_t n, Value from, function_ref<SmallVector<Value>(Value)> src,
               Value to, function_ref<SmallVector<Value>(Value)> dst) {
    forEachUnit(n, [&](Value j) { storeAt(loadAt(from, src(j)), to, dst(j)); });
  }
};

} // namespace mlir::cell::batched

#endif // CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_BATCHEDBUILDER_H
