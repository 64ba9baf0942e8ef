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
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/Passes.h"

#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Conversion/Common/StepEmitter.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "llvm/ADT/SetVector.h"

#include <functional>
#include <map>

namespace mlir::cell {
#define GEN_PASS_DEF_CONVERTCELLTOTILEDKERNELS
#include "compiler/Conversion/Passes.h.inc"

namespace {

/// Whether `op` (a matvec or vecmat) runs on tensor cores at `precision`:
/// its rows must fill 16-row MMA tiles and its depth the MMA's k.
bool onTensorCores(Operation *op, cellc::Precision precision) {
  if (precision == cellc::Precision::Ieee || !isa<MatvecOp, VecmatOp>(op))
    return false;
  int64_t k = precision == cellc::Precision::Bf16 ? 16 : 8;
  return sizeOf(op->getResult(0)) % 16 == 0 && sizeOf(op->getOperand(1)) % k == 0;
}

/// Builds the batch-tiled kernels of one cell.
class TiledBuilder : public StepEmitter {
public:
  TiledBuilder(OpBuilder &builder, Location loc, int64_t tile, Type element,
               bool gpu)
      : StepEmitter(builder, loc, element, VectorType::get({tile}, element)),
        tile(tile), gpu(gpu) {}

  int64_t tile;
  bool gpu;

  /// Set by the kernel before building the body.
  Value tid, ntid;
  int64_t ntidStatic = 1;
  SmallVector<Value> rows, rowValid;
  /// Allocates a `[shape..., BT]` workgroup buffer.
  std::function<Value(ArrayRef<int64_t>)> allocShared;
  /// Allocates a `[shape...]` buffer of `type` in workgroup memory (CUDA) or
  /// on the heap (CPU), for the persistent strategy's weights.
  std::function<Value(ArrayRef<int64_t>, Type)> allocCache;
  Value tileIndex;
  int64_t sharedElements = 0;
  /// CUDA: "tf32" or "bf16" runs the matvecs that `onTensorCores` accepts
  /// with mma.sync.
  cellc::Precision precision = cellc::Precision::Ieee;
  /// The persistent strategy: `slices` CTAs split every step of a tile, the
  /// CTA `cta` taking a slice of each loop's elements and of each matvec's
  /// rows, whose weights it keeps in `weightCache` from before the time
  /// loop. Its buffers are in global memory (`allocShared` takes them from
  /// the workspace) and its barriers are grid-wide. 0: batch-tiled.
  int64_t slices = 0;
  Value cta, barrierWords;
  DenseMap<Operation *, Value> weightCache;
  SmallVector<Value> cacheOrder;
  /// Per thread partial products of the persistent strategy (CUDA).
  Value partials;

  /// A `[shape..., BT]` buffer in workgroup memory.
  Value buffer(ArrayRef<int64_t> shape) override {
    int64_t n = tile;
    for (int64_t d : shape)
      n *= d;
    sharedElements += n;
    return allocShared(shape);
  }
  Value shared(ArrayRef<int64_t> shape) { return buffer(shape); }

  Value load(Value buffer, Value slot, Value j) override {
    SmallVector<Value> indices;
    if (slot)
      indices.push_back(slot);
    indices.push_back(j);
    indices.push_back(index(0));
    return builder.create<vector::LoadOp>(loc, lane, buffer, indices);
  }
  void store(Value v, Value buffer, Value slot, Value j) override {
    SmallVector<Value> indices;
    if (slot)
      indices.push_back(slot);
    indices.push_back(j);
    indices.push_back(index(0));
    builder.create<vector::StoreOp>(loc, v, buffer, indices);
  }
  Value loadShared(Value buffer, Value slot, Value j) { return load(buffer, slot, j); }
  void storeShared(Value v, Value buffer, Value slot, Value j) {
    store(v, buffer, slot, j);
  }
  Value loadPerStep(Value buffer, Value j) override { return gather(buffer, true, j); }
  Value loadParam(Value param, Value j) override {
    Value scalar = builder.create<memref::LoadOp>(loc, param, j);
    return builder.create<vector::BroadcastOp>(loc, lane, scalar);
  }
  Value evalProduct(Operation *op, const Index &i) override;

