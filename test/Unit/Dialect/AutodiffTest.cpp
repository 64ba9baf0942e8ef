//===- AutodiffTest.cpp - Derived backward steps against finite differences -===//
//
// Compiles cells through cell-plan-saves in double precision, runs the forward
// and the derived backward step with the reference interpreter, and checks
// every gradient (inputs, initial states, every param) against central finite
// differences of a random linear loss on the outputs and the final states.
// Sequences with resets are run the way the kernels run them.
//
//===----------------------------------------------------------------------===//

#include "Support/Reference.h"
#include "Support/TestCells.h"

#include "gtest/gtest.h"

using namespace mlir;
using namespace cellc;
using namespace cellc::testing;

namespace {

/// Checks a cell's derived backward, replayed and from saved values, on one
/// step and on a sequence with resets in the middle.
void checkCompiled(Compiled &compiled);

void checkCell(const std::string &source, const SizeBindings &sizes) {
  auto c = compile(source, sizes);
  ASSERT_TRUE(c->module) << c->diagnostics;
  checkCompiled(*c);
}

void checkCompiled(Compiled &compiled) {
  Compiled *c = &compiled;
  struct Case {
    int steps;
    std::vector<bool> resets;
  };
  for (const Case &cs : {Case{1, {false}},
                         Case{5, {false, false, true, false, true}}}) {
    SCOPED_TRACE("T=" + std::to_string(cs.steps));
    SequenceProblem problem(*c, cs.steps, cs.resets, /*seed=*/1234 + cs.steps);
    Point replayed = problem.gradient(/*saved=*/false);
    Point fromSaved = problem.gradient(/*saved=*/true);
    problem.checkAgainstFiniteDifferences(replayed);
    // Both recompute modes compute the same numbers in the same order.
    for (auto &[name, value] : replayed.params)
      for (size_t j = 0; j < value.size(); ++j)
        EXPECT_EQ(value[j], fromSaved.params[name][j]) << name;
    for (size_t s = 0; s < replayed.states.size(); ++s)
      EXPECT_EQ(replayed.states[s], fromSaved.states[s]);
  }
}

const SizeBindings kSizes = {{"H", 3}, {"I", 2}, {"J", 4}, {"N", 3}};

} // namespace

//===----------------------------------------------------------------------===//
// One op at a time
//===----------------------------------------------------------------------===//

/// A cell whose next state is `expr`, over x, h and the vector param u.
static std::string opCell(const std::string &expr) {
  return "cell op {\n input x: [N]\n state h: [N]\n param u: [N], W: [N, N], "
         "V: [2*N, N]\n h = " +
         expr + "\n}\n";
}

class OpDerivativeTest : public ::testing::TestWithParam<const char *> {};

TEST_P(OpDerivativeTest, AgreesWithFiniteDifferences) {
  // Unused params are warned about, not errors; their gradient must be zero.
  checkCell(opCell(GetParam()), kSizes);
}

INSTANTIATE_TEST_SUITE_P(
    EveryOp, OpDerivativeTest,
    ::testing::Values(
        "-(u * h + x)", "sigmoid(u * h + x)", "tanh(u * h + x)",
        "exp(u * h + x)", "log(u * u * h * h + x * x + 0.5)",
        "relu(u * h + x)", "softplus(u * h + x)", "logsigmoid(u * h + x)", "abs(u * h + x)",
        "sqrt(u * u * h * h + x * x + 0.5)", "u * h + x", "u * h - x",
        "(u * h) * x", "(u * h) / (x * x + 1)", "max(u * h, x)",
        "min(u * h, x)", "h * h + x", "2 * h - 1 + x",
        "tanh(W @ h + x)", "tanh(W @ (u * h) + x)", "tanh(h) * sum(u * x)",
        "(h - mean(h)) / sqrt(mean((h - mean(h)) * (h - mean(h))) + 0.1) + x",
        "tanh(W @ (h / sqrt(mean(h * h) + 0.1)) + x)", "h * mean(x) + sum(u)",
        "tanh(h @ W + x)", "tanh((u * h) @ W + x)", "tanh(x @ W + h)",
        "tanh(W @ h - h @ W + x)", "rsqrt(u * u * h * h + x * x + 0.5)",
        "log1p(u * u * h * h + x * x)", "sin(u * h + x)", "cos(u * h + x)",
        "erf(u * h + x)", "silu(u * h + x)", "gelu(u * h + x)", "gelu_tanh(u * h + x)",
        "elu(u * h + x)"));

TEST(OpDerivativeTest, ChunkWithAnUnusedPart) {
  checkCell(R"(cell chunked {
    input x: [N]
    state h: [N]
    param V: [3*N, N]
    a, b, c = chunk(V @ h, 3)
    h = tanh(a * c + x)
  })",
            kSizes);
}

//===----------------------------------------------------------------------===//
// Whole cells
//===----------------------------------------------------------------------===//

