//===- SequenceDriver.cpp - One sequence driver for every backend ---------===//

#include "runtime/driver/SequenceDriver.h"

#include <algorithm>
#include <map>

using namespace cellc;
using namespace cellc::driver;

namespace {

std::string shapeStr(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Checks a caller's view: present (unless optional) and of `shape`.
Status check(const View &view, const std::vector<int64_t> &shape,
             const std::string &what, bool optional = false) {
  if (!view.valid())
    return optional ? Status() : Status::error(what + " is missing");
  if (view.shape != shape)
    return Status::error(what + " has shape " + shapeStr(view.shape) +
                         ", expected " + shapeStr(shape));
  return Status();
}

/// Checks per-sample lengths: none, or B of them in [0, T].
Status checkLengths(const std::vector<int64_t> &lengths, int64_t T, int64_t B) {
  if (lengths.empty())
    return Status();
  if (int64_t(lengths.size()) != B)
    return Status::error("expected " + std::to_string(B) +
                         " lengths, one a sample, got " + std::to_string(lengths.size()));
  for (size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] < 0 || lengths[b] > T)
      return Status::error("length " + std::to_string(lengths[b]) + " of sample " +
                           std::to_string(b) + " is outside [0, T = " +
                           std::to_string(T) + "]");
  return Status();
}

} // namespace

//===----------------------------------------------------------------------===//
// Scratch and Saved
//===----------------------------------------------------------------------===//

/// A buffer the driver owns: released through its backend.
class SequenceDriver::Scratch {
public:
  Scratch() = default;
  Scratch(Scratch &&other) noexcept { *this = std::move(other); }
  Scratch &operator=(Scratch &&other) noexcept {
    release();
    backend = std::move(other.backend);
    buffer = other.buffer;
    shape = std::move(other.shape);
    other.buffer = Buffer();
    return *this;
  }
  ~Scratch() { release(); }

  static Status make(const std::shared_ptr<Backend> &backend,
                     std::vector<int64_t> shape, Element element, bool zero,
                     Scratch &out) {
    int64_t elements = 1;
    for (int64_t d : shape)
      elements *= d;
    Scratch s;
    s.backend = backend;
    s.shape = std::move(shape);
    if (Status e = backend->allocate(std::max<int64_t>(elements, 1), element,
                                     zero, s.buffer))
      return e;
    s.buffer.element = element;
    out = std::move(s);
    return Status();
  }

  View view() const {
    View v;
    v.buffer = buffer;
    v.shape = shape;
    return v;
  }
  int64_t bytes() const {
    int64_t n = bytesOf(buffer.element);
    for (int64_t d : shape)
      n *= d;
    return n;
  }

private:
  void release() {
    if (backend && buffer.valid())
      backend->release(buffer);
    buffer = Buffer();
  }
  std::shared_ptr<Backend> backend;
  Buffer buffer;
  std::vector<int64_t> shape;
};

class cellc::driver::Saved {
public:
  Recompute mode;
  int64_t steps = 0, batch = 0;
  /// Steps per chunk: T unless the mode is chunk:K with K < T.
  int64_t chunkSteps = 0;
  /// none, full: each state after each step, [T, B, n]. chunk: the state
  /// before each chunk, [chunks, B, n].
  std::vector<SequenceDriver::Scratch> states;
  /// none: the planned gate values, [T, B, S].
  SequenceDriver::Scratch gates;
  bool hasGates = false;
  /// The forward's per-sample lengths (empty: all T).
  std::vector<int64_t> lengths;
};

void SavedDeleter::operator()(Saved *saved) const { delete saved; }

int64_t cellc::driver::savedBytes(const Saved &saved) {
  int64_t bytes = saved.hasGates ? saved.gates.bytes() : 0;
  for (const auto &s : saved.states)
    bytes += s.bytes();
  return bytes;
}

int64_t cellc::driver::savedSteps(const Saved &saved) { return saved.steps; }
int64_t cellc::driver::savedBatch(const Saved &saved) { return saved.batch; }

//===----------------------------------------------------------------------===//
// The driver
//===----------------------------------------------------------------------===//

