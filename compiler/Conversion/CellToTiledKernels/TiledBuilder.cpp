//===- TiledBuilder.cpp - The step emitter of the tiled kernels ------------===//
//
// A thread computes elements `tid`, `tid + ntid`, ... of every vector, each
// element as a `vector<BT>` holding it for the BT rows of the tile. Where
// buffers live, how the elements are split and what ends a phase are the
// strategy's (TileStrategy).
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"

namespace mlir::cell {

TiledBuilder::~TiledBuilder() = default;

Value TiledBuilder::buffer(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> full(shape.begin(), shape.end());
  full.push_back(tile);
  int64_t n = 1;
  for (int64_t d : full)
    n *= d;
  sharedElements += n;
  return strategy->rowBuffer(full);
}

Value TiledBuilder::load(Value buffer, Value slot, Value j) {
  SmallVector<Value> indices;
  if (slot)
    indices.push_back(slot);
  indices.push_back(strategy->localIndex(buffer, j));
  indices.push_back(index(0));
  return builder.create<vector::LoadOp>(loc, lane, buffer, indices);
}

void TiledBuilder::store(Value v, Value buffer, Value slot, Value j) {
  SmallVector<Value> indices;
  if (slot)
    indices.push_back(slot);
  indices.push_back(strategy->localIndex(buffer, j));
  indices.push_back(index(0));
  builder.create<vector::StoreOp>(loc, v, buffer, indices);
}

Value TiledBuilder::loadParam(Value param, Value j) {
  Value scalar = builder.create<memref::LoadOp>(loc, param, j);
  return builder.create<vector::BroadcastOp>(loc, lane, scalar);
}

void TiledBuilder::forEachElement(int64_t n, function_ref<void(Value j)> body) {
  strategy->forEachElement(n, body);
}

void TiledBuilder::barrier() { strategy->barrier(); }

bool TiledBuilder::computesProduct(Operation *op) {
  if (isa<SumOp>(op))
    return true;
  return PhasePlan::isProduct(op) && strategy->computesProduct(op);
}

void TiledBuilder::emitProduct(Operation *op, Value out) {
  if (auto sum = dyn_cast<SumOp>(op))
    return emitSum(sum, out);
  strategy->emitProduct(op, out);
}

// Each thread (of every CTA of the tile) adds its units of the input, whole
// in its buffer; on CUDA a warp adds its threads' sums by shuffles. Each
// warp's sum (on the CPU, each thread's) goes to its slot of `partials`;
// after a barrier one thread adds the partials, for all the rows of the
// tile; the phase's barrier publishes `out`. One barrier a reduction: the
// reductions of a phase use the two sets of partials in turn, so the set a
// reduction writes was last read before the previous reduction's barrier.
void TiledBuilder::emitSum(SumOp sum, Value out) {
  Value input = sum.getInput(), slot;
  Value buffer = bufferOf(input, slot);
  Value partials = this->partials[nextPartials++ % 2];
  strategy->forEachPartial(
      sizeOf(input), [&](Value j) { return load(buffer, slot, j); },
      [&](Value at, Value partial) { store(partial, partials, Value(), at); });
  barrier();
  forEachElement(1, [&](Value j) {
    auto loop = builder.create<scf::ForOp>(
        loc, index(0), index(strategy->partialSlots()), index(1),
        ValueRange{splat(builder, loc, lane, 0.0)},
        [&](OpBuilder &b, Location l, Value k, ValueRange acc) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPointToStart(b.getInsertionBlock());
          Value next = builder.create<arith::AddFOp>(l, acc[0], load(partials, Value(), k));
          builder.create<scf::YieldOp>(l, next);
        });
    store(loop.getResult(0), out, Value(), j);
  });
}

void TiledBuilder::sinkPartial(Value first, Value partial,
                               function_ref<void(Value slot, Value partial)> sink) {
  if (!gpu)
    return sink(builder.create<arith::AddIOp>(loc, first, tid), partial);
  // A butterfly over the warp's 32 lanes, each row of the tile apart.
  Value sum = warpAllReduce(partial, ReduceCombine{Combine::Sum});
  Value lane = builder.create<arith::RemUIOp>(loc, tid, index(32));
  Value warp = builder.create<arith::DivUIOp>(loc, tid, index(32));
  Value isFirst = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, lane, index(0));
  auto ifOp = builder.create<scf::IfOp>(loc, isFirst, false);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
  sink(builder.create<arith::AddIOp>(loc, first, warp), sum);
}

