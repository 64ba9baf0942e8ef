// The batch-tiled kernels for CUDA: a gpu.func per kernel, one CTA per tile
// of batch rows, workgroup buffers for the states (two slots), threads
// striding over the hidden units, and a barrier after each phase.
//
// RUN: cellc %examples/lstm.cell -D H=8 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-tiled-kernels="batch-tile=2 cta-threads=64" \
// RUN:   | FileCheck %s
//
// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @cellc_kernels
// CHECK: gpu.func @lstm_fwd(
// CHECK-SAME: workgroup(%[[H:.*]] : memref<2x8x2xf32, #gpu.address_space<workgroup>>, %[[C:.*]] : memref<2x8x2xf32, #gpu.address_space<workgroup>>)
// CHECK-SAME: kernel
// CHECK-SAME: cell.batch_tile = 2 : i64
// CHECK-SAME: cell.threads = 64 : i64
// CHECK-SAME: cell.workgroup_bytes = 256 : i64
// CHECK-SAME: known_block_size = array<i32: 64, 1, 1>
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: gpu.block_id x
// The time loop; the threads stride over the 8 hidden units.
// CHECK: scf.for %[[T:.*]] = %{{.*}} to %{{.*}} step
// CHECK: scf.for %{{.*}} = %[[TID]] to %{{.*}} step %{{.*}}
// CHECK: gpu.barrier
// The recurrent matvec: a weight broadcast over the tile's rows, times h
// read from workgroup memory.
// CHECK: vector.broadcast %{{.*}} : f32 to vector<2xf32>
// CHECK: vector.load %[[H]][%{{.*}}, %{{.*}}, %{{.*}}] : memref<2x8x2xf32, #gpu.address_space<workgroup>>, vector<2xf32>
// CHECK: vector.fma
// The gates are stored only under the SAVE_GATES flag.
// CHECK: scf.if %{{.*}} {
// CHECK: memref.store %{{.*}}, %{{.*}}[%[[T]], %{{.*}}, %{{.*}}] : memref<?x?x40xf32>
// CHECK: gpu.barrier
// CHECK: gpu.return
//
// The backward kernel keeps the gate gradients in workgroup memory for the
// transposed matvec.
// CHECK: gpu.func @lstm_bwd(
// CHECK-SAME: memref<32x2xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: kernel
// CHECK: gpu.barrier
// CHECK: gpu.return

// The same kernels for the host: func.func, one thread, a loop over tiles,
// no barriers.
// RUN: cellc %examples/lstm.cell -D H=8 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves \
// RUN:       --convert-cell-to-tiled-kernels="target=cpu batch-tile=2" \
// RUN:   | FileCheck %s --check-prefix=CPU --implicit-check-not=gpu.barrier
//
// CPU: func.func @lstm_fwd(
// CPU-SAME: cell.threads = 1 : i64
// CPU: memref.alloca() : memref<2x8x2xf32>
// CPU: func.func @lstm_bwd(
