//===- TensorCoreMatvec.cpp - Recurrent products on mma.sync ---------------===//
//
// A matvec or vecmat whose rows fill 16-row tiles runs once per step on the
// CTA's warps, with tf32 (m16n8k8) or bf16 (m16n8k16) operands and fp32
// accumulators, into a workgroup buffer that the element loops then read.
// Both strategies use it: with a CTA per tile from the weight in global
// memory, persistent from a CTA's shared-memory slice of it.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/CellToTiledKernels/TiledBuilder.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

namespace mlir::cell {

namespace {

/// Two f32 values as one register of bf16x2, the first in the low half.
Value packBf16x2(OpBuilder &builder, Location loc, Value lo, Value hi) {
  Type f32 = builder.getF32Type();
  auto pair = builder.create<vector::FromElementsOp>(loc, VectorType::get({2}, f32),
                                                     ValueRange{lo, hi});
  Value narrow = builder.create<arith::TruncFOp>(
      loc, VectorType::get({2}, builder.getBF16Type()), pair);
  Value word = builder.create<vector::BitCastOp>(
      loc, VectorType::get({1}, builder.getI32Type()), narrow);
  return builder.create<vector::ExtractOp>(loc, word, 0);
}

/// One mma.sync: m16n8k8 with tf32 operands, or m16n8k16 with bf16 ones
/// (packed in pairs), into four fp32 accumulators.
Value emitMma(OpBuilder &builder, Location loc, bool bf16, ArrayRef<Value> a,
              ArrayRef<Value> b, ValueRange c) {
  Type f32 = builder.getF32Type();
  auto accType =
      LLVM::LLVMStructType::getLiteral(builder.getContext(), SmallVector<Type>(4, f32));
  if (!bf16)
    return builder.create<NVVM::MmaOp>(
        loc, accType, a, b, c, ArrayRef<int64_t>{16, 8, 8}, std::nullopt, std::nullopt,
        std::array<NVVM::MMATypes, 2>{NVVM::MMATypes::tf32, NVVM::MMATypes::tf32},
        std::array<NVVM::MMALayout, 2>{NVVM::MMALayout::row, NVVM::MMALayout::col});
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
}

/// Stores the accumulators `d` of the fragment at rows r0 and r1 = r0 + 8 and
/// the tile's columns n0 + 2q and n0 + 2q + 1 into `out`, those in the tile
/// (and, for a persistent CTA's slice from row `first`, in the rows).
void storeAccumulators(TiledBuilder &tb, ValueRange d, Value out, Value r0, Value r1,
                       Value q, int64_t n0, Value first, int64_t rows) {
  OpBuilder &builder = tb.builder;
  Location loc = tb.loc;
  for (int64_t e = 0; e < 4; ++e) {
    Value row = e < 2 ? r0 : r1;
    Value outCol =
        tb.shifted(builder.create<arith::MulIOp>(loc, q, tb.index(2)), n0 + (e & 1));
    Value inTile = builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, outCol,
                                                 tb.index(tb.tile));
    if (first) {
      // A persistent CTA's last slice may run past the rows.
      row = builder.create<arith::AddIOp>(loc, first, row);
      inTile = builder.create<arith::AndIOp>(
          loc, inTile,
          builder.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, row,
                                        tb.index(rows)));
    }
    auto ifOp = builder.create<scf::IfOp>(loc, inTile, false);
    OpBuilder::InsertionGuard store(builder);
    builder.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    builder.create<memref::StoreOp>(loc, d[e], out, ValueRange{row, outCol});
  }
}

} // namespace

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
  // A block-diagonal weight: each 16-row tile lies in one block (whose rows
  // onTensorCores checks are a multiple of 16) and reads that block of the
  // weight and its part of the vector, `depth` deep.
  ProductBlocks blocks = productBlocks(op);
  bool blocked = blocks.diagonal;
  int64_t blockRows = blocks.outs, depth = blocks.ins;
  Value vecBuffer = bufferOf(vec, slot);
  Value weight =
      params.lookup(op->getOperand(0).getDefiningOp<ParamOp>().getName());
  Type i32 = builder.getI32Type();
  auto remui = [&](Value a, int64_t b) {
    return builder.create<arith::RemUIOp>(loc, a, index(b)).getResult();
  };
  auto divui = [&](Value a, int64_t b) {
    return builder.create<arith::DivUIOp>(loc, a, index(b)).getResult();
  };
  Value laneId = remui(tid, 32);
  Value warp = divui(tid, 32);
  Value g = divui(laneId, 4), q = remui(laneId, 4);

  // `r` is the row within the rows computed here; with blocks, the row of
  // block `blockOfTile`, whose part of the vector starts at `vectorStart`.
  Value blockOfTile, vectorStart;
  auto loadWeight = [&](Value r, Value c) -> Value {
    if (cached)
      return cached(r, c);
    SmallVector<Value> at;
    if (blocked)
      at.push_back(blockOfTile);
    at.append(transposed ? SmallVector<Value>{c, r} : SmallVector<Value>{r, c});
    return builder.create<memref::LoadOp>(loc, weight, at);
  };
  int64_t computed = count ? count : rows;
  auto pack = [&](Value lo, Value hi) { return packBf16x2(builder, loc, lo, hi); };
  auto bits = [&](Value x) -> Value { return builder.create<arith::BitcastOp>(loc, i32, x); };
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
      if (vectorStart)
        k = builder.create<arith::AddIOp>(loc, vectorStart, k);
      indices.append({k, col});
      return builder.create<memref::LoadOp>(loc, vecBuffer, indices);
    };
    auto tiles = builder.create<scf::ForOp>(loc, warp, index(computed / 16),
                                            index(ntidStatic / 32));
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(tiles.getBody());
    Value tileRow = builder.create<arith::MulIOp>(loc, tiles.getInductionVar(), index(16));
    Value r0 = builder.create<arith::AddIOp>(loc, tileRow, g);
    Value r1 = shifted(r0, 8);
    // The weight's rows of this tile: within its block.
    Value w0 = r0, w1 = r1;
    if (blocked) {
      blockOfTile = divui(tileRow, blockRows);
      vectorStart = builder.create<arith::MulIOp>(loc, blockOfTile, index(depth));
      w0 = remui(r0, blockRows);
      w1 = shifted(w0, 8);
    }
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
              for (Value r : {w0, w1})
                a.push_back(pack(loadWeight(r, shifted(c, dc)),
                                 loadWeight(r, shifted(c, dc + 1))));
            for (int64_t dc : {0, 8})
              bFrag.push_back(pack(loadVector(shifted(c, dc)),
                                   loadVector(shifted(c, dc + 1))));
          } else {
            Value c = builder.create<arith::AddIOp>(loc, k0, q);
            for (int64_t dc : {0, 4})
              for (Value r : {w0, w1})
                a.push_back(bits(loadWeight(r, shifted(c, dc))));
            for (int64_t dc : {0, 4})
              bFrag.push_back(bits(loadVector(shifted(c, dc))));
          }
          Value d = emitMma(builder, loc, bf16, a, bFrag, acc);
          SmallVector<Value> next;
          for (int64_t e = 0; e < 4; ++e)
            next.push_back(builder.create<LLVM::ExtractValueOp>(loc, d, e));
          builder.create<scf::YieldOp>(loc, next);
        });
    storeAccumulators(*this, steps.getResults(), out, r0, r1, q, n0, first, rows);
  }
}

} // namespace mlir::cell
