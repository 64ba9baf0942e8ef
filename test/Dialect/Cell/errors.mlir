// RUN: cellc-opt %s --split-input-file --verify-diagnostics
// One case for each diagnostic of the cell dialect's verifiers.

// expected-error @below {{'cell.def' op expects 2 body arguments (input_names then state_names), got 1}}
"cell.def"() ({
^bb0(%h: tensor<4xf32>):
  "cell.yield"(%h) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<4xf32>) -> ()
}) {sym_name = "c", input_names = ["x"], state_names = ["h"], output_names = []} : () -> ()

// -----

// expected-error @below {{'cell.def' op expects at least one state}}
cell.def @no_state inputs(%x: tensor<4xf32>) states() outputs() {
  cell.yield
}

// -----

// expected-error @below {{'cell.def' op expects body argument #0 to be a static 1-D float tensor, got 'tensor<2x2xf32>'}}
cell.def @matrix_state inputs() states(%h: tensor<2x2xf32>) outputs() {
  "cell.yield"(%h) {operandSegmentSizes = array<i32: 1, 0>} : (tensor<2x2xf32>) -> ()
}

// -----

// expected-error @below {{'cell.def' op expects all body arguments to have element type 'f32', got 'f64' for argument #1}}
cell.def @mixed inputs(%x: tensor<4xf32>) states(%h: tensor<4xf64>) outputs() {
  cell.yield states(%h : tensor<4xf64>)
}

// -----

cell.def @yield_count inputs() states(%h: tensor<4xf32>, %c: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.yield' op expects 2 states, got 1}}
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @yield_type inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.yield' op expects state #0 ('h') to have type 'tensor<4xf32>', got 'tensor<3xf32>'}}
  cell.yield states(%x : tensor<3xf32>)
}

// -----

cell.def @output_count inputs() states(%h: tensor<4xf32>) outputs("h", "g") {
  // expected-error @below {{'cell.yield' op expects 2 outputs (output_names), got 1}}
  cell.yield states(%h : tensor<4xf32>) outputs(%h : tensor<4xf32>)
}

// -----

cell.def @empty_param_name inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.param' op expects a non-empty name}}
  %p = cell.param "" : tensor<4xf32>
  cell.yield states(%p : tensor<4xf32>)
}

// -----

cell.def @param_rank inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.param' op result #0 must be static 1-D, 2-D or 3-D float tensor}}
  %p = cell.param "p" : tensor<2x2x1x1xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @matvec_weight_rank inputs() states(%h: tensor<4xf32>) outputs() {
  %b = cell.param "b" : tensor<4xf32>
  // expected-error @below {{'cell.matvec' op expects weight to be a matrix, got 'tensor<4xf32>'}}
  %y = "cell.matvec"(%b, %h) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @matvec_vector_rank inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x4xf32>
  // expected-error @below {{'cell.matvec' op expects vector to be 1-D, got 'tensor<4x4xf32>'}}
  %y = "cell.matvec"(%w, %w) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @matvec_columns inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x3xf32>
  // expected-error @below {{'cell.matvec' op expects the columns of weight (3) to equal the size of vector (4)}}
  %y = cell.matvec %w, %h : tensor<4x3xf32>, tensor<4xf32> -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @matvec_rows inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<8x4xf32>
  // expected-error @below {{'cell.matvec' op expects the size of result (4) to equal the rows of weight (8)}}
  %y = cell.matvec %w, %h : tensor<8x4xf32>, tensor<4xf32> -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @matvec_element_type inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x4xf64>
  // expected-error @below {{'cell.matvec' op expects weight, vector and result to share an element type, got 'f64', 'f32' and 'f32'}}
  %y = cell.matvec %w, %h : tensor<4x4xf64>, tensor<4xf32> -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @chunk_no_results inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.chunk' op expects at least one result}}
  "cell.chunk"(%h) : (tensor<4xf32>) -> ()
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @chunk_unequal inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.chunk' op expects all results to have one type, got 'tensor<1xf32>' and 'tensor<3xf32>'}}
  %a, %b = cell.chunk %h : tensor<4xf32> -> tensor<1xf32>, tensor<3xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @chunk_element_type inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.chunk' op expects results to have the element type of input ('f32'), got 'f64'}}
  %a, %b = cell.chunk %h : tensor<4xf32> -> tensor<2xf64>, tensor<2xf64>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @chunk_cover inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.chunk' op expects 3 results of size 1 to cover input of size 4}}
  %a, %b, %c = cell.chunk %h : tensor<4xf32> -> tensor<1xf32>, tensor<1xf32>, tensor<1xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @binary_operands inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.add' op expects lhs and rhs to have one type, got 'tensor<4xf32>' and 'tensor<3xf32>'}}
  %y = "cell.add"(%h, %x) : (tensor<4xf32>, tensor<3xf32>) -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @binary_result inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.max' op expects result to have the type of lhs and rhs ('tensor<4xf32>'), got 'tensor<3xf32>'}}
  %y = "cell.max"(%h, %h) : (tensor<4xf32>, tensor<4xf32>) -> tensor<3xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @unary_type inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.tanh' op requires the same type for all operands and results}}
  %y = "cell.tanh"(%x) : (tensor<3xf32>) -> tensor<4xf32>
  cell.yield states(%y : tensor<4xf32>)
}

