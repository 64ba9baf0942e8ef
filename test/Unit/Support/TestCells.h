//===- TestCells.h - Cells the numeric tests share --------------*- C++ -*-===//
//
// Cells written for the tests (not copies of the examples), kept as files in
// test/Inputs/cells so that the lit tests compile the same cells:
//
// - peephole: a peephole LSTM with a positive-definite forget gate: exp, log,
//   softplus, division, sqrt and max, and vector params read in the step.
// - mgu: the recurrent matvec reads f * h, a value computed from the state.
// - two: two inputs, one used directly in the step as well as through a
//   projection, and two outputs.
// - indrnn: no recurrent matvec; relu, abs and min in the step.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H
#define CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cellc::testing {

/// The text of test/Inputs/cells/<name>.cell.
inline std::string readTestCell(const std::string &name) {
  std::string path = std::string(CELLC_SOURCE_DIR) + "/test/Inputs/cells/" + name + ".cell";
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline const std::string kPeephole = readTestCell("peephole");
inline const std::string kMgu = readTestCell("mgu");
inline const std::string kTwo = readTestCell("two");
inline const std::string kIndRnn = readTestCell("indrnn");
inline const std::string kTied = readTestCell("tied");
inline const std::string kGroupNorm = readTestCell("groupnorm");

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_SUPPORT_TESTCELLS_H
