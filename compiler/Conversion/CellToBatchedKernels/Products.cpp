//===- Products.cpp - Register-blocked products over a batch tile ---------===//

#include "compiler/Conversion/CellToBatchedKernels/Products.h"

#include "compiler/Conversion/Common/KernelABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

namespace mlir::cell {

namespace {
Value constant(OpBuilder &b, Location loc, int64_t v) {
  return b.create<arith::ConstantIndexOp>(loc, v);
}
} // namespace

void packWeightInto(OpBuilder &b, Location loc, Value weight, Value packed,
                    bool transposed, int64_t size, int64_t depth, Value firstPanel,
                    Value lastPanel, const BlockShape &shape) {
  Type element = cast<MemRefType>(weight.getType()).getElementType();
  int64_t panels = shape.panels(size), panel = shape.panel();
  Value zero = b.create<arith::ConstantOp>(loc, b.getFloatAttr(element, 0.0));
  // The outputs of the panels, up to `size`.
  Value first = b.create<arith::MulIOp>(loc, firstPanel, constant(b, loc, panel));
  Value last = b.create<arith::MinUIOp>(
      loc, b.create<arith::MulIOp>(loc, lastPanel, constant(b, loc, panel)),
      constant(b, loc, size));
  if (!transposed) {
    // A matvec's whole panels: for each step of depth, the panel's outputs
    // gathered from their rows and stored as one contiguous vector (a
    // scalar store per element, `panel` floats apart, was the slow part).
    int64_t whole = size / panel;
    Value end = b.create<arith::MinUIOp>(loc, lastPanel, constant(b, loc, whole));
    auto vectorType = VectorType::get({panel}, element);
    b.create<scf::ForOp>(
        loc, firstPanel, end, constant(b, loc, 1), ValueRange(),
        [&](OpBuilder &pb, Location l, Value p, ValueRange) {
          Value row0 = pb.create<arith::MulIOp>(l, p, constant(pb, l, panel));
          SmallVector<Value> rows;
          for (int64_t q = 0; q < panel; ++q)
            rows.push_back(q ? pb.create<arith::AddIOp>(l, row0, constant(pb, l, q)).getResult()
                             : row0);
          pb.create<scf::ForOp>(
              l, constant(pb, l, 0), constant(pb, l, depth), constant(pb, l, 1), ValueRange(),
              [&](OpBuilder &kb, Location kl, Value k, ValueRange) {
                SmallVector<Value> column;
                for (Value r : rows)
                  column.push_back(kb.create<memref::LoadOp>(kl, weight, ValueRange{r, k}));
                Value v = kb.create<vector::FromElementsOp>(kl, vectorType, column);
                kb.create<vector::StoreOp>(kl, v, packed,
                                           ValueRange{p, k, constant(kb, kl, 0)});
                kb.create<scf::YieldOp>(kl);
              });
          pb.create<scf::YieldOp>(l);
        });
    // The rows of the last panel, when it is partial, one by one below.
    first = b.create<arith::MaxUIOp>(loc, first, constant(b, loc, whole * panel));
  }
  // Walk the weight in its own order: a row of a matvec's weight is an
  // output over depth, a row of a vecmat's weight a depth over outputs.
  Value outerBegin = transposed ? constant(b, loc, 0) : first;
  Value outerEnd = transposed ? constant(b, loc, depth) : last;
  Value innerBegin = transposed ? first : constant(b, loc, 0);
  Value innerEnd = transposed ? last : constant(b, loc, depth);
  b.create<scf::ForOp>(
      loc, outerBegin, outerEnd, constant(b, loc, 1), ValueRange(),
      [&](OpBuilder &ob, Location l, Value i, ValueRange) {
        ob.create<scf::ForOp>(
            l, innerBegin, innerEnd, constant(ob, l, 1), ValueRange(),
            [&](OpBuilder &ib, Location il, Value j, ValueRange) {
              Value w = ib.create<memref::LoadOp>(il, weight, ValueRange{i, j});
              Value c = transposed ? j : i, k = transposed ? i : j;
              Value p = ib.create<arith::DivUIOp>(il, c, constant(ib, il, panel));
              Value q = ib.create<arith::RemUIOp>(il, c, constant(ib, il, panel));
              ib.create<memref::StoreOp>(il, w, packed, ValueRange{p, k, q});
              ib.create<scf::YieldOp>(il);
            });
        ob.create<scf::YieldOp>(l);
      });
  // The columns past `size` in the last panel are zero, where it is ours.
  int64_t tail = panels * panel - size;
  if (tail > 0) {
    Value ours = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, lastPanel,
                                         constant(b, loc, panels));
    auto ifOp = b.create<scf::IfOp>(loc, ours, false);
    OpBuilder tb = OpBuilder::atBlockBegin(ifOp.thenBlock());
    Value lastOne = constant(tb, loc, panels - 1);
    tb.create<scf::ForOp>(
        loc, constant(tb, loc, 0), constant(tb, loc, depth), constant(tb, loc, 1),
        ValueRange(), [&](OpBuilder &ob, Location l, Value k, ValueRange) {
          for (int64_t q = panel - tail; q < panel; ++q)
            ob.create<memref::StoreOp>(l, zero, packed,
                                       ValueRange{lastOne, k, constant(ob, l, q)});
          ob.create<scf::YieldOp>(l);
        });
  }
}

