// A matrix state per sample, C [2, 16], on the CPU's batched kernels, along
// the last dim 8 lanes at a time. An expand is read in place where it is
// used: the outer product k vᵀ writes no matrix of copies. A reduce over the
// last dim (the rows' sums) starts a phase and sums from a buffer; one that
// keeps the last dim (the columns' sums of k vᵀ, whose operand nothing else
// writes out) evaluates its operand in place, in one loop over the rows.
// The step has no recurrent product, so the kernels run one-row tiles
// (batch-tile is 64 by default): the rows would share nothing.
// RUN: cellc-opt %s --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:   --convert-cell-to-batched-kernels="vector-width=8" | FileCheck %s

// CHECK-LABEL: func.func @mstate_fwd
// CHECK-SAME:    %[[STREAM:[^:]+]]: index)
// CHECK-SAME:    cell.batch_tile = 1 :
// CHECK:         %[[STREAMING:.*]] = arith.cmpi ne, %[[STREAM]], %c0
// The sums of the columns: a loop over the 2 rows, k vᵀ evaluated at each
// (k's element spread, times v's 8) and added into 8 lanes.
// CHECK:         scf.for %{{.*}} = %{{.*}} to %c2{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (vector<8xf32>)
// CHECK:           vector.broadcast %{{.*}} : f32 to vector<8xf32>
// CHECK:           arith.mulf %{{.*}} : vector<8xf32>
// CHECK:           arith.addf %[[ACC]], %{{.*}} : vector<8xf32>
// The outer product: k [2] at each unit's row, one element spread over the
// lanes; v [16] at its column, 8 contiguous; C + k vᵀ stored to the next
// state, the state history and the rows' sums' buffer, and nothing else.
// The history ([T, B, 32], read again only by the backward) is streamed
// past the caches where the vector's address is a multiple of 32 bytes and
// the launch says it is read later (`stream`: not a chunk's replay).
// CHECK:         %[[K:.*]] = vector.load %{{.*}} : memref<1x16xf32, {{.*}}>, vector<1xf32>
// CHECK-NEXT:    %[[KS:.*]] = vector.extract %[[K]][0] : f32 from vector<1xf32>
// CHECK-NEXT:    %[[KV:.*]] = vector.broadcast %[[KS]] : f32 to vector<8xf32>
// CHECK:         %[[V:.*]] = vector.load %{{.*}} : memref<1x16xf32, {{.*}}>, vector<8xf32>
// CHECK-NEXT:    %[[KVT:.*]] = arith.mulf %[[KV]], %[[V]] : vector<8xf32>
// CHECK-NEXT:    %[[NEXT:.*]] = arith.addf %{{.*}}, %[[KVT]] : vector<8xf32>
// CHECK-NEXT:    vector.store %[[NEXT]]
// CHECK:         %[[BASE:.*]] = memref.extract_aligned_pointer_as_index %[[HIST:.*]] : memref<?x?x32xf32> -> index
// CHECK-NEXT:    %[[AT:.*]] = arith.addi %[[BASE]], %{{.*}} : index
// CHECK:         %[[LOW:.*]] = arith.andi %[[AT]], %c31 : index
// CHECK-NEXT:    %[[ALIGNED:.*]] = arith.cmpi eq, %[[LOW]], %{{.*}} : index
// CHECK-NEXT:    %[[PAST:.*]] = arith.andi %[[STREAMING]], %[[ALIGNED]] : i1
// CHECK-NEXT:    scf.if %[[PAST]] {
// CHECK-NEXT:      vector.store %[[NEXT]], %[[HIST]][{{.*}}] {nontemporal = true} : memref<?x?x32xf32>, vector<8xf32>
// CHECK-NEXT:    } else {
// CHECK-NEXT:      vector.store %[[NEXT]], %[[HIST]][{{.*}}] : memref<?x?x32xf32>, vector<8xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    vector.store %[[NEXT]]
// CHECK-NEXT:  }
// The sums of the rows: zeros first, then each row's 16 in two vectors,
// added across the lanes.
// CHECK:         vector.store %{{.*}}, %{{.*}} : memref<1x16xf32, {{.*}}>, vector<1xf32>
// CHECK:         arith.addf %{{.*}} : vector<8xf32>
// CHECK:         vector.reduction <add>, %{{.*}} : vector<8xf32> into f32
// CHECK-LABEL: func.func @mstate_bwd
// CHECK-SAME:    cell.batch_tile = 1 :
// The backward expands the rows' gradient back over C and sums the outer
// product's gradients: both ops again.
// CHECK:         vector.broadcast %{{.*}} : f32 to vector<8xf32>
// CHECK:         vector.reduction <add>

cell.def @mstate inputs(%k: tensor<2xf32>, %v: tensor<16xf32>) states(%C: tensor<32xf32>) outputs("h", "cols") {
  %ke = cell.expand %k {shape = array<i64: 2, 16>, kept = array<i64: 0>} : tensor<2xf32> -> tensor<32xf32>
  %ve = cell.expand %v {shape = array<i64: 2, 16>, kept = array<i64: 1>} : tensor<16xf32> -> tensor<32xf32>
  %kv = cell.mul %ke, %ve : tensor<32xf32>
  %next = cell.add %C, %kv : tensor<32xf32>
  %h = cell.reduce %next {shape = array<i64: 2, 16>, kept = array<i64: 0>} : tensor<32xf32> -> tensor<2xf32>
  %cols = cell.reduce %kv {shape = array<i64: 2, 16>, kept = array<i64: 1>} : tensor<32xf32> -> tensor<16xf32>
  cell.yield states(%next : tensor<32xf32>) outputs(%h, %cols : tensor<2xf32>, tensor<16xf32>)
}
