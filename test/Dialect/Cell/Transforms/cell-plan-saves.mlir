// RUN: cellc-opt %s --split-input-file --cell-autodiff | cellc-opt --split-input-file --cell-plan-saves | FileCheck %s
// RUN: not cellc-opt %s --split-input-file --cell-plan-saves 2>&1 | FileCheck %s --check-prefix=NOGRAD
// What the backward reads and the forward saves, per cell.

// NOGRAD: error: 'cell.def' op has no backward step; run cell-autodiff first

// LSTM: the four activated gates and tanh(c) are saved; the backward's replay
// keeps only what produces them.
// CHECK-LABEL: cell.def @lstm
// CHECK:         %[[F:.*]] = cell.sigmoid %{{.*}}#1
// CHECK:         %[[I:.*]] = cell.sigmoid %{{.*}}#0
// CHECK:         %[[G:.*]] = cell.tanh %{{.*}}#2
// CHECK:         %[[O:.*]] = cell.sigmoid %{{.*}}#3
// CHECK:         %[[TC:.*]] = cell.tanh
// CHECK:         cell.save %[[F]], %[[I]], %[[G]], %[[O]], %[[TC]] : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
// CHECK-NEXT:    cell.yield
// CHECK-LABEL: func.func @lstm_grad
// CHECK:         %{{.*}}:5 = cell.restore -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32> {
// CHECK:           cell.matvec
// CHECK:           cell.projection
// CHECK:           cell.restore_yield %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} :
// CHECK-NEXT:    }
cell.def @lstm inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>, %c: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_ih" : tensor<8x3xf32>
  %1 = cell.param "W_hh" : tensor<8x2xf32>
  %2 = cell.param "b_ih" : tensor<8xf32>
  %3 = cell.param "b_hh" : tensor<8xf32>
  %4 = cell.matvec %1, %h : tensor<8x2xf32>, tensor<2xf32> -> tensor<8xf32>
  %5 = cell.projection %0, %x biases(%2, %3 : tensor<8xf32>, tensor<8xf32>) : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  %6 = cell.add %5, %4 : tensor<8xf32>
  %7:4 = cell.chunk %6 : tensor<8xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %8 = cell.sigmoid %7#1 : tensor<2xf32>
  %9 = cell.mul %8, %c : tensor<2xf32>
  %10 = cell.sigmoid %7#0 : tensor<2xf32>
  %11 = cell.tanh %7#2 : tensor<2xf32>
  %12 = cell.mul %10, %11 : tensor<2xf32>
  %13 = cell.add %9, %12 : tensor<2xf32>
  %14 = cell.sigmoid %7#3 : tensor<2xf32>
  %15 = cell.tanh %13 : tensor<2xf32>
  %16 = cell.mul %14, %15 : tensor<2xf32>
  cell.yield states(%16, %13 : tensor<2xf32>, tensor<2xf32>) outputs(%16 : tensor<2xf32>)
}

// -----

// GRU: 1 - z is recomputed from z after the restore, not saved.
// CHECK-LABEL: cell.def @gru
// CHECK:         cell.chunk
// CHECK:         %[[HG:.*]]:3 = cell.chunk
// CHECK:         %[[R:.*]] = cell.sigmoid
// CHECK:         %[[Z:.*]] = cell.sigmoid
// CHECK:         %[[N:.*]] = cell.tanh
// CHECK:         cell.save %[[HG]]#2, %[[R]], %[[Z]], %[[N]] :
// CHECK-LABEL: func.func @gru_grad
// CHECK:         %[[ONE:.*]] = cell.constant 1.0
// CHECK:         %[[S:.*]]:4 = cell.restore -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32> {
// CHECK:         }
// CHECK-NEXT:    %{{.*}} = cell.sub %[[ONE]], %[[S]]#2
cell.def @gru inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_ih" : tensor<6x3xf32>
  %1 = cell.param "W_hh" : tensor<6x2xf32>
  %2 = cell.param "b_ih" : tensor<6xf32>
  %3 = cell.param "b_hh" : tensor<6xf32>
  %4 = cell.projection %0, %x biases(%2 : tensor<6xf32>) : tensor<6x3xf32>, tensor<3xf32> -> tensor<6xf32>
  %5:3 = cell.chunk %4 : tensor<6xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %6 = cell.matvec %1, %h : tensor<6x2xf32>, tensor<2xf32> -> tensor<6xf32>
  %7 = cell.add %6, %3 : tensor<6xf32>
  %8:3 = cell.chunk %7 : tensor<6xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %9 = cell.add %5#0, %8#0 : tensor<2xf32>
  %10 = cell.sigmoid %9 : tensor<2xf32>
  %11 = cell.add %5#1, %8#1 : tensor<2xf32>
  %12 = cell.sigmoid %11 : tensor<2xf32>
  %13 = cell.mul %10, %8#2 : tensor<2xf32>
  %14 = cell.add %5#2, %13 : tensor<2xf32>
  %15 = cell.tanh %14 : tensor<2xf32>
  %16 = cell.constant 1.000000e+00 : tensor<2xf32>
  %17 = cell.sub %16, %12 : tensor<2xf32>
  %18 = cell.mul %17, %15 : tensor<2xf32>
  %19 = cell.mul %12, %h : tensor<2xf32>
  %20 = cell.add %18, %19 : tensor<2xf32>
  cell.yield states(%20 : tensor<2xf32>) outputs(%20 : tensor<2xf32>)
}