Status SequenceDriver::workspace(const Kernel &kernel, int64_t batch,
                                 std::vector<Arg> &args, std::vector<Scratch> &keep) {
  // The persistent strategy's global buffers: a workspace per tile, and the
  // barrier words (zero before the launch; each launch leaves them so).
  int64_t tiles = (batch + kernel.batchTile - 1) / std::max<int64_t>(kernel.batchTile, 1);
  for (size_t i = 0; i < kernel.args.size(); ++i) {
    const KernelArg &arg = kernel.args[i];
    if (arg.kind != ArgKind::Workspace && arg.kind != ArgKind::GridBarrier)
      continue;
    bool words = arg.kind == ArgKind::GridBarrier;
    Element element = arg.element.value_or(words ? Element::I32 : cell.compute);
    int64_t n = words ? 2 * tiles : tiles * kernel.workspaceBytes / bytesOf(element);
    keep.emplace_back();
    if (Status e = Scratch::make(backend, {n}, element, /*zero=*/words, keep.back()))
      return e;
    args[i].view = keep.back().view();
  }
  return Status();
}

/// A kernel argument that the forward (or backward) kernel should not have.
static Status misplaced(const KernelArg &arg, bool backward) {
  return Status::error(std::string("internal error: the ") +
                       (backward ? "backward" : "forward") + " kernel has a " +
                       name(arg.kind) + " argument");
}

Status SequenceDriver::bind(const Kernel &kernel, const Sequence &seq,
                           const Chunk &chunk, bool backward, std::vector<Arg> &args,
                           std::vector<size_t> &results) {
  int64_t B = seq.batch, t0 = chunk.t0, len = chunk.len;
  args.assign(kernel.args.size(), Arg());
  results.clear();
  size_t projection = 0;
  for (size_t a = 0; a < kernel.args.size(); ++a) {
    const KernelArg &arg = kernel.args[a];
    View &v = args[a].view;
    switch (arg.kind) {
    case ArgKind::Input: {
      size_t i = indexOf(cell.inputs, arg.name);
      int64_t n = cell.inputs[i].shape[0];
      v = seq.inputs[i].at(t0 * B * n, {len, B, n});
      break;
    }
    case ArgKind::Projection:
      v = chunk.projections[projection++];
      break;
    case ArgKind::Resets:
      v = chunk.resets.at(t0 * B, {len, B});
      break;
    case ArgKind::InitialState:
      v = chunk.initial[indexOf(cell.states, arg.name)];
      break;
    case ArgKind::StartState:
      v = chunk.start[indexOf(cell.states, arg.name)];
      break;
    case ArgKind::Param:
      v = seq.params[indexOf(cell.params, arg.name)];
      break;
    case ArgKind::StateHistory:
      v = chunk.history[indexOf(cell.states, arg.name)];
      break;
    case ArgKind::Gates:
      v = chunk.gates;
      break;
    case ArgKind::BatchBegin:
      args[a].index = 0;
      break;
    case ArgKind::BatchEnd:
      args[a].index = chunk.rows < 0 ? B : chunk.rows;
      break;
    case ArgKind::Workspace:
    case ArgKind::GridBarrier:
      break;
    case ArgKind::Output:
      if (backward)
        return misplaced(arg, backward);
      v = chunk.outputs[indexOf(cell.outputs, arg.name)];
      break;
    case ArgKind::FinalStateGrad:
      if (!backward)
        return misplaced(arg, backward);
      v = chunk.finalStateGrads[indexOf(cell.states, arg.name)];
      break;
    case ArgKind::OutputGrad: {
      if (!backward)
        return misplaced(arg, backward);
      size_t i = indexOf(cell.outputs, arg.name);
      int64_t n = cell.outputs[i].shape[0];
      v = chunk.outputGrads[i].at(t0 * B * n, {len, B, n});
      break;
    }
    case ArgKind::InitialStateGrad:
    case ArgKind::InputGrad:
    case ArgKind::ProjectionGrad:
    case ArgKind::WeightRows:
    case ArgKind::WeightVectors:
    case ArgKind::ParamGrad:
    case ArgKind::StartStateGrad:
      if (!backward)
        return misplaced(arg, backward);
      results.push_back(a);
      break;
    }
  }
  return Status();
}

