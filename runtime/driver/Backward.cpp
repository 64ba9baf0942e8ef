//===- Backward.cpp - The backward, chunk by chunk and piece by piece -------===//
//
// The backward: per chunk (replayed for chunk:K), its pieces latest first,
// each a launch of the backward kernel whose results fold into the
// gradients with the weight, bias and input gradients' GEMMs.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

/// Where the backward's gradients go: the caller's buffers, or scratch for
/// those nobody wants (`unwanted`); the gradient carried into the end of
/// the piece being worked on.
struct SequenceDriver::Gradients {
  std::vector<View> params, initial, inputs, outputs, finalStates;
  std::vector<Scratch> carry, unwanted;
};

/// The backward's buffers, made once a call for the longest chunk and
/// piece and used through views, so that fresh memory faults once a call,
/// not once a piece.
struct SequenceDriver::Workspace {
  bool replay = false;
  int64_t pieceMax = 0;
  std::vector<Scratch> projected, history, outputs, outputGrads, results, sums;
  /// Where chunk:K's replay leaves the states (Interface::endStates).
  std::vector<Scratch> replayEnd;
  /// A piece's states to start from, where the history holds them in
  /// another type (startsInCompute).
  std::vector<Scratch> starts;
  Scratch gates;
  /// For each backward argument, the projection whose replay buffer holds
  /// its result (chunk:K's projection gradients), or -1; the input whose
  /// gradient (the caller's) the kernel writes into, or -1.
  std::vector<int64_t> projectionOf, inputOf;
  /// chunk:K's replay, and the backward kernel.
  KernelBuffers forwardKernel, backwardKernel;
};

std::vector<int64_t> SequenceDriver::pieceEnds(const std::vector<int64_t> &lengths,
                                               int64_t t0, int64_t len, int64_t steps) {
  std::vector<int64_t> ends = {t0 + len - 1};
  for (int64_t length : lengths)
    if (length - 1 >= t0 && length - 1 < t0 + len - 1)
      ends.push_back(length - 1);
  std::sort(ends.rbegin(), ends.rend());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  // No piece longer than `steps`: more ends where a gap is.
  std::vector<int64_t> all;
  for (size_t k = 0; k < ends.size(); ++k) {
    int64_t first = k + 1 < ends.size() ? ends[k + 1] + 1 : t0;
    for (int64_t end = ends[k]; end >= first; end -= steps)
      all.push_back(end);
  }
  return all;
}

/// Which projection (Interface::projections) the backward kernel's
/// argument `a` is the gradient of: its place among the kernel's projection
/// gradients, each counted whether or not it repeats an earlier result or
/// is zero; -1 for any other argument.
static int64_t projectionOfArg(const Kernel &kernel, size_t a) {
  if (kernel.args[a].kind != ArgKind::ProjectionGrad)
    return -1;
  int64_t index = 0;
  for (size_t b = 0; b < a; ++b)
    index += kernel.args[b].kind == ArgKind::ProjectionGrad;
  return index;
}

Status SequenceDriver::injectFinalStateGrads(const std::vector<int64_t> &lengths,
                                            int64_t step,
                                            const std::vector<View> &gradFinalStates,
                                            std::vector<Scratch> &carry) {
  if (std::find(lengths.begin(), lengths.end(), step + 1) == lengths.end())
    return Status();
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (gradFinalStates[i].valid())
      if (Status e = backend->addAtLengths(gradFinalStates[i], lengthsOnBackend, step,
                                           carry[i].view()))
        return e;
  return Status();
}