  /// Gathers element `j` of each row of the tile from a `[T, B, n]` buffer
  /// (at step `t`) or a `[B, n]` buffer.
  Value gather(Value buffer, bool perStep, Value j, Value step = {}) {
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
  /// Scatters `v` to element `j` of each valid row of the tile.
  void scatter(Value v, Value buffer, bool perStep, Value j) {
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
  /// A per-row flag as a `vector<BT x i1>`.
  Value laneMask(function_ref<Value(Value row)> flag) {
    auto type = VectorType::get({tile}, builder.getI1Type());
    Value acc = builder.create<arith::ConstantOp>(
        loc, type, DenseElementsAttr::get(type, false));
    for (int64_t s = 0; s < tile; ++s)
      acc = builder.create<vector::InsertOp>(loc, flag(rows[s]), acc, s);
    return acc;
  }

  /// Whether any row of the tile has its `mask` lane set. All threads of a
  /// CTA branch the same way on it.
  Value any(Value mask) {
    // Lane by lane: the extracts fold into the flags the mask was built from.
    Value acc = builder.create<vector::ExtractOp>(loc, mask, 0);
    for (int64_t s = 1; s < tile; ++s)
      acc = builder.create<arith::OrIOp>(
          loc, acc, builder.create<vector::ExtractOp>(loc, mask, s));
    return acc;
  }
  /// `then()` where `cond` holds and `otherwise()` elsewhere, building only
  /// the side taken: the loads of the other side are not issued.
  Value choose(Value cond, function_ref<Value()> then,
               function_ref<Value()> otherwise) {
    auto ifOp = builder.create<scf::IfOp>(loc, TypeRange{lane}, cond, true, true);
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(ifOp.thenBlock());
    builder.create<scf::YieldOp>(loc, then());
    builder.setInsertionPointToStart(ifOp.elseBlock());
    builder.create<scf::YieldOp>(loc, otherwise());
    return ifOp.getResult(0);
  }

  /// A loop over the elements `[0, n)` of this thread: with the persistent
  /// strategy, over its CTA's slice of them.
  void forEachElement(int64_t n, function_ref<void(Value j)> body) override {
    forEachCta([&] {
      Value begin = tid, end = index(n);
      if (slices > 0) {
        Value first = builder.create<arith::MulIOp>(loc, cta, index(sliceOf(n)));
        begin = builder.create<arith::AddIOp>(loc, first, tid);
        end = builder.create<arith::MinUIOp>(
            loc, shifted(first, sliceOf(n)), index(n));
      }
      builder.create<scf::ForOp>(
          loc, begin, end, ntid, ValueRange(),
          [&](OpBuilder &b, Location l, Value j, ValueRange) {
            OpBuilder::InsertionGuard guard(builder);
            builder.setInsertionPoint(b.create<scf::YieldOp>(l));
            body(j);
          });
    });
  }
  void barrier() override {
    if (!gpu)
      return;
    if (slices > 0)
      gridBarrier();
    else
      builder.create<gpu::BarrierOp>(loc);
  }

  /// Whether the matvec or vecmat `op` is computed whole before the element
  /// loops that read it, rather than per element.
  bool computesProduct(Operation *op) override {
    if (!isa<MatvecOp, VecmatOp>(op))
      return false;
    return slices > 0 || (gpu && onTensorCores(op, precision));
  }
  void emitProduct(Operation *op, Value out) override {
    if (slices > 0)
      emitSlicedProduct(op, out);
    else
      emitTensorCoreMatvec(op, out);
  }
  /// Computes the product of `op` into the buffer `out` (`[rows, BT]`) with
  /// the CTA's warps on tensor cores: all its rows from the weight in global
  /// memory, or (persistent) the `count` rows from `first`, whose weights
  /// `cached(local row, column)` reads.
  void emitTensorCoreMatvec(Operation *op, Value out, Value first = {},
                            int64_t count = 0,
                            function_ref<Value(Value, Value)> cached = nullptr);
  /// The persistent strategy: computes this CTA's slice of the rows of `op`
  /// into `out` from the weights in `weightCache`.
  void emitSlicedProduct(Operation *op, Value out);
  /// The persistent strategy: fills `weightCache` with this CTA's slice of
  /// every recurrent weight the step reads, before the time loop.
  void cacheWeights(Block &step);

  /// The rows of a persistent CTA's slice of `n`.
  int64_t sliceOf(int64_t n) const { return (n + slices - 1) / slices; }
  /// The element type of a persistent CTA's copy of the weight of `op`: bf16
  /// when bf16 tensor cores read it, which round it to bf16 anyway.
  Type cachedType(Operation *op) const {
    if (gpu && precision == cellc::Precision::Bf16 && onTensorCores(op, precision))
      return BFloat16Type::get(builder.getContext());
    return element;
  }
  /// The rows of a persistent CTA's slice of the product of `op`: whole
  /// 16-row MMA tiles when it runs on tensor cores.
  int64_t productSliceOf(Operation *op) const {
    int64_t slice = sliceOf(sizeOf(op->getResult(0)));
    return onTensorCores(op, precision) ? (slice + 15) / 16 * 16 : slice;
  }
  /// A loop over the CTAs of a persistent tile, on the CPU; on CUDA, the
  /// body once for this CTA.
  void forEachCta(function_ref<void()> body) {
    if (slices == 0 || gpu) {
      body();
      return;
    }
    builder.create<scf::ForOp>(
        loc, index(0), index(slices), index(1), ValueRange(),
        [&](OpBuilder &b, Location l, Value c, ValueRange) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPoint(b.create<scf::YieldOp>(l));
          cta = c;
          body();
        });
  }
  /// A barrier across the CTAs of a persistent tile: every CTA arrives at
  /// `barrierWords[2 * tile]` (a count) and waits until the last one bumps
  /// `barrierWords[2 * tile + 1]` (a generation). The count goes back to 0,
  /// so the words need zeroing once, not per launch.
  void gridBarrier();
};

// matvec: result[row] = sum_k W[row, k] * u[k]; vecmat: result[col] =
// sum_r W[r, col] * g[r]. The vector is read from workgroup memory.
Value TiledBuilder::evalProduct(Operation *op, const Index &i) {
  bool transposed = isa<VecmatOp>(op);
  Value weight = params.lookup(
      op->getOperand(0).getDefiningOp<ParamOp>().getName());
  Value vec = op->getOperand(1), slot;
  Value buffer = bufferOf(vec, slot);
  Value fixed = at(i);
  auto loop = builder.create<scf::ForOp>(
      loc, index(0), index(sizeOf(vec)), index(1),
      ValueRange{splat(builder, loc, lane, 0.0)},
      [&](OpBuilder &b, Location l, Value k, ValueRange acc) {
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPointToStart(b.getInsertionBlock());
        Value w = builder.create<memref::LoadOp>(
            l, weight, transposed ? ValueRange{k, fixed} : ValueRange{fixed, k});
        Value ws = builder.create<vector::BroadcastOp>(l, lane, w);
        Value next = builder.create<vector::FMAOp>(
            l, ws, loadShared(buffer, slot, k), acc[0]);
        builder.create<scf::YieldOp>(l, next);
      });
  return loop.getResult(0);
}

void TiledBuilder::emitTensorCoreMatvec(Operation *op, Value out, Value first,
                                        int64_t count,
                                        function_ref<Value(Value, Value)> cached) {
  // The fragments of mma.sync.m16n8k16 (bf16) and m16n8k8 (tf32), PTX ISA
  // "Matrix Fragments for mma.m16n8k*": with g = lane / 4 and q = lane % 4,
  // A holds rows g and g + 8 at columns 2q, 2q + 1, 2q + 8, 2q + 9 (bf16, two
  // per register) or q, q + 4 (tf32); B holds column g at rows 2q, 2q + 1,
  // 2q + 8, 2q + 9 or q, q + 4; C holds rows g and g + 8 at columns 2q and
  // 2q + 1. A is the weight (transposed for a vecmat), B the vector with the
  // tile's rows as its 8 columns.
  bool bf16 = precision == cellc::Precision::Bf16;
  bool transposed = isa<VecmatOp>(op);
  int64_t kStep = bf16 ? 16 : 8;
  int64_t rows = sizeOf(op->getResult(0));
  Value vec = op->getOperand(1), slot;
  int64_t depth = sizeOf(vec);
  Value vecBuffer = bufferOf(vec, slot);
  Value weight =
      params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
  Type f32 = builder.getF32Type(), i32 = builder.getI32Type();
  auto remui = [&](Value a, int64_t b) {
    return builder.create<arith::RemUIOp>(loc, a, index(b)).getResult();
  };
  auto divui = [&](Value a, int64_t b) {
    return builder.create<arith::DivUIOp>(loc, a, index(b)).getResult();
  };
  Value laneId = remui(tid, 32);
  Value warp = divui(tid, 32);
  Value g = divui(laneId, 4), q = remui(laneId, 4);

  // `r` is the row within the rows computed here.
  auto loadWeight = [&](Value r, Value c) -> Value {
    if (cached)
      return cached(r, c);
    return builder.create<memref::LoadOp>(
        loc, weight, transposed ? ValueRange{c, r} : ValueRange{r, c});
  };
  int64_t computed = count ? count : rows;
  // Two values as one register of bf16x2, the first in the low half.
  auto pack = [&](Value lo, Value hi) -> Value {
    auto pair = builder.create<vector::FromElementsOp>(
        loc, VectorType::get({2}, f32), ValueRange{lo, hi});
    Value narrow = builder.create<arith::TruncFOp>(
        loc, VectorType::get({2}, builder.getBF16Type()), pair);
    Value word = builder.create<vector::BitCastOp>(
        loc, VectorType::get({1}, i32), narrow);
    return builder.create<vector::ExtractOp>(loc, word, 0);
  };
  auto bits = [&](Value x) -> Value {
    return builder.create<arith::BitcastOp>(loc, i32, x);
  };
  auto accType = LLVM::LLVMStructType::getLiteral(
      builder.getContext(), SmallVector<Type>(4, f32));
  auto mma = [&](ArrayRef<Value> a, ArrayRef<Value> b,
                 ValueRange c) -> Value {
    if (!bf16)
      return builder.create<NVVM::MmaOp>(
          loc, accType, a, b, c, ArrayRef<int64_t>{16, 8, 8}, std::nullopt,
          std::nullopt,
          std::array<NVVM::MMATypes, 2>{NVVM::MMATypes::tf32,
                                        NVVM::MMATypes::tf32},
          std::array<NVVM::MMALayout, 2>{NVVM::MMALayout::row,
                                         NVVM::MMALayout::col});
    // LLVM 19's nvvm.mma.sync verifier rejects bf16 operands in i32
    // registers, the form its intrinsic takes; the instruction is written
    // out instead.
    SmallVector<Value> operands(a);
    llvm::append_range(operands, b);
    llvm::append_range(operands, c);
    return builder
        .create<LLVM::InlineAsmOp>(
            loc, accType, operands,
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", /*has_side_effects=*/false,
            /*is_align_stack=*/false, LLVM::AsmDialectAttr(), ArrayAttr())
        .getResult(0);
  };

  Value zero = builder.create<arith::ConstantOp>(loc, builder.getF32FloatAttr(0));
  // The tile's rows are B's columns, 8 at a time. Columns past the tile read
  // its last row; their products are not stored.
  for (int64_t n0 = 0; n0 < tile; n0 += 8) {
    Value col = builder.create<arith::MinUIOp>(
        loc, builder.create<arith::AddIOp>(loc, g, index(n0)), index(tile - 1));
    auto loadVector = [&](Value k) -> Value {
      SmallVector<Value> indices;
      if (slot)
        indices.push_back(slot);
      indices.append({k, col});
      return builder.create<memref::LoadOp>(loc, vecBuffer, indices);
    };
    auto tiles = builder.create<scf::ForOp>(loc, warp, index(computed / 16),
                                            index(ntidStatic / 32));
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(tiles.getBody());
    Value r0 = builder.create<arith::AddIOp>(
        loc, builder.create<arith::MulIOp>(loc, tiles.getInductionVar(), index(16)), g);
    Value r1 = shifted(r0, 8);
    auto steps = builder.create<scf::ForOp>(
        loc, index(0), index(depth / kStep), index(1),
        ValueRange{zero, zero, zero, zero},
        [&](OpBuilder &b, Location l, Value kt, ValueRange acc) {
          OpBuilder::InsertionGuard inner(builder);
          builder.setInsertionPointToStart(b.getInsertionBlock());
          Value k0 = builder.create<arith::MulIOp>(loc, kt, index(kStep));
          SmallVector<Value> a, bFrag;
          if (bf16) {
            Value c = builder.create<arith::AddIOp>(
                loc, k0, builder.create<arith::MulIOp>(loc, q, index(2)));
            for (int64_t dc : {0, 8})
              for (Value r : {r0, r1})
                a.push_back(pack(loadWeight(r, shifted(c, dc)),
                                 loadWeight(r, shifted(c, dc + 1))));
            for (int64_t dc : {0, 8})
              bFrag.push_back(pack(loadVector(shifted(c, dc)),
                                   loadVector(shifted(c, dc + 1))));
          } else {
            Value c = builder.create<arith::AddIOp>(loc, k0, q);
            for (int64_t dc : {0, 4})
              for (Value r : {r0, r1})
                a.push_back(bits(loadWeight(r, shifted(c, dc))));
            for (int64_t dc : {0, 4})
              bFrag.push_back(bits(loadVector(shifted(c, dc))));
          }
          Value d = mma(a, bFrag, acc);
          SmallVector<Value> next;
          for (int64_t e = 0; e < 4; ++e)
            next.push_back(builder.create<LLVM::ExtractValueOp>(loc, d, e));
          builder.create<scf::YieldOp>(loc, next);
        });
    for (int64_t e = 0; e < 4; ++e) {
      Value row = e < 2 ? r0 : r1;
      Value outCol = shifted(builder.create<arith::MulIOp>(loc, q, index(2)),
                             n0 + (e & 1));
      Value inTile = builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::ult, outCol, index(tile));
      if (first) {
        // A persistent CTA's last slice may run past the rows.
        row = builder.create<arith::AddIOp>(loc, first, row);
        inTile = builder.create<arith::AndIOp>(
            loc, inTile,
            builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, row,
                                          index(rows)));
      }
      auto ifOp = builder.create<scf::IfOp>(loc, inTile, false);
      OpBuilder::InsertionGuard store(builder);
      builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
      builder.create<memref::StoreOp>(loc, steps.getResult(e), out,
                                      ValueRange{row, outCol});
    }
  }
}

void TiledBuilder::gridBarrier() {
  builder.create<gpu::BarrierOp>(loc);
  auto fence = [&] {
    builder.create<LLVM::InlineAsmOp>(
        loc, TypeRange(), ValueRange(), "fence.acq_rel.gpu;", "",
        /*has_side_effects=*/true, /*is_align_stack=*/false,
        LLVM::AsmDialectAttr(), ArrayAttr());
  };
  auto rmw = [&](arith::AtomicRMWKind kind, int64_t value, Value word) {
    Value v = builder.create<arith::ConstantIntOp>(loc, value, 32);
    return builder
        .create<memref::AtomicRMWOp>(loc, kind, v, barrierWords, ValueRange{word})
        .getResult();
  };
  Value first = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                              tid, index(0));
  auto leader = builder.create<scf::IfOp>(loc, first, false);
  {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPoint(leader.thenBlock()->getTerminator());
    Value count = builder.create<arith::MulIOp>(loc, tileIndex, index(2));
    Value generation = shifted(count, 1);
    fence();
    // An atomic add of 0 reads the word where all CTAs meet, in L2.
    Value seen = rmw(arith::AtomicRMWKind::addi, 0, generation);
    Value arrived = rmw(arith::AtomicRMWKind::addi, 1, count);
    Value last = builder.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::eq, arrived,
        builder.create<arith::ConstantIntOp>(loc, slices - 1, 32));
    auto ifLast = builder.create<scf::IfOp>(loc, last, true);
    builder.setInsertionPoint(ifLast.thenBlock()->getTerminator());
    rmw(arith::AtomicRMWKind::assign, 0, count);
    fence();
    rmw(arith::AtomicRMWKind::addi, 1, generation);
    builder.setInsertionPoint(ifLast.elseBlock()->getTerminator());
    auto spin = builder.create<scf::WhileOp>(loc, TypeRange(), ValueRange());
    builder.createBlock(&spin.getBefore());
    Value now = rmw(arith::AtomicRMWKind::addi, 0, generation);
    builder.create<scf::ConditionOp>(
        loc,
        builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, now, seen),
        ValueRange());
    builder.createBlock(&spin.getAfter());
    builder.create<scf::YieldOp>(loc);
    builder.setInsertionPointAfter(ifLast);
    fence();
  }
  builder.create<gpu::BarrierOp>(loc);
}