Status SequenceDriver::runForwardChunk(const Sequence &seq, const Chunk &chunk,
                                       bool saveGates) {
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
  for (size_t k = ends.size(); k-- > 0;) {
    int64_t first = k + 1 < ends.size() ? ends[k + 1] + 1 : chunk.t0;
    Chunk piece = slice(chunk, seq.batch, first, ends[k] - first + 1);
    piece.rows = rowsRunning(seq.lengths, seq.batch, ends[k]);
    if (piece.rows == 0)
      continue;
    std::vector<Arg> args;
    std::vector<size_t> results;
    if (Status e = bind(kernel, seq, piece, /*backward=*/false, args, results))
      return e;
    std::vector<Scratch> keep;
    if (Status e = workspace(kernel, piece.rows, args, keep))
      return e;
    if (Status e = backend->launch(/*backward=*/false, saveGates, args, piece.rows))
      return e;
  }
  return Status();
}

/// The rows that run change in steps of this many: each change splits the
/// forward into one more launch, and a launch over few steps and rows costs
/// more than the rows it saves (bench/cpu/lengths.py).
static constexpr int64_t kRowGranule = 16;

bool SequenceDriver::skipsEndedRows(const std::vector<int64_t> &lengths) {
  return !lengths.empty() && std::is_sorted(lengths.rbegin(), lengths.rend()) &&
         lengths.front() != lengths.back();
}

int64_t SequenceDriver::rowsRunning(const std::vector<int64_t> &lengths, int64_t B,
                                    int64_t step) {
  if (!skipsEndedRows(lengths))
    return B;
  // In steps of kRowGranule: fewer, longer pieces, on whole tiles.
  int64_t running = std::count_if(lengths.begin(), lengths.end(),
                                  [&](int64_t length) { return length > step; });
  return std::min(B, (running + kRowGranule - 1) / kRowGranule * kRowGranule);
}

Status SequenceDriver::resetsAndInitial(const Sequence &seq,
                                        std::vector<Scratch> &defaults, View &resets,
                                        std::vector<View> &initial) {
  int64_t T = seq.steps, B = seq.batch;
  resets = seq.resets;
  if (!resets.valid()) {
    defaults.emplace_back();
    if (Status e = Scratch::make(backend, {T, B}, Element::U8, true, defaults.back()))
      return e;
    resets = defaults.back().view();
  }
  initial.clear();
  for (size_t i = 0; i < cell.states.size(); ++i) {
    if (!seq.initialStates.empty() && seq.initialStates[i].valid()) {
      initial.push_back(seq.initialStates[i]);
      continue;
    }
    defaults.emplace_back();
    if (Status e = Scratch::make(backend, {B, cell.states[i].shape[0]}, cell.compute,
                                 true, defaults.back()))
      return e;
    initial.push_back(defaults.back().view());
  }
  return Status();
}

Status SequenceDriver::zeroPastLengths(const std::vector<int64_t> &lengths,
                                      const std::vector<View> &views) {
  for (const View &v : views) {
    if (!v.valid())
      continue;
    int64_t T = v.shape[0], B = v.shape[1], n = v.shape[2];
    Scratch zeros;
    if (Status e = Scratch::make(backend, {B, n}, v.element(), true, zeros))
      return e;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B;) {
        if (lengths[b] > t) {
          ++b;
          continue;
        }
        int64_t end = b;
        while (end < B && lengths[end] <= t)
          ++end;
        if (Status e = backend->copy(zeros.view().at(0, {end - b, n}),
                                     v.at((t * B + b) * n, {end - b, n})))
          return e;
        b = end;
      }
  }
  return Status();
}

Status SequenceDriver::gatherFinalStates(const std::vector<int64_t> &lengths,
                                        int64_t t0, int64_t len,
                                        const std::vector<View> &history,
                                        const std::vector<View> &finalStates) {
  int64_t B = lengths.size();
  for (int64_t b = 0; b < B; ++b) {
    int64_t last = lengths[b] - 1;
    if (last < t0 || last >= t0 + len)
      continue;
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      // A [B, n] view (the initial states, t0 = -1) or [len, B, n].
      int64_t row = history[i].shape.size() == 2 ? b : (last - t0) * B + b;
      if (Status e = backend->copy(history[i].at(row * n, {n}),
                                   finalStates[i].at(b * n, {n})))
        return e;
    }
  }
  return Status();
}

