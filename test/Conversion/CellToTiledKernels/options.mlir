// The options of convert-cell-to-tiled-kernels, one RUN each: the strategy,
// the tensor-core precision, the storage of the per-step sequences, the
// register cap, and the errors for words and combinations it rejects.
//
// RUN: cellc %examples/lstm.cell -D H=16 -D I=8 --emit=mlir \
// RUN:   | cellc-opt --cell-split-projections --cell-autodiff --cell-plan-saves -o %t.mlir
//
// RUN: cellc-opt %t.mlir --convert-cell-to-tiled-kernels="strategy=persistent cta-threads=64 batch-tile=2" \
// RUN:   | FileCheck %s --check-prefix=PERSISTENT
// The CTAs of a tile along x, the tiles along y; the weights' slices and the
// partial products in dynamic shared memory; a global workspace and the
// grid barrier's words as the last two arguments.
// PERSISTENT: gpu.func @lstm_fwd(
// PERSISTENT-SAME: %[[WS:[a-z0-9]+]]: memref<?xf32>, %[[BAR:[a-z0-9]+]]: memref<?xi32>) kernel
// PERSISTENT-SAME: cell.barrier_words = 64 : i64
// PERSISTENT-SAME: cell.ctas = 1 : i64
// PERSISTENT-SAME: cell.dynamic_shared_bytes = 4864 : i64
// PERSISTENT-SAME: #cell.arg<workspace "workspace">, #cell.arg<grid_barrier "grid_barrier">
// PERSISTENT-SAME: cell.strategy = "persistent"
// PERSISTENT-SAME: cell.workgroup_bytes = 4864 : i64
// PERSISTENT-SAME: cell.workspace_bytes =
// PERSISTENT: %[[DYN:.*]] = gpu.dynamic_shared_memory
// The weight slice: 64 rows of 16 columns, padded by one against bank conflicts.
// PERSISTENT: memref.view %[[DYN]][%{{.*}}][] : {{.*}} to memref<64x17xf32, #gpu.address_space<workgroup>>
// A CTA loops over the tiles of its grid row, by the grid's rows.
// PERSISTENT: %[[ROW:.*]] = gpu.block_id y
// PERSISTENT: gpu.block_id x
// PERSISTENT: %[[ROWS:.*]] = gpu.grid_dim y
// PERSISTENT: scf.for %{{.*}} = %[[ROW]] to %{{.*}} step %[[ROWS]]
// PERSISTENT: memref.reinterpret_cast %[[WS]]
// The grid barrier: the generation word read with acquire, then the
// arrival at the count, both words of the barrier's buffer.
// PERSISTENT: memref.extract_aligned_pointer_as_index %[[BAR]]
// PERSISTENT: llvm.inline_asm has_side_effects "ld.acquire.gpu.u32 $0, [$1];"
// PERSISTENT: llvm.inline_asm has_side_effects "atom.add.acq_rel.gpu.u32 $0, [$1], $2;"
// PERSISTENT: gpu.func @lstm_bwd(
//
// RUN: cellc-opt %t.mlir --convert-cell-to-tiled-kernels="precision=tf32 cta-threads=64 batch-tile=2" \
// RUN:   | FileCheck %s --check-prefix=TF32
// TF32: gpu.func @lstm_fwd(
// TF32: nvvm.mma.sync {{.*}}multiplicandAPtxType = #nvvm.mma_type<tf32>{{.*}}shape = #nvvm.shape<m = 16, n = 8, k = 8>
// TF32: gpu.func @lstm_bwd(
// TF32: nvvm.mma.sync
//
// RUN: cellc-opt %t.mlir --convert-cell-to-tiled-kernels="precision=bf16 cta-threads=64 batch-tile=2" \
// RUN:   | FileCheck %s --check-prefix=BF16 --implicit-check-not=nvvm.mma.sync
// BF16: gpu.func @lstm_fwd(
// BF16: arith.truncf %{{.*}} : vector<2xf32> to vector<2xbf16>
// BF16: llvm.inline_asm "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//
// RUN: cellc-opt %t.mlir --convert-cell-to-tiled-kernels="storage=bf16 cta-threads=64 batch-tile=2" \
// RUN:   | FileCheck %s --check-prefix=STORAGE
// The per-step sequences are bf16 in memory, the states and params f32.
// STORAGE: gpu.func @lstm_fwd(%{{.*}}: memref<?x?x8xbf16>, %{{.*}}: memref<?x?x64xbf16>, %{{.*}}: memref<?x?xi8>, %{{.*}}: memref<?x16xf32>
// STORAGE-SAME: cell.storage = "bf16"
// STORAGE: arith.extf %{{.*}} : bf16 to f32
// STORAGE: arith.truncf %{{.*}} : f32 to bf16
//
// RUN: cellc-opt %t.mlir --convert-cell-to-tiled-kernels="max-registers=128 cta-threads=64" \
// RUN:   | FileCheck %s --check-prefix=MAXREG
// MAXREG: gpu.func @lstm_fwd({{.*}} kernel attributes {{{.*}}nvvm.maxnreg = 128 : i32
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="strategy=ring" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-STRATEGY
// ERR-STRATEGY: error: convert-cell-to-tiled-kernels: unknown strategy 'ring'; expected batch-tiled or persistent
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="precision=fp8" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-PRECISION
// ERR-PRECISION: error: convert-cell-to-tiled-kernels: unknown precision 'fp8'; expected ieee, tf32 or bf16
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="storage=f16" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-STORAGE
// ERR-STORAGE: error: convert-cell-to-tiled-kernels: unknown storage 'f16'; expected
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="target=cpu precision=tf32" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-CPU-PRECISION
// ERR-CPU-PRECISION: error: convert-cell-to-tiled-kernels: precision=tf32 needs tensor cores, so target=cuda
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="target=cpu storage=bf16" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-CPU-STORAGE
// ERR-CPU-STORAGE: error: convert-cell-to-tiled-kernels: storage=bf16 is for target=cuda
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="cta-threads=48" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-THREADS
// ERR-THREADS: error: convert-cell-to-tiled-kernels: cta-threads=48 is not a whole number of warps
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="shared-limit=128" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-SHARED
// ERR-SHARED: error: 'lstm' needs {{[0-9]+}} bytes of workgroup memory per CTA for its forward kernel even with one batch row per CTA, over the limit of 128
//
// RUN: not cellc-opt %t.mlir --convert-cell-to-tiled-kernels="strategy=persistent ctas=1 shared-limit=1024" 2>&1 \
// RUN:   | FileCheck %s --check-prefix=ERR-CTAS
// ERR-CTAS: error: 'lstm': the persistent strategy cannot fit its forward kernel's recurrent weights in 1 CTAs of 1024 bytes of workgroup memory each