void TiledBuilder::cacheWeights(Block &step) {
  step.walk([&](Operation *op) {
    if (!computesProduct(op) || weightCache.count(op))
      return;
    bool transposed = isa<VecmatOp>(op);
    int64_t rows = sizeOf(op->getResult(0)), depth = sizeOf(op->getOperand(1));
    int64_t slice = productSliceOf(op);
    // One row more than the depth keeps the threads of a product, which read
    // consecutive rows at the same k, off one bank.
    SmallVector<int64_t> shape = {slice, depth + 1};
    if (!gpu)
      shape.insert(shape.begin(), slices);
    Type cached = cachedType(op);
    Value cache = allocCache(shape, cached);
    weightCache[op] = cache;
    cacheOrder.push_back(cache);
    Value weight =
        params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
    // A replayed product's weights are only needed when the gates were not
    // saved.
    OpBuilder::InsertionGuard guard(builder);
    if (op->getParentOfType<RestoreOp>()) {
      Value replaying = builder.create<arith::XOrIOp>(
          loc, saveGates, builder.create<arith::ConstantIntOp>(loc, 1, 1));
      auto ifOp = builder.create<scf::IfOp>(loc, replaying, false);
      builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    }
    forEachCta([&] {
      Value first = builder.create<arith::MulIOp>(loc, cta, index(slice));
      builder.create<scf::ForOp>(
          loc, tid, index(slice * depth), ntid, ValueRange(),
          [&](OpBuilder &b, Location l, Value e, ValueRange) {
            OpBuilder::InsertionGuard guard(builder);
            builder.setInsertionPoint(b.create<scf::YieldOp>(l));
            Value local = builder.create<arith::DivUIOp>(l, e, index(depth));
            Value k = builder.create<arith::RemUIOp>(l, e, index(depth));
            Value row = builder.create<arith::AddIOp>(l, first, local);
            Value inside = builder.create<arith::CmpIOp>(
                l, arith::CmpIPredicate::ult, row, index(rows));
            auto ifOp = builder.create<scf::IfOp>(l, inside, false);
            builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
            Value w = builder.create<memref::LoadOp>(
                l, weight, transposed ? ValueRange{k, row} : ValueRange{row, k});
            if (cached != element)
              w = builder.create<arith::TruncFOp>(l, cached, w);
            SmallVector<Value> at = {local, k};
            if (!gpu)
              at.insert(at.begin(), cta);
            builder.create<memref::StoreOp>(l, w, cache, at);
          });
    });
  });
  if (gpu)
    builder.create<gpu::BarrierOp>(loc);
}