/// One register block: `count` rows from `r0`, the panel `p`.
static void emitBlock(OpBuilder &b, Location loc, Value a, Value slot,
                      Value packed, Value out, Value p, Value r0, int64_t count,
                      int64_t depth, const BlockShape &shape, int64_t aOffset,
                      int64_t outOffset) {
  Type element = cast<MemRefType>(packed.getType()).getElementType();
  auto vectorType = VectorType::get({shape.lanes}, element);
  SmallVector<Value> rows;
  for (int64_t r = 0; r < count; ++r)
    rows.push_back(r == 0 ? r0
                          : b.create<arith::AddIOp>(loc, r0, constant(b, loc, r))
                                .getResult());
  SmallVector<Value> zeros(count * shape.vectors, splat(b, loc, vectorType, 0.0));
  auto loop = b.create<scf::ForOp>(
      loc, constant(b, loc, 0), constant(b, loc, depth), constant(b, loc, 1),
      zeros, [&](OpBuilder &kb, Location l, Value k, ValueRange acc) {
        SmallVector<Value> w;
        for (int64_t v = 0; v < shape.vectors; ++v)
          w.push_back(kb.create<vector::LoadOp>(
              l, vectorType, packed,
              ValueRange{p, k, constant(kb, l, v * shape.lanes)}));
        SmallVector<Value> next;
        for (int64_t r = 0; r < count; ++r) {
          SmallVector<Value> at;
          if (slot)
            at.push_back(slot);
          at.append({rows[r], aOffset ? kb.create<arith::AddIOp>(
                                            l, k, constant(kb, l, aOffset))
                                      : k});
          Value x = kb.create<memref::LoadOp>(l, a, at);
          Value xs = kb.create<vector::BroadcastOp>(l, vectorType, x);
          for (int64_t v = 0; v < shape.vectors; ++v)
            next.push_back(kb.create<vector::FMAOp>(
                l, xs, w[v], acc[r * shape.vectors + v]));
        }
        kb.create<scf::YieldOp>(l, next);
      });
  Value column = b.create<arith::MulIOp>(loc, p, constant(b, loc, shape.panel()));
  if (outOffset)
    column = b.create<arith::AddIOp>(loc, column, constant(b, loc, outOffset));
  for (int64_t r = 0; r < count; ++r)
    for (int64_t v = 0; v < shape.vectors; ++v) {
      Value c = b.create<arith::AddIOp>(loc, column,
                                        constant(b, loc, v * shape.lanes));
      b.create<vector::StoreOp>(loc, loop.getResult(r * shape.vectors + v), out,
                                ValueRange{rows[r], c});
    }
}

void emitProduct(OpBuilder &b, Location loc, Value a, Value slot, Value packed,
                 Value out, Value rows, int64_t depth, Value firstPanel,
                 Value lastPanel, const BlockShape &shape, int64_t aOffset,
                 int64_t outOffset) {
  int64_t R = shape.rows;
  Value rest = b.create<arith::RemUIOp>(loc, rows, constant(b, loc, R));
  Value full = b.create<arith::SubIOp>(loc, rows, rest);
  b.create<scf::ForOp>(
      loc, firstPanel, lastPanel, constant(b, loc, 1),
      ValueRange(), [&](OpBuilder &pb, Location l, Value p, ValueRange) {
        pb.create<scf::ForOp>(
            l, constant(pb, l, 0), full, constant(pb, l, R), ValueRange(),
            [&](OpBuilder &rb, Location rl, Value r0, ValueRange) {
              emitBlock(rb, rl, a, slot, packed, out, p, r0, R, depth, shape, aOffset,
                        outOffset);
              rb.create<scf::YieldOp>(rl);
            });
        // The last rows, fewer than R: a block per set bit of their count,
        // largest first.
        int64_t s = 1;
        while (s * 2 < R)
          s *= 2;
        for (; s >= 1; s /= 2) {
          Value bit = pb.create<arith::AndIOp>(l, rest, constant(pb, l, s));
          Value has = pb.create<arith::CmpIOp>(l, arith::CmpIPredicate::ne, bit,
                                               constant(pb, l, 0));
          Value above = pb.create<arith::AndIOp>(l, rest, constant(pb, l, ~(2 * s - 1)));
          Value r0 = pb.create<arith::AddIOp>(l, full, above);
          auto ifOp = pb.create<scf::IfOp>(l, has, false);
          OpBuilder ib = OpBuilder::atBlockBegin(ifOp.thenBlock());
          emitBlock(ib, l, a, slot, packed, out, p, r0, s, depth, shape, aOffset,
                    outOffset);
        }
        pb.create<scf::YieldOp>(l);
      });
}

} // namespace mlir::cell