// -----

cell.def @constant_type inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.constant' op result #0 must be static 1-D float tensor}}
  %c = cell.constant 1.0 : tensor<4xi32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

// expected-error @below {{'cell.yield' op expects parent op 'cell.def'}}
"cell.yield"() {operandSegmentSizes = array<i32: 0, 0>} : () -> ()

// -----

// expected-error @below {{unknown kernel argument kind 'weights'; expected input, projection,}}
func.func private @f() attributes {cell.kernel_args = [#cell.arg<weights "W">]}

// -----

// expected-error @below {{expects input and biases only on a projection}}
func.func private @f() attributes {cell.kernel_args = [#cell.arg<param "W", input = "x">]}

// -----

// expected-error @below {{expects same_as and zero only on backward results}}
func.func private @f() attributes {cell.kernel_args = [#cell.arg<output "h", zero>]}

// -----

// expected-error @below {{expects a projection to name its input}}
func.func private @f() attributes {cell.grad_results = [#cell.grad<projection "W">]}

// -----

// expected-error @below {{unknown field 'weight'}}
func.func private @f() attributes {cell.grad_results = [#cell.grad<weight_rows "W", weight = "W">]}

// -----

// expected-error @below {{expects a name}}
func.func private @f() attributes {cell.kernel_args = [#cell.arg<input "">]}

// -----

cell.def @greater_types inputs(%x: tensor<4xf32>) states(%h: tensor<2xf32>) outputs() {
  // expected-error @below {{'cell.greater' op expects lhs and rhs to have one type, got 'tensor<4xf32>' and 'tensor<2xf32>'}}
  %g = "cell.greater"(%x, %h) : (tensor<4xf32>, tensor<2xf32>) -> tensor<4xf32>
  cell.yield states(%h : tensor<2xf32>)
}

// -----

cell.def @projection_bias inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x3xf32>
  %b = cell.param "b" : tensor<2xf32>
  // expected-error @below {{'cell.projection' op expects bias #0 to have the result's type 'tensor<4xf32>', got 'tensor<2xf32>'}}
  %p = cell.projection %w, %x biases(%b : tensor<2xf32>) : tensor<4x3xf32>, tensor<3xf32> -> tensor<4xf32>
  cell.yield states(%p : tensor<4xf32>)
}

// -----

cell.def @projection_shape inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<4x2xf32>
  // expected-error @below {{'cell.projection' op expects the columns of weight (2) to equal the size of vector (3)}}
  %p = cell.projection %w, %x : tensor<4x2xf32>, tensor<3xf32> -> tensor<4xf32>
  cell.yield states(%p : tensor<4xf32>)
}

// -----

cell.def @vecmat_shape inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<3x5xf32>
  // expected-error @below {{'cell.vecmat' op expects the size of result (4) to equal the columns of weight (5)}}
  %v = cell.vecmat %w, %x : tensor<3x5xf32>, tensor<3xf32> -> tensor<4xf32>
  cell.yield states(%v : tensor<4xf32>)
}

// -----

cell.def @concat_types inputs(%x: tensor<3xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.concat' op expects all inputs to have one type, got 'tensor<3xf32>' and 'tensor<4xf32>'}}
  %c = cell.concat %x, %h : tensor<3xf32>, tensor<4xf32> -> tensor<7xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @concat_result inputs(%x: tensor<4xf32>) states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.concat' op expects result type 'tensor<8xf32>', got 'tensor<6xf32>'}}
  %c = cell.concat %x, %h : tensor<4xf32>, tensor<4xf32> -> tensor<6xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

func.func @restore_types(%x: tensor<4xf32>) -> tensor<2xf32> {
  // expected-error @below {{'cell.restore' op expects the body to yield the result types}}
  %r = cell.restore -> tensor<2xf32> {
    cell.restore_yield %x : tensor<4xf32>
  }
  return %r : tensor<2xf32>
}

// -----

cell.def @sum_to_two inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.sum' op expects the result to hold one value per sample (size 1), got 'tensor<2xf32>'}}
  %s = cell.sum %h : tensor<4xf32> -> tensor<2xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @broadcast_of_two inputs() states(%h: tensor<2xf32>) outputs() {
  // expected-error @below {{'cell.broadcast' op expects the input to hold one value per sample (size 1), got 'tensor<2xf32>'}}
  %b = cell.broadcast %h : tensor<2xf32> -> tensor<4xf32>
  cell.yield states(%h : tensor<2xf32>)
}

// -----

cell.def @sum_to_f64 inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.sum' op expects input and result to share an element type, got 'f32' and 'f64'}}
  %s = cell.sum %h : tensor<4xf32> -> tensor<1xf64>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @expand_kept_out_of_order inputs() states(%h: tensor<6xf32>) outputs() {
  // expected-error @below {{'cell.expand' op expects kept dims increasing within the shape's 3 dims}}
  %e = cell.expand %h {shape = array<i64: 2, 3, 4>, kept = array<i64: 1, 0>} : tensor<6xf32> -> tensor<24xf32>
  cell.yield states(%h : tensor<6xf32>)
}

// -----

cell.def @expand_kept_past_the_shape inputs() states(%h: tensor<6xf32>) outputs() {
  // expected-error @below {{'cell.expand' op expects kept dims increasing within the shape's 2 dims}}
  %e = cell.expand %h {shape = array<i64: 2, 3>, kept = array<i64: 0, 2>} : tensor<6xf32> -> tensor<6xf32>
  cell.yield states(%h : tensor<6xf32>)
}

// -----

cell.def @expand_wrong_result inputs() states(%h: tensor<6xf32>) outputs() {
  // expected-error @below {{'cell.expand' op expects the shape's 24 elements, got 12}}
  %e = cell.expand %h {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 1>} : tensor<6xf32> -> tensor<12xf32>
  cell.yield states(%h : tensor<6xf32>)
}

// -----

cell.def @reduce_wrong_result inputs() states(%h: tensor<24xf32>) outputs() {
  // expected-error @below {{'cell.reduce' op expects the kept dims' 8 elements, got 6}}
  %r = cell.reduce %h {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 2>} : tensor<24xf32> -> tensor<6xf32>
  cell.yield states(%h : tensor<24xf32>)
}

// -----

cell.def @reduce_bad_combine inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.reduce' op expects combine to be sum, max or min, got 'prod'}}
  %r = cell.reduce %h {shape = array<i64: 4>, kept = array<i64>, combine = "prod"} : tensor<4xf32> -> tensor<1xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @select_types inputs() states(%h: tensor<4xf32>) outputs() {
  %c = cell.constant 1.0 : tensor<2xf32>
  // expected-error @below {{'cell.select' op requires the same type for all operands and results}}
  %r = "cell.select"(%c, %h, %h) : (tensor<2xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  cell.yield states(%r : tensor<4xf32>)
}

// -----

cell.def @reduce_zero_dim inputs() states(%h: tensor<4xf32>) outputs() {
  // expected-error @below {{'cell.reduce' op expects dims of at least 1, got 0}}
  %r = cell.reduce %h {shape = array<i64: 4, 0>, kept = array<i64: 0>} : tensor<4xf32> -> tensor<4xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @block_product_size inputs() states(%h: tensor<4xf32>) outputs() {
  %w = cell.param "W" : tensor<2x4x3xf32>
  // expected-error @below {{'cell.matvec' op expects the columns of weight's 2 blocks (6) to equal the size of vector (4)}}
  %y = cell.matvec %w, %h : tensor<2x4x3xf32>, tensor<4xf32> -> tensor<8xf32>
  cell.yield states(%h : tensor<4xf32>)
}

// -----

cell.def @block_vecmat_size inputs() states(%h: tensor<8xf32>) outputs() {
  %w = cell.param "W" : tensor<2x4x3xf32>
  // expected-error @below {{'cell.vecmat' op expects the size of result (8) to equal the columns of weight's 2 blocks (6)}}
  %y = cell.vecmat %w, %h : tensor<2x4x3xf32>, tensor<8xf32> -> tensor<8xf32>
  cell.yield states(%h : tensor<8xf32>)
}
