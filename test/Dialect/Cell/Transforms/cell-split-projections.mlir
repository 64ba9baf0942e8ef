// RUN: cellc-opt %s --split-input-file --cell-split-projections | FileCheck %s
// Matvecs on inputs, with their bias params, become projections; matvecs
// that read a state stay in the step.

// Both input biases join the projection: b_hh is added after the recurrent
// matvec, and addition is reassociated to hoist it.
// CHECK-LABEL: cell.def @lstm
// CHECK-DAG:     %[[WIH:.*]] = cell.param "W_ih"
// CHECK-DAG:     %[[WHH:.*]] = cell.param "W_hh"
// CHECK-DAG:     %[[BIH:.*]] = cell.param "b_ih"
// CHECK-DAG:     %[[BHH:.*]] = cell.param "b_hh"
// CHECK:         %[[REC:.*]] = cell.matvec %[[WHH]], %h
// CHECK:         %[[P:.*]] = cell.projection %[[WIH]], %x biases(%[[BIH]], %[[BHH]] : tensor<8xf32>, tensor<8xf32>)
// CHECK:         %[[G:.*]] = cell.add %[[P]], %[[REC]]
// CHECK:         cell.chunk %[[G]]
// CHECK-NOT:     cell.matvec %[[WIH]]
cell.def @lstm inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>, %c: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_ih" : tensor<8x3xf32>
  %1 = cell.param "W_hh" : tensor<8x2xf32>
  %2 = cell.param "b_ih" : tensor<8xf32>
  %3 = cell.param "b_hh" : tensor<8xf32>
  %4 = cell.matvec %0, %x : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  %5 = cell.add %4, %2 : tensor<8xf32>
  %6 = cell.matvec %1, %h : tensor<8x2xf32>, tensor<2xf32> -> tensor<8xf32>
  %7 = cell.add %5, %6 : tensor<8xf32>
  %8 = cell.add %7, %3 : tensor<8xf32>
  %9:4 = cell.chunk %8 : tensor<8xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %10 = cell.sigmoid %9#1 : tensor<2xf32>
  %11 = cell.mul %10, %c : tensor<2xf32>
  %12 = cell.sigmoid %9#0 : tensor<2xf32>
  %13 = cell.tanh %9#2 : tensor<2xf32>
  %14 = cell.mul %12, %13 : tensor<2xf32>
  %15 = cell.add %11, %14 : tensor<2xf32>
  %16 = cell.sigmoid %9#3 : tensor<2xf32>
  %17 = cell.tanh %15 : tensor<2xf32>
  %18 = cell.mul %16, %17 : tensor<2xf32>
  cell.yield states(%18, %15 : tensor<2xf32>, tensor<2xf32>) outputs(%18 : tensor<2xf32>)
}

// -----

