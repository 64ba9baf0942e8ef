// RUN: cellc %examples/lstm.cell -D H=4 -D I=3 --emit=kernels --strategy=per-row --save-gates=0 | FileCheck %s --check-prefix=NOSAVE
// RUN: cellc %examples/lstm.cell -D H=4 -D I=3 --emit=kernels --strategy=per-row --save-gates=1 | FileCheck %s --check-prefix=SAVE
// RUN: cellc %examples/lstm.cell -D H=4 -D I=3 --emit=kernels --save-gates=0 | FileCheck %s --check-prefix=BNOSAVE
// RUN: cellc %examples/lstm.cell -D H=4 -D I=3 --emit=kernels --save-gates=1 | FileCheck %s --check-prefix=BSAVE
// RUN: cellc %examples/lstm.cell -D H=4 -D I=3 | cellc-opt --cell-to-kernels="save-gates=0" | FileCheck %s --check-prefix=BNOSAVE
// After cell-specialize and canonicalization, SAVE_GATES=0 leaves no gate
// store in the forward kernel and no gate load in the backward kernel, which
// replays the step (its recurrent matvec included). SAVE_GATES=1 stores the
// five planned vectors (20 floats) and the backward reads them instead of
// replaying. The per-row kernels (NOSAVE, SAVE) and the batched ones, the
// default (BNOSAVE, BSAVE), both.

// The gate buffer is [T, B, 20]: i, f, g, o and tanh(c), 4 each.
// The per-row forward's one scf.if turns the recurrent matvec's order
// around (a snake); none is left on SAVE_GATES.
// NOSAVE-LABEL: func.func @lstm_fwd
// NOSAVE-SAME:    %[[GATES:[^:]+]]: memref<?x?x20xf32>
// NOSAVE:         memref.atomic_rmw
// NOSAVE-NOT:     scf.if
// NOSAVE:         scf.if
// NOSAVE:         } else {
// NOSAVE-NOT:     scf.if
// NOSAVE-NOT:     vector.store {{.*}}, %[[GATES]]
// NOSAVE:         return
// NOSAVE-LABEL: func.func @lstm_bwd
// NOSAVE-SAME:    %[[WHH:[^:]+]]: memref<16x4xf32>
// NOSAVE-SAME:    %[[BGATES:[^:]+]]: memref<?x?x20xf32>
// NOSAVE-NOT:     vector.load %[[BGATES]]
// The replayed recurrent matvec, then the transposed one of the backward.
// NOSAVE:         vector.load %[[WHH]]
// NOSAVE:         vector.reduction <add>
// NOSAVE:         vector.load %[[WHH]]
// NOSAVE:         vector.fma
// NOSAVE-NOT:     vector.load %[[BGATES]]
// NOSAVE:         return

// SAVE-LABEL: func.func @lstm_fwd
// SAVE-SAME:    %[[GATES:[^:]+]]: memref<?x?x20xf32>
// SAVE:         memref.atomic_rmw
// SAVE-NOT:     scf.if
// SAVE:         scf.if
// SAVE:         } else {
// SAVE-NOT:     scf.if
// SAVE-COUNT-5: vector.store %{{.*}}, %[[GATES]]
// SAVE-NOT:     vector.store {{.*}}, %[[GATES]]
// SAVE:         return
// SAVE-LABEL: func.func @lstm_bwd
// SAVE-SAME:    %[[WHH:[^:]+]]: memref<16x4xf32>
// SAVE-SAME:    %[[BGATES:[^:]+]]: memref<?x?x20xf32>
// SAVE-COUNT-5: vector.load %[[BGATES]]
// Only the transposed matvec reads W_hh: the step is not replayed.
// SAVE-NOT:     vector.reduction
// SAVE:         vector.load %[[WHH]]
// SAVE:         vector.fma
// SAVE-NOT:     vector.load %[[WHH]]
// SAVE:         return

// BNOSAVE-LABEL: func.func @lstm_fwd
// BNOSAVE-SAME:    %[[GATES:[^:]+]]: memref<?x?x20xf32>
// BNOSAVE-NOT:     vector.store {{.*}}, %[[GATES]]
// BNOSAVE:         return
// BNOSAVE-LABEL: func.func @lstm_bwd
// BNOSAVE-SAME:    %[[WHH:[^:]+]]: memref<16x4xf32>
// BNOSAVE-SAME:    %[[BGATES:[^:]+]]: memref<?x?x20xf32>
// BNOSAVE-NOT:     vector.load %[[BGATES]]
// Both products' weights are packed: the replayed one and the transposed one.
// BNOSAVE-COUNT-2: memref.load %[[WHH]]
// BNOSAVE-NOT:     vector.load %[[BGATES]]
// BNOSAVE:         return

// BSAVE-LABEL: func.func @lstm_fwd
// BSAVE-SAME:    %[[GATES:[^:]+]]: memref<?x?x20xf32>
// BSAVE-COUNT-5: vector.store %{{.*}}, %[[GATES]]
// BSAVE-NOT:     vector.store {{.*}}, %[[GATES]]
// BSAVE:         return
// BSAVE-LABEL: func.func @lstm_bwd
// BSAVE-SAME:    %[[WHH:[^:]+]]: memref<16x4xf32>
// BSAVE-SAME:    %[[BGATES:[^:]+]]: memref<?x?x20xf32>
// Only the transposed product's weights are packed: nothing is replayed.
// BSAVE:         memref.load %[[WHH]]
// BSAVE-NOT:     memref.load %[[WHH]]
// BSAVE-COUNT-5: vector.load %[[BGATES]]
// BSAVE-NOT:     memref.load %[[WHH]]
// BSAVE:         return
