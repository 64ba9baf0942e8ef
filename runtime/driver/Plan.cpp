//===- Plan.cpp - What a training step holds, planned -----------------------===//
//
// The memory plan: a forward and a backward on a backend that allocates
// nothing, whose ledger counts what a call would hold.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

namespace {
/// A backend that allocates nothing and runs nothing: the driver's ledger
/// then counts what a call would hold.
class CountingBackend : public Backend {
public:
  explicit CountingBackend(int64_t threads) : threads(threads) {}
  int64_t instances(int64_t batch) const override {
    return std::max<int64_t>(1, std::min(threads, batch));
  }
  Status allocate(int64_t, Element element, bool, Buffer &out) override {
    out.id = next++;
    out.element = element;
    return Status();
  }
  void release(const Buffer &) override {}
  Status launch(bool, bool, const std::vector<Arg> &, int64_t) override {
    return Status();
  }
  Status gemm(bool, bool, int64_t, int64_t, int64_t, const View &, int64_t,
              const View &, int64_t, double, const View &, int64_t) override {
    return Status();
  }
  Status columnSums(const View &, int64_t, int64_t, const View &) override {
    return Status();
  }
  Status fillRows(const View &, int64_t, int64_t, const std::vector<View> &) override {
    return Status();
  }
  Status copy(const View &, const View &) override { return Status(); }
  Status add(const View &, const View &) override { return Status(); }
  Status upload(const void *, int64_t, const View &) override { return Status(); }
  Status transpose(const View &, const View &) override { return Status(); }
  Status maskPastLengths(const View &, const View &, int64_t) override { return Status(); }
  Status gatherAtLengths(const View &, int64_t, const View &, const View &) override {
    return Status();
  }
  Status addAtLengths(const View &, const View &, int64_t, const View &) override {
    return Status();
  }

  int64_t next = 0, threads;
};

} // namespace

int64_t MemoryPlan::peak() const {
  int64_t held = outputs + finalStates;
  return std::max(held + driver.forwardPeak,
                  held + gradOutputs + gradInputs + gradParams + driver.backwardPeak);
}

int64_t MemoryPlan::floor() const {
  return outputs + gradOutputs + gradInputs + gradParams + driver.kept;
}

std::array<int64_t, 12> MemoryPlan::figures() const {
  return {driver.kept, driver.forwardPeak, driver.backwardPeak, outputs,
          finalStates, gradOutputs,        gradInputs,          gradParams,
          keptOutputs, pieceSteps,         peak(),              floor()};
}

Status SequenceDriver::plan(const Interface &cell, int64_t T, int64_t B, Recompute mode,
                            MemoryPlan &out, int64_t pieceRows, int64_t threads) {
  auto backend = std::make_shared<CountingBackend>(threads);
  SequenceDriver driver(cell, backend);
  driver.setPieceRows(pieceRows);
  out = MemoryPlan();
  if (T < 1 || B < 1)
    return Status::error("a plan needs T >= 1 steps and B >= 1 rows; got T=" +
                         std::to_string(T) + ", B=" + std::to_string(B));
  if (Status e = driver.checkExtent(T, B))
    return e;
  out.pieceSteps = driver.pieceSteps(B, T);
  // The caller's buffers, as views of buffers of their own.
  auto caller = [&](const std::vector<int64_t> &shape, Element element, int64_t &bytes) {
    Buffer buffer;
    backend->allocate(0, element, false, buffer);
    View v;
    v.buffer = buffer;
    v.shape = shape;
    bytes += v.size() * bytesOf(element);
    return v;
  };
  // The inputs and params are there before the step: not counted.
  int64_t before = 0;
  Sequence seq;
  seq.steps = T;
  seq.batch = B;
  for (const Slot &s : cell.inputs)
    seq.inputs.push_back(caller({T, B, s.shape[0]}, cell.storage, before));
  for (const Slot &s : cell.params)
    seq.params.push_back(caller(s.shape, cell.compute, before));
  std::vector<View> outputs, finals, gradOutputs, gradInputs, gradParams;
  for (const Slot &s : cell.outputs) {
    outputs.push_back(caller({T, B, s.shape[0]}, cell.storage, out.outputs));
    gradOutputs.push_back(caller({T, B, s.shape[0]}, cell.storage, out.gradOutputs));
  }
  for (const Slot &s : cell.states)
    finals.push_back(caller({B, s.shape[0]}, cell.compute, out.finalStates));
  for (const Slot &s : cell.inputs)
    gradInputs.push_back(caller({T, B, s.shape[0]}, cell.storage, out.gradInputs));
  for (const Slot &s : cell.params)
    gradParams.push_back(caller(s.shape, cell.compute, out.gradParams));
  SavedPtr saved;
  if (Status e = driver.forward(seq, outputs, finals, mode, &saved,
                                /*outputsOutliveSaved=*/true))
    return e;
  if (Status e = driver.backward(seq, *saved, gradOutputs,
                                 std::vector<View>(cell.states.size()), gradInputs,
                                 gradParams, std::vector<View>(cell.states.size())))
    return e;
  out.driver = driver.stats();
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (std::any_of(outputs.begin(), outputs.end(), [&](const View &o) {
          return o.buffer.id == saved->states[i].buffer.id;
        }))
      out.keptOutputs += saved->states[i].size() * bytesOf(cell.storage);
  return Status();
}