std::vector<int64_t> SequenceDriver::pieceEnds(const std::vector<int64_t> &lengths,
                                               int64_t t0, int64_t len) {
  std::vector<int64_t> ends = {t0 + len - 1};
  for (int64_t length : lengths)
    if (length - 1 >= t0 && length - 1 < t0 + len - 1)
      ends.push_back(length - 1);
  std::sort(ends.rbegin(), ends.rend());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  return ends;
}

SequenceDriver::Chunk SequenceDriver::slice(const Chunk &chunk, int64_t B,
                                            int64_t begin, int64_t len) {
  if (begin == chunk.t0 && len == chunk.len)
    return chunk;
  int64_t o = begin - chunk.t0;
  // [len, B, n] views from step `o` on; empty ones ([0, B, n]) stay empty.
  auto steps = [&](const View &v) {
    return v.shape[0] == 0 ? v : v.at(o * B * v.shape[2], {len, B, v.shape[2]});
  };
  Chunk piece = chunk;
  piece.t0 = begin;
  piece.len = len;
  piece.gates = steps(chunk.gates);
  for (View &output : piece.outputs)
    output = steps(output);
  for (size_t p = 0; p < chunk.projections.size(); ++p)
    piece.projections[p] = steps(chunk.projections[p]);
  for (size_t i = 0; i < chunk.history.size(); ++i) {
    int64_t n = chunk.history[i].shape[2];
    piece.history[i] = steps(chunk.history[i]);
    if (o > 0)
      piece.start[i] = chunk.history[i].at((o - 1) * B * n, {B, n});
  }
  return piece;
}

Status SequenceDriver::injectFinalStateGrads(const std::vector<int64_t> &lengths,
                                            int64_t step,
                                            const std::vector<View> &gradFinalStates,
                                            std::vector<Scratch> &carry) {
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] - 1 != step)
      continue;
    for (size_t i = 0; i < cell.states.size(); ++i) {
      if (!gradFinalStates[i].valid())
        continue;
      int64_t n = cell.states[i].shape[0];
      if (Status e = backend->add(gradFinalStates[i].at(b * n, {n}),
                                  carry[i].view().at(b * n, {n})))
        return e;
    }
  }
  return Status();
}

