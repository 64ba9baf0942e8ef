//===- Forward.cpp - The forward, span by span ------------------------------===//
//
// A forward over a sequence: its buffers, then span by span (no span across
// a chunk) the projections and the forward kernel, the final states and
// what a training forward keeps.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

Status SequenceDriver::runForwardChunk(const Sequence &seq, const Chunk &chunk,
                                       bool saveGates, KernelBuffers &buffers) {
  const Kernel &kernel = cell.forward;
  // Samples sorted longest first drop out of the rows that run as they end
  // (rowsRunning): the chunk runs in pieces split where those rows change.
  std::vector<int64_t> ends = {chunk.t0 + chunk.len - 1};
  int64_t later = rowsRunning(seq.lengths, seq.batch, ends[0]);
  for (int64_t t = ends[0] - 1; t >= chunk.t0; --t) {
    int64_t rows = rowsRunning(seq.lengths, seq.batch, t);
    if (rows != later)
      ends.push_back(t);
    later = rows;
  }
  std::vector<Scratch> starts;
  bool first = true;
  for (size_t k = ends.size(); k-- > 0;) {
    int64_t begin = k + 1 < ends.size() ? ends[k + 1] + 1 : chunk.t0;
    Chunk piece = slice(chunk, seq.batch, begin, ends[k] - begin + 1);
    piece.rows = rowsRunning(seq.lengths, seq.batch, ends[k]);
    if (piece.rows == 0)
      continue;
    if (cell.endStates && !first) {
      // From where the last piece ended, in the compute type: the end
      // states, copied aside (this piece writes them again).
      if (Status e = endsAsStarts(chunk.end, piece, starts))
        return e;
    } else if (Status e = startsInCompute(piece, starts)) {
      return e;
    }
    first = false;
    std::vector<Arg> args;
    std::vector<size_t> results;
    if (Status e = bind(kernel, seq, piece, /*backward=*/false, args, results))
      return e;
    if (Status e = launchOn(kernel, /*backward=*/false, saveGates, args, piece.rows, buffers))
      return e;
  }
  return Status();
}

Status SequenceDriver::endsAsStarts(const std::vector<View> &ends, Chunk &piece,
                                    std::vector<Scratch> &keep) {
  keep.resize(cell.states.size());
  for (size_t i = 0; i < cell.states.size(); ++i) {
    if (!keep[i].view().valid())
      if (Status e = scratch(ends[i].shape, cell.compute, false, keep[i]))
        return e;
    if (Status e = backend->copy(ends[i], keep[i].view()))
      return e;
    piece.start[i] = keep[i].view();
  }
  return Status();
}

Status SequenceDriver::gatherFinalStates(const std::vector<int64_t> &lengths,
                                        int64_t t0, int64_t len,
                                        const std::vector<View> &history,
                                        const std::vector<View> &finalStates) {
  bool any = std::any_of(lengths.begin(), lengths.end(), [&](int64_t length) {
    return length - 1 >= t0 && length - 1 < t0 + len;
  });
  if (!any)
    return Status();
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (Status e = backend->gatherAtLengths(history[i], t0, lengthsOnBackend, finalStates[i]))
      return e;
  return Status();
}

