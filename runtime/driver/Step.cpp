//===- Step.cpp - A stream's one step ---------------------------------------===//
//
// One step of inference as a stream calls it, with the buffers and packed
// weights kept between calls (a CPU backend's bound step relaunches it).
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

Status SequenceDriver::step(const Sequence &seq, const std::vector<View> &outputs,
                            const std::vector<View> &newStates, StepPacking *packing) {
  if (seq.steps != 1)
    return Status::error("a step runs T = 1, not T = " + std::to_string(seq.steps));
  if (Status e = checkForward(seq, outputs, newStates))
    return e;
  if (seq.resets.valid() || !seq.lengths.empty())
    return Status::error("a step takes no resets and no lengths");
  if (seq.initialStates.size() != cell.states.size())
    return Status::error("a step needs every state to step from");
  for (size_t i = 0; i < cell.states.size(); ++i) {
    if (!seq.initialStates[i].valid())
      return Status::error("a step needs every state to step from; '" +
                           cell.states[i].name + "' is missing");
    // No kernel promises to read the state it starts from before it writes
    // the state's history.
    if (seq.initialStates[i].pointer() == newStates[i].pointer())
      return Status::error("a step's new state '" + cell.states[i].name +
                           "' must not be the state it steps from");
  }
  int64_t B = seq.batch;
  if (!stepBuffers)
    stepBuffers = std::make_unique<StepBuffers>();
  StepBuffers &s = *stepBuffers;
  std::lock_guard<std::mutex> lock(s.turn);
  if (s.batch != B) {
    ++s.epoch;
    s.batch = -1;
    s.projected.clear();
    s.projected.resize(cell.projections.size());
    for (size_t p = 0; p < cell.projections.size(); ++p)
      if (Status e = scratch({1, B, cell.projections[p].rows}, cell.projections[p].element,
                             false, s.projected[p]))
        return e;
    if (Status e = scratch({1, B}, Element::U8, true, s.resets))
      return e;
    if (Status e = scratch({0, B, cell.gatesWidth}, cell.storage, false, s.noGates))
      return e;
    s.batch = B;
  }
  Chunk chunk;
  chunk.len = 1;
  chunk.stream = false; // the next step reads the new states
  chunk.resets = s.resets.view();
  chunk.initial = seq.initialStates;
  chunk.start = seq.initialStates;
  chunk.outputs = outputs;
  chunk.gates = s.noGates.view();
  for (size_t p = 0; p < cell.projections.size(); ++p) {
    chunk.projections.push_back(s.projected[p].view());
    if (Status e = project(seq, cell.projections[p], 0, 1, chunk.projections.back()))
      return e;
  }
  for (size_t i = 0; i < cell.states.size(); ++i)
    chunk.history.push_back(newStates[i].at(0, {1, B, cell.states[i].shape[0]}));
  std::vector<Arg> args;
  std::vector<size_t> results;
  if (Status e = bind(cell.forward, seq, chunk, /*backward=*/false, args, results))
    return e;
  // A workspace made anew (another size: another number of groups) may
  // start where the last one did, but holds nothing packed.
  bool reused = false;
  if (Status e = workspace(cell.forward, /*backward=*/false, /*saveGates=*/false, B, args,
                           s.workspace, &reused))
    return e;
  if (!reused)
    ++s.epoch;
  // The weights packed by the last step serve this one where the backend
  // that packed them says the workspace holds them.
  std::vector<void *> params;
  for (const View &p : seq.params)
    params.push_back(p.pointer());
  bool packed = packing && packing->holds(params, reused);
  for (size_t a = 0; a < cell.forward.args.size(); ++a)
    if (cell.forward.args[a].kind == ArgKind::Packed)
      args[a].index = packed ? 1 : 0;
  if (packing)
    packing->packed({});
  if (Status e = launch(cell.forward, /*backward=*/false, /*saveGates=*/false, args, B))
    return e;
  if (packing)
    packing->packed(std::move(params));
  return Status();
}

std::unique_lock<std::mutex> SequenceDriver::lockStep() {
  if (!stepBuffers)
    stepBuffers = std::make_unique<StepBuffers>();
  return std::unique_lock<std::mutex>(stepBuffers->turn);
}

int64_t SequenceDriver::stepEpoch() const { return stepBuffers ? stepBuffers->epoch : -1; }