TEST(CellDerivativeTest, Lstm) { checkCell(readExample("lstm.cell"), kSizes); }
TEST(CellDerivativeTest, Gru) { checkCell(readExample("gru.cell"), kSizes); }
TEST(CellDerivativeTest, Elman) { checkCell(readExample("elman.cell"), kSizes); }
TEST(CellDerivativeTest, LayerNormLstm) {
  checkCell(readExample("layernorm_lstm.cell"), kSizes);
}
/// Block-diagonal products: of the state, of an input (hoisted), and of a
/// value normalized in the step, with blocks of two shapes.
TEST(CellDerivativeTest, BlockDiagonalProducts) {
  checkCell(R"(cell blocks {
    input x: [2*N]
    state h: [2*N]
    param R: [2, N, N], W: [2, N, N], U: [2, 2*N, N]
    a = R @ h + W @ x
    y = a / sqrt(mean(a * a) + 0.5)
    b, c = chunk(U @ y, 2)
    h = tanh(b) * sigmoid(c)
  })",
            kSizes);
}

TEST(CellDerivativeTest, RmsNormGru) { checkCell(readExample("rmsnorm_gru.cell"), kSizes); }
TEST(CellDerivativeTest, BlockGru) {
  checkCell(readExample("block_gru.cell"), {{"G", 2}, {"D", 3}});
}
TEST(CellDerivativeTest, SLstm) {
  checkCell(readExample("slstm.cell"), {{"I", 3}, {"NH", 2}, {"D", 2}});
}

/// Peephole LSTM with a positive-definite forget gate: exp, log, softplus,
/// division, sqrt and max, and vector params read in the step.
TEST(CellDerivativeTest, PeepholeWithSmoothClamps) {
  checkCell(kPeephole, kSizes);
}

/// MGU: the recurrent matvec reads f * h, a value computed from the state.
TEST(CellDerivativeTest, MinimalGatedUnit) {
  checkCell(kMgu, kSizes);
}

/// Two inputs, one used directly in the step as well as through a
/// projection, and two outputs.
TEST(CellDerivativeTest, TwoInputsTwoOutputs) {
  checkCell(kTwo, kSizes);
}

/// Transposed params: the antisymmetric RNN's W - W^T, and tied.cell's
/// `x @ U` on an input and `h @ W` beside `W @ h`.
TEST(CellDerivativeTest, TransposedParams) {
  checkCell(readExample("antisymmetric.cell"), kSizes);
  checkCell(kTied, kSizes);
}

/// Heads: GroupNorm over 2 heads of 3 (a mean per head, spread back over
/// its head), a gate per head on the state, and each head's sum spread
/// over it.
TEST(CellDerivativeTest, GroupNormPerHead) {
  checkCell(R"(cell gn {
    input x: [N]
    state h: [2*N]
    param W: [2*N, 2*N], U: [2*N, N], gamma: [2*N], s: [2]
    z = heads(W @ h + U @ x, 2)
    d = z - mean(z)
    y = d / sqrt(mean(d * d) + 0.1) * gamma
    h = tanh(y) + heads(h, 2) * sigmoid(s) + 0.1 * tanh(sum(z)) + 0.1 * mean(x)
  })",
            kSizes);
}

/// A matrix state per head, as the dialect holds one: C [2 heads, 3, 4] in
/// row-major order, decayed by a gate per head and added to the outer
/// product of k [2, 3] and v [2, 4]; the output C q [2, 3], scaled by a
/// function of its sum per head. Every cell.expand and cell.reduce, and
/// their gradients, against finite differences.
TEST(CellDerivativeTest, ExpandAndReduceOfAMatrixState) {
  auto c = compileIR(R"(
    cell.def @mstate inputs(%k: tensor<6xf64>, %v: tensor<8xf64>, %q: tensor<8xf64>)
        states(%C: tensor<24xf64>) outputs("h") {
      %u = cell.param "u" : tensor<2xf64>
      %f = cell.sigmoid %u : tensor<2xf64>
      %fe = cell.expand %f {shape = array<i64: 2, 3, 4>, kept = array<i64: 0>} : tensor<2xf64> -> tensor<24xf64>
      %ke = cell.expand %k {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 1>} : tensor<6xf64> -> tensor<24xf64>
      %ve = cell.expand %v {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 2>} : tensor<8xf64> -> tensor<24xf64>
      %kv = cell.mul %ke, %ve : tensor<24xf64>
      %fc = cell.mul %fe, %C : tensor<24xf64>
      %next = cell.add %fc, %kv : tensor<24xf64>
      %qe = cell.expand %q {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 2>} : tensor<8xf64> -> tensor<24xf64>
      %cq = cell.mul %next, %qe : tensor<24xf64>
      %h = cell.reduce %cq {shape = array<i64: 2, 3, 4>, kept = array<i64: 0, 1>} : tensor<24xf64> -> tensor<6xf64>
      %n = cell.reduce %h {shape = array<i64: 2, 3>, kept = array<i64: 0>} : tensor<6xf64> -> tensor<2xf64>
      %t = cell.tanh %n : tensor<2xf64>
      %te = cell.expand %t {shape = array<i64: 2, 3>, kept = array<i64: 0>} : tensor<2xf64> -> tensor<6xf64>
      %out = cell.mul %h, %te : tensor<6xf64>
      cell.yield states(%next : tensor<24xf64>) outputs(%out : tensor<6xf64>)
    }
  )");
  ASSERT_TRUE(c->module);
  checkCompiled(*c);
}

/// IndRNN: no recurrent matvec; relu, abs and min in the step.
TEST(CellDerivativeTest, IndRnnWithClamps) {
  checkCell(kIndRnn, kSizes);
}