Status SequenceDriver::checkForward(const Sequence &seq, const std::vector<View> &outputs,
                                    const std::vector<View> &finalStates) const {
  int64_t T = seq.steps, B = seq.batch;
  if (T < 1 || B < 1)
    return Status::error("the sequence needs T >= 1 steps and B >= 1 rows; got T=" +
                         std::to_string(T) + ", B=" + std::to_string(B));
  if (Status e = checkExtent(T, B))
    return e;
  if (seq.inputs.size() != cell.inputs.size())
    return Status::error("expected " + std::to_string(cell.inputs.size()) +
                         " inputs, got " + std::to_string(seq.inputs.size()));
  if (seq.params.size() != cell.params.size())
    return Status::error("expected " + std::to_string(cell.params.size()) +
                         " params, got " + std::to_string(seq.params.size()));
  if (!seq.initialStates.empty() && seq.initialStates.size() != cell.states.size())
    return Status::error("expected " + std::to_string(cell.states.size()) +
                         " initial states, got " +
                         std::to_string(seq.initialStates.size()));
  if (outputs.size() != cell.outputs.size() || finalStates.size() != cell.states.size())
    return Status::error("expected " + std::to_string(cell.outputs.size()) +
                         " outputs and " + std::to_string(cell.states.size()) +
                         " final states");
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    if (Status e = check(seq.inputs[i], {T, B, cell.inputs[i].shape[0]},
                         "input '" + cell.inputs[i].name + "'"))
      return e;
  for (size_t i = 0; i < cell.params.size(); ++i)
    if (Status e = check(seq.params[i], cell.params[i].shape,
                         "param '" + cell.params[i].name + "'"))
      return e;
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (!seq.initialStates.empty())
      if (Status e = check(seq.initialStates[i], {B, n},
                           "initial state '" + cell.states[i].name + "'", true))
        return e;
    if (Status e = check(finalStates[i], {B, n},
                         "final state '" + cell.states[i].name + "'"))
      return e;
  }
  for (size_t i = 0; i < cell.outputs.size(); ++i)
    if (Status e = check(outputs[i], {T, B, cell.outputs[i].shape[0]},
                         "output '" + cell.outputs[i].name + "'"))
      return e;
  if (seq.resets.valid())
    if (Status e = check(seq.resets, {T, B}, "resets"))
      return e;
  return checkLengths(seq.lengths, T, B);
}

/// The buffers a forward runs through, made once a call (forwardBuffers).
struct SequenceDriver::ForwardRun {
  bool saveGates = false, chunked = false;
  /// Steps per chunk (chunk:K keeps the states before each; else T), and
  /// per span: the steps that one projection buffer holds, never across a
  /// chunk.
  int64_t K = 0, span = 0;
  /// Zeros for what the caller left out: no resets, no initial states.
  std::vector<Scratch> defaults;
  View resets;
  std::vector<View> initial;
  /// Each state's history: what none and full keep, the output that is the
  /// state, or a span's buffer (spanBuffers); chunk:K's states before each
  /// chunk (boundaries); the state a span starts from (start), and where
  /// the span's kernel leaves each state, in the compute type (end;
  /// Interface::endStates).
  std::vector<View> history, boundaries;
  std::vector<Scratch> spanBuffers, start, end;
  /// Whether the histories go past the caches: only where each is a whole
  /// sequence's, read after it. A span's buffer is read at the span's end.
  bool stream = true;
  /// A span's projections.
  std::vector<Scratch> projected;
  /// The gates kept (none), or an empty buffer.
  Scratch noGates;
  View gates;
  KernelBuffers kernel;
};

Status SequenceDriver::forwardBuffers(const Sequence &seq, const std::vector<View> &outputs,
                                      Recompute mode, bool training, Saved *keep,
                                      ForwardRun &run) {
  int64_t T = seq.steps, B = seq.batch;
  run.saveGates = training && mode.kind == Recompute::Kind::None;
  run.chunked = training && mode.kind == Recompute::Kind::Chunk;
  run.K = run.chunked ? std::min(mode.chunk, T) : T;
  run.span = std::min(run.K, pieceSteps(B, T));
  if (Status e = resetsAndInitial(seq, run.span, run.defaults, run.resets, run.initial))
    return e;
  size_t states = cell.states.size();
  run.history.resize(states);
  run.boundaries.resize(states);
  run.spanBuffers.resize(states);
  run.start.resize(states);
  run.end.resize(states);
  if (Status e = scratch({0, B, cell.gatesWidth}, cell.storage, false, run.noGates))
    return e;
  run.gates = run.saveGates ? keep->gates : run.noGates.view();
  for (size_t i = 0; i < states; ++i) {
    int64_t n = cell.states[i].shape[0];
    if (training && !run.chunked)
      run.history[i] = keep->states[i];
    else if (cell.stateOutputs[i] >= 0)
      run.history[i] = outputs[cell.stateOutputs[i]];
    if (!run.history[i].valid()) {
      if (Status e = scratch({run.span, B, n}, cell.storage, false, run.spanBuffers[i]))
        return e;
      run.history[i] = run.spanBuffers[i].view();
      run.stream = false;
    }
    if (run.chunked)
      run.boundaries[i] = keep->states[i];
    if (Status e = scratch({B, n}, cell.compute, false, run.start[i]))
      return e;
    if (Status e = backend->copy(run.initial[i], run.start[i].view()))
      return e;
    if (cell.endStates)
      if (Status e = scratch({B, n}, cell.compute, false, run.end[i]))
        return e;
  }
  run.projected.resize(cell.projections.size());
  for (size_t p = 0; p < cell.projections.size(); ++p)
    if (Status e = scratch({run.span, B, cell.projections[p].rows},
                           cell.projections[p].element, false, run.projected[p]))
      return e;
  return Status();
}

