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
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="vector-bits=512 product-rows=2 product-vectors=1" \
// RUN:   | FileCheck %s --check-prefix=WIDE
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | not cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="batch-tile=-1" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="batch-tile=0" \
// RUN:   | FileCheck %s --check-prefix=TILE0
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | not cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="vector-bits=384" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=kernels --save-gates=1 \
// RUN:   | FileCheck %s --check-prefix=CPU

// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels \
// RUN:   | FileCheck %s --check-prefix=NOALLOC
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-batched-kernels="batch-tile=16 product-rows=3 product-vectors=2" \
// RUN:   | FileCheck %s --check-prefix=ALIAS

// The output h is the state h: the driver may pass h's history as the
// output (Python keeps the output for the backward). Then only the
// history's store, past the caches where the launch streams, writes it; the
// output's plain store to the same line runs only where the two differ.
// ALIAS-LABEL: func.func @lstm_fwd
// ALIAS-SAME:    %[[OUT:[^:]+]]: memref<?x?x12xf32>, %[[HIST:[^:]+]]: memref<?x?x12xf32>, %{{[^:]+}}: memref<?x?x12xf32>, %[[GATES:[^:]+]]: memref<?x?x60xf32>
// ALIAS:         %[[HP:.*]] = memref.extract_aligned_pointer_as_index %[[HIST]]
// ALIAS:         %[[OP:.*]] = memref.extract_aligned_pointer_as_index %[[OUT]]
// ALIAS:         %[[APART:.*]] = arith.cmpi ne, %[[OP]], %[[HP]]
// ALIAS:         vector.store %[[H:[^,]+]], %[[HIST]]{{.*}} {nontemporal = true}
// ALIAS:         scf.if %[[APART]] {
// ALIAS-NEXT:      vector.store %[[H]], %[[OUT]]
// The five saved vectors (i, f, g, o and c) go past the caches too, where
// the launch streams: the backward reads them after the sequence.
// ALIAS-COUNT-5: vector.store %{{[^,]+}}, %[[GATES]][{{.*}}] {nontemporal = true} : memref<?x?x60xf32>, vector<8xf32>

// The gate gradients are two results of the backward, W_ih's projection's
// and W_hh's rows', the second `same_as` the first: the driver passes one
// buffer, and only the first result's stores write it.
// ALIAS-LABEL: func.func @lstm_bwd
// ALIAS-SAME:    %[[DG:[^:]+]]: memref<?x?x48xf32>, %[[ROWS:[^:]+]]: memref<?x?x48xf32>, %{{[^:]+}}: memref<?x?x12xf32>
// ALIAS-SAME:    #cell.arg<projection_grad "W_ih">, #cell.arg<weight_rows "W_hh", same_as = 20>
// ALIAS-NOT:     %[[ROWS]][
// ALIAS:         vector.store %{{[^,]+}}, %[[DG]][{{.*}}] {nontemporal = true}
// ALIAS-NOT:     %[[ROWS]][