void TiledBuilder::emitSlicedProduct(Operation *op, Value out) {
  int64_t rows = sizeOf(op->getResult(0));
  Value vec = op->getOperand(1), slot;
  int64_t depth = sizeOf(vec);
  Value vecBuffer = bufferOf(vec, slot);
  Value cache = weightCache.lookup(op);
  int64_t slice = productSliceOf(op);
  if (gpu && onTensorCores(op, precision)) {
    Value first = builder.create<arith::MulIOp>(loc, cta, index(slice));
    emitTensorCoreMatvec(op, out, first, slice, [&](Value local, Value k) -> Value {
      Value w = builder.create<memref::LoadOp>(loc, cache, ValueRange{local, k});
      // A bf16 copy widens here and rounds back, exactly, in the packing.
      if (w.getType() != element)
        w = builder.create<arith::ExtFOp>(loc, element, w);
      return w;
    });
    return;
  }
  // Threads split the slice's rows and, where there are threads to spare,
  // each row's depth into `split` parts, which are then summed.
  int64_t split = 1;
  if (gpu)
    while (split * 2 * slice <= ntidStatic && depth % (split * 2) == 0)
      split *= 2;
  int64_t part = depth / split;
  auto partial = [&](Value local, Value kBegin) -> Value {
    auto loop = builder.create<scf::ForOp>(
        loc, kBegin, builder.create<arith::AddIOp>(loc, kBegin, index(part)),
        index(1), ValueRange{splat(builder, loc, lane, 0.0)},
        [&](OpBuilder &b, Location l, Value k, ValueRange acc) {
          OpBuilder::InsertionGuard guard(builder);
          builder.setInsertionPointToStart(b.getInsertionBlock());
          SmallVector<Value> at = {local, k};
          if (!gpu)
            at.insert(at.begin(), cta);
          Value w = builder.create<memref::LoadOp>(l, cache, at);
          Value next = builder.create<vector::FMAOp>(
              l, builder.create<vector::BroadcastOp>(l, lane, w),
              loadShared(vecBuffer, slot, k), acc[0]);
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
    Value first = builder.create<arith::MulIOp>(loc, cta, index(slice));
    if (!gpu) {
      builder.create<scf::ForOp>(
          loc, index(0), index(slice), index(1), ValueRange(),
          [&](OpBuilder &b, Location l, Value local, ValueRange) {
            OpBuilder::InsertionGuard guard(builder);
            builder.setInsertionPoint(b.create<scf::YieldOp>(l));
            Value row = builder.create<arith::AddIOp>(l, first, local);
            when(ult(row, index(rows)), [&] {
              storeShared(partial(local, index(0)), out, Value(), row);
            });
          });
      return;
    }
    Value local = builder.create<arith::DivUIOp>(loc, tid, index(split));
    Value piece = builder.create<arith::RemUIOp>(loc, tid, index(split));
    when(ult(tid, index(slice * split)), [&] {
      Value kBegin = builder.create<arith::MulIOp>(loc, piece, index(part));
      storeShared(partial(local, kBegin), partials, Value(), tid);
    });
    builder.create<gpu::BarrierOp>(loc);
    Value row = builder.create<arith::AddIOp>(loc, first, tid);
    when(builder.create<arith::AndIOp>(loc, ult(tid, index(slice)),
                                       ult(row, index(rows))),
         [&] {
           Value base = builder.create<arith::MulIOp>(loc, tid, index(split));
           Value sum = loadShared(partials, Value(), base);
           for (int64_t p = 1; p < split; ++p)
             sum = builder.create<arith::AddFOp>(
                 loc, sum, loadShared(partials, Value(), shifted(base, p)));
           storeShared(sum, out, Value(), row);
         });
    // The next product of the phase writes the partials again.
    builder.create<gpu::BarrierOp>(loc);
  });
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct ConvertCellToTiledKernels
    : public impl::ConvertCellToTiledKernelsBase<ConvertCellToTiledKernels> {
  using ConvertCellToTiledKernelsBase::ConvertCellToTiledKernelsBase;

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
    std::optional<cellc::Target> parsedTarget = cellc::parse<cellc::Target>(target);
    std::optional<cellc::Precision> parsedPrecision =
        cellc::parse<cellc::Precision>(precision);
    std::optional<cellc::Storage> parsedStorage = cellc::parse<cellc::Storage>(storage);
    std::optional<cellc::Strategy> parsedStrategy =
        cellc::parse<cellc::Strategy>(strategy);
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
      module.emitError("convert-cell-to-tiled-kernels: threads=")
          << threads << " is not a whole number of warps";
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
    for (DefOp def : llvm::to_vector(module.getOps<DefOp>())) {
      func::FuncOp grad = backwardStepOf(def);
      if (!grad ||
          failed(buildKernel(def, grad, /*backward=*/false, gpuModule)) ||
          failed(buildKernel(def, grad, /*backward=*/true, gpuModule)))
        return signalPassFailure();
      grad->erase();
      def->erase();
    }
  }

  LogicalResult buildKernel(DefOp def, func::FuncOp grad, bool backward,
                            gpu::GPUModuleOp gpuModule);

  /// The options, parsed.
  struct {
    cellc::Precision precision = cellc::Precision::Ieee;
    cellc::Storage storage = cellc::Storage::F32;
    bool persistent = false;
  } config;
};

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
    sig = forwardSignature(def, args);
  }
  Type element = cast<RankedTensorType>(def.getStates()[0].getType())
                     .getElementType();
  std::string name = (def.getSymName() + (backward ? "_bwd" : "_fwd")).str();
  cellc::Precision precision = config.precision;
  cellc::Storage storage = config.storage;
  if ((precision != cellc::Precision::Ieee || storage != cellc::Storage::F32) &&
      !element.isF32())
    return emitError(loc) << (precision != cellc::Precision::Ieee
                                  ? std::string("precision=") + cellc::name(precision)
                                  : std::string("storage=") + cellc::name(storage))
                          << " needs an f32 cell; '" << def.getSymName() << "' is "
                          << element;

  // The step's block, and its phases.
  Block &body = backward ? grad.getBody().front() : def.getBody().front();
  unsigned numStates = def.getStateNames().size();
  unsigned numInputs = def.getInputNames().size();
  PhasePlan plan = backward ? planBackward(def, grad, {}) : planForward(def, {});

  // Workgroup memory per row: states (two slots), and in backward the
  // previous states, the state gradients (two slots) and the accumulators.
  // With the persistent strategy these buffers are in global memory, the
  // workspace, and every matvec's product is one of them.
  bool persistent = config.persistent;
  int64_t perRow = 0;
  for (Value m : plan.materialized)
    perRow += sizeOf(m);
  SmallVector<Operation *> matvecs;
  body.walk([&](Operation *op) {
    if (isa<MatvecOp, VecmatOp>(op))
      matvecs.push_back(op);
  });
  for (Operation *op : matvecs)
    if (persistent || (gpu && onTensorCores(op, precision)))
      perRow += sizeOf(op->getResult(0));
  for (Value s : def.getStates())
    perRow += (backward ? 5 : 2) * sizeOf(s);
  if (backward)
    for (auto [r, kind] : llvm::enumerate(args.kinds))
      if (kind == cellc::GradKind::Param)
        perRow += sizeOf(body.getTerminator()->getOperand(r));
  int64_t bytes = cast<FloatType>(element).getWidth() / 8;
  // The tile: at most `batch-tile` rows, halved until the workgroup buffers
  // fit. Past 4 rows the per-row accumulators and addresses spill registers
  // on sm_80 and sm_90 (ptxas -v, LSTM and GRU at H=256).
  int64_t tile = batchTile > 0 ? int64_t(batchTile) : 4;
  while (!persistent && tile > 1 && perRow * tile * bytes > sharedLimit)
    tile /= 2;
  if (gpu && !persistent && perRow * tile * bytes > sharedLimit)
    return emitError(def.getLoc())
           << "'" << def.getSymName() << "' needs " << perRow * tile * bytes
           << " bytes of workgroup memory per CTA for "
           << (backward ? "its backward" : "its forward")
           << " kernel even with one batch row per CTA, over the limit of "
           << int64_t(sharedLimit)
           << "; this size needs the per-step strategy, which does not exist "
              "yet";

  // The persistent strategy's CTAs per tile: the fewest whose slices of the
  // recurrent weights, with the per-thread partial products, fit in
  // workgroup memory, each slice with no more rows than threads.
  int64_t slices = 0, sharedBytes = 0;
  if (persistent) {
    auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };
    int64_t partialBytes = gpu ? padded(threads * tile * bytes) : 0;
    auto sharedFor = [&](int64_t g) -> std::optional<int64_t> {
      int64_t total = partialBytes;
      for (Operation *op : matvecs) {
        int64_t slice = (sizeOf(op->getResult(0)) + g - 1) / g;
        bool mma = gpu && onTensorCores(op, precision);
        if (mma)
          slice = (slice + 15) / 16 * 16;
        if (slice > threads)
          return std::nullopt;
        // bf16 tensor cores keep a bf16 copy (TiledBuilder::cachedType).
        int64_t width = mma && precision == cellc::Precision::Bf16 ? 2 : bytes;
        total += padded(slice * (sizeOf(op->getOperand(1)) + 1) * width);
      }
      if (total > sharedLimit)
        return std::nullopt;
      return total;
    };
    for (int64_t g = ctas > 0 ? int64_t(ctas) : 1; g <= 4096; ++g) {
      if (auto fit = sharedFor(g)) {
        slices = g;
        sharedBytes = *fit;
        break;
      }
      if (ctas > 0)
        break;
    }
    if (slices == 0)
      return emitError(loc)
             << "'" << def.getSymName() << "': the persistent strategy cannot "
             << "fit " << (backward ? "its backward" : "its forward")
             << " kernel's recurrent weights in "
             << (ctas > 0 ? llvm::Twine(int64_t(ctas)).str() + " CTAs"
                          : std::string("4096 CTAs or fewer"))
             << " of " << int64_t(sharedLimit)
             << " bytes of workgroup memory each";
  }
  // bf16 storage: the per-step sequences ([T, B, n]: inputs, projections,
  // outputs, state history, gates and their gradients) are bf16 in memory;
  // states, params and their gradients stay in the cell's type.
  if (storage == cellc::Storage::Bf16)
    for (Type &type : sig.types)
      if (auto memref = dyn_cast<MemRefType>(type);
          memref && memref.getRank() == 3 && memref.getElementType() == element)
        type = MemRefType::get(memref.getShape(), BFloat16Type::get(ctx));
  unsigned batchBeginArg = sig.types.size() - 2;
  unsigned workspaceArg = 0;
  if (persistent && gpu) {
    workspaceArg = sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, element),
                           cellc::ArgKind::Workspace, "workspace");
    sig.add(ctx, MemRefType::get({ShapedType::kDynamic}, IntegerType::get(ctx, 32)),
            cellc::ArgKind::GridBarrier, "grid_barrier");
  }

  // The kernel.
  OpBuilder outer(def);
  Block *entry;
  Operation *kernelOp;
  auto memSpace = gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
  gpu::GPUFuncOp gpuFunc;
  if (gpu) {
    outer.setInsertionPoint(gpuModule.getBody()->getTerminator());
    gpuFunc = outer.create<gpu::GPUFuncOp>(loc, name,
                                           outer.getFunctionType(sig.types, {}));
    gpuFunc->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), outer.getUnitAttr());
    gpuFunc.setKnownBlockSize(
        ArrayRef<int32_t>{int32_t(threads), 1, 1});
    if (maxRegisters > 0)
      gpuFunc->setAttr(NVVM::NVVMDialect::getMaxnregAttrName(),
                       outer.getI32IntegerAttr(maxRegisters));
    kernelOp = gpuFunc;
    entry = &gpuFunc.getBody().front();
  } else {
    auto func = outer.create<func::FuncOp>(loc, name,
                                           outer.getFunctionType(sig.types, {}));
    func.addEntryBlock();
    kernelOp = func;
    entry = &func.getBody().front();
  }
  kernelOp->setAttr("cell.kernel_args", outer.getArrayAttr(sig.info));
  kernelOp->setAttr("cell.batch_tile", outer.getI64IntegerAttr(tile));
  kernelOp->setAttr("cell.threads", outer.getI64IntegerAttr(gpu ? threads : 1));
  kernelOp->setAttr("cell.storage", outer.getStringAttr(cellc::name(storage)));
  kernelOp->setAttr("cell.strategy",
                    outer.getStringAttr(cellc::name(persistent
                                                        ? cellc::Strategy::Persistent
                                                        : cellc::Strategy::BatchTiled)));
  if (persistent) {
    kernelOp->setAttr("cell.ctas", outer.getI64IntegerAttr(slices));
    kernelOp->setAttr("cell.workspace_bytes",
                      outer.getI64IntegerAttr(perRow * tile * bytes));
  }

  OpBuilder builder = OpBuilder::atBlockEnd(entry);
  TiledBuilder tb(builder, loc, tile, element, gpu);
  tb.plan = &plan;
  tb.precision = precision;
  tb.slices = slices;
  // The persistent strategy's workspace: `perRow * tile` elements per tile,
  // an argument on CUDA, one buffer for the tiles in turn on the CPU.
  Value workspace;
  int64_t workspaceUsed = 0;
  if (persistent) {
    if (gpu) {
      workspace = entry->getArgument(workspaceArg);
      tb.barrierWords = entry->getArgument(workspaceArg + 1);
    } else {
      OpBuilder at = OpBuilder::atBlockBegin(entry);
      workspace = at.create<memref::AllocOp>(
          loc, MemRefType::get({std::max<int64_t>(perRow * tile, 1)}, element));
    }
  }
  // On CUDA the persistent strategy's workgroup buffers are views of the
  // dynamic shared memory, which may exceed the 48 KiB of static shared
  // memory (up to `shared-limit`; the runtime raises the kernel's limit).
  Value dynamicShared;
  int64_t dynamicUsed = 0;
  auto allocDynamic = [&](ArrayRef<int64_t> shape, Type type) -> Value {
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
    dynamicUsed += (n + 15) / 16 * 16;
    return view;
  };
  tb.allocCache = [&](ArrayRef<int64_t> shape, Type type) -> Value {
    if (gpu)
      return allocDynamic(shape, type);
    OpBuilder at = OpBuilder::atBlockBegin(entry);
    return at.create<memref::AllocOp>(loc, MemRefType::get(shape, type));
  };
  tb.allocShared = [&](ArrayRef<int64_t> shape) -> Value {
    SmallVector<int64_t> full(shape.begin(), shape.end());
    full.push_back(tile);
    if (persistent) {
      SmallVector<int64_t> strides(full.size(), 1);
      for (int64_t d = int64_t(full.size()) - 2; d >= 0; --d)
        strides[d] = strides[d + 1] * full[d + 1];
      Value offset = builder.create<arith::AddIOp>(
          loc, builder.create<arith::MulIOp>(loc, tb.tileIndex,
                                             tb.index(perRow * tile)),
          tb.index(workspaceUsed));
      workspaceUsed += strides[0] * full[0];
      auto type = MemRefType::get(
          full, element, StridedLayoutAttr::get(ctx, ShapedType::kDynamic, strides));
      SmallVector<OpFoldResult> sizes, steps;
      for (auto [n, st] : llvm::zip(full, strides)) {
        sizes.push_back(builder.getIndexAttr(n));
        steps.push_back(builder.getIndexAttr(st));
      }
      return builder.create<memref::ReinterpretCastOp>(loc, type, workspace,
                                                       OpFoldResult(offset),
                                                       sizes, steps);
    }
    if (gpu)
      return gpuFunc.addWorkgroupAttribution(
          MemRefType::get(full, element, MemRefLayoutAttrInterface(), memSpace),
          loc);
    OpBuilder at = OpBuilder::atBlockBegin(entry);
    return at.create<memref::AllocaOp>(loc, MemRefType::get(full, element));
  };
  auto arg = [&](unsigned i) { return entry->getArgument(i); };
  for (auto [i, param] : llvm::enumerate(def.getBody().getOps<ParamOp>()))
    tb.params[param.getName()] = arg(args.firstParam + i);
  // The backward step's projections are in its replay: match them in order.
  SmallVector<ProjectionOp> bodyProjections;
  body.walk([&](ProjectionOp p) { bodyProjections.push_back(p); });
  for (auto [k, p] : llvm::enumerate(bodyProjections))
    tb.projectionBuffers[p] = arg(args.numInputs + k);
  tb.gates = arg(args.gates);
  tb.saveGates = builder.create<SaveGatesOp>(loc, builder.getI1Type());
  Value c0 = tb.index(0), c1 = tb.index(1), c2 = tb.index(2);
  Value resets = arg(args.resets);
  Value steps = builder.create<memref::DimOp>(loc, resets, 0);
  Value bBegin = arg(batchBeginArg), bEnd = arg(batchBeginArg + 1);
  Value zeroByte = builder.create<arith::ConstantIntOp>(loc, 0, 8);

  // The tile: a CTA per tile on the GPU, a loop over tiles on the CPU.
  auto buildTile = [&](Value b0) -> LogicalResult {
    Value last = builder.create<arith::SubIOp>(loc, bEnd, c1);
    tb.rows.clear();
    tb.rowValid.clear();
    for (int64_t s = 0; s < tile; ++s) {
      Value b = builder.create<arith::AddIOp>(loc, b0, tb.index(s));
      tb.rowValid.push_back(builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::slt, b, bEnd));
      tb.rows.push_back(builder.create<arith::MinSIOp>(loc, b, last));
    }
    auto resetMask = [&](Value t) {
      return tb.laneMask([&](Value row) {
        Value flag = builder.create<memref::LoadOp>(loc, resets, ValueRange{t, row});
        return builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, flag,
                                             zeroByte);
      });
    };
    if (persistent)
      tb.cacheWeights(body);
    SmallVector<Value> stateBufs;
    for (Value s : def.getStates())
      stateBufs.push_back(tb.shared({2, sizeOf(s)}));

    if (!backward) {
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
      return tb.emitPhases(items);
    }

    // Backward.
    SmallVector<Value> prevBufs, accInit, accStart;
    for (Value s : def.getStates()) {
      prevBufs.push_back(tb.shared({sizeOf(s)}));
      accInit.push_back(tb.shared({sizeOf(s)}));
      accStart.push_back(tb.shared({sizeOf(s)}));
    }
    Operation *ret = body.getTerminator();
    DenseMap<unsigned, Value> accParam;
    for (auto [r, kind] : llvm::enumerate(args.kinds))
      if (kind == cellc::GradKind::Param)
        accParam[r] = tb.shared({sizeOf(ret->getOperand(r))});
    Value zero = splat(builder, loc, tb.lane, 0.0);
    // The state gradients start from the final-state gradients.
    for (auto [k, s] : llvm::enumerate(def.getStates()))
      tb.forEachElement(sizeOf(s), [&](Value j) {
        tb.storeShared(tb.gather(arg(args.firstDFinal + k), false, j),
                       stateBufs[k], c0, j);
        tb.storeShared(zero, accInit[k], Value(), j);
        tb.storeShared(zero, accStart[k], Value(), j);
      });
    for (auto [r, buf] : accParam) {
      Value b = buf;
      tb.forEachElement(sizeOf(ret->getOperand(r)),
                        [&](Value j) { tb.storeShared(zero, b, Value(), j); });
    }
    tb.barrier();
    Value lastStep = builder.create<arith::SubIOp>(loc, steps, c1);
    auto loop = builder.create<scf::ForOp>(loc, c0, steps, c1);
    {
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(loop.getBody());
      Value iv = loop.getInductionVar();
      Value t = builder.create<arith::SubIOp>(loc, lastStep, iv);
      tb.t = t;
      Value slot = builder.create<arith::RemUIOp>(loc, iv, c2);
      Value next = builder.create<arith::SubIOp>(loc, c1, slot);
      Value isFirst = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, t, c0);
      auto maskType = VectorType::get({tile}, builder.getI1Type());
      Value reset = resetMask(t);
      Value first = builder.create<vector::BroadcastOp>(loc, maskType, isFirst);
      Value ones = builder.create<arith::ConstantOp>(
          loc, maskType, DenseElementsAttr::get(maskType, true));
      Value fromStart = builder.create<arith::AndIOp>(
          loc, first, builder.create<arith::XOrIOp>(loc, reset, ones));
      Value fromOutside = builder.create<arith::OrIOp>(loc, reset, first);
      // The states before step t: the start state at t = 0, the history
      // otherwise, the initial state in the rows that reset.
      Value anyReset = tb.any(reset);
      for (auto [k, s] : llvm::enumerate(def.getStates()))
        tb.forEachElement(sizeOf(s), [&](Value j) {
          Value before = tb.choose(
              isFirst,
              [&] { return tb.gather(arg(args.firstStart + k), false, j); },
              [&] {
                Value tm1 = builder.create<arith::SubIOp>(loc, t, c1);
                return tb.gather(arg(args.firstHistory + k), true, j, tm1);
              });
          Value prev = tb.choose(
              anyReset,
              [&]() -> Value {
                Value init = tb.gather(arg(args.firstInit + k), false, j);
                return builder.create<arith::SelectOp>(loc, reset, init, before);
              },
              [&] { return before; });
          tb.storeShared(prev, prevBufs[k], Value(), j);
        });
      tb.barrier();
      tb.sources.clear();
      unsigned a = 0;
      for (unsigned k = 0; k < numInputs; ++k)
        tb.sources[body.getArgument(a++)] = {Source::PerStep, arg(k), {}};
      for (unsigned k = 0; k < numStates; ++k)
        tb.sources[body.getArgument(a++)] = {Source::Shared, prevBufs[k], {}};
      for (unsigned k = 0; k < def.getOutputNames().size(); ++k)
        tb.sources[body.getArgument(a++)] = {Source::PerStep, arg(args.firstDOut + k), {}};
      for (unsigned k = 0; k < numStates; ++k)
        tb.sources[body.getArgument(a++)] = {Source::Shared, stateBufs[k], slot};

      SmallVector<Item> items;
      unsigned stateResult = 0;
      for (auto [r, value] : llvm::enumerate(ret->getOperands())) {
        cellc::GradKind kind = args.kinds[r];
        Value buffer = arg(args.firstResult + r);
        Item item;
        item.value = value;
        if (kind == cellc::GradKind::State) {
          unsigned k = stateResult++;
          Value sbuf = stateBufs[k], ai = accInit[k], as = accStart[k];
          item.sinks.push_back(
              {[&tb, sbuf, ai, as, next, reset, fromStart, fromOutside,
                zero](OpBuilder &, Location, Value v, Value j, int64_t offset) {
                 j = tb.shifted(j, offset);
                 OpBuilder &b = tb.builder;
                 Location l = tb.loc;
                 tb.storeShared(b.create<arith::SelectOp>(l, fromOutside, zero, v),
                                sbuf, next, j);
                 Value oldInit = tb.loadShared(ai, Value(), j);
                 tb.storeShared(b.create<arith::AddFOp>(
                                    l, oldInit,
                                    b.create<arith::SelectOp>(l, reset, v, zero)),
                                ai, Value(), j);
                 Value oldStart = tb.loadShared(as, Value(), j);
                 tb.storeShared(b.create<arith::AddFOp>(
                                    l, oldStart,
                                    b.create<arith::SelectOp>(l, fromStart, v, zero)),
                                as, Value(), j);
               },
               0});
        } else if (kind == cellc::GradKind::Param) {
          Value acc = accParam[r];
          item.sinks.push_back({[&tb, acc](OpBuilder &, Location, Value v,
                                           Value j, int64_t offset) {
                                  j = tb.shifted(j, offset);
                                  Value old = tb.loadShared(acc, Value(), j);
                                  tb.storeShared(tb.builder.create<arith::AddFOp>(
                                                     tb.loc, old, v),
                                                 acc, Value(), j);
                                },
                                0});
        } else {
          item.sinks.push_back({[&tb, buffer](OpBuilder &, Location, Value v,
                                              Value j, int64_t offset) {
                                  tb.scatter(v, buffer, true,
                                             tb.shifted(j, offset));
                                },
                                0});
        }
        items.push_back(item);
      }
      if (failed(tb.emitPhases(items)))
        return failure();
    }
    // The accumulated gradients, written once.
    for (auto [k, s] : llvm::enumerate(def.getStates()))
      tb.forEachElement(sizeOf(s), [&](Value j) {
        tb.scatter(tb.loadShared(accInit[k], Value(), j),
                   arg(args.firstResult + k), false, j);
        tb.scatter(tb.loadShared(accStart[k], Value(), j),
                   arg(args.firstStartGrad + k), false, j);
      });
    for (auto [r, buf] : accParam) {
      Value b = buf;
      unsigned result = r;
      tb.forEachElement(sizeOf(ret->getOperand(r)), [&](Value j) {
        tb.scatter(tb.loadShared(b, Value(), j), arg(args.firstResult + result),
                   false, j);
      });
    }
    return success();
  };

  LogicalResult status = success();
  if (gpu) {
    tb.tid = builder.create<gpu::ThreadIdOp>(loc, gpu::Dimension::x);
    tb.ntid = tb.index(threads);
    tb.ntidStatic = threads;
    // Batch-tiled: a CTA per tile along x. Persistent: the CTAs of a tile
    // along x, the tiles along y.
    Value bid = builder.create<gpu::BlockIdOp>(
        loc, persistent ? gpu::Dimension::y : gpu::Dimension::x);
    if (persistent) {
      tb.cta = builder.create<gpu::BlockIdOp>(loc, gpu::Dimension::x);
      tb.tileIndex = bid;
      tb.partials = allocDynamic({int64_t(threads), tile}, element);
    }
    Value b0 = builder.create<arith::AddIOp>(
        loc, bBegin, builder.create<arith::MulIOp>(loc, bid, tb.index(tile)));
    status = buildTile(b0);
    builder.create<gpu::ReturnOp>(loc);
  } else {
    tb.tid = c0;
    tb.ntid = c1;
    tb.tileIndex = c0;
    auto tiles = builder.create<scf::ForOp>(loc, bBegin, bEnd, tb.index(tile));
    {
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointToStart(tiles.getBody());
      status = buildTile(tiles.getInductionVar());
    }
    if (workspace)
      builder.create<memref::DeallocOp>(loc, workspace);
    // In the order they were made: the kernel's text, which keys the kernel
    // cache, must not depend on where ops happen to be in memory.
    for (Value cache : tb.cacheOrder)
      builder.create<memref::DeallocOp>(loc, cache);
    builder.create<func::ReturnOp>(loc);
  }
  // The tile was chosen from `perRow` before the buffers existed; the
  // buffers allocated must be what it counted.
  if (succeeded(status) && tb.sharedElements != perRow * tile)
    return emitError(loc) << "internal error: " << name << " allocated "
                          << tb.sharedElements << " workgroup elements, planned "
                          << perRow * tile;
  kernelOp->setAttr("cell.workgroup_bytes",
                    outer.getI64IntegerAttr(persistent ? sharedBytes
                                                       : tb.sharedElements * bytes));
  // The bytes of dynamic shared memory a launch must give the kernel.
  kernelOp->setAttr("cell.dynamic_shared_bytes", outer.getI64IntegerAttr(dynamicUsed));
  if (gpu && dynamicUsed != sharedBytes)
    return emitError(loc) << "internal error: " << name << " uses " << dynamicUsed
                          << " bytes of dynamic shared memory, planned " << sharedBytes;
  return status;
}

} // namespace
} // namespace mlir::cell
