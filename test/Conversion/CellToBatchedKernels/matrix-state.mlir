// A matrix state per sample, C [2, 16], on the CPU's batched kernels: each
// cell.expand and cell.reduce starts a phase and runs over this slice's rows
// of the tile, along the last dim 8 lanes at a time.
// RUN: cellc-opt %s --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:   --convert-cell-to-batched-kernels="vector-width=8" | FileCheck %s

// k [2] repeated along the last dim: one element, spread over the lanes.
// CHECK-LABEL: func.func @mstate_fwd
// CHECK:         %[[K:.*]] = vector.load %{{.*}} : memref<64x16xf32, {{.*}}>, vector<1xf32>
// CHECK-NEXT:    %[[KS:.*]] = vector.extract %[[K]][0] : f32 from vector<1xf32>
// CHECK-NEXT:    %[[KV:.*]] = vector.broadcast %[[KS]] : f32 to vector<8xf32>
// CHECK-NEXT:    vector.store %[[KV]], %{{.*}} : memref<64x32xf32, {{.*}}>, vector<8xf32>
// v [16] along the last dim: contiguous, 8 at a time.
// CHECK:         %[[V:.*]] = vector.load %{{.*}} : memref<64x16xf32, {{.*}}>, vector<8xf32>
// CHECK-NEXT:    vector.store %[[V]], %{{.*}} : memref<64x32xf32, {{.*}}>, vector<8xf32>
// The sums of C's rows: zeros first, then each row's 16 in two vectors,
// added across the lanes.
// CHECK:         vector.store %{{.*}}, %{{.*}} : memref<64x16xf32, {{.*}}>, vector<1xf32>
// CHECK:         arith.addf %{{.*}} : vector<8xf32>
// CHECK:         vector.reduction <add>, %{{.*}} : vector<8xf32> into f32
// CHECK-NOT:     vector.reduction <add>, %{{.*}} : vector<1xf32>
// CHECK-LABEL: func.func @mstate_bwd
// The backward expands the rows' gradient back over C and sums the outer
// product's gradients: both ops again.
// CHECK:         vector.broadcast %{{.*}} : f32 to vector<8xf32>
// CHECK:         vector.reduction <add>

cell.def @mstate inputs(%k: tensor<2xf32>, %v: tensor<16xf32>) states(%C: tensor<32xf32>) outputs("h") {
  %ke = cell.expand %k {shape = array<i64: 2, 16>, kept = array<i64: 0>} : tensor<2xf32> -> tensor<32xf32>
  %ve = cell.expand %v {shape = array<i64: 2, 16>, kept = array<i64: 1>} : tensor<16xf32> -> tensor<32xf32>
  %kv = cell.mul %ke, %ve : tensor<32xf32>
  %next = cell.add %C, %kv : tensor<32xf32>
  %h = cell.reduce %next {shape = array<i64: 2, 16>, kept = array<i64: 0>} : tensor<32xf32> -> tensor<2xf32>
  cell.yield states(%next : tensor<32xf32>) outputs(%h : tensor<2xf32>)
}
