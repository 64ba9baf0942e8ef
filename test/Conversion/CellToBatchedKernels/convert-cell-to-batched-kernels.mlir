// The CPU's batched kernels: tiles of rows, each step as phases over the
// tile, products as register-blocked matrix products over it.
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="batch-tile=16 product-rows=3 product-vectors=2" \
// RUN:   | FileCheck %s
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="vector-width=4 product-rows=2 product-vectors=3" \
// RUN:   | FileCheck %s --check-prefix=LANES
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | not cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="batch-tile=0" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=kernels --save-gates=1 \
// RUN:   | FileCheck %s --check-prefix=CPU

// The forward: the tile's buffers and the packed recurrent weight are made
// once, before the tiles. W_hh's 48 rows are 3 panels of 16 outputs, over a
// depth of 12; the state slots hold 16 rows of 12 units padded to 16; the
// product buffer 16 rows of the 3 panels.
// CHECK-LABEL: func.func @lstm_fwd
// CHECK-SAME:    %[[WHH:[^:]+]]: memref<48x12xf32>
// CHECK-SAME:    cell.batch_tile = 16
// CHECK-DAG:     %[[PRODUCT:.*]] = memref.alloc() : memref<16x48xf32>
// CHECK-DAG:     memref.alloc() : memref<2x16x16xf32>
// CHECK-DAG:     %[[SAVE:.*]] = cell.save_gates
// CHECK:         %[[PACKED:.*]] = memref.alloc() : memref<3x12x16xf32>
// CHECK:         memref.load %[[WHH]]
// CHECK:         memref.store %{{.*}}, %[[PACKED]]
// The tiles of the kernel's rows, then the steps of each.
// CHECK:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c16
// CHECK:           scf.for %{{.*}} = %{{.*}} to %{{.*}} step
// A register block of 3 rows by 2 vectors: 6 accumulators over the depth,
// a broadcast of the state per row, two loads of the panel per step.
// CHECK:             scf.for %{{.*}} iter_args({{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK-COUNT-2:       vector.load %[[PACKED]]
// CHECK:               vector.broadcast
// CHECK-COUNT-2:       vector.fma
// CHECK:             vector.store %{{.*}}, %[[PRODUCT]]
// The rows left over, fewer than 3: a block of 2 and a block of 1.
// CHECK:             scf.if
// CHECK:             scf.for %{{.*}} iter_args({{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK:             scf.if
// CHECK:             scf.for %{{.*}} iter_args({{.*}}) -> (vector<8xf32>, vector<8xf32>)
// The element phase: 8 units at a time, then the 4 left one at a time; the
// gates are stored only with SAVE_GATES.
// CHECK:             vector.load %[[PRODUCT]]{{.*}} vector<8xf32>
// CHECK:             scf.if %[[SAVE]]
// CHECK:             vector.load %[[PRODUCT]]{{.*}} vector<1xf32>
// CHECK:         memref.dealloc %[[PACKED]]
// CHECK:         return

// The backward packs W_hh twice: for the replayed product (only when the
// gates were not saved) and, transposed, for the gradients' product, 12
// outputs over a depth of 48.
// CHECK-LABEL: func.func @lstm_bwd
// CHECK-SAME:    %[[BWHH:[^:]+]]: memref<48x12xf32>
// CHECK-DAG:     %[[REPLAY:.*]] = memref.alloc() : memref<3x12x16xf32>
// CHECK-DAG:     %[[SAVED:.*]] = cell.save_gates
// CHECK:         %[[REPLAYING:.*]] = arith.xori %[[SAVED]]
// CHECK:         scf.if %[[REPLAYING]] {
// CHECK:           memref.load %[[BWHH]]
// CHECK:           memref.store %{{.*}}, %[[REPLAY]]
// CHECK:         }
// CHECK:         %[[TRANSPOSED:.*]] = memref.alloc() : memref<1x48x16xf32>
// CHECK:         memref.load %[[BWHH]]
// CHECK:         memref.store %{{.*}}, %[[TRANSPOSED]]
// CHECK:         return

// LANES-LABEL: func.func @lstm_fwd
// LANES:         memref.alloc() : memref<4x12x12xf32>
// LANES:         scf.for %{{.*}} iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// LANES-COUNT-3:   vector.load %{{.*}} vector<4xf32>

// ERR: convert-cell-to-batched-kernels: batch-tile, product-rows and product-vectors must be >= 1

// cellc's CPU kernels are the batched ones: 64 rows per tile.
// CPU-LABEL: func.func @lstm_fwd
// CPU-SAME:    cell.batch_tile = 64
