// The ops of matrix states (cell.expand, cell.reduce) are lowered by the
// CPU's kernels only: the CUDA kernel conversion says so at the op, and does
// not crash (docs/matrix-states.md).
// RUN: cellc-opt %s --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:   --convert-cell-to-tiled-kernels --verify-diagnostics

cell.def @mstate inputs(%k: tensor<2xf32>, %v: tensor<3xf32>) states(%C: tensor<6xf32>) outputs("C") {
  // expected-error @below {{'cell.expand' op has no lowering in these kernels yet: matrix states run on the CPU's kernels only (docs/matrix-states.md)}}
  %ke = cell.expand %k {shape = array<i64: 2, 3>, kept = array<i64: 0>} : tensor<2xf32> -> tensor<6xf32>
  %ve = cell.expand %v {shape = array<i64: 2, 3>, kept = array<i64: 1>} : tensor<3xf32> -> tensor<6xf32>
  %kv = cell.mul %ke, %ve : tensor<6xf32>
  %next = cell.add %C, %kv : tensor<6xf32>
  cell.yield states(%next : tensor<6xf32>) outputs(%next : tensor<6xf32>)
}
