// RUN: cellc-opt %s --convert-cell-to-kernels | FileCheck %s
// RUN: cellc-opt %s --convert-cell-to-kernels --cell-specialize --canonicalize | FileCheck %s --check-prefix=CANON
// RUN: cellc-opt %s --convert-cell-to-kernels="matvec-width=2 matvec-unroll=2" --cell-specialize --canonicalize | FileCheck %s --check-prefix=TUNED
// RUN: not cellc-opt %s --convert-cell-to-kernels="matvec-width=3" 2>&1 | FileCheck %s --check-prefix=BADWIDTH
// The knobs reach the pass from cellc's command line (Knobs.def).
// RUN: not cellc %examples/lstm.cell -D H=12 -D I=4 --emit=kernels --strategy=per-row \
// RUN:   --matvec-width=5 2>&1 | FileCheck %s --check-prefix=CLIWIDTH
// RUN: cellc %examples/block_gru.cell -D G=2 -D D=4 --emit=kernels --strategy=per-row | FileCheck %s --check-prefix=NOSNAKE
// A cell whose products are all block-diagonal has no matvec to turn
// around: no call counter, no atomic per call.
// NOSNAKE-NOT:   memref.global
// NOSNAKE-LABEL: func.func @block_gru_fwd
// NOSNAKE-NOT:   memref.atomic_rmw
// NOSNAKE:       return
// The Elman cell (after split-projections, autodiff and plan-saves) becomes
// a forward and a backward sequence kernel. Cell ops are gone; only the
// SAVE_GATES flag remains, for cell-specialize.

