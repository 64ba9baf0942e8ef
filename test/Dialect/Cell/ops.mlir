// RUN: cellc-opt %s | cellc-opt | FileCheck %s
// RUN: cellc-opt %s --mlir-print-op-generic | cellc-opt | FileCheck %s
// Every op of the cell dialect prints and parses back to itself.

// CHECK-LABEL: cell.def @every_op
// CHECK-SAME:    inputs(%[[X:[^:]+]]: tensor<3xf32>, %[[Y:[^:]+]]: tensor<4xf32>)
// CHECK-SAME:    states(%[[H:[^:]+]]: tensor<4xf32>, %[[C:[^:]+]]: tensor<4xf32>)
// CHECK-SAME:    outputs("h", "gate")
// CHECK-SAME:    attributes {sizes = {H = 4 : i64}}
cell.def @every_op inputs(%x: tensor<3xf32>, %y: tensor<4xf32>) states(%h: tensor<4xf32>, %c: tensor<4xf32>) outputs("h", "gate") attributes {sizes = {H = 4 : i64}} {
  // CHECK: %[[W:.*]] = cell.param "W" : tensor<8x3xf32>
  %w = cell.param "W" : tensor<8x3xf32>
  // CHECK: %[[B:.*]] = cell.param "b" : tensor<4xf32>
  %b = cell.param "b" : tensor<4xf32>
  // CHECK: %[[ONE:.*]] = cell.constant 1.000000e+00 : tensor<4xf32>
  %one = cell.constant 1.0 : tensor<4xf32>
  // CHECK: %[[MV:.*]] = cell.matvec %[[W]], %[[X]] : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  %mv = cell.matvec %w, %x : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  // CHECK: %[[P:.*]]:2 = cell.chunk %[[MV]] : tensor<8xf32> -> tensor<4xf32>, tensor<4xf32>
  %p:2 = cell.chunk %mv : tensor<8xf32> -> tensor<4xf32>, tensor<4xf32>
  // CHECK: %[[ADD:.*]] = cell.add %[[P]]#0, %[[B]] : tensor<4xf32>
  %add = cell.add %p#0, %b : tensor<4xf32>
  // CHECK: %[[SUB:.*]] = cell.sub %[[ADD]], %[[Y]] : tensor<4xf32>
  %sub = cell.sub %add, %y : tensor<4xf32>
  // CHECK: %[[MUL:.*]] = cell.mul %[[SUB]], %[[H]] : tensor<4xf32>
  %mul = cell.mul %sub, %h : tensor<4xf32>
  // CHECK: %[[DIV:.*]] = cell.div %[[MUL]], %[[ONE]] : tensor<4xf32>
  %div = cell.div %mul, %one : tensor<4xf32>
  // CHECK: %[[MAX:.*]] = cell.max %[[DIV]], %[[P]]#1 : tensor<4xf32>
  %max = cell.max %div, %p#1 : tensor<4xf32>
  // CHECK: %[[MIN:.*]] = cell.min %[[MAX]], %[[C]] : tensor<4xf32>
  %min = cell.min %max, %c : tensor<4xf32>
  // CHECK: %[[NEG:.*]] = cell.neg %[[MIN]] : tensor<4xf32>
  %neg = cell.neg %min : tensor<4xf32>
  // CHECK: %[[SIG:.*]] = cell.sigmoid %[[NEG]] : tensor<4xf32>
  %sig = cell.sigmoid %neg : tensor<4xf32>
  // CHECK: %[[TANH:.*]] = cell.tanh %[[SIG]] : tensor<4xf32>
  %tanh = cell.tanh %sig : tensor<4xf32>
  // CHECK: %[[EXP:.*]] = cell.exp %[[TANH]] : tensor<4xf32>
  %exp = cell.exp %tanh : tensor<4xf32>
  // CHECK: %[[LOG:.*]] = cell.log %[[EXP]] : tensor<4xf32>
  %log = cell.log %exp : tensor<4xf32>
  // CHECK: %[[RELU:.*]] = cell.relu %[[LOG]] : tensor<4xf32>
  %relu = cell.relu %log : tensor<4xf32>
  // CHECK: %[[SP:.*]] = cell.softplus %[[RELU]] : tensor<4xf32>
  %sp = cell.softplus %relu : tensor<4xf32>
  // CHECK: %[[ABS:.*]] = cell.abs %[[SP]] : tensor<4xf32>
  %abs = cell.abs %sp : tensor<4xf32>
  // CHECK: %[[SQRT:.*]] = cell.sqrt %[[ABS]] : tensor<4xf32>
  %sqrt = cell.sqrt %abs : tensor<4xf32>
  // CHECK: %[[SUM:.*]] = cell.sum %[[SQRT]] : tensor<4xf32> -> tensor<1xf32>
  %sum = cell.sum %sqrt : tensor<4xf32> -> tensor<1xf32>
  // CHECK: cell.broadcast %[[SUM]] : tensor<1xf32> -> tensor<4xf32>
  %bc = cell.broadcast %sum : tensor<1xf32> -> tensor<4xf32>
  // A [2, 2] matrix per sample, as a vector: its rows' sums, repeated.
  // CHECK: %[[ROWS:.*]] = cell.reduce %[[SQRT]] {kept = array<i64: 0>, shape = array<i64: 2, 2>} : tensor<4xf32> -> tensor<2xf32>
  %rows = cell.reduce %sqrt {shape = array<i64: 2, 2>, kept = array<i64: 0>} : tensor<4xf32> -> tensor<2xf32>
  // CHECK: cell.expand %[[ROWS]] {kept = array<i64: 0>, shape = array<i64: 2, 2>} : tensor<2xf32> -> tensor<4xf32>
  %spread = cell.expand %rows {shape = array<i64: 2, 2>, kept = array<i64: 0>} : tensor<2xf32> -> tensor<4xf32>
  // Each row's largest and smallest element.
  // CHECK: cell.reduce %[[SQRT]] {combine = "max", kept = array<i64: 0>, shape = array<i64: 2, 2>} : tensor<4xf32> -> tensor<2xf32>
  %rowmax = cell.reduce %sqrt {shape = array<i64: 2, 2>, kept = array<i64: 0>, combine = "max"} : tensor<4xf32> -> tensor<2xf32>
  // CHECK: cell.reduce %[[SQRT]] {combine = "min", kept = array<i64>, shape = array<i64: 4>} : tensor<4xf32> -> tensor<1xf32>
  %least = cell.reduce %sqrt {shape = array<i64: 4>, kept = array<i64>, combine = "min"} : tensor<4xf32> -> tensor<1xf32>
  // The functions that papers use.
  // CHECK: cell.rsqrt %[[SQRT]] : tensor<4xf32>
  %rsqrt = cell.rsqrt %sqrt : tensor<4xf32>
  // CHECK: cell.log1p %[[SQRT]] : tensor<4xf32>
  %log1p = cell.log1p %sqrt : tensor<4xf32>
  // CHECK: cell.sin %[[SQRT]] : tensor<4xf32>
  %sin = cell.sin %sqrt : tensor<4xf32>
  // CHECK: cell.cos %[[SQRT]] : tensor<4xf32>
  %cos = cell.cos %sqrt : tensor<4xf32>
  // CHECK: cell.erf %[[SQRT]] : tensor<4xf32>
  %erf = cell.erf %sqrt : tensor<4xf32>
  // CHECK: cell.silu %[[SQRT]] : tensor<4xf32>
  %silu = cell.silu %sqrt : tensor<4xf32>
  // CHECK: cell.gelu %[[SQRT]] : tensor<4xf32>
  %gelu = cell.gelu %sqrt : tensor<4xf32>
  // CHECK: cell.gelu_tanh %[[SQRT]] : tensor<4xf32>
  %gelut = cell.gelu_tanh %sqrt : tensor<4xf32>
  // CHECK: cell.elu %[[SQRT]] : tensor<4xf32>
  %elu = cell.elu %sqrt : tensor<4xf32>
  // CHECK: %[[POW:.*]] = cell.pow %[[SQRT]], %[[ABS]] : tensor<4xf32>
  %pow = cell.pow %sqrt, %abs : tensor<4xf32>
  // CHECK: cell.select %[[POW]], %[[SQRT]], %[[ABS]] : tensor<4xf32>
  %sel = cell.select %pow, %sqrt, %abs : tensor<4xf32>
  // CHECK: cell.yield states(%[[SQRT]], %[[C]] : tensor<4xf32>, tensor<4xf32>) outputs(%[[SQRT]], %[[SIG]] : tensor<4xf32>, tensor<4xf32>)
  cell.yield states(%sqrt, %c : tensor<4xf32>, tensor<4xf32>) outputs(%sqrt, %sig : tensor<4xf32>, tensor<4xf32>)
}