Status SequenceDriver::backward(const Sequence &seq, const Saved &saved,
                                const std::vector<View> &gradOutputs,
                                const std::vector<View> &gradFinalStates,
                                const std::vector<View> &gradInputs,
                                const std::vector<View> &gradParams,
                                const std::vector<View> &gradInitialStates) {
  int64_t T = saved.steps, B = saved.batch;
  if (Status e = checkExtent(T, B))
    return e;
  if (gradOutputs.size() != cell.outputs.size() ||
      gradFinalStates.size() != cell.states.size() ||
      gradInputs.size() != cell.inputs.size() ||
      gradParams.size() != cell.params.size() ||
      gradInitialStates.size() != cell.states.size())
    return Status::error("backward expects one gradient buffer per output, final "
                         "state, input, param and initial state");
  for (size_t i = 0; i < cell.outputs.size(); ++i)
    if (Status e = check(gradOutputs[i], {T, B, cell.outputs[i].shape[0]},
                         "gradient of output '" + cell.outputs[i].name + "'", true))
      return e;
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (Status e = check(gradFinalStates[i], {B, n},
                         "gradient of final state '" + cell.states[i].name + "'", true))
      return e;
    if (Status e = check(gradInitialStates[i], {B, n},
                         "gradient of initial state '" + cell.states[i].name + "'",
                         true))
      return e;
  }
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    if (Status e = check(gradInputs[i], {T, B, cell.inputs[i].shape[0]},
                         "gradient of input '" + cell.inputs[i].name + "'", true))
      return e;
  for (size_t i = 0; i < cell.params.size(); ++i)
    if (Status e = check(gradParams[i], cell.params[i].shape,
                         "gradient of param '" + cell.params[i].name + "'", true))
      return e;
  if (seq.inputs.size() != cell.inputs.size() || seq.batch != B || seq.steps != T)
    return Status::error("backward must see the forward's inputs");
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    if (seq.inputs[i].shape != std::vector<int64_t>{T, B, cell.inputs[i].shape[0]})
      return Status::error("backward must see the forward's inputs");
  if (seq.lengths != saved.lengths)
    return Status::error("backward must see the forward's lengths");

  ledger->restart();
  CallBuffers call;
  if (Status e = beginCall(seq, call))
    return e;
  std::vector<Scratch> defaults;
  View resets;
  std::vector<View> initial;
  // The longest launch: chunk:K's replay of a chunk, or a piece.
  int64_t K = saved.chunkSteps;
  bool chunked = saved.mode.kind == Recompute::Kind::Chunk;
  int64_t longest = chunked ? K : std::min(K, pieceSteps(B, T));
  if (Status e = resetsAndInitial(seq, longest, defaults, resets, initial))
    return e;

  // The gradients go straight into the caller's buffers, zeroed first: the
  // pieces add to them. Scratch takes those of params and initial states
  // that nobody wants; an input's that nobody wants is not computed.
  Gradients g;
  g.params.resize(cell.params.size());
  g.initial.resize(cell.states.size());
  g.carry.resize(cell.states.size());
  g.outputs = gradOutputs;
  g.finalStates = gradFinalStates;
  g.inputs = gradInputs;
  auto zeroed = [&](const View &wanted, std::vector<int64_t> shape, View &to) {
    if (wanted.valid()) {
      to = wanted;
      int64_t cols = shape.back(), rows = wanted.size() / std::max<int64_t>(cols, 1);
      return backend->fillRows(wanted, rows, cols, {});
    }
    g.unwanted.emplace_back();
    if (Status e = scratch(std::move(shape), cell.compute, true, g.unwanted.back()))
      return e;
    to = g.unwanted.back().view();
    return Status();
  };
  for (size_t i = 0; i < cell.params.size(); ++i)
    if (Status e = zeroed(gradParams[i], cell.params[i].shape, g.params[i]))
      return e;
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    if (gradInputs[i].valid())
      if (Status e = backend->fillRows(gradInputs[i], T * B, cell.inputs[i].shape[0], {}))
        return e;
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (Status e = zeroed(gradInitialStates[i], {B, n}, g.initial[i]))
      return e;
    if (Status e = scratch({B, n}, cell.compute, true, g.carry[i]))
      return e;
    // With lengths, each sample's final-state gradient joins the carry at
    // its own last step (injectFinalStateGrads).
    if (gradFinalStates[i].valid() && seq.lengths.empty())
      if (Status e = backend->copy(gradFinalStates[i], g.carry[i].view()))
        return e;
  }

  Workspace w;
  if (Status e = backwardWorkspace(seq, saved, g, w))
    return e;
  for (int64_t c = (T + K - 1) / K - 1; c >= 0; --c) {
    Chunk chunk;
    chunk.t0 = c * K;
    chunk.len = std::min(K, T - chunk.t0);
    chunk.resets = resets;
    chunk.initial = initial;
    if (Status e = backwardChunk(seq, saved, chunk, w, g))
      return e;
  }
  // Samples of length 0: their final states are their initial states.
  if (Status e = injectFinalStateGrads(seq.lengths, -1, gradFinalStates, g.carry))
    return e;
  // What flows into the start of the first chunk belongs to the initial state.
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (Status e = backend->add(g.carry[i].view(), g.initial[i]))
      return e;
  last.backwardPeak = ledger->peak;
  return Status();
}