// The forward: the tile's buffers and the packed recurrent weight are views
// of the group's part of the workspace (2368 floats: 9472 bytes), laid out
// once, before the tiles. W_hh's 48 rows are 3 panels of 16 outputs, over a
// depth of 12; the state slots hold 16 rows of 12 units padded to 16; the
// product buffer 16 rows of the 3 panels.
// CHECK-LABEL: func.func @lstm_fwd
// CHECK-SAME:    %[[WHH:[^:]+]]: memref<48x12xf32>
// CHECK-SAME:    %[[WS:[^:]+]]: memref<?xf32>, %[[WORDS:[^:]+]]: memref<?xi32>, %[[GROUP:[^:]+]]: index, %[[SLICE:[^:]+]]: index, %[[SLICES:[^:]+]]: index, %[[PACKED_ALREADY:[^:]+]]: index, %[[STREAM:[^:]+]]: index)
// CHECK-SAME:    cell.barrier_words = 16
// CHECK-SAME:    cell.batch_tile = 16
// CHECK-SAME:    cell.workspace_bytes = 9472
// CHECK:         %[[BASE:.*]] = arith.muli %[[GROUP]], %c2368
// CHECK-DAG:     %[[PRODUCT:.*]] = memref.reinterpret_cast %[[WS]] to offset: [%{{.*}}], sizes: [16, 48], strides: [48, 1]
// CHECK-DAG:     memref.reinterpret_cast %[[WS]] to offset: [%{{.*}}], sizes: [2, 16, 16], strides: [256, 16, 1]
// CHECK-DAG:     %[[PACKED:.*]] = memref.reinterpret_cast %[[WS]] to offset: [%{{.*}}], sizes: [3, 12, 16], strides: [192, 16, 1]
// CHECK-DAG:     %[[SAVE:.*]] = cell.save_gates
// Unless the launch says the workspace holds them packed (a streaming
// step's earlier launch), each slice packs its panels of the 3, [slice * 3 /
// slices, (slice + 1) * 3 / slices): the outputs from 16 times the first up
// to 48.
// CHECK:         %[[REPACK:.*]] = arith.cmpi eq, %[[PACKED_ALREADY]], %c0
// CHECK:         scf.if %[[REPACK]] {
// CHECK:           %[[FIRST:.*]] = arith.muli %[[SLICE]], %c3
// CHECK:           arith.divui %[[FIRST]], %[[SLICES]]
// CHECK:           scf.for
// CHECK:             memref.load %[[WHH]]
// CHECK:             memref.store %{{.*}}, %[[PACKED]]
// CHECK:         }
// Then the slices meet: with more than one, each adds 1 to the group's count
// word (16 words per group) and the last bumps the generation word (8 on),
// which the others spin on, then yield their core.
// CHECK:         %[[SEVERAL:.*]] = arith.cmpi ugt, %[[SLICES]], %c1
// CHECK:         scf.if %[[SEVERAL]]
// CHECK:           %[[COUNT:.*]] = arith.muli %[[GROUP]], %c16
// CHECK:           %[[GEN:.*]] = arith.addi %[[COUNT]], %c8
// CHECK:           %[[SEEN:.*]] = memref.atomic_rmw addi %{{.*}}, %[[WORDS]][%[[GEN]]]
// CHECK:           memref.atomic_rmw addi %{{.*}}, %[[WORDS]][%[[COUNT]]]
// CHECK:           scf.if
// CHECK:             memref.atomic_rmw assign %{{.*}}, %[[WORDS]][%[[COUNT]]]
// CHECK:             memref.atomic_rmw addi %{{.*}}, %[[WORDS]][%[[GEN]]]
// CHECK:           } else {
// CHECK:             scf.while
// CHECK:               %[[NOW:.*]] = memref.atomic_rmw addi %{{.*}}, %[[WORDS]][%[[GEN]]]
// CHECK:               arith.cmpi eq, %[[NOW]], %[[SEEN]]
// CHECK:               func.call @sched_yield()
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
// The element phase: 8 units at a time, then the 4 left one at a time (on
// the last slice); the gates are stored only with SAVE_GATES.
// CHECK:             vector.load %[[PRODUCT]]{{.*}} vector<8xf32>
// CHECK:             scf.if %[[SAVE]]
// CHECK:             vector.load %[[PRODUCT]]{{.*}} vector<1xf32>
// CHECK:         return

// The backward packs W_hh twice: for the replayed product (only when the
// gates were not saved) and, transposed, for the gradients' product, 12
// outputs over a depth of 48.
// CHECK-LABEL: func.func @lstm_bwd
// CHECK-SAME:    %[[BWHH:[^:]+]]: memref<48x12xf32>
// CHECK-DAG:     %[[REPLAY:.*]] = memref.reinterpret_cast {{.*}} sizes: [3, 12, 16]
// CHECK-DAG:     %[[TRANSPOSED:.*]] = memref.reinterpret_cast {{.*}} sizes: [1, 48, 16]
// CHECK-DAG:     %[[SAVED:.*]] = cell.save_gates
// CHECK:         scf.if
// CHECK:           %[[REPLAYING:.*]] = arith.xori %[[SAVED]]
// CHECK:           scf.if %[[REPLAYING]] {
// CHECK:             memref.load %[[BWHH]]
// CHECK:             memref.store %{{.*}}, %[[REPLAY]]
// CHECK:           }
// CHECK:           memref.load %[[BWHH]]
// CHECK:           memref.store %{{.*}}, %[[TRANSPOSED]]
// CHECK:         return

// The kernels allocate nothing: every buffer is in the workspace.
// NOALLOC-NOT: memref.alloc

// LANES-LABEL: func.func @lstm_fwd
// LANES:         memref.reinterpret_cast {{.*}} sizes: [4, 12, 12]
// LANES:         scf.for %{{.*}} iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// LANES-COUNT-3:   vector.load %{{.*}} vector<4xf32>

// With AVX-512's vectors (the JIT's choice on such a host): 16 f32 lanes, so
// W_hh's 48 rows are 3 panels of one 16-lane vector, and the element loops
// run 16 units at a time.
// WIDE-LABEL: func.func @lstm_fwd
// WIDE:         memref.reinterpret_cast {{.*}} sizes: [3, 12, 16]
// WIDE:         vector.store %{{.*}} : memref<3x12x16xf32, {{.*}}>, vector<16xf32>

// ERR: convert-cell-to-batched-kernels: product-rows and product-vectors must be >= 1, batch-tile and vector-width >= 0 and vector-bits 256 or 512

// batch-tile=0, the knob's default, is 64 rows a tile.
// TILE0-LABEL: func.func @lstm_fwd
// TILE0-SAME:    cell.batch_tile = 64

// cellc's CPU kernels are the batched ones: 64 rows per tile.
// CPU-LABEL: func.func @lstm_fwd
// CPU-SAME:    cell.batch_tile = 64