/// Each row of the tile apart.
Value TiledBuilder::warpAllReduce(Value v, const ReduceCombine &combine) {
  Value width = builder.create<arith::ConstantIntOp>(loc, 32, 32);
  for (int64_t s = 0; s < tile; ++s) {
    Value x = builder.create<vector::ExtractOp>(loc, v, s);
    for (int64_t offset = 16; offset >= 1; offset /= 2) {
      Value by = builder.create<arith::ConstantIntOp>(loc, offset, 32);
      auto shuffle = builder.create<gpu::ShuffleOp>(loc, x, by, width,
                                                    gpu::ShuffleMode::XOR);
      x = combine.combine(builder, loc, x, shuffle.getShuffleResult());
    }
    v = builder.create<vector::InsertOp>(loc, x, v, s);
  }
  return v;
}

void TiledBuilder::forEachItemElement(int64_t n, function_ref<void(Value j)> body) {
  // A reduction of at least this many terms is worth a warp.
  constexpr int64_t kWarpTerms = 256;
  int64_t warps = ntidStatic / 32;
  bool heavy = false;
  if (gpu && plan && warps > 0 && ntidStatic % 32 == 0 &&
      strategy->elementsPerCta(n) <= warps)
    plan->block.walk([&](ReduceOp r) {
      int64_t terms = 1;
      for (auto [d, extent] : llvm::enumerate(r.getShape()))
        if (!llvm::is_contained(r.getKept(), int64_t(d)))
          terms *= extent;
      heavy |= terms >= kWarpTerms;
    });
  if (!heavy)
    return forEachElement(n, body);
  // The strategy's loop over the elements, with warps for threads: each
  // warp's lanes take the same elements. Both strategies build their loop's
  // bounds from tid and ntid before they call the body, once; inside it the
  // thread's own are back.
  Value threadId = tid, threads = ntid;
  Value lane = builder.create<arith::RemUIOp>(loc, tid, index(32));
  tid = builder.create<arith::DivUIOp>(loc, tid, index(32));
  ntid = index(warps);
  strategy->forEachElement(n, [&](Value j) {
    tid = threadId;
    ntid = threads;
    warpLane = lane;
    writeGuard = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, lane, index(0));
    body(j);
    warpLane = Value();
    writeGuard = Value();
  });
  tid = threadId;
  ntid = threads;
}

/// The sum of `term(j)` for j from `begin` to `end` by `step`.
Value TiledBuilder::sumRange(Value begin, Value end, Value step,
                             function_ref<Value(Value)> term) {
  return reduceRange(ReduceCombine{Combine::Sum}, begin, end, step, term);
}

Value TiledBuilder::reduceRange(const ReduceCombine &combine, Value begin, Value end,
                                Value step, function_ref<Value(Value)> term) {
  auto loop = builder.create<scf::ForOp>(
      loc, begin, end, step, ValueRange{splat(builder, loc, lane, combine.identity())},
      [&](OpBuilder &b, Location l, Value j, ValueRange acc) {
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPointToStart(b.getInsertionBlock());
        builder.create<scf::YieldOp>(l, ValueRange{combine.combine(builder, l, acc[0], term(j))});
      });
  return loop.getResult(0);
}