Status SequenceDriver::forwardSpan(const Sequence &seq, int64_t t0, int64_t len,
                                   const std::vector<View> &outputs,
                                   const std::vector<View> &finalStates, ForwardRun &run) {
  int64_t T = seq.steps, B = seq.batch;
  int64_t c = t0 / run.K;
  if (t0 == c * run.K && run.chunked)
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      if (Status e = backend->copy(run.start[i].view(),
                                   run.boundaries[i].at(c * B * n, {B, n})))
        return e;
    }
  Chunk chunk;
  chunk.t0 = t0;
  chunk.len = len;
  chunk.resets = run.resets;
  chunk.initial = run.initial;
  for (size_t p = 0; p < cell.projections.size(); ++p) {
    View rows = run.projected[p].view().at(0, {len, B, cell.projections[p].rows});
    if (Status e = project(seq, cell.projections[p], t0, len, rows))
      return e;
    chunk.projections.push_back(rows);
  }
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    chunk.start.push_back(run.start[i].view());
    if (cell.endStates)
      chunk.end.push_back(run.end[i].view());
    // A span's buffer, or the steps of a whole sequence's.
    int64_t at = run.history[i].shape[0] == T ? t0 : 0;
    chunk.history.push_back(run.history[i].at(at * B * n, {len, B, n}));
  }
  for (size_t i = 0; i < cell.outputs.size(); ++i) {
    int64_t n = cell.outputs[i].shape[0];
    chunk.outputs.push_back(outputs[i].at(t0 * B * n, {len, B, n}));
  }
  int64_t G = cell.gatesWidth;
  chunk.gates = run.saveGates ? run.gates.at(t0 * B * G, {len, B, G}) : run.gates;
  chunk.stream = run.stream;
  if (Status e = runForwardChunk(seq, chunk, run.saveGates, run.kernel))
    return e;
  if (Status e = gatherFinalStates(seq.lengths, t0, len, chunk.history, finalStates))
    return e;
  // The next span starts where this one ended: the kernel's end states,
  // exact, or the history's last step (in the storage type).
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (cell.endStates) {
      std::swap(run.start[i], run.end[i]);
      continue;
    }
    if (Status e = backend->copy(chunk.history[i].at((len - 1) * B * n, {B, n}),
                                 run.start[i].view()))
      return e;
  }
  return Status();
}

Status SequenceDriver::forward(const Sequence &seq, const std::vector<View> &outputs,
                               const std::vector<View> &finalStates, Recompute mode,
                               SavedPtr *saved, bool outputsOutliveSaved,
                               const std::vector<View> *kept) {
  if (Status e = checkForward(seq, outputs, finalStates))
    return e;
  ledger->restart();
  CallBuffers call;
  if (Status e = beginCall(seq, call))
    return e;
  bool training = saved != nullptr;
  SavedPtr keep;
  if (training)
    if (Status e = makeSaved(seq, mode, outputs, outputsOutliveSaved, kept, keep))
      return e;
  ForwardRun run;
  if (Status e = forwardBuffers(seq, outputs, mode, training, keep.get(), run))
    return e;

  // Span by span: no span crosses a chunk.
  int64_t T = seq.steps;
  for (int64_t t0 = 0, len = 0; t0 < T; t0 += len) {
    len = std::min(run.span, std::min((t0 / run.K + 1) * run.K, T) - t0);
    if (Status e = forwardSpan(seq, t0, len, outputs, finalStates, run))
      return e;
  }

  if (seq.lengths.empty()) {
    for (size_t i = 0; i < cell.states.size(); ++i)
      if (Status e = backend->copy(run.start[i].view(), finalStates[i]))
        return e;
  } else {
    // Samples of length 0 end where they start.
    if (Status e = gatherFinalStates(seq.lengths, -1, 1, run.initial, finalStates))
      return e;
    if (Status e = zeroPastLengths(seq.lengths, 0, outputs))
      return e;
  }
  last.kept = training ? savedBytes(*keep) : 0;
  last.forwardPeak = ledger->peak;
  if (training)
    *saved = std::move(keep);
  return Status();
}
