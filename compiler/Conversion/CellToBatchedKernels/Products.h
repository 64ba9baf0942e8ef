//===- Products.h - Register-blocked products over a batch tile -*- C++ -*-===//
//
// The product phases of the CPU's batched kernels: `out = A x op(W)` for the
// rows of a tile, where A is `[rows, depth]` (a state, or a value the
// previous phase wrote) and W a recurrent weight. W is packed once per call
// (each thread of a group its panels, Products run over the same panels)
// into panels `[panels, depth, panel]` of `panel` output columns (zero past
// the last), so that the micro-kernel reads a panel contiguously; each
// register block holds `rows x vectors` accumulators of `lanes` lanes, fed by
// one broadcast of A and `vectors` loads of the panel per step of `depth`.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_PRODUCTS_H
#define CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_PRODUCTS_H

#include "mlir/IR/Builders.h"

namespace mlir::cell {

/// The shape of a product's register block.
struct BlockShape {
  int64_t lanes = 8;
  int64_t rows = 6;
  int64_t vectors = 2;
  /// Output columns per panel.
  int64_t panel() const { return lanes * vectors; }
  /// Panels that cover `size` output columns.
  int64_t panels(int64_t size) const { return (size + panel() - 1) / panel(); }
};

/// Packs the panels `[firstPanel, lastPanel)` of `weight` (`[rows, cols]`)
/// into `packed` (`[panels, depth, panel]`), for products that compute
/// `size` outputs from `depth` inputs: output `c` is row `c` of the weight,
/// or its column `c` when `transposed` (a vecmat). The columns past `size`
/// in the last panel are zero.
void packWeightInto(OpBuilder &b, Location loc, Value weight, Value packed,
                    bool transposed, int64_t size, int64_t depth, Value firstPanel,
                    Value lastPanel, const BlockShape &shape);

/// Computes `out[r, outOffset + c] = sum_k a[(slot,) r, aOffset + k] *
/// packed(k, c)` for the rows `r < rows` (a run-time value) and the columns
/// of the panels `[firstPanel, lastPanel)`: `out` is `[tile, outOffset +
/// panels * panel]` or wider. The offsets place one block of a
/// block-diagonal product.
void emitProduct(OpBuilder &b, Location loc, Value a, Value slot, Value packed,
                 Value out, Value rows, int64_t depth, Value firstPanel,
                 Value lastPanel, const BlockShape &shape, int64_t aOffset = 0,
                 int64_t outOffset = 0);

} // namespace mlir::cell

#endif // CELLC_COMPILER_CONVERSION_CELLTOBATCHEDKERNELS_PRODUCTS_H