Status SequenceDriver::forward(const Sequence &seq, const std::vector<View> &outputs,
                               const std::vector<View> &finalStates, Recompute mode,
                               SavedPtr *saved) {
  int64_t T = seq.steps, B = seq.batch;
  if (T < 1 || B < 1)
    return Status::error("the sequence needs T >= 1 steps and B >= 1 rows; got T=" +
                         std::to_string(T) + ", B=" + std::to_string(B));
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
  if (Status e = checkLengths(seq.lengths, T, B))
    return e;

  // Zeros for what the caller left out: no resets, no initial states.
  std::vector<Scratch> defaults;
  View resets;
  std::vector<View> initial;
  if (Status e = resetsAndInitial(seq, defaults, resets, initial))
    return e;

  // The hoisted projections: one GEMM each over all T*B rows.
  std::vector<Scratch> projected(cell.projections.size());
  std::vector<View> projectedViews;
  for (size_t p = 0; p < cell.projections.size(); ++p) {
    if (Status e = project(seq, cell.projections[p], 0, T, projected[p]))
      return e;
    projectedViews.push_back(projected[p].view());
  }

  bool training = saved != nullptr;
  bool saveGates = training && mode.kind == Recompute::Kind::None;
  int64_t K = mode.kind == Recompute::Kind::Chunk && training ? std::min(mode.chunk, T)
                                                              : T;
  int64_t chunks = (T + K - 1) / K;
  SavedPtr keep(new Saved());
  keep->mode = mode;
  keep->steps = T;
  keep->batch = B;
  keep->chunkSteps = K;

  Scratch gates;
  if (Status e = Scratch::make(backend, {saveGates ? T : 0, B, cell.gatesWidth},
                               cell.storage, false, gates))
    return e;
  std::vector<Scratch> history(cell.states.size()), boundaries, start(cell.states.size());
  if (K < T)
    boundaries.resize(cell.states.size());
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (Status e = Scratch::make(backend, {K, B, n}, cell.storage, false, history[i]))
      return e;
    // Chunked: the state before each chunk.
    if (K < T)
      if (Status e = Scratch::make(backend, {chunks, B, n}, cell.compute, false,
                                   boundaries[i]))
        return e;
    if (Status e = Scratch::make(backend, {B, n}, cell.compute, false, start[i]))
      return e;
    if (Status e = backend->copy(initial[i], start[i].view()))
      return e;
  }

  for (int64_t c = 0; c < chunks; ++c) {
    Chunk chunk;
    int64_t t0 = chunk.t0 = c * K, len = chunk.len = std::min(K, T - t0);
    chunk.resets = resets;
    chunk.initial = initial;
    for (size_t p = 0; p < cell.projections.size(); ++p)
      chunk.projections.push_back(projectedViews[p].at(
          t0 * B * cell.projections[p].rows, {len, B, cell.projections[p].rows}));
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      if (!boundaries.empty())
        if (Status e = backend->copy(start[i].view(),
                                     boundaries[i].view().at(c * B * n, {B, n})))
          return e;
      chunk.start.push_back(start[i].view());
      chunk.history.push_back(history[i].view().at(0, {len, B, n}));
    }
    for (size_t i = 0; i < cell.outputs.size(); ++i) {
      int64_t n = cell.outputs[i].shape[0];
      chunk.outputs.push_back(outputs[i].at(t0 * B * n, {len, B, n}));
    }
    chunk.gates = saveGates ? gates.view().at(t0 * B * cell.gatesWidth,
                                              {len, B, cell.gatesWidth})
                            : gates.view();
    if (Status e = runForwardChunk(seq, chunk, saveGates))
      return e;
    if (Status e = gatherFinalStates(seq.lengths, t0, len, chunk.history, finalStates))
      return e;
    // The next chunk starts where this one ended.
    for (size_t i = 0; i < cell.states.size(); ++i) {
      int64_t n = cell.states[i].shape[0];
      if (Status e = backend->copy(history[i].view().at((len - 1) * B * n, {B, n}),
                                   start[i].view()))
        return e;
    }
  }
  if (seq.lengths.empty()) {
    for (size_t i = 0; i < cell.states.size(); ++i)
      if (Status e = backend->copy(start[i].view(), finalStates[i]))
        return e;
  } else {
    // Samples of length 0 end where they start.
    if (Status e = gatherFinalStates(seq.lengths, -1, 1, initial, finalStates))
      return e;
    if (Status e = zeroPastLengths(seq.lengths, outputs))
      return e;
  }
  keep->lengths = seq.lengths;

  if (!training)
    return Status();
  if (K < T) {
    keep->states = std::move(boundaries);
  } else {
    keep->states = std::move(history);
    if (saveGates) {
      keep->gates = std::move(gates);
      keep->hasGates = true;
    }
  }
  *saved = std::move(keep);
  return Status();
}

/// `c = op(a) op(b) + beta c` for each of `blocks` diagonal blocks of a
/// block-diagonal weight (one for a dense weight): block g of a, b and c
/// starts g times `aStep`, `bStep` and `cStep` elements in. One GEMM a
/// block, each over all the rows.
static Status blockGemm(Backend &backend, int64_t blocks, bool transA, bool transB,
                        int64_t m, int64_t n, int64_t k, const View &a, int64_t lda,
                        int64_t aStep, const View &b, int64_t ldb, int64_t bStep,
                        double beta, const View &c, int64_t ldc, int64_t cStep) {
  for (int64_t g = 0; g < blocks; ++g)
    if (Status e = backend.gemm(transA, transB, m, n, k, a.at(g * aStep, a.shape), lda,
                                b.at(g * bStep, b.shape), ldb, beta,
                                c.at(g * cStep, c.shape), ldc))
      return e;
  return Status();
}

Status SequenceDriver::project(const Sequence &seq, const Interface::Projection &p,
                               int64_t t0, int64_t len, Scratch &out) {
  int64_t B = seq.batch;
  // The rows start as the biases' sum, and the GEMM adds to them: no pass
  // over the result adds the biases afterwards.
  if (Status e = Scratch::make(backend, {len, B, p.rows}, p.element, false, out))
    return e;
  std::vector<View> biases;
  for (size_t b : p.biases)
    biases.push_back(seq.params[b]);
  if (!biases.empty())
    if (Status e = backend->fillRows(out.view(), len * B, p.rows, biases))
      return e;
  View x = seq.inputs[p.input].at(t0 * B * p.cols, {len * B, p.cols});
  int64_t m = p.rows / p.blocks, n = p.cols / p.blocks;
  return blockGemm(*backend, p.blocks, false, true, len * B, m, n, x, p.cols, n,
                   seq.params[p.weight], n, m * n, biases.empty() ? 0.0 : 1.0,
                   out.view(), p.rows, m);
}

