//===- Workload.cpp - A cell's forward and backward on random data --------===//

#include "tuner/Workload.h"

#include <algorithm>
#include <cmath>
#include <random>

using namespace cellc::tuner;

Workload::Workload(const CpuCell &cell, int64_t steps, int64_t batch,
                   unsigned seed)
    : elementBytes(cell.elementBytes()), seed(seed) {
  int64_t T = steps, B = batch;
  seq.steps = T;
  seq.batch = B;
  for (const Slot &s : cell.inputs())
    seq.inputs.push_back(array({T, B, s.shape[0]}));
  for (const Slot &s : cell.params())
    seq.params.push_back(array(s.shape));
  for (const Slot &s : cell.states()) {
    seq.initialStates.push_back(array({B, s.shape[0]}));
    finals.push_back(array({B, s.shape[0]}));
    dFinals.push_back(array({B, s.shape[0]}));
    dInits.push_back(array({B, s.shape[0]}));
  }
  for (const Slot &s : cell.outputs()) {
    outs.push_back(array({T, B, s.shape[0]}));
    dOuts.push_back(array({T, B, s.shape[0]}));
  }
  for (const Slot &s : cell.inputs())
    dIns.push_back(array({T, B, s.shape[0]}));
  for (const Slot &s : cell.params())
    dPars.push_back(array(s.shape));
}

Array Workload::array(std::vector<int64_t> shape) {
  // Each buffer draws from its own stream, so its contents depend only on
  // the seed and its position in the workload.
  std::mt19937 rng(seed * 1000003u + storage.size());
  std::uniform_real_distribution<double> dist(-0.1, 0.1);
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  storage.emplace_back((n * elementBytes + 7) / 8);
  if (elementBytes == 4) {
    auto *p = reinterpret_cast<float *>(storage.back().data());
    for (int64_t i = 0; i < n; ++i)
      p[i] = dist(rng);
  } else {
    for (double &v : storage.back())
      v = dist(rng);
  }
  return Array{storage.back().data(), shape};
}

llvm::Expected<int64_t> Workload::run(CpuCell &cell, Recompute mode,
                                      bool backward) {
  SavedPtr saved;
  if (llvm::Error e = errorOf(cell.forward(seq, outs, finals, mode, backward ? &saved : nullptr)))
    return std::move(e);
  ranBackward = backward;
  if (!backward)
    return 0;
  if (llvm::Error e = errorOf(cell.backward(seq, *saved, dOuts, dFinals, dIns, dPars, dInits)))
    return std::move(e);
  return CpuCell::savedBytes(*saved);
}

Workload::Results Workload::results() const {
  Results all;
  auto append = [&](const std::vector<Array> &arrays) {
    for (const Array &a : arrays) {
      int64_t n = 1;
      for (int64_t d : a.shape)
        n *= d;
      std::vector<double> &out = all.emplace_back(n);
      for (int64_t i = 0; i < n; ++i)
        out[i] = elementBytes == 4 ? static_cast<const float *>(a.data)[i]
                                   : static_cast<const double *>(a.data)[i];
    }
  };
  append(outs);
  append(finals);
  if (ranBackward) {
    append(dIns);
    append(dPars);
    append(dInits);
  }
  return all;
}

double Workload::relativeError(const Results &results, const Results &reference) {
  if (results.size() != reference.size())
    return INFINITY;
  double worst = 0;
  for (size_t k = 0; k < results.size(); ++k) {
    const std::vector<double> &got = results[k], &want = reference[k];
    if (got.size() != want.size())
      return INFINITY;
    double scale = 0, diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, std::fabs(want[i]));
      double d = std::fabs(got[i] - want[i]);
      if (std::isnan(d))
        return INFINITY;
      diff = std::max(diff, d);
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}