Status SequenceDriver::backwardWorkspace(const Sequence &seq, const Saved &saved,
                                         const Gradients &g, Workspace &w) {
  int64_t T = saved.steps, B = seq.batch, K = saved.chunkSteps;
  bool chunked = saved.mode.kind == Recompute::Kind::Chunk;
  w.replay = !chunked && saved.mode.kind != Recompute::Kind::None;
  w.pieceMax = std::min(K, pieceSteps(B, T));
  // The projections: chunk:K's replay of a chunk, or each piece's for full,
  // which replays inside the backward kernel; none with saved gates.
  int64_t projectedSteps = chunked ? K : w.replay ? w.pieceMax : 0;
  for (const Interface::Projection &p : cell.projections) {
    w.projected.emplace_back();
    if (Status e = scratch({projectedSteps, B, p.rows}, p.element, false,
                           w.projected.back()))
      return e;
  }
  // chunk:K's replay: the chunk's states, outputs (an output that is a
  // state is its history) and gates.
  if (chunked) {
    w.history.resize(cell.states.size());
    for (size_t i = 0; i < cell.states.size(); ++i)
      if (Status e = scratch({K, B, cell.states[i].shape[0]}, cell.storage, false,
                             w.history[i]))
        return e;
    if (cell.endStates) {
      w.replayEnd.resize(cell.states.size());
      for (size_t i = 0; i < cell.states.size(); ++i)
        if (Status e = scratch({B, cell.states[i].shape[0]}, cell.compute, false,
                               w.replayEnd[i]))
          return e;
    }
    w.outputs.resize(cell.outputs.size());
    for (size_t i = 0; i < cell.outputs.size(); ++i)
      if (std::find(cell.stateOutputs.begin(), cell.stateOutputs.end(), int64_t(i)) ==
          cell.stateOutputs.end())
        if (Status e = scratch({K, B, cell.outputs[i].shape[0]}, cell.storage, false,
                               w.outputs[i]))
          return e;
  }
  if (Status e = scratch({chunked ? K : 0, B, cell.gatesWidth}, cell.storage, false,
                         w.gates))
    return e;
  // Output gradients of a piece where the caller's cannot serve: none given,
  // or lengths that make some zeros.
  w.outputGrads.resize(cell.outputs.size());
  for (size_t i = 0; i < cell.outputs.size(); ++i)
    if (!seq.lengths.empty() || !g.outputs[i].valid())
      if (Status e = scratch({w.pieceMax, B, cell.outputs[i].shape[0]}, cell.storage,
                             false, w.outputGrads[i]))
        return e;
  // What the backward kernel writes, at the longest piece. After chunk:K's
  // replay, its projections are dead, and the projections' gradients (the
  // same shape) take their buffers.
  const Kernel &kernel = cell.backward;
  w.results.resize(kernel.args.size());
  w.projectionOf.assign(kernel.args.size(), -1);
  w.inputOf.assign(kernel.args.size(), -1);
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    const KernelArg &arg = kernel.args[a];
    if (!isBackwardResult(arg.kind) || (arg.sameAs >= 0 && size_t(arg.sameAs) < a))
      continue;
    Element element = arg.element.value_or(cell.compute);
    // A piece's steps of an input gradient are written by its kernel first
    // (the projections' GEMMs add to them after): into the caller's buffer.
    if (arg.kind == ArgKind::InputGrad) {
      size_t i = indexOf(cell.inputs, arg.name);
      if (g.inputs[i].valid() && g.inputs[i].element() == element) {
        w.inputOf[a] = int64_t(i);
        continue;
      }
    }
    if (arg.kind == ArgKind::ProjectionGrad) {
      size_t p = size_t(projectionOfArg(kernel, a));
      if (chunked && p < cell.projections.size() &&
          cell.projections[p].element == element) {
        w.projectionOf[a] = int64_t(p);
        continue;
      }
    }
    std::vector<int64_t> shape = arg.shape;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] < 0)
        shape[d] = shape.size() == 3 && d == 0 ? w.pieceMax : B;
    if (Status e = scratch(shape, element, false, w.results[a]))
      return e;
  }
  for (const Interface::Projection &p : cell.projections) {
    w.sums.emplace_back();
    if (!p.biases.empty())
      if (Status e = scratch({p.rows}, cell.compute, false, w.sums.back()))
        return e;
  }
  return Status();
}