Status SequenceDriver::backward(const Sequence &seq, const Saved &saved,
                                const std::vector<View> &gradOutputs,
                                const std::vector<View> &gradFinalStates,
                                const std::vector<View> &gradInputs,
                                const std::vector<View> &gradParams,
                                const std::vector<View> &gradInitialStates) {
  int64_t T = saved.steps, B = saved.batch;
  const Recompute &mode = saved.mode;
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

  std::vector<Scratch> defaults;
  View resets;
  std::vector<View> initial;
  if (Status e = resetsAndInitial(seq, defaults, resets, initial))
    return e;

  // Accumulators: params, inputs and initial states, and the gradient that
  // flows into the end of the chunk being worked on.
  std::vector<Scratch> dParams(cell.params.size()), dInputs(cell.inputs.size()),
      dInitial(cell.states.size()), carry(cell.states.size()),
      zeroOutputGrads(cell.outputs.size());
  for (size_t i = 0; i < cell.params.size(); ++i)
    if (Status e = Scratch::make(backend, cell.params[i].shape, cell.compute, true,
                                 dParams[i]))
      return e;
  for (size_t i = 0; i < cell.inputs.size(); ++i)
    if (Status e = Scratch::make(backend, {T, B, cell.inputs[i].shape[0]},
                                 cell.compute, true, dInputs[i]))
      return e;
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
    if (Status e = Scratch::make(backend, {B, n}, cell.compute, true, dInitial[i]))
      return e;
    if (Status e = Scratch::make(backend, {B, n}, cell.compute, true, carry[i]))
      return e;
    // With lengths, each sample's final-state gradient joins the carry at
    // its own last step (injectFinalStateGrads).
    if (gradFinalStates[i].valid() && seq.lengths.empty())
      if (Status e = backend->copy(gradFinalStates[i], carry[i].view()))
        return e;
  }
  // The outputs' gradients (none: zeros); with lengths, none past a sample's
  // last step, where its outputs are constant zeros.
  std::vector<View> outputGrads;
  for (size_t i = 0; i < cell.outputs.size(); ++i) {
    if (!gradOutputs[i].valid() || !seq.lengths.empty()) {
      if (Status e = Scratch::make(backend, {T, B, cell.outputs[i].shape[0]},
                                   cell.storage, true, zeroOutputGrads[i]))
        return e;
      if (gradOutputs[i].valid())
        if (Status e = backend->copy(gradOutputs[i], zeroOutputGrads[i].view()))
          return e;
    }
    outputGrads.push_back(zeroOutputGrads[i].view().valid() ? zeroOutputGrads[i].view()
                                                              : gradOutputs[i]);
  }
  if (!seq.lengths.empty())
    if (Status e = zeroPastLengths(seq.lengths, outputGrads))
      return e;

  int64_t K = saved.chunkSteps;
  bool chunked = K < T;
  int64_t chunks = (T + K - 1) / K;
  // Unchunked and without saved gates (full, or chunk:K with K >= T): replay.
  bool replay = !chunked && mode.kind != Recompute::Kind::None;

  for (int64_t c = chunks - 1; c >= 0; --c) {
    int64_t t0 = c * K, len = std::min(K, T - t0);
    // The projections for this chunk, when the step is replayed.
    std::vector<Scratch> projected(cell.projections.size());
    for (size_t p = 0; p < cell.projections.size(); ++p) {
      const Interface::Projection &proj = cell.projections[p];
      Status e = mode.kind == Recompute::Kind::None
                     ? Scratch::make(backend, {0, B, proj.rows}, proj.element, false,
                                     projected[p])
                     : project(seq, proj, t0, len, projected[p]);
      if (e)
        return e;
    }

    // The chunk's states and gates: saved, or recomputed by a forward pass
    // over the chunk that saves its gates.
    Chunk chunk;
    chunk.t0 = t0;
    chunk.len = len;
    chunk.resets = resets;
    chunk.initial = initial;
    for (Scratch &p : projected)
      chunk.projections.push_back(p.view());
    std::vector<Scratch> chunkHistory(cell.states.size()),
        chunkOutputs(cell.outputs.size());
    Scratch chunkGates;
    if (chunked) {
      for (size_t i = 0; i < cell.states.size(); ++i) {
        int64_t n = cell.states[i].shape[0];
        if (Status e = Scratch::make(backend, {len, B, n}, cell.storage, false,
                                     chunkHistory[i]))
          return e;
        chunk.history.push_back(chunkHistory[i].view());
        chunk.start.push_back(saved.states[i].view().at(c * B * n, {B, n}));
      }
      for (size_t i = 0; i < cell.outputs.size(); ++i) {
        if (Status e = Scratch::make(backend, {len, B, cell.outputs[i].shape[0]},
                                     cell.storage, false, chunkOutputs[i]))
          return e;
        chunk.outputs.push_back(chunkOutputs[i].view());
      }
      if (Status e = Scratch::make(backend, {len, B, cell.gatesWidth}, cell.storage,
                                   false, chunkGates))
        return e;
      chunk.gates = chunkGates.view();
      if (Status e = runForwardChunk(seq, chunk, /*saveGates=*/true))
        return e;
    } else {
      for (size_t i = 0; i < cell.states.size(); ++i) {
        int64_t n = cell.states[i].shape[0];
        chunk.history.push_back(saved.states[i].view().at(t0 * B * n, {len, B, n}));
        chunk.start.push_back(initial[i]);
      }
      chunk.gates = mode.kind == Recompute::Kind::None && saved.hasGates
                        ? saved.gates.view().at(t0 * B * cell.gatesWidth,
                                                {len, B, cell.gatesWidth})
                        : View();
      if (!chunk.gates.valid()) {
        if (Status e = Scratch::make(backend, {0, B, cell.gatesWidth}, cell.storage,
                                     false, chunkGates))
          return e;
        chunk.gates = chunkGates.view();
      }
    }
    for (size_t i = 0; i < cell.states.size(); ++i)
      chunk.finalStateGrads.push_back(carry[i].view());
    chunk.outputGrads = outputGrads;

    // With lengths, the chunk runs in pieces that end at samples' last
    // steps, where their final-state gradients join the carry.
    std::vector<int64_t> ends = pieceEnds(seq.lengths, t0, len);
    for (size_t k = 0; k < ends.size(); ++k) {
      // The piece's first step and its number of steps.
      int64_t first = k + 1 < ends.size() ? ends[k + 1] + 1 : t0;
      int64_t count = ends[k] - first + 1;
      Chunk piece = slice(chunk, B, first, count);
      piece.rows = rowsRunning(seq.lengths, B, ends[k]);
      if (Status e = injectFinalStateGrads(seq.lengths, ends[k], gradFinalStates, carry))
        return e;
      if (piece.rows == 0)
        continue;

      // The backward kernel's arguments, in its order, with scratch for what it
      // writes.
      const Kernel &kernel = cell.backward;
      std::vector<Arg> args;
      std::vector<size_t> resultArgs;
      if (Status e = bind(kernel, seq, piece, /*backward=*/true, args, resultArgs))
        return e;
      std::vector<Scratch> results(kernel.args.size());
      struct Written {
        ArgKind kind;
        std::string name;
        View view;
      };
      std::vector<Written> written;
      for (size_t a : resultArgs) {
        const KernelArg &arg = kernel.args[a];
        View &v = args[a].view;
        if (arg.sameAs >= 0 && size_t(arg.sameAs) < a) {
          // The same values as an earlier result: its buffer.
          v = args[arg.sameAs].view;
        } else {
          std::vector<int64_t> shape = arg.shape;
          for (size_t d = 0; d < shape.size(); ++d)
            if (shape[d] < 0)
              shape[d] = shape.size() == 3 && d == 0 ? count : B;
          // Rows that do not run must add nothing where the results go.
          if (Status e = Scratch::make(backend, shape, arg.element.value_or(cell.compute),
                                       /*zero=*/piece.rows < B, results[a]))
            return e;
          v = results[a].view();
        }
        // A zero result adds nothing to what it is folded into (weight rows
        // and vectors go in pairs, so they stay).
        if (!arg.zero || arg.kind == ArgKind::WeightRows ||
            arg.kind == ArgKind::WeightVectors)
          written.push_back({arg.kind, arg.name, v});
      }
      std::vector<Scratch> keep;
      if (Status e = workspace(kernel, piece.rows, args, keep))
        return e;
      if (Status e =
              backend->launch(/*backward=*/true, /*saveGates=*/!replay, args, piece.rows))
        return e;

      // Fold what the kernel wrote into the accumulators, with the GEMMs for
      // the weight, bias and input gradients.
      size_t projectionGrad = 0;
      for (size_t w = 0; w < written.size(); ++w) {
        const Written &out = written[w];
        const View &r = out.view;
        switch (out.kind) {
        case ArgKind::InitialStateGrad: {
          size_t i = indexOf(cell.states, out.name);
          if (Status e = backend->add(r, dInitial[i].view()))
            return e;
          break;
        }
        case ArgKind::StartStateGrad: {
          size_t i = indexOf(cell.states, out.name);
          if (Status e = backend->copy(r, carry[i].view()))
            return e;
          break;
        }
        case ArgKind::InputGrad: {
          size_t i = indexOf(cell.inputs, out.name);
          int64_t n = cell.inputs[i].shape[0];
          View to = dInputs[i].view().at(first * B * n, {count, B, n});
          if (Status e = backend->add(r, to))
            return e;
          break;
        }
        case ArgKind::ProjectionGrad: {
          const Interface::Projection &p = cell.projections[projectionGrad++];
          View rows = r.at(0, {count * B, p.rows});
          View x = seq.inputs[p.input].at(first * B * p.cols, {count * B, p.cols});
          int64_t m = p.rows / p.blocks, n = p.cols / p.blocks;
          if (Status e = blockGemm(*backend, p.blocks, true, false, m, n, count * B, rows,
                                   p.rows, m, x, p.cols, n, 1.0, dParams[p.weight].view(),
                                   n, m * n))
            return e;
          if (Status e = blockGemm(
                  *backend, p.blocks, false, false, count * B, n, m, rows, p.rows, m,
                  seq.params[p.weight], n, m * n, 1.0,
                  dInputs[p.input].view().at(first * B * p.cols, {count * B, p.cols}),
                  p.cols, n))
            return e;
          // Every bias of the projection has the same gradient: sum the rows
          // once (an LSTM's b_ih and b_hh).
          if (!p.biases.empty()) {
            Scratch sums;
            if (Status e = Scratch::make(backend, {p.rows}, cell.compute, true, sums))
              return e;
            if (Status e = backend->columnSums(rows, count * B, p.rows, sums.view()))
              return e;
            for (size_t b : p.biases)
              if (Status e = backend->add(sums.view(), dParams[b].view()))
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
                                   cols, 1.0, dParams[i].view(), cols, rows * cols))
            return e;
          ++w;
          break;
        }
        case ArgKind::ParamGrad: {
          size_t i = indexOf(cell.params, out.name);
          if (Status e = backend->columnSums(r, B, cell.params[i].shape[0],
                                             dParams[i].view()))
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
        case ArgKind::Output:
        case ArgKind::StateHistory:
        case ArgKind::Gates:
        case ArgKind::OutputGrad:
        case ArgKind::FinalStateGrad:
        case ArgKind::BatchBegin:
        case ArgKind::BatchEnd:
        case ArgKind::Workspace:
        case ArgKind::GridBarrier:
          break;
        }
      }
    }
  }
  // Samples of length 0: their final states are their initial states.
  if (Status e = injectFinalStateGrads(seq.lengths, -1, gradFinalStates, carry))
    return e;
  // What flows into the start of the first chunk belongs to the initial state.
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (Status e = backend->add(carry[i].view(), dInitial[i].view()))
      return e;

  auto copyOut = [&](const std::vector<View> &to, std::vector<Scratch> &from) {
    for (size_t i = 0; i < to.size(); ++i)
      if (to[i].valid())
        if (Status e = backend->copy(from[i].view(), to[i]))
          return e;
    return Status();
  };
  if (Status e = copyOut(gradInputs, dInputs))
    return e;
  if (Status e = copyOut(gradParams, dParams))
    return e;
  return copyOut(gradInitialStates, dInitial);
}
