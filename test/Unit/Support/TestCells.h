//===- TestCells.h - Cells the numeric tests share --------------*- C++ -*-===//
//
// Cells written for the tests (not copies of the examples): together they use
// every op, vector params read in the step, several inputs and outputs, a
// matvec on a computed value, and no recurrent matvec at all.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H
#define CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H

namespace cellc::testing {

/// Peephole LSTM with a positive-definite forget gate: exp, log, softplus,
/// division, sqrt and max, and vector params read in the step.
inline const char *kPeephole = R"(cell peephole {
  input x: [I]
  state h: [H], c: [H]
  param W: [4*H, I], R: [4*H, H], b: [4*H], p_i: [H], p_f: [H], p_o: [H]
  i, f, g, o = chunk(W @ x + R @ h + b, 4)
  ig = sigmoid(i + p_i * c)
  fg = exp(-softplus(-(f + p_f * c)))
  c = fg * c + ig * max(tanh(g), -0.9)
  n = sqrt(c * c + 1)
  h = sigmoid(o + p_o * c) * c / n + 0.1 * log(n)
  output h, c
})";

/// MGU: the recurrent matvec reads f * h, a value computed from the state.
inline const char *kMgu = R"(cell mgu {
  input x: [I]
  state h: [H]
  param W_f: [H, I], U_f: [H, H], b_f: [H], W_h: [H, I], U_h: [H, H], b_h: [H]
  f = sigmoid(W_f @ x + U_f @ h + b_f)
  n = tanh(W_h @ x + U_h @ (f * h) + b_h)
  h = (1 - f) * h + f * n
})";

/// Two inputs, one used directly in the step as well as through a
/// projection, and two outputs.
inline const char *kTwo = R"(cell two {
  input x: [I], y: [H]
  state h: [H]
  param W: [H, I], U: [H, H], R: [H, H], b: [H]
  z = W @ x + U @ y + R @ h + b
  h = tanh(z) * sigmoid(y)
  output h, z
})";

/// IndRNN: no recurrent matvec; relu, abs and min in the step.
inline const char *kIndRnn = R"(cell indrnn {
  input x: [I]
  state h: [H]
  param W: [H, I], u: [H], b: [H]
  h = min(relu(W @ x + u * h + b), 2 - abs(h))
})";

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H
