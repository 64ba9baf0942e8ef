// RUN: cellc-opt %s --split-input-file --cell-autodiff | FileCheck %s
// The derivative of each op, as cell-autodiff builds it into <cell>_grad. The
// backward step's arguments are the inputs, the previous states, the output
// gradients and the next-state gradients.

// d(-h) = -g
// CHECK-LABEL: func.func @d_neg_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[D:.*]] = cell.neg %[[G]]
// CHECK:         return %[[D]]
cell.def @d_neg inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.neg %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d sigmoid(h) = g * s * (1 - s), from the saved result s.
// CHECK-LABEL: func.func @d_sigmoid_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[S:.*]] = cell.restore -> tensor<4xf32> {
// CHECK-NEXT:      %[[R:.*]] = cell.sigmoid %[[H]]
// CHECK-NEXT:      cell.restore_yield %[[R]]
// CHECK:         %[[ONE:.*]] = cell.constant 1.0
// CHECK:         %[[OMS:.*]] = cell.sub %[[ONE]], %[[S]]
// CHECK:         %[[DS:.*]] = cell.mul %[[S]], %[[OMS]]
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[DS]]
// CHECK:         return %[[D]]
cell.def @d_sigmoid inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.sigmoid %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d tanh(h) = g * (1 - t * t), from the result t.
// CHECK-LABEL: func.func @d_tanh_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[T:.*]] = cell.restore -> tensor<4xf32>
// CHECK:         %[[TT:.*]] = cell.mul %[[T]], %[[T]]
// CHECK:         %[[ONE:.*]] = cell.constant 1.0
// CHECK:         %[[OM:.*]] = cell.sub %[[ONE]], %[[TT]]
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[OM]]
// CHECK:         return %[[D]]
cell.def @d_tanh inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.tanh %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d exp(h) = g * exp(h), from the result.
// CHECK-LABEL: func.func @d_exp_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[E:.*]] = cell.restore -> tensor<4xf32>
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[E]]
// CHECK:         return %[[D]]
cell.def @d_exp inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.exp %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d log(h) = g / h: nothing to save.
// CHECK-LABEL: func.func @d_log_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         cell.restore {
// CHECK:         %[[D:.*]] = cell.div %[[G]], %[[H]]
// CHECK:         return %[[D]]
cell.def @d_log inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.log %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d relu(h) = g * (h > 0): the subgradient at 0 is 0.
// CHECK-LABEL: func.func @d_relu_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[Z:.*]] = cell.constant 0.0
// CHECK:         %[[M:.*]] = cell.greater %[[H]], %[[Z]]
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[M]]
// CHECK:         return %[[D]]
cell.def @d_relu inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.relu %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d softplus(h) = g * sigmoid(h).
// CHECK-LABEL: func.func @d_softplus_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[S:.*]] = cell.sigmoid %[[H]]
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[S]]
// CHECK:         return %[[D]]
cell.def @d_softplus inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.softplus %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d |h| = g * sign(h), with sign(0) = 0.
// CHECK-LABEL: func.func @d_abs_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[Z:.*]] = cell.constant 0.0
// CHECK:         %[[POS:.*]] = cell.greater %[[H]], %[[Z]]
// CHECK:         %[[NEG:.*]] = cell.greater %[[Z]], %[[H]]
// CHECK:         %[[SIGN:.*]] = cell.sub %[[POS]], %[[NEG]]
// CHECK:         %[[D:.*]] = cell.mul %[[G]], %[[SIGN]]
// CHECK:         return %[[D]]
cell.def @d_abs inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.abs %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d sqrt(h) = g / (2 r), from the result r.
// CHECK-LABEL: func.func @d_sqrt_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[R:.*]] = cell.restore -> tensor<4xf32>
// CHECK:         %[[TWO:.*]] = cell.constant 2.0
// CHECK:         %[[TR:.*]] = cell.mul %[[TWO]], %[[R]]
// CHECK:         %[[D:.*]] = cell.div %[[G]], %[[TR]]
// CHECK:         return %[[D]]
cell.def @d_sqrt inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.sqrt %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d(h + x) = (g, g).
// CHECK-LABEL: func.func @d_add_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<4xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         return %[[G]], %[[G]]
cell.def @d_add inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  %y = cell.add %h, %x : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d(h - x) = (g, -g).
// CHECK-LABEL: func.func @d_sub_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<4xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[N:.*]] = cell.neg %[[G]]
// CHECK:         return %[[G]], %[[N]]
cell.def @d_sub inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  %y = cell.sub %h, %x : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d(h / x) = (g / x, -(g / x) * r), from the result r.
// CHECK-LABEL: func.func @d_div_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<4xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[R:.*]] = cell.restore -> tensor<4xf32>
// CHECK:         %[[DH:.*]] = cell.div %[[G]], %[[X]]
// CHECK:         %[[T:.*]] = cell.mul %[[DH]], %[[R]]
// CHECK:         %[[DX:.*]] = cell.neg %[[T]]
// CHECK:         return %[[DH]], %[[DX]]
cell.def @d_div inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  %y = cell.div %h, %x : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d max(h, x): the gradient goes to x where x > h, else to h (ties to h).
// CHECK-LABEL: func.func @d_max_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<4xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[TOX:.*]] = cell.greater %[[X]], %[[H]]
// CHECK:         %[[ONE:.*]] = cell.constant 1.0
// CHECK:         %[[TOH:.*]] = cell.sub %[[ONE]], %[[TOX]]
// CHECK:         %[[DH:.*]] = cell.mul %[[G]], %[[TOH]]
// CHECK:         %[[DX:.*]] = cell.mul %[[G]], %[[TOX]]
// CHECK:         return %[[DH]], %[[DX]]
cell.def @d_max inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  %y = cell.max %h, %x : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// d min(h, x): the gradient goes to x where h > x, else to h (ties to h).
// CHECK-LABEL: func.func @d_min_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<4xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[TOX:.*]] = cell.greater %[[H]], %[[X]]
// CHECK:         %[[ONE:.*]] = cell.constant 1.0
// CHECK:         %[[TOH:.*]] = cell.sub %[[ONE]], %[[TOX]]
// CHECK:         %[[DH:.*]] = cell.mul %[[G]], %[[TOH]]
// CHECK:         %[[DX:.*]] = cell.mul %[[G]], %[[TOX]]
// CHECK:         return %[[DH]], %[[DX]]
cell.def @d_min inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  %y = cell.min %h, %x : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// h * h is one value used twice: both contributions are summed.
// CHECK-LABEL: func.func @d_square_grad
// CHECK-SAME:    (%[[H:[^:]+]]: tensor<4xf32>, %[[G:[^:]+]]: tensor<4xf32>)
// CHECK:         %[[A:.*]] = cell.mul %[[G]], %[[H]]
// CHECK:         %[[B:.*]] = cell.mul %[[G]], %[[H]]
// CHECK:         %[[D:.*]] = cell.add %[[A]], %[[B]]
// CHECK:         return %[[D]]
cell.def @d_square inputs() states(%h: tensor<4xf32>) outputs() {
  %y = cell.mul %h, %h : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// A matvec on a param: the vector's gradient is the transposed product; the
// weight's comes out as rows (result gradient, vector) for the GEMM.
// CHECK-LABEL: func.func @d_matvec_grad
// CHECK-SAME:    cell.grad_results = [#cell.grad<state "h">, #cell.grad<weight_rows "W">, #cell.grad<weight_vectors "W">]
// CHECK:         %[[W:.*]] = cell.param "W"
// CHECK:         %[[D:.*]] = cell.vecmat %[[W]], %[[G:[^ ]+]]
// CHECK:         return %[[D]], %[[G]], %{{.*}} :
cell.def @d_matvec inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x4xf32>
  %y = cell.matvec %w, %h : tensor<4x4xf32>, tensor<4xf32> -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// A chunk whose middle part is unused: zeros fill its place in the concat.
// CHECK-LABEL: func.func @d_chunk_grad
// CHECK:         %[[P:.*]]:2 = cell.restore -> tensor<4xf32>, tensor<4xf32>
// CHECK:         %[[D0:.*]] = cell.mul %{{.*}}, %[[P]]#1
// CHECK:         %[[D2:.*]] = cell.mul %{{.*}}, %[[P]]#0
// CHECK:         %[[Z:.*]] = cell.constant 0.0
// CHECK:         %[[CAT:.*]] = cell.concat %[[D0]], %[[Z]], %[[D2]] : tensor<4xf32>, tensor<4xf32>, tensor<4xf32> -> tensor<12xf32>
// CHECK:         cell.vecmat %{{.*}}, %[[CAT]]
cell.def @d_chunk inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<12x4xf32>
  %g = cell.matvec %w, %h : tensor<12x4xf32>, tensor<4xf32> -> tensor<12xf32>
  %a:3 = cell.chunk %g : tensor<12xf32> -> tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
  %y = cell.mul %a#0, %a#2 : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

// A projection's gradient leaves the step for the GEMMs; the input it reads
// gets zeros in the step. The output and the next state are the same value:
// their gradients add. The vector param u is summed by the kernel.
// CHECK-LABEL: func.func @d_projection_grad
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<3xf32>, %[[H:[^:]+]]: tensor<4xf32>, %[[GY:[^:]+]]: tensor<4xf32>, %[[GH:[^:]+]]: tensor<4xf32>)
// CHECK-SAME:    cell.grad_results = [#cell.grad<state "h">, #cell.grad<input "x">, #cell.grad<projection "W", input = "x", biases = ["b"]>, #cell.grad<param "u">]
// CHECK:         %[[U:.*]] = cell.param "u"
// CHECK:         %[[G:.*]] = cell.add %[[GY]], %[[GH]]
// CHECK:         %[[DU:.*]] = cell.mul %[[G]], %[[H]]
// CHECK:         %[[DH:.*]] = cell.mul %[[G]], %[[U]]
// CHECK:         %[[DX:.*]] = cell.constant 0.0{{.*}} : tensor<3xf32>
// CHECK:         return %[[DH]], %[[DX]], %[[G]], %[[DU]]
cell.def @d_projection inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs("y") {
  %w = cell.param "W" : tensor<4x3xf32>
  %b = cell.param "b" : tensor<4xf32>
  %u = cell.param "u" : tensor<4xf32>
  %p = cell.projection %w, %x biases(%b : tensor<4xf32>) : tensor<4x3xf32>, tensor<3xf32> -> tensor<4xf32>
  %uh = cell.mul %u, %h : tensor<4xf32>
  %y = cell.add %p, %uh : tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>) outputs(%y : tensor<4xf32>)
}

// -----

// A state passed through unchanged passes its gradient through.
// CHECK-LABEL: func.func @d_pass_through_grad
// CHECK-SAME:    (%{{[^:]+}}: tensor<4xf32>, %{{[^:]+}}: tensor<4xf32>, %{{[^:]+}}: tensor<4xf32>, %[[GC:[^:]+]]: tensor<4xf32>)
// CHECK:         return %{{.*}}, %[[GC]] :
cell.def @d_pass_through inputs() states(%h: tensor<4xf32>, %c: tensor<4xf32>) outputs() {
  %y = cell.tanh %h : tensor<4xf32>
  cell.yield states(%y, %c : tensor<4xf32>, tensor<4xf32>)
}