Status SequenceDriver::backwardChunk(const Sequence &seq, const Saved &saved,
                                     Chunk &chunk, Workspace &w, Gradients &g) {
  int64_t B = seq.batch, t0 = chunk.t0, len = chunk.len;
  bool chunked = saved.mode.kind == Recompute::Kind::Chunk;
  // The chunk's states and gates: saved, or replayed by a forward over the
  // chunk that saves its gates (chunk:K).
  for (size_t p = 0; p < cell.projections.size(); ++p) {
    const Interface::Projection &proj = cell.projections[p];
    View v = w.projected[p].view();
    chunk.projections.push_back(chunked ? v.at(0, {len, B, proj.rows}) : v);
    if (chunked)
      if (Status e = project(seq, proj, t0, len, chunk.projections.back()))
        return e;
  }
  if (chunked) {
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      chunk.history.push_back(w.history[i].view().at(0, {len, B, n}));
      chunk.start.push_back(saved.states[i].at(t0 / saved.chunkSteps * B * n, {B, n}));
    }
    for (size_t i = 0; i < cell.outputs.size(); ++i) {
      auto state = std::find(cell.stateOutputs.begin(), cell.stateOutputs.end(),
                             int64_t(i));
      int64_t n = cell.outputs[i].shape[0];
      chunk.outputs.push_back(state != cell.stateOutputs.end()
                                  ? chunk.history[state - cell.stateOutputs.begin()]
                                  : w.outputs[i].view().at(0, {len, B, n}));
    }
    chunk.gates = w.gates.view().at(0, {len, B, cell.gatesWidth});
    // The backward reads the replay's history and gates next: in cache.
    Chunk replay = chunk;
    replay.stream = false;
    for (Scratch &end : w.replayEnd)
      replay.end.push_back(end.view());
    if (Status e = runForwardChunk(seq, replay, /*saveGates=*/true, w.forwardKernel))
      return e;
    // The backward reads the gates that the replay saved, not its
    // projections.
    for (size_t p = 0; p < cell.projections.size(); ++p)
      chunk.projections[p] = chunk.projections[p].at(0, {0, B, cell.projections[p].rows});
  } else {
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      chunk.history.push_back(saved.states[i].at(t0 * B * n, {len, B, n}));
      chunk.start.push_back(chunk.initial[i]);
    }
    chunk.gates = saved.gates.valid() ? saved.gates.at(t0 * B * cell.gatesWidth,
                                                       {len, B, cell.gatesWidth})
                                      : w.gates.view();
  }
  for (size_t i = 0; i < cell.states.size(); ++i)
    chunk.finalStateGrads.push_back(g.carry[i].view());

  // Pieces, latest first, that end at samples' last steps (where their
  // final-state gradients join the carry) and are at most pieceMax long.
  std::vector<int64_t> ends = pieceEnds(seq.lengths, t0, len, w.pieceMax);
  for (size_t k = 0; k < ends.size(); ++k) {
    int64_t first = k + 1 < ends.size() ? ends[k + 1] + 1 : t0;
    int64_t count = ends[k] - first + 1;
    Chunk piece = slice(chunk, B, first, count);
    piece.rows = rowsRunning(seq.lengths, B, ends[k]);
    if (Status e = injectFinalStateGrads(seq.lengths, ends[k], g.finalStates, g.carry))
      return e;
    if (piece.rows == 0)
      continue;
    if (Status e = startsInCompute(piece, w.starts))
      return e;
    if (w.replay)
      for (size_t p = 0; p < cell.projections.size(); ++p) {
        const Interface::Projection &proj = cell.projections[p];
        piece.projections[p] = w.projected[p].view().at(0, {count, B, proj.rows});
        if (Status e = project(seq, proj, first, count, piece.projections[p]))
          return e;
      }
    if (Status e = outputGradsOf(seq, g.outputs, first, count, w, piece.outputGrads))
      return e;
    if (Status e = backwardPiece(seq, piece, w, g))
      return e;
  }
  return Status();
}