// -----

// MGU: the matvec's vector f * h is recomputed from the saved f and the
// previous state; f and n are saved.
// CHECK-LABEL: cell.def @mgu
// CHECK:         %[[F:.*]] = cell.sigmoid
// CHECK:         %[[N:.*]] = cell.tanh
// CHECK:         cell.save %[[F]], %[[N]] : tensor<2xf32>, tensor<2xf32>
// CHECK-LABEL: func.func @mgu_grad
// CHECK-SAME:    (%{{[^:]+}}: tensor<3xf32>, %[[H:[^:]+]]: tensor<2xf32>
// CHECK:         %[[S:.*]]:2 = cell.restore
// CHECK:         }
// CHECK-NEXT:    %[[FH:.*]] = cell.mul %[[S]]#0, %[[H]]
// CHECK:         return {{.*}}%[[FH]] :
cell.def @mgu inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_f" : tensor<2x3xf32>
  %1 = cell.param "U_f" : tensor<2x2xf32>
  %2 = cell.param "b_f" : tensor<2xf32>
  %3 = cell.param "W_h" : tensor<2x3xf32>
  %4 = cell.param "U_h" : tensor<2x2xf32>
  %5 = cell.param "b_h" : tensor<2xf32>
  %6 = cell.matvec %1, %h : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %7 = cell.projection %0, %x biases(%2 : tensor<2xf32>) : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %8 = cell.add %7, %6 : tensor<2xf32>
  %9 = cell.sigmoid %8 : tensor<2xf32>
  %10 = cell.mul %9, %h : tensor<2xf32>
  %11 = cell.matvec %4, %10 : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %12 = cell.projection %3, %x biases(%5 : tensor<2xf32>) : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %13 = cell.add %12, %11 : tensor<2xf32>
  %14 = cell.tanh %13 : tensor<2xf32>
  %15 = cell.constant 1.000000e+00 : tensor<2xf32>
  %16 = cell.sub %15, %9 : tensor<2xf32>
  %17 = cell.mul %16, %h : tensor<2xf32>
  %18 = cell.mul %9, %14 : tensor<2xf32>
  %19 = cell.add %17, %18 : tensor<2xf32>
  cell.yield states(%19 : tensor<2xf32>) outputs(%19 : tensor<2xf32>)
}

// -----

// Nothing to save: the backward of log needs only its operand.
// CHECK-LABEL: cell.def @nothing
// CHECK:         cell.save{{$}}
// CHECK-LABEL: func.func @nothing_grad
// CHECK:         cell.restore {
// CHECK-NEXT:      cell.restore_yield{{$}}
// CHECK-NEXT:    }
cell.def @nothing inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.log %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// An expand of a value the replay computes (outer(k, s * u), as gated
// DeltaNet's outer(k, beta * u)): the backward reads it, but the plan keeps
// only s (for the sigmoid's derivative) and computes s * u and its expand
// again after the restore, rather than keeping the [2, 4] expand.
// CHECK-LABEL: cell.def @expanded
// CHECK:         %[[S:.*]] = cell.sigmoid
// CHECK:         cell.save %[[S]] : tensor<4xf32>{{$}}
// CHECK-LABEL: func.func @expanded_grad
// CHECK:         %[[R:.*]] = cell.restore -> tensor<4xf32> {
// CHECK:           cell.restore_yield %{{.*}} : tensor<4xf32>{{$}}
// CHECK-NEXT:    }
// CHECK:         %[[SU:.*]] = cell.mul %[[R]], %arg2 : tensor<4xf32>
// CHECK-NEXT:    cell.expand %[[SU]] {kept = array<i64: 1>, shape = array<i64: 2, 4>} : tensor<4xf32> -> tensor<8xf32>
cell.def @expanded inputs(%k: tensor<2xf32>, %v: tensor<4xf32>, %u: tensor<4xf32>) states(%C: tensor<8xf32>) outputs() {
  %s = cell.sigmoid %v : tensor<4xf32>
  %su = cell.mul %s, %u : tensor<4xf32>
  %ke = cell.expand %k {shape = array<i64: 2, 4>, kept = array<i64: 0>} : tensor<2xf32> -> tensor<8xf32>
  %se = cell.expand %su {shape = array<i64: 2, 4>, kept = array<i64: 1>} : tensor<4xf32> -> tensor<8xf32>
  %kv = cell.mul %ke, %se : tensor<8xf32>
  %next = cell.add %C, %kv : tensor<8xf32>
  cell.yield states(%next : tensor<8xf32>)
}