// CHECK-LABEL: func.func @elman_fwd
// CHECK-SAME:    (%[[X:[^:]+]]: memref<?x?x3xf32>, %[[P:[^:]+]]: memref<?x?x4xf32>, %[[RESETS:[^:]+]]: memref<?x?xi8>, %[[H0:[^:]+]]: memref<?x4xf32>,
// CHECK-SAME:     %[[START:[^:]+]]: memref<?x4xf32>, %{{[^:]+}}: memref<4x3xf32>, %[[WHH:[^:]+]]: memref<4x4xf32>, %{{[^:]+}}: memref<4xf32>, %{{[^:]+}}: memref<4xf32>,
// CHECK-SAME:     %[[OUT:[^:]+]]: memref<?x?x4xf32>, %[[HIST:[^:]+]]: memref<?x?x4xf32>, %[[GATES:[^:]+]]: memref<?x?x4xf32>, %[[BB:[^:]+]]: index, %[[BE:[^:]+]]: index)
// CHECK-SAME:    cell.kernel_args = [#cell.arg<input "x">, #cell.arg<projection "W_ih", input = "x", biases = ["b_ih", "b_hh"]>, #cell.arg<resets "resets">, #cell.arg<initial_state "h">, #cell.arg<start_state "h">, #cell.arg<param "W_ih">, #cell.arg<param "W_hh">, #cell.arg<param "b_ih">, #cell.arg<param "b_hh">, #cell.arg<output "h">, #cell.arg<state_history "h">, #cell.arg<gates "gates">, #cell.arg<batch_begin "b_begin">, #cell.arg<batch_end "b_end">]
// CHECK:         %[[FLAG:.*]] = cell.save_gates : i1
// CHECK:         %[[T:.*]] = memref.dim %[[RESETS]], %{{.*}}
// The kernel's calls, counted in a global: the parity of the count and of
// the step turns the recurrent matvec's order around (a snake).
// CHECK:         %[[COUNTER:.*]] = memref.get_global @elman_fwd_calls : memref<1xi64>
// CHECK:         %[[CALLS:.*]] = memref.atomic_rmw addi %{{.*}}, %[[COUNTER]][%{{.*}}] : (i64, memref<1xi64>) -> i64
// CHECK:         %[[PARITY:.*]] = arith.index_cast %[[CALLS]] : i64 to index
// CHECK:         scf.for %[[B:.*]] = %[[BB]] to %[[BE]]
// The state starts from the start state; a reset restores the initial one.
// CHECK:           %[[INIT:.*]] = vector.load %[[H0]][%[[B]], %{{.*}}] : memref<?x4xf32>, vector<4xf32>
// CHECK:           %[[FROM:.*]] = vector.load %[[START]][%[[B]], %{{.*}}] : memref<?x4xf32>, vector<4xf32>
// CHECK:           scf.for %[[S:.*]] = %{{.*}} to %[[T]] {{.*}} iter_args(%[[H:.*]] = %[[FROM]])
// A reset at (t, b) puts the initial state back.
// CHECK:             %[[R:.*]] = memref.load %[[RESETS]][%[[S]], %[[B]]]
// CHECK:             %[[ISR:.*]] = arith.cmpi ne, %[[R]]
// CHECK:             %[[PREV:.*]] = arith.select %[[ISR]], %[[INIT]], %[[H]]
// The recurrent matvec on the previous state (through scratch), a row at a
// time, the projection read per step: from the last row at an odd step of
// the calls, from the first at an even one.
// CHECK:             %[[AT:.*]] = arith.addi %[[PARITY]], %[[S]] : index
// CHECK:             %[[ODD:.*]] = arith.andi %[[AT]], %c1 : index
// CHECK:             %[[DOWN:.*]] = arith.cmpi ne, %[[ODD]], %{{.*}} : index
// CHECK:             scf.if %[[DOWN]] {
// CHECK:               scf.for %[[I:[^ ]+]] = %{{.*}} to %c4
// CHECK:                 %[[ROW:.*]] = arith.subi %c3, %[[I]] : index
// CHECK:                 vector.load %[[WHH]][%[[ROW]], %{{.*}}]
// CHECK:                 memref.store %{{.*}}, %[[DOT:.*]][%[[ROW]]] : memref<4xf32>
// CHECK:             } else {
// CHECK:             vector.store %[[PREV]], %[[VEC:.*]][
// CHECK:             scf.for %[[I:[^ ]+]] =
// CHECK-NOT:           arith.subi
// CHECK:               scf.for %[[K:[^ ]+]] =
// CHECK:                 vector.load %[[VEC]][%[[K]]]
// CHECK:                 vector.load %[[WHH]]
// CHECK:                 vector.fma
// CHECK:               vector.reduction <add>
// CHECK:             %[[XP:.*]] = vector.load %[[P]][%[[S]], %[[B]], %{{.*}}]
// CHECK:             %[[SUM:.*]] = arith.addf %[[XP]]
// CHECK:             %[[NEXT:.*]] = math.tanh %[[SUM]]
// CHECK:             scf.if %[[FLAG]] {
// CHECK-NEXT:          arith.constant 0
// CHECK-NEXT:          vector.store %[[NEXT]], %[[GATES]][%[[S]], %[[B]]
// CHECK:             vector.store %[[NEXT]], %[[OUT]][%[[S]], %[[B]]
// CHECK:             vector.store %[[NEXT]], %[[HIST]][%[[S]], %[[B]]
// CHECK:             scf.yield %[[NEXT]]