Status SequenceDriver::outputGradsOf(const Sequence &seq,
                                     const std::vector<View> &gradOutputs,
                                     int64_t first, int64_t count, Workspace &w,
                                     std::vector<View> &out) {
  int64_t B = seq.batch;
  out.clear();
  for (size_t i = 0; i < cell.outputs.size(); ++i) {
    int64_t n = cell.outputs[i].shape[0];
    View given = gradOutputs[i].valid()
                     ? gradOutputs[i].at(first * B * n, {count, B, n})
                     : View();
    // The caller's, unless there are none, or lengths make some zeros.
    if (!w.outputGrads[i].view().valid()) {
      out.push_back(given);
      continue;
    }
    View v = w.outputGrads[i].view().at(0, {count, B, n});
    Status e = given.valid() ? backend->copy(given, v)
                             : backend->fillRows(v, count * B, n, {});
    if (e)
      return e;
    if (!seq.lengths.empty())
      if (Status e = zeroPastLengths(seq.lengths, first, {v}))
        return e;
    out.push_back(v);
  }
  return Status();
}

Status SequenceDriver::backwardPiece(const Sequence &seq, const Chunk &piece,
                                     Workspace &w, Gradients &g) {
  int64_t B = seq.batch, count = piece.len;
  // The backward kernel's arguments, in its order, with the workspace's
  // buffers for what it writes.
  const Kernel &kernel = cell.backward;
  std::vector<Arg> args;
  std::vector<size_t> resultArgs;
  if (Status e = bind(kernel, seq, piece, /*backward=*/true, args, resultArgs))
    return e;
  std::vector<Written> written;
  for (size_t a : resultArgs) {
    const KernelArg &arg = kernel.args[a];
    View &v = args[a].view;
    if (arg.sameAs >= 0 && size_t(arg.sameAs) < a) {
      // The same values as an earlier result: its buffer.
      v = args[arg.sameAs].view;
    } else if (w.inputOf[a] >= 0) {
      // Rows that do not run keep the zeros they start with.
      int64_t n = cell.inputs[w.inputOf[a]].shape[0];
      v = g.inputs[w.inputOf[a]].at(piece.t0 * B * n, {count, B, n});
      continue;
    } else {
      View buffer = w.projectionOf[a] >= 0 ? w.projected[w.projectionOf[a]].view()
                                           : w.results[a].view();
      std::vector<int64_t> shape = arg.shape;
      for (size_t d = 0; d < shape.size(); ++d)
        if (shape[d] < 0)
          shape[d] = shape.size() == 3 && d == 0 ? count : B;
      v = buffer.at(0, shape);
      // Rows that do not run must add nothing where the results go.
      if (piece.rows < B)
        if (Status e = backend->fillRows(v, v.size() / shape.back(), shape.back(), {}))
          return e;
    }
    // A zero result adds nothing to what it is folded into (weight rows
    // and vectors go in pairs, so they stay).
    if (!arg.zero || arg.kind == ArgKind::WeightRows ||
        arg.kind == ArgKind::WeightVectors)
      written.push_back({arg.kind, arg.name, v, a, arg.sameAs, projectionOfArg(kernel, a)});
  }
  if (Status e = launchOn(kernel, /*backward=*/true, /*saveGates=*/!w.replay, args,
                          piece.rows, w.backwardKernel))
    return e;
  return fold(seq, piece.t0, count, written, w, g);
}