// The GRU's r * (W_hn h + b_hn) keeps b_hh in the step; b_ih joins the
// projection.
// CHECK-LABEL: cell.def @gru
// CHECK-DAG:     %[[WIH:.*]] = cell.param "W_ih"
// CHECK-DAG:     %[[WHH:.*]] = cell.param "W_hh"
// CHECK-DAG:     %[[BIH:.*]] = cell.param "b_ih"
// CHECK-DAG:     %[[BHH:.*]] = cell.param "b_hh"
// CHECK:         %[[P:.*]] = cell.projection %[[WIH]], %x biases(%[[BIH]] : tensor<6xf32>)
// CHECK:         cell.chunk %[[P]]
// CHECK:         %[[REC:.*]] = cell.matvec %[[WHH]], %h
// CHECK:         %[[RB:.*]] = cell.add %[[REC]], %[[BHH]]
// CHECK:         cell.chunk %[[RB]]
cell.def @gru inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_ih" : tensor<6x3xf32>
  %1 = cell.param "W_hh" : tensor<6x2xf32>
  %2 = cell.param "b_ih" : tensor<6xf32>
  %3 = cell.param "b_hh" : tensor<6xf32>
  %4 = cell.matvec %0, %x : tensor<6x3xf32>, tensor<3xf32> -> tensor<6xf32>
  %5 = cell.add %4, %2 : tensor<6xf32>
  %6:3 = cell.chunk %5 : tensor<6xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %7 = cell.matvec %1, %h : tensor<6x2xf32>, tensor<2xf32> -> tensor<6xf32>
  %8 = cell.add %7, %3 : tensor<6xf32>
  %9:3 = cell.chunk %8 : tensor<6xf32> -> tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  %10 = cell.add %6#0, %9#0 : tensor<2xf32>
  %11 = cell.sigmoid %10 : tensor<2xf32>
  %12 = cell.add %6#1, %9#1 : tensor<2xf32>
  %13 = cell.sigmoid %12 : tensor<2xf32>
  %14 = cell.mul %11, %9#2 : tensor<2xf32>
  %15 = cell.add %6#2, %14 : tensor<2xf32>
  %16 = cell.tanh %15 : tensor<2xf32>
  %17 = cell.constant 1.000000e+00 : tensor<2xf32>
  %18 = cell.sub %17, %13 : tensor<2xf32>
  %19 = cell.mul %18, %16 : tensor<2xf32>
  %20 = cell.mul %13, %h : tensor<2xf32>
  %21 = cell.add %19, %20 : tensor<2xf32>
  cell.yield states(%21 : tensor<2xf32>) outputs(%21 : tensor<2xf32>)
}

// -----

// Two inputs: one projection each, the bias with the first.
// CHECK-LABEL: cell.def @two_inputs
// CHECK-DAG:     %[[W:.*]] = cell.param "W"
// CHECK-DAG:     %[[U:.*]] = cell.param "U"
// CHECK-DAG:     %[[R:.*]] = cell.param "R"
// CHECK-DAG:     %[[B:.*]] = cell.param "b"
// CHECK:         %[[REC:.*]] = cell.matvec %[[R]], %h
// CHECK:         %[[PX:.*]] = cell.projection %[[W]], %x biases(%[[B]] : tensor<2xf32>)
// CHECK:         %[[PY:.*]] = cell.projection %[[U]], %y :
// CHECK:         %[[S:.*]] = cell.add %[[PX]], %[[PY]]
// CHECK:         %[[T:.*]] = cell.add %[[S]], %[[REC]]
// CHECK:         cell.tanh %[[T]]
cell.def @two_inputs inputs(%x: tensor<3xf32>, %y: tensor<4xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W" : tensor<2x3xf32>
  %1 = cell.param "U" : tensor<2x4xf32>
  %2 = cell.param "R" : tensor<2x2xf32>
  %3 = cell.param "b" : tensor<2xf32>
  %4 = cell.matvec %0, %x : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %5 = cell.matvec %2, %h : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %6 = cell.add %4, %5 : tensor<2xf32>
  %7 = cell.matvec %1, %y : tensor<2x4xf32>, tensor<4xf32> -> tensor<2xf32>
  %8 = cell.add %6, %7 : tensor<2xf32>
  %9 = cell.add %8, %3 : tensor<2xf32>
  %10 = cell.tanh %9 : tensor<2xf32>
  cell.yield states(%10 : tensor<2xf32>) outputs(%10 : tensor<2xf32>)
}

// -----

// No recurrent matvec: the state only meets a vector param elementwise.
// CHECK-LABEL: cell.def @indrnn
// CHECK-DAG:     %[[W:.*]] = cell.param "W"
// CHECK-DAG:     %[[U:.*]] = cell.param "u"
// CHECK-DAG:     %[[B:.*]] = cell.param "b"
// CHECK:         %[[UH:.*]] = cell.mul %[[U]], %h
// CHECK:         %[[P:.*]] = cell.projection %[[W]], %x biases(%[[B]] : tensor<2xf32>)
// CHECK:         %[[S:.*]] = cell.add %[[P]], %[[UH]]
// CHECK:         cell.relu %[[S]]
// CHECK-NOT:     cell.matvec
cell.def @indrnn inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W" : tensor<2x3xf32>
  %1 = cell.param "u" : tensor<2xf32>
  %2 = cell.param "b" : tensor<2xf32>
  %3 = cell.matvec %0, %x : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %4 = cell.mul %1, %h : tensor<2xf32>
  %5 = cell.add %3, %4 : tensor<2xf32>
  %6 = cell.add %5, %2 : tensor<2xf32>
  %7 = cell.relu %6 : tensor<2xf32>
  cell.yield states(%7 : tensor<2xf32>) outputs(%7 : tensor<2xf32>)
}