// matvec: result[row] = sum_k W[row, k] * u[k]; vecmat: result[col] =
// sum_r W[r, col] * g[r]. The vector is read from workgroup memory. With a
// block-diagonal weight `[G, M, N]`, the element's block g reads W[g] and
// part g of the vector.
Value TiledBuilder::evalProduct(Operation *op, const Index &i) {
  if (isa<ExpandOp, ReduceOp>(op))
    return evalExpandOrReduce(op, i);
  bool transposed = isa<VecmatOp>(op);
  StringRef name = op->getOperand(0).getDefiningOp<ParamOp>().getName();
  Value weight = params.lookup(name);
  // A matvec whose weight has a transposed copy reads it as a vecmat does.
  if (!transposed)
    if (Value copy = transposedParams.lookup(name)) {
      weight = copy;
      transposed = true;
    }
  Value vec = op->getOperand(1), slot;
  Value buffer = bufferOf(vec, slot);
  Value fixed = at(i);
  ProductBlocks blocks = productBlocks(op);
  int64_t depth = blocks.ins, outs = blocks.outs;
  Value block, first;
  if (blocks.diagonal) {
    block = builder.create<arith::DivUIOp>(loc, fixed, index(outs));
    fixed = builder.create<arith::RemUIOp>(loc, fixed, index(outs));
    first = builder.create<arith::MulIOp>(loc, block, index(depth));
  }
  auto loop = builder.create<scf::ForOp>(
      loc, index(0), index(depth), index(1),
      ValueRange{splat(builder, loc, lane, 0.0)},
      [&](OpBuilder &b, Location l, Value k, ValueRange acc) {
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPointToStart(b.getInsertionBlock());
        SmallVector<Value> at;
        if (block)
          at.push_back(block);
        at.append(transposed ? SmallVector<Value>{k, fixed} : SmallVector<Value>{fixed, k});
        Value w = builder.create<memref::LoadOp>(l, weight, at);
        Value ws = builder.create<vector::BroadcastOp>(l, lane, w);
        Value kk = first ? builder.create<arith::AddIOp>(l, first, k).getResult() : k;
        Value next = builder.create<vector::FMAOp>(
            l, ws, loadShared(buffer, slot, kk), acc[0]);
        builder.create<scf::YieldOp>(l, next);
      });
  return loop.getResult(0);
}

// cell.expand: element e reads the input at its kept index. cell.reduce:
// element e, an index into the kept dims, adds the input over the other
// dims. The input is whole in its buffer, written in an earlier phase.
Value TiledBuilder::evalExpandOrReduce(Operation *op, const Index &i) {
  bool expand = isa<ExpandOp>(op);
  ArrayRef<int64_t> shape =
      expand ? cast<ExpandOp>(op).getShape() : cast<ReduceOp>(op).getShape();
  ArrayRef<int64_t> kept = expand ? cast<ExpandOp>(op).getKept() : cast<ReduceOp>(op).getKept();
  Value input = op->getOperand(0), slot;
  Value buffer = bufferOf(input, slot);
  int64_t dims = shape.size();
  SmallVector<int64_t> stride(dims, 1);
  for (int64_t d = dims - 2; d >= 0; --d)
    stride[d] = stride[d + 1] * shape[d + 1];
  // Peels `dim`'s index off `rest` (the lowest dim first).
  auto peel = [&](Value &rest, int64_t dim) {
    Value at = builder.create<arith::RemUIOp>(loc, rest, index(shape[dim]));
    rest = builder.create<arith::DivUIOp>(loc, rest, index(shape[dim]));
    return at;
  };
  auto addScaled = [&](Value sum, Value at, int64_t by) {
    return builder.create<arith::AddIOp>(loc, sum,
                                         builder.create<arith::MulIOp>(loc, at, index(by)));
  };
  Value e = at(i);
  if (expand) {
    SmallVector<Value> at(dims);
    Value rest = e;
    for (int64_t d = dims - 1; d >= 0; --d)
      at[d] = peel(rest, d);
    Value from = index(0);
    for (int64_t k : kept)
      from = builder.create<arith::AddIOp>(
          loc, builder.create<arith::MulIOp>(loc, from, index(shape[k])), at[k]);
    return loadShared(buffer, slot, from);
  }
  Value rest = e, base = index(0);
  for (int64_t k : llvm::reverse(kept))
    base = addScaled(base, peel(rest, k), stride[k]);
  SmallVector<int64_t> others;
  int64_t count = 1;
  for (int64_t d = 0; d < dims; ++d)
    if (!llvm::is_contained(kept, d)) {
      others.push_back(d);
      count *= shape[d];
    }
  // An operand that the plan left unwritten (Options::reducesInPlace) is
  // evaluated at each element summed. In a warp-an-element loop the lanes
  // take every 32nd term and combine theirs by shuffles.
  bool inPlace = !buffer;
  ReduceCombine combine{cast<ReduceOp>(op).getCombineKind()};
  // A reduction inside a term is the lane's own: its lanes are at other
  // terms (and at a count under 32, some at none).
  Value lanes = warpLane;
  warpLane = Value();
  Value sum = reduceRange(combine, lanes ? lanes : index(0), index(count),
                          index(lanes ? 32 : 1), [&](Value r) {
    Value from = base;
    for (int64_t d : llvm::reverse(others))
      from = addScaled(from, peel(r, d), stride[d]);
    if (!inPlace)
      return loadShared(buffer, slot, from);
    scopes.emplace_back();
    Value x = eval(input, {from, 0, sizeOf(input)});
    scopes.pop_back();
    return x;
  });
  warpLane = lanes;
  return lanes ? warpAllReduce(sum, combine) : sum;
}