// CHECK-LABEL: func.func @elman_bwd
// CHECK-SAME:    %[[RESETS:[^:]+]]: memref<?x?xi8>, %[[H0:[^:]+]]: memref<?x4xf32>, %[[START:[^:]+]]: memref<?x4xf32>,
// CHECK-SAME:    %[[HIST:[^:]+]]: memref<?x?x4xf32>, %[[GATES:[^:]+]]: memref<?x?x4xf32>, %[[DOUT:[^:]+]]: memref<?x?x4xf32>, %[[DFINAL:[^:]+]]: memref<?x4xf32>,
// CHECK-SAME:    %[[DH0:[^:]+]]: memref<?x4xf32>, %[[DX:[^:]+]]: memref<?x?x3xf32>, %[[DP:[^:]+]]: memref<?x?x4xf32>, %[[ROWS:[^:]+]]: memref<?x?x4xf32>, %[[VECS:[^:]+]]: memref<?x?x4xf32>, %[[DSTART:[^:]+]]: memref<?x4xf32>,
// CHECK:         %[[FLAG:.*]] = cell.save_gates : i1
// CHECK:         %[[T:.*]] = memref.dim %[[RESETS]]
// CHECK:         %[[LAST:.*]] = arith.subi %[[T]], %{{.*}}
// CHECK:         scf.for %[[B:[^ ]+]] =
// CHECK:           %[[INIT:.*]] = vector.load %[[H0]][%[[B]]
// CHECK:           %[[FROM:.*]] = vector.load %[[START]][%[[B]]
// CHECK:           %[[G0:.*]] = vector.load %[[DFINAL]][%[[B]]
// CHECK:           %[[RES:.*]]:3 = scf.for %[[I:.*]] = {{.*}} iter_args(%[[DS:.*]] = %[[G0]], %[[ACCI:.*]] = %{{.*}}, %[[ACCS:.*]] = %{{.*}})
// Time runs backwards; the previous state is the initial one at a reset,
// the start state at t = 0, else the history at t - 1.
// CHECK:             %[[S:.*]] = arith.subi %[[LAST]], %[[I]]
// CHECK:             %[[ISR:.*]] = arith.cmpi ne
// CHECK:             %[[FIRST:.*]] = arith.cmpi eq, %[[S]]
// CHECK:             %[[NOTR:.*]] = arith.xori %[[ISR]]
// CHECK:             %[[FROMSTART:.*]] = arith.andi %[[FIRST]], %[[NOTR]]
// CHECK:             %[[OUTSIDE:.*]] = arith.ori %[[ISR]], %[[FIRST]]
// CHECK:             %[[STORED:.*]] = vector.load %[[HIST]]
// CHECK:             %[[BEFORE:.*]] = arith.select %[[FIRST]], %[[FROM]], %[[STORED]]
// CHECK:             %[[PREV:.*]] = arith.select %[[ISR]], %[[INIT]], %[[BEFORE]]
// CHECK:             %[[GOUT:.*]] = vector.load %[[DOUT]][%[[S]], %[[B]]
// Saved gates are loaded, or the step is replayed.
// CHECK:             %[[TH:.*]] = scf.if %[[FLAG]] -> (vector<4xf32>) {
// CHECK:               vector.load %[[GATES]][%[[S]], %[[B]]
// CHECK:             } else {
// CHECK:               math.tanh
// CHECK:             }
// CHECK:             %[[G:.*]] = arith.addf %[[GOUT]], %[[DS]]
// The state gradient goes to the initial state at a reset, to the start
// state at t = 0, else on in time (routeStateGrad); the first two add to
// their accumulators.
// CHECK:             %[[INITPART:.*]] = arith.select %[[ISR]], %[[DHP:[^,]*]], %[[Z:[^ ]*]] :
// CHECK:             %[[STARTPART:.*]] = arith.select %[[FROMSTART]], %[[DHP]], %[[Z]] :
// CHECK:             %[[ONWARD:.*]] = arith.select %[[OUTSIDE]], %[[Z]], %[[DHP]] :
// CHECK:             %[[TOINIT:.*]] = arith.addf %{{.*}}, %[[INITPART]]
// CHECK:             %[[TOSTART:.*]] = arith.addf %{{.*}}, %[[STARTPART]]
// CHECK:             vector.store %{{.*}}, %[[DX]][%[[S]], %[[B]]
// The pre-activation's gradient is W_ih's projection's and W_hh's rows'
// (same_as: one buffer), stored once.
// CHECK:             vector.store %[[DPRE:.*]], %[[DP]][%[[S]], %[[B]]
// CHECK-NOT:         %[[ROWS]][
// CHECK:             vector.store %[[PREV]], %[[VECS]][%[[S]], %[[B]]
// CHECK:             scf.yield %[[ONWARD]], %[[TOINIT]], %[[TOSTART]]
// CHECK:           vector.store %[[RES]]#1, %[[DH0]][%[[B]]
// CHECK:           vector.store %[[RES]]#2, %[[DSTART]][%[[B]]

