// The kernels of a streaming step (Cell.step): without cell-split-projections
// the product of the input stays in the step, so the kernel takes no
// projection and packs W_ih beside W_hh, both under the launch's `packed`
// flag, which lets a step use the weights the last step packed.
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-to-kernels="split-projections=false save-gates=0" \
// RUN:   | FileCheck %s
// RUN: cellc %examples/lstm.cell -D H=12 -D I=4 --emit=mlir \
// RUN:   | cellc-opt --cell-to-kernels="save-gates=0" \
// RUN:   | FileCheck %s --check-prefix=SPLIT

// CHECK-LABEL: func.func @lstm_fwd
// CHECK-SAME:    %{{[^:]+}}: memref<?x?x4xf32>, %{{[^:]+}}: memref<?x?xi8>
// CHECK-SAME:    %[[WIH:[^:]+]]: memref<48x4xf32>, %[[WHH:[^:]+]]: memref<48x12xf32>
// CHECK-SAME:    %[[PACKED_ALREADY:[^:]+]]: index, %{{[^:]+}}: index)
// CHECK-DAG:     %[[PWHH:.*]] = memref.reinterpret_cast {{.*}} sizes: [3, 12, 16]
// CHECK-DAG:     %[[PWIH:.*]] = memref.reinterpret_cast {{.*}} sizes: [3, 4, 16]
// CHECK:         %[[REPACK:.*]] = arith.cmpi eq, %[[PACKED_ALREADY]], %c0
// CHECK:         scf.if %[[REPACK]] {
// CHECK-DAG:       memref.store %{{.*}}, %[[PWIH]]
// CHECK-DAG:       memref.store %{{.*}}, %[[PWHH]]
// CHECK:         }
// CHECK-LABEL: func.func @lstm_bwd

// Hoisted, the input's product is a [T, B, 48] projection the kernel reads.
// SPLIT-LABEL: func.func @lstm_fwd
// SPLIT-SAME:    %{{[^:]+}}: memref<?x?x4xf32>, %{{[^:]+}}: memref<?x?x48xf32>, %{{[^:]+}}: memref<?x?xi8>