void TiledBuilder::forRange(Value begin, Value end, Value step,
                            function_ref<void(Value)> body) {
  builder.create<scf::ForOp>(loc, begin, end, step, ValueRange(),
                             [&](OpBuilder &b, Location l, Value i, ValueRange) {
                               OpBuilder::InsertionGuard guard(builder);
                               builder.setInsertionPoint(b.create<scf::YieldOp>(l));
                               body(i);
                             });
}

Value TiledBuilder::gather(Value buffer, bool perStep, Value j, Value step) {
  Value acc = splat(builder, loc, lane, 0.0);
  for (int64_t s = 0; s < tile; ++s) {
    SmallVector<Value> indices;
    if (perStep)
      indices.push_back(step ? step : t);
    indices.push_back(rows[s]);
    indices.push_back(j);
    Value x = builder.create<memref::LoadOp>(loc, buffer, indices);
    // bf16 storage: computed in the cell's type.
    if (x.getType() != element)
      x = builder.create<arith::ExtFOp>(loc, element, x);
    acc = builder.create<vector::InsertOp>(loc, x, acc, s);
  }
  return acc;
}

void TiledBuilder::scatter(Value v, Value buffer, bool perStep, Value j) {
  for (int64_t s = 0; s < tile; ++s) {
    Value x = builder.create<vector::ExtractOp>(loc, v, s);
    Type stored = cast<MemRefType>(buffer.getType()).getElementType();
    if (stored != element)
      x = builder.create<arith::TruncFOp>(loc, stored, x);
    builder.create<scf::IfOp>(loc, rowValid[s], [&](OpBuilder &b, Location l) {
      SmallVector<Value> indices;
      if (perStep)
        indices.push_back(t);
      indices.push_back(rows[s]);
      indices.push_back(j);
      b.create<memref::StoreOp>(l, x, buffer, indices);
      b.create<scf::YieldOp>(l);
    });
  }
}

Value TiledBuilder::laneMask(function_ref<Value(Value row)> flag) {
  auto type = VectorType::get({tile}, builder.getI1Type());
  Value acc = builder.create<arith::ConstantOp>(
      loc, type, DenseElementsAttr::get(type, false));
  for (int64_t s = 0; s < tile; ++s)
    acc = builder.create<vector::InsertOp>(loc, flag(rows[s]), acc, s);
  return acc;
}

Value TiledBuilder::any(Value mask) {
  // Lane by lane: the extracts fold into the flags the mask was built from.
  Value acc = builder.create<vector::ExtractOp>(loc, mask, 0);
  for (int64_t s = 1; s < tile; ++s)
    acc = builder.create<arith::OrIOp>(
        loc, acc, builder.create<vector::ExtractOp>(loc, mask, s));
  return acc;
}

Value TiledBuilder::choose(Value cond, function_ref<Value()> then,
                           function_ref<Value()> otherwise) {
  auto ifOp = builder.create<scf::IfOp>(loc, TypeRange{lane}, cond, true, true);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(ifOp.thenBlock());
  builder.create<scf::YieldOp>(loc, then());
  builder.setInsertionPointToStart(ifOp.elseBlock());
  builder.create<scf::YieldOp>(loc, otherwise());
  return ifOp.getResult(0);
}

} // namespace mlir::cell