// -----

// A cell without inputs, in double precision.
// CHECK-LABEL: cell.def @autonomous
// CHECK-SAME:    inputs() states(%[[S:[^:]+]]: tensor<2xf64>) outputs()
cell.def @autonomous inputs() states(%s: tensor<2xf64>) outputs() {
  // CHECK: cell.yield states(%[[S]] : tensor<2xf64>)
  cell.yield states(%s : tensor<2xf64>)
}

// The attributes of the kernel interface: what each kernel argument and each
// backward result is.
// CHECK-LABEL: func.func @kernel_interface
// CHECK-SAME:    cell.grad_results = [#cell.grad<state "h">, #cell.grad<projection "W", input = "x", biases = ["b", "c"]>, #cell.grad<weight_rows "U">]
// CHECK-SAME:    cell.kernel_args = [#cell.arg<input "x">, #cell.arg<projection "W", input = "x", biases = ["b"]>, #cell.arg<weight_rows "U", same_as = 7>, #cell.arg<input_grad "x", zero>, #cell.arg<batch_end "b_end">]
func.func @kernel_interface() attributes {
    cell.kernel_args = [#cell.arg<input "x">,
                        #cell.arg<projection "W", input = "x", biases = ["b"]>,
                        #cell.arg<weight_rows "U", same_as = 7>,
                        #cell.arg<input_grad "x", zero>,
                        #cell.arg<batch_end "b_end">],
    cell.grad_results = [#cell.grad<state "h">,
                         #cell.grad<projection "W", input = "x", biases = ["b", "c"]>,
                         #cell.grad<weight_rows "U">]} {
  return
}

// The ops that the passes add: projections, comparisons, concats, vecmats,
// saves and restores, and the SAVE_GATES flag.
// CHECK-LABEL: cell.def @pass_ops
// CHECK-SAME:    inputs(%[[PX:[^:]+]]: tensor<3xf32>) states(%[[PH:[^:]+]]: tensor<4xf32>)
cell.def @pass_ops inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // CHECK: %[[PW:.*]] = cell.param "W"
  %w = cell.param "W" : tensor<8x3xf32>
  // CHECK: %[[PU:.*]] = cell.param "U"
  %u = cell.param "U" : tensor<8x4xf32>
  // CHECK: %[[PB:.*]] = cell.param "b"
  %b = cell.param "b" : tensor<8xf32>
  // CHECK: %[[PR:.*]] = cell.projection %[[PW]], %[[PX]] biases(%[[PB]] : tensor<8xf32>) : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  %p = cell.projection %w, %x biases(%b : tensor<8xf32>) : tensor<8x3xf32>, tensor<3xf32> -> tensor<8xf32>
  // CHECK: %[[Q:.*]]:2 = cell.chunk %[[PR]]
  %q:2 = cell.chunk %p : tensor<8xf32> -> tensor<4xf32>, tensor<4xf32>
  // CHECK: %[[G:.*]] = cell.greater %[[Q]]#0, %[[PH]] : tensor<4xf32>
  %g = cell.greater %q#0, %h : tensor<4xf32>
  // CHECK: %[[CAT:.*]] = cell.concat %[[G]], %[[Q]]#1 : tensor<4xf32>, tensor<4xf32> -> tensor<8xf32>
  %cat = cell.concat %g, %q#1 : tensor<4xf32>, tensor<4xf32> -> tensor<8xf32>
  // CHECK: %[[V:.*]] = cell.vecmat %[[PU]], %[[CAT]] : tensor<8x4xf32>, tensor<8xf32> -> tensor<4xf32>
  %v = cell.vecmat %u, %cat : tensor<8x4xf32>, tensor<8xf32> -> tensor<4xf32>
  // CHECK: cell.save %[[V]], %[[G]] : tensor<4xf32>, tensor<4xf32>
  cell.save %v, %g : tensor<4xf32>, tensor<4xf32>
  cell.yield states(%v : tensor<4xf32>)
}

// CHECK-LABEL: func.func @restore_and_flag
func.func @restore_and_flag(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, i1) {
  // CHECK: %[[R:.*]]:2 = cell.restore -> tensor<4xf32>, tensor<4xf32> {
  %r:2 = cell.restore -> tensor<4xf32>, tensor<4xf32> {
    // CHECK: %[[T:.*]] = cell.tanh
    %t = cell.tanh %x : tensor<4xf32>
    // CHECK: cell.restore_yield %[[T]], %[[T]] : tensor<4xf32>, tensor<4xf32>
    cell.restore_yield %t, %t : tensor<4xf32>, tensor<4xf32>
  }
  // CHECK: %[[S:.*]] = cell.save_gates : i1
  %s = cell.save_gates : i1
  return %r#0, %r#1, %s : tensor<4xf32>, tensor<4xf32>, i1
}