// -----

// MGU: U_h @ (f * h) reads a value computed from the state and stays.
// CHECK-LABEL: cell.def @mgu
// CHECK-DAG:     %[[WF:.*]] = cell.param "W_f"
// CHECK-DAG:     %[[WH:.*]] = cell.param "W_h"
// CHECK-DAG:     %[[UH:.*]] = cell.param "U_h"
// CHECK:         cell.projection %[[WF]], %x
// CHECK:         %[[FH:.*]] = cell.mul %{{.*}}, %h
// CHECK:         %[[REC:.*]] = cell.matvec %[[UH]], %[[FH]]
// CHECK:         %[[P:.*]] = cell.projection %[[WH]], %x
// CHECK:         cell.add %[[P]], %[[REC]]
cell.def @mgu inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W_f" : tensor<2x3xf32>
  %1 = cell.param "U_f" : tensor<2x2xf32>
  %2 = cell.param "b_f" : tensor<2xf32>
  %3 = cell.param "W_h" : tensor<2x3xf32>
  %4 = cell.param "U_h" : tensor<2x2xf32>
  %5 = cell.param "b_h" : tensor<2xf32>
  %6 = cell.matvec %0, %x : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %7 = cell.matvec %1, %h : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %8 = cell.add %6, %7 : tensor<2xf32>
  %9 = cell.add %8, %2 : tensor<2xf32>
  %10 = cell.sigmoid %9 : tensor<2xf32>
  %11 = cell.matvec %3, %x : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %12 = cell.mul %10, %h : tensor<2xf32>
  %13 = cell.matvec %4, %12 : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %14 = cell.add %11, %13 : tensor<2xf32>
  %15 = cell.add %14, %5 : tensor<2xf32>
  %16 = cell.tanh %15 : tensor<2xf32>
  %17 = cell.constant 1.000000e+00 : tensor<2xf32>
  %18 = cell.sub %17, %10 : tensor<2xf32>
  %19 = cell.mul %18, %h : tensor<2xf32>
  %20 = cell.mul %10, %16 : tensor<2xf32>
  %21 = cell.add %19, %20 : tensor<2xf32>
  cell.yield states(%21 : tensor<2xf32>) outputs(%21 : tensor<2xf32>)
}

// -----

// A matvec on a value computed from an input is left in the step: there is
// no prologue kernel to compute that value before the GEMM yet.
// CHECK-LABEL: cell.def @computed_input
// CHECK-NOT:     cell.projection
// CHECK:         %[[TX:.*]] = cell.tanh %x
// CHECK:         cell.matvec %{{.*}}, %[[TX]]
// CHECK-NOT:     cell.projection
cell.def @computed_input inputs(%x: tensor<3xf32>) states(%h: tensor<2xf32>) outputs("h") {
  %0 = cell.param "W" : tensor<2x3xf32>
  %1 = cell.param "R" : tensor<2x2xf32>
  %2 = cell.tanh %x : tensor<3xf32>
  %3 = cell.matvec %0, %2 : tensor<2x3xf32>, tensor<3xf32> -> tensor<2xf32>
  %4 = cell.matvec %1, %h : tensor<2x2xf32>, tensor<2xf32> -> tensor<2xf32>
  %5 = cell.add %3, %4 : tensor<2xf32>
  %6 = cell.tanh %5 : tensor<2xf32>
  cell.yield states(%6 : tensor<2xf32>) outputs(%6 : tensor<2xf32>)
}