// CANON-LABEL: func.func @elman_fwd
// CANON-NOT:     = cell.
// CANON-LABEL: func.func @elman_bwd
// CANON-NOT:     = cell.
// CANON-NOT:     math.tanh
// CANON:         return
cell.def @elman inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs("h") {
  %0 = cell.param "W_ih" : tensor<4x3xf32>
  %1 = cell.param "W_hh" : tensor<4x4xf32>
  %2 = cell.param "b_ih" : tensor<4xf32>
  %3 = cell.param "b_hh" : tensor<4xf32>
  %4 = cell.matvec %1, %h : tensor<4x4xf32>, tensor<4xf32> -> tensor<4xf32>
  %5 = cell.projection %0, %x biases(%2, %3 : tensor<4xf32>, tensor<4xf32>) : tensor<4x3xf32>, tensor<3xf32> -> tensor<4xf32>
  %6 = cell.add %5, %4 : tensor<4xf32>
  %7 = cell.tanh %6 : tensor<4xf32>
  cell.save %7 : tensor<4xf32>
  cell.yield states(%7 : tensor<4xf32>) outputs(%7 : tensor<4xf32>)
}
func.func @elman_grad(%arg0: tensor<3xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>, %arg3: tensor<4xf32>) -> (tensor<4xf32>, tensor<3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) attributes {cell.grad_of = @elman, cell.grad_results = [#cell.grad<state "h">, #cell.grad<input "x">, #cell.grad<projection "W_ih", input = "x", biases = ["b_ih", "b_hh"]>, #cell.grad<weight_rows "W_hh">, #cell.grad<weight_vectors "W_hh">]} {
  %0 = cell.param "W_ih" : tensor<4x3xf32>
  %1 = cell.param "W_hh" : tensor<4x4xf32>
  %2 = cell.param "b_ih" : tensor<4xf32>
  %3 = cell.param "b_hh" : tensor<4xf32>
  %4 = cell.restore -> tensor<4xf32> {
    %12 = cell.matvec %1, %arg1 : tensor<4x4xf32>, tensor<4xf32> -> tensor<4xf32>
    %13 = cell.projection %0, %arg0 biases(%2, %3 : tensor<4xf32>, tensor<4xf32>) : tensor<4x3xf32>, tensor<3xf32> -> tensor<4xf32>
    %14 = cell.add %13, %12 : tensor<4xf32>
    %15 = cell.tanh %14 : tensor<4xf32>
    cell.restore_yield %15 : tensor<4xf32>
  }
  %5 = cell.add %arg2, %arg3 : tensor<4xf32>
  %6 = cell.mul %4, %4 : tensor<4xf32>
  %7 = cell.constant 1.000000e+00 : tensor<4xf32>
  %8 = cell.sub %7, %6 : tensor<4xf32>
  %9 = cell.mul %5, %8 : tensor<4xf32>
  %10 = cell.vecmat %1, %9 : tensor<4x4xf32>, tensor<4xf32> -> tensor<4xf32>
  %11 = cell.constant 0.000000e+00 : tensor<3xf32>
  return %10, %11, %9, %9, %arg1 : tensor<4xf32>, tensor<3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// The tuned matvec: two rows per iteration (step 2), each in two pieces of
// two lanes accumulated by FMA, then reduced once per row.
// TUNED-LABEL: func.func @elman_fwd
// TUNED:         %[[C2:.*]] = arith.constant 2 : index
// TUNED:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %[[C2]]
// TUNED:           scf.for %{{.*}} = %{{.*}} to %{{.*}} step %[[C2]] iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (vector<2xf32>, vector<2xf32>)
// TUNED-COUNT-2:     vector.fma {{.*}} : vector<2xf32>
// TUNED:           vector.reduction <add>, %{{.*}} : vector<2xf32> into f32
// TUNED:           vector.reduction <add>, %{{.*}} : vector<2xf32> into f32

// CLIWIDTH: lstm.cell:7:45: error: matvec-width=5 and matvec-unroll=1 must divide the weight's columns (12) and rows (48)
// BADWIDTH: error: matvec-width=3 and matvec-unroll=1 must divide the weight's columns (4) and rows (4)
