//===- Workload.h - A cell's forward and backward on random data -*- C++ -*-===//
//
// What the benchmark and the autotuner run: every buffer of one training step
// of a compiled cell at [T, B], filled with seeded random values, and the
// step itself (forward in a recompute mode, then backward).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_TUNER_WORKLOAD_H
#define CELLC_COMPILER_TUNER_WORKLOAD_H

#include "jit/CpuJit.h"

#include <cstdint>
#include <vector>

namespace cellc::tuner {

using namespace cellc::jit;
using namespace cellc::runtime;

class Workload {
public:
  /// Buffers for `cell` at `steps` x `batch`, filled from `seed`. Two
  /// workloads with the same cell slots, sizes and seed hold the same data.
  Workload(const CpuCell &cell, int64_t steps, int64_t batch,
           unsigned seed = 0);

  /// Runs the forward in `mode` and, when `backward`, the backward. Returns
  /// the bytes kept between them.
  llvm::Expected<int64_t> run(CpuCell &cell, Recompute mode, bool backward);

  /// Every result of the last run (outputs, final states, and after a
  /// backward the input, param and initial-state gradients), one vector of
  /// doubles per buffer.
  using Results = std::vector<std::vector<double>>;
  Results results() const;

  /// The largest difference between two runs' results, each buffer's
  /// relative to the largest magnitude in its reference.
  static double relativeError(const Results &results, const Results &reference);

private:
  Array array(std::vector<int64_t> shape);

  int64_t elementBytes;
  unsigned seed;
  bool ranBackward = false;
  std::vector<std::vector<double>> storage;
  CpuCell::Sequence seq;
  std::vector<Array> outs, finals, dOuts, dFinals, dIns, dPars, dInits;
};

} // namespace cellc::tuner

#endif // CELLC_COMPILER_TUNER_WORKLOAD_H