/// The weight rows in `written` (with their vectors after them) that
/// repeat the projection gradient at `projectionGrad` (`same_as`: one
/// buffer), for a dense weight of as many rows: an LSTM's W_hh beside W_ih,
/// both dG. Their two weight gradients are one product
/// (Backend::gemmPair). written.size() where there are none.
size_t SequenceDriver::pairedWeightRows(const std::vector<Written> &written,
                                        size_t projectionGrad,
                                        const Interface::Projection &p) const {
  if (p.blocks != 1)
    return written.size();
  for (size_t w = 0; w + 1 < written.size(); ++w) {
    if (written[w].kind != ArgKind::WeightRows ||
        written[w + 1].kind != ArgKind::WeightVectors ||
        written[w].sameAs != int64_t(written[projectionGrad].arg))
      continue;
    size_t i = indexOf(cell.params, written[w].name);
    if (i < cell.params.size() && cell.params[i].shape.size() == 2 &&
        cell.params[i].shape[0] == p.rows)
      return w;
  }
  return written.size();
}

Status SequenceDriver::fold(const Sequence &seq, int64_t first, int64_t count,
                            const std::vector<Written> &written, Workspace &work,
                            Gradients &g) {
  int64_t B = seq.batch;
  // Fold what the kernel wrote into the gradients, with the GEMMs for the
  // weight, bias and input gradients. Weight rows that a projection's
  // gradient already folded (paired) are skipped.
  // Each projection gradient's paired weight rows, found before either is
  // folded (the rows may come first).
  std::vector<size_t> pairOf(written.size(), written.size());
  std::vector<bool> paired(written.size(), false);
  for (size_t w = 0; w < written.size(); ++w)
    if (written[w].kind == ArgKind::ProjectionGrad) {
      if (written[w].projection < 0 ||
          size_t(written[w].projection) >= cell.projections.size())
        return Status::error("internal error: the backward kernel has more projection "
                             "gradients than the package has projections");
      size_t pair = pairedWeightRows(written, w, cell.projections[written[w].projection]);
      if (pair < written.size() && !paired[pair]) {
        pairOf[w] = pair;
        paired[pair] = true;
      }
    }
  for (size_t w = 0; w < written.size(); ++w) {
    if (paired[w]) {
      ++w; // and the vectors after them
      continue;
    }
    const Written &out = written[w];
    const View &r = out.view;
    switch (out.kind) {
    case ArgKind::InitialStateGrad: {
      size_t i = indexOf(cell.states, out.name);
      if (Status e = backend->add(r, g.initial[i]))
        return e;
      break;
    }
    case ArgKind::StartStateGrad: {
      size_t i = indexOf(cell.states, out.name);
      if (Status e = backend->copy(r, g.carry[i].view()))
        return e;
      break;
    }
    case ArgKind::InputGrad: {
      size_t i = indexOf(cell.inputs, out.name);
      int64_t n = cell.inputs[i].shape[0];
      if (!g.inputs[i].valid())
        break;
      if (Status e = backend->add(r, g.inputs[i].at(first * B * n, {count, B, n})))
        return e;
      break;
    }
    case ArgKind::ProjectionGrad: {
      size_t index = size_t(out.projection);
      const Interface::Projection &p = cell.projections[index];
      View rows = r.at(0, {count * B, p.rows});
      View x = seq.inputs[p.input].at(first * B * p.cols, {count * B, p.cols});
      int64_t m = p.rows / p.blocks, n = p.cols / p.blocks;
      size_t pair = pairOf[w];
      if (pair < written.size()) {
        // dW = dG^T x and dW' = dG^T v: dG read once for both.
        size_t i = indexOf(cell.params, written[pair].name);
        int64_t cols = cell.params[i].shape[1];
        if (Status e = backend->gemmPair(
                true, false, p.rows, p.cols, cols, count * B, rows, p.rows, x, p.cols,
                written[pair + 1].view.at(0, {count * B, cols}), cols, 1.0,
                g.params[p.weight], p.cols, g.params[i], cols))
          return e;
      } else if (Status e = blockGemm(*backend, p.blocks, true, false, m, n, count * B, rows,
                                      p.rows, m, x, p.cols, n, 1.0, g.params[p.weight], n,
                                      m * n)) {
        return e;
      }
      if (g.inputs[p.input].valid())
        if (Status e = blockGemm(
                *backend, p.blocks, false, false, count * B, n, m, rows, p.rows, m,
                seq.params[p.weight], n, m * n, 1.0,
                g.inputs[p.input].at(first * B * p.cols, {count * B, p.cols}), p.cols,
                n))
          return e;
      // Every bias of the projection has the same gradient: sum the rows
      // once (an LSTM's b_ih and b_hh).
      if (!p.biases.empty()) {
        View sums = work.sums[index].view();
        if (Status e = backend->fillRows(sums, 1, p.rows, {}))
          return e;
        if (Status e = backend->columnSums(rows, count * B, p.rows, sums))
          return e;
        for (size_t b : p.biases)
          if (Status e = backend->add(sums, g.params[b]))
            return e;
      }
      break;
    }
    case ArgKind::WeightRows: {
      // The next written buffer holds the matching vectors.
      if (w + 1 >= written.size() || written[w + 1].kind != ArgKind::WeightVectors)
        return Status::error("internal error: weight rows without their vectors");
      const View &vecs = written[w + 1].view;
      size_t i = indexOf(cell.params, out.name);
      // [rows, cols], or blocks of them: the gradient rows and the
      // vectors hold a part a block.
      const std::vector<int64_t> &shape = cell.params[i].shape;
      int64_t blocks = shape.size() == 3 ? shape[0] : 1;
      int64_t rows = shape[shape.size() - 2], cols = shape.back();
      if (Status e = blockGemm(*backend, blocks, true, false, rows, cols, count * B,
                               r.at(0, {count * B, blocks * rows}), blocks * rows, rows,
                               vecs.at(0, {count * B, blocks * cols}), blocks * cols,
                               cols, 1.0, g.params[i], cols, rows * cols))
        return e;
      ++w;
      break;
    }
    case ArgKind::ParamGrad: {
      size_t i = indexOf(cell.params, out.name);
      if (Status e = backend->columnSums(r, B, cell.params[i].shape[0], g.params[i]))
        return e;
      break;
    }
    // Read with their weight rows, or not results at all.
    case ArgKind::WeightVectors:
    case ArgKind::Input:
    case ArgKind::Projection:
    case ArgKind::Resets:
    case ArgKind::InitialState:
    case ArgKind::StartState:
    case ArgKind::Param:
    case ArgKind::ParamTransposed:
    case ArgKind::Output:
    case ArgKind::StateHistory:
    case ArgKind::Gates:
    case ArgKind::EndState:
    case ArgKind::OutputGrad:
    case ArgKind::FinalStateGrad:
    case ArgKind::BatchBegin:
    case ArgKind::BatchEnd:
    case ArgKind::Workspace:
    case ArgKind::GridBarrier:
    case ArgKind::Group:
    case ArgKind::Slice:
    case ArgKind::Slices:
    case ArgKind::Packed:
    case ArgKind::Stream:
      break;
    }
  }
  return Status();
}
