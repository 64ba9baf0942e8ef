//===- SequenceDriver.cpp - One sequence driver for every backend ---------===//

#include "runtime/driver/SequenceDriver.h"

#include "dialects/Cell/IR/Checked.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

using namespace cellc;
using namespace cellc::driver;

namespace {

/// Checks a caller's view: present (unless optional) and of `shape`.
Status check(const View &view, const std::vector<int64_t> &shape,
             const std::string &what, bool optional = false) {
  if (!view.valid())
    return optional ? Status() : Status::error(what + " is missing");
  if (view.shape != shape)
    return Status::error(what + " has shape " + shapeString(view.shape) +
                         ", expected " + shapeString(shape));
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
// Scratch, the ledger and Saved
//===----------------------------------------------------------------------===//

/// The bytes a driver's buffers hold: now, and the most since `restart`.
struct SequenceDriver::Ledger {
  std::atomic<int64_t> live{0}, peak{0};

  void add(int64_t bytes) {
    int64_t now = live += bytes;
    int64_t high = peak.load();
    while (now > high && !peak.compare_exchange_weak(high, now)) {
    }
  }
  void remove(int64_t bytes) { live -= bytes; }
  void restart() { peak = live.load(); }
};

/// A buffer the driver owns: released through its backend, and counted in
/// its driver's ledger while it lives.
class SequenceDriver::Scratch {
public:
  Scratch() = default;
  Scratch(Scratch &&other) noexcept { *this = std::move(other); }
  Scratch &operator=(Scratch &&other) noexcept {
    release();
    backend = std::move(other.backend);
    ledger = std::move(other.ledger);
    buffer = other.buffer;
    shape = std::move(other.shape);
    other.buffer = Buffer();
    return *this;
  }
  ~Scratch() { release(); }

  static Status make(const std::shared_ptr<Backend> &backend,
                     const std::shared_ptr<Ledger> &ledger, std::vector<int64_t> shape,
                     Element element, bool zero, Scratch &out) {
    std::optional<int64_t> count = checkedProduct(shape);
    if (!count || !checkedMul(*count, bytesOf(element)))
      return Status::error("a buffer of shape " + shapeString(shape) +
                           " holds more bytes than int64 counts");
    int64_t elements = *count;
    Scratch s;
    s.backend = backend;
    s.shape = std::move(shape);
    if (Status e = backend->allocate(std::max<int64_t>(elements, 1), element,
                                     zero, s.buffer))
      return e;
    s.buffer.element = element;
    s.ledger = ledger;
    s.ledger->add(s.bytes());
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
    if (backend && buffer.valid()) {
      backend->release(buffer);
      if (ledger)
        ledger->remove(bytes());
    }
    buffer = Buffer();
  }
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Ledger> ledger;
  Buffer buffer;
  std::vector<int64_t> shape;
};

class cellc::driver::Saved {
public:
  Recompute mode;
  int64_t steps = 0, batch = 0;
  /// Steps per chunk: chunk:K's K (at most T), otherwise T.
  int64_t chunkSteps = 0;
  /// none and full: each state after each step, [T, B, n]. chunk: the state
  /// before each chunk, [chunks, B, n]. A view of `owned`, of the caller's
  /// kept buffers, or of the output that is the state.
  std::vector<View> states;
  /// none: the planned gate values, [T, B, S]; invalid otherwise.
  View gates;
  std::vector<SequenceDriver::Scratch> owned;
  /// The bytes of `states` and `gates`, the outputs among them not counted.
  int64_t keptBytes = 0;
  /// The forward's per-sample lengths (empty: all T).
  std::vector<int64_t> lengths;
  /// The outputs that `states` reads (the caller's buffers).
  std::vector<size_t> outputsRead;
  /// The caller's kept buffers (bytes) that this Saved views: counted in
  /// `ledger` while it lives, as `owned` is, so that the driver's figures do
  /// not depend on who allocates.
  std::shared_ptr<SequenceDriver::Ledger> ledger;
  int64_t callerBytes = 0;

  ~Saved() {
    if (ledger)
      ledger->remove(callerBytes);
  }
};

void SavedDeleter::operator()(Saved *saved) const { delete saved; }

int64_t cellc::driver::savedBytes(const Saved &saved) { return saved.keptBytes; }

const std::vector<size_t> &cellc::driver::savedOutputsRead(const Saved &saved) {
  return saved.outputsRead;
}
int64_t cellc::driver::savedSteps(const Saved &saved) { return saved.steps; }
int64_t cellc::driver::savedBatch(const Saved &saved) { return saved.batch; }

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

/// What `step` keeps between calls, for the B it last ran: the
/// projections' buffers ([1, B, rows]), zero resets ([1, B]), the empty
/// gates, and the kernel's workspace (workspace() reuses it while its size
/// holds).
/// Calls of one driver's step take turns.
struct SequenceDriver::StepBuffers {
  std::mutex turn;
  int64_t batch = -1;
  /// Bumped whenever the buffers below are made anew (stepEpoch).
  int64_t epoch = 0;
  std::vector<Scratch> projected, workspace;
  Scratch resets, noGates;
  /// The params (and their versions) whose weights the workspace holds
  /// packed; empty when it holds none.
  std::vector<void *> packedParams;
  std::vector<int64_t> packedVersions;
};

//===----------------------------------------------------------------------===//
// The driver
//===----------------------------------------------------------------------===//

SequenceDriver::SequenceDriver(Interface cell, std::shared_ptr<Backend> backend)
    : cell(std::move(cell)), backend(std::move(backend)),
      ledger(std::make_shared<Ledger>()) {}

SequenceDriver::~SequenceDriver() = default;

MemoryStats SequenceDriver::stats() const {
  MemoryStats s = last;
  s.live = ledger->live;
  return s;
}

Status SequenceDriver::scratch(std::vector<int64_t> shape, Element element, bool zero,
                               Scratch &out) {
  return Scratch::make(backend, ledger, std::move(shape), element, zero, out);
}

int64_t SequenceDriver::pieceSteps(int64_t batch, int64_t steps) const {
  batch = std::max<int64_t>(batch, 1);
  return std::max<int64_t>(1, std::min((pieceRows + batch - 1) / batch, steps));
}

bool Kernel::perGroup() const {
  return std::any_of(args.begin(), args.end(),
                     [](const KernelArg &a) { return a.kind == ArgKind::Group; });
}

Status SequenceDriver::workspace(const Kernel &kernel, int64_t batch,
                                 std::vector<Arg> &args, std::vector<Scratch> &keep,
                                 bool *reused) {
  // The kernels' global buffers: a workspace per tile (CUDA's persistent
  // strategy) or per group of threads (the CPU's batched kernels), and the
  // barrier words (zero before the launch; each launch leaves them so).
  // Buffers that `keep` already holds, of the sizes needed, are used again
  // (the step keeps them between calls).
  int64_t parts = kernel.perGroup()
                      ? backend->instances(batch)
                      : (batch + kernel.batchTile - 1) / std::max<int64_t>(kernel.batchTile, 1);
  struct Wanted {
    size_t arg;
    bool words;
    Element element;
    int64_t n;
  };
  std::vector<Wanted> wanted;
  for (size_t i = 0; i < kernel.args.size(); ++i) {
    const KernelArg &arg = kernel.args[i];
    if (arg.kind != ArgKind::Workspace && arg.kind != ArgKind::GridBarrier)
      continue;
    bool words = arg.kind == ArgKind::GridBarrier;
    Element element = arg.element.value_or(words ? Element::I32 : cell.compute);
    std::optional<int64_t> n = checkedMul(parts, words ? kernel.barrierWords
                                                       : kernel.workspaceBytes);
    if (!n)
      return Status::error("the sizes overflow: " + std::to_string(parts) +
                           " parts of a kernel's workspace of " +
                           std::to_string(kernel.workspaceBytes) +
                           " bytes are more than int64 counts");
    wanted.push_back({i, words, element, words ? *n : *n / bytesOf(element)});
  }
  bool reuse = keep.size() == wanted.size();
  for (size_t w = 0; reuse && w < wanted.size(); ++w)
    reuse = keep[w].view().shape == std::vector<int64_t>{wanted[w].n};
  if (reused)
    *reused = reuse;
  if (!reuse) {
    keep.clear();
    for (const Wanted &w : wanted) {
      keep.emplace_back();
      if (Status e = scratch({w.n}, w.element, /*zero=*/w.words, keep.back()))
        return e;
    }
  }
  for (size_t w = 0; w < wanted.size(); ++w)
    args[wanted[w].arg].view = keep[w].view();
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
      // The caller's [T, B], or zeros for a launch.
      v = chunk.resets.at(chunk.resets.shape[0] < seq.steps ? 0 : t0 * B, {len, B});
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
    // One group of one slice; a backend that runs more sets them.
    case ArgKind::Group:
    case ArgKind::Slice:
      args[a].index = 0;
      break;
    case ArgKind::Slices:
      args[a].index = 1;
      break;
    // Packed once per launch, unless a step says otherwise.
    case ArgKind::Packed:
      args[a].index = 0;
      break;
    case ArgKind::Stream:
      args[a].index = chunk.stream ? 1 : 0;
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
      v = chunk.outputGrads[indexOf(cell.outputs, arg.name)];
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
  for (size_t k = ends.size(); k-- > 0;) {
    int64_t first = k + 1 < ends.size() ? ends[k + 1] + 1 : chunk.t0;
    Chunk piece = slice(chunk, seq.batch, first, ends[k] - first + 1);
    piece.rows = rowsRunning(seq.lengths, seq.batch, ends[k]);
    if (piece.rows == 0)
      continue;
    if (Status e = startsInCompute(piece, starts))
      return e;
    std::vector<Arg> args;
    std::vector<size_t> results;
    if (Status e = bind(kernel, seq, piece, /*backward=*/false, args, results))
      return e;
    if (Status e = launchOn(kernel, /*backward=*/false, saveGates, args, piece.rows, buffers))
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

Status SequenceDriver::resetsAndInitial(const Sequence &seq, int64_t longest,
                                        std::vector<Scratch> &defaults, View &resets,
                                        std::vector<View> &initial) {
  int64_t T = seq.steps, B = seq.batch;
  resets = seq.resets;
  if (!resets.valid()) {
    // Zeros for the longest launch, which every launch reads from its start
    // (bind).
    defaults.emplace_back();
    if (Status e = scratch({std::min(T, longest), B}, Element::U8, true, defaults.back()))
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
    if (Status e = scratch({B, cell.states[i].shape[0]}, cell.compute,
                                 true, defaults.back()))
      return e;
    initial.push_back(defaults.back().view());
  }
  return Status();
}

Status SequenceDriver::zeroPastLengths(const std::vector<int64_t> &lengths,
                                      int64_t first, const std::vector<View> &views) {
  for (const View &v : views) {
    if (!v.valid())
      continue;
    int64_t len = v.shape[0], B = v.shape[1], n = v.shape[2];
    for (int64_t s = 0; s < len; ++s)
      for (int64_t b = 0; b < B;) {
        if (lengths[b] > first + s) {
          ++b;
          continue;
        }
        int64_t end = b;
        while (end < B && lengths[end] <= first + s)
          ++end;
        if (Status e = backend->fillRows(v.at((s * B + b) * n, {end - b, n}), end - b,
                                         n, {}))
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

Status SequenceDriver::startsInCompute(Chunk &piece, std::vector<Scratch> &keep) {
  // A piece after a chunk's first starts from the step before it in the
  // history, which is in the storage type (bf16 on CUDA); the kernels take
  // the state they start from in the compute type.
  keep.resize(cell.states.size());
  for (size_t i = 0; i < cell.states.size(); ++i) {
    if (!piece.start[i].valid() || piece.start[i].element() == cell.compute)
      continue;
    if (!keep[i].view().valid())
      if (Status e = scratch(piece.start[i].shape, cell.compute, false, keep[i]))
        return e;
    if (Status e = backend->copy(piece.start[i], keep[i].view()))
      return e;
    piece.start[i] = keep[i].view();
  }
  return Status();
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

Status SequenceDriver::checkExtent(int64_t T, int64_t B) const {
  // The values a step of a row holds across a call's buffers: each state's
  // history, start and gradients, the inputs and outputs with theirs, the
  // gates and the projections with theirs. With them in bytes, and room for
  // the few such buffers that a plan adds up, every size, count and offset
  // the driver forms fits int64.
  int64_t width = 0;
  bool fits = true;
  auto add = [&](int64_t n, int64_t times) {
    std::optional<int64_t> sum = checkedMul(n, times);
    if (sum)
      sum = checkedAdd(width, *sum);
    fits = fits && sum;
    width = sum.value_or(width);
  };
  for (const Slot &s : cell.states)
    add(s.shape[0], 4);
  for (const auto *slots : {&cell.inputs, &cell.outputs})
    for (const Slot &s : *slots)
      add(s.shape[0], 2);
  for (const Interface::Projection &p : cell.projections)
    add(p.rows, 2);
  add(cell.gatesWidth, 1);
  if (!fits || !checkedProduct({std::max<int64_t>(T, 1), std::max<int64_t>(B, 1), width, 8, 16}))
    return Status::error("the sizes overflow: T = " + std::to_string(T) + " steps of B = " +
                         std::to_string(B) + " rows, at the " + std::to_string(width) +
                         " values a row and step that a call's buffers hold, are more bytes "
                         "than int64 counts");
  int64_t params = 0;
  for (const Slot &p : cell.params) {
    std::optional<int64_t> n = checkedProduct(p.shape);
    std::optional<int64_t> sum = n ? checkedAdd(params, *n) : std::nullopt;
    if (!sum || !checkedMul(*sum, 8 * 16))
      return Status::error("the sizes overflow: the params of " + shapeString(p.shape) +
                           " and the others are more bytes than int64 counts");
    params = *sum;
  }
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
  /// chunk (boundaries); the state a span starts from (start).
  std::vector<View> history, boundaries;
  std::vector<Scratch> spanBuffers, start;
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
  // The next span starts where this one ended.
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t n = cell.states[i].shape[0];
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

Status SequenceDriver::step(const Sequence &seq, const std::vector<View> &outputs,
                            const std::vector<View> &newStates,
                            const std::vector<int64_t> *paramVersions) {
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
  if (Status e = workspace(cell.forward, B, args, s.workspace, &reused))
    return e;
  if (!reused)
    ++s.epoch;
  // The weights packed by the last step serve this one where its
  // workspace, params and their versions are the same.
  std::vector<void *> params;
  for (const View &p : seq.params)
    params.push_back(p.pointer());
  bool packed = paramVersions && reused && !s.packedParams.empty() &&
                params == s.packedParams && *paramVersions == s.packedVersions;
  for (size_t a = 0; a < cell.forward.args.size(); ++a)
    if (cell.forward.args[a].kind == ArgKind::Packed)
      args[a].index = packed ? 1 : 0;
  s.packedParams.clear();
  if (Status e = launch(cell.forward, /*backward=*/false, /*saveGates=*/false, args, B))
    return e;
  if (paramVersions && !params.empty()) {
    s.packedParams = std::move(params);
    s.packedVersions = *paramVersions;
  }
  return Status();
}

std::unique_lock<std::mutex> SequenceDriver::lockStep() {
  if (!stepBuffers)
    stepBuffers = std::make_unique<StepBuffers>();
  return std::unique_lock<std::mutex>(stepBuffers->turn);
}

int64_t SequenceDriver::stepEpoch() const { return stepBuffers ? stepBuffers->epoch : -1; }

bool SequenceDriver::stepPacked(const std::vector<void *> &params,
                                const std::vector<int64_t> &versions) const {
  return stepBuffers && !stepBuffers->packedParams.empty() &&
         params == stepBuffers->packedParams && versions == stepBuffers->packedVersions;
}

void SequenceDriver::setStepPacked(std::vector<void *> params, std::vector<int64_t> versions) {
  stepBuffers->packedParams = std::move(params);
  stepBuffers->packedVersions = std::move(versions);
}

int64_t SequenceDriver::keptOutput(size_t state, Recompute mode, bool hasLengths,
                                   bool outputsOutliveSaved) const {
  // A kept history is read after the call, and with lengths the outputs
  // past a sample's last step become zeros, which its history must not.
  if (mode.kind == Recompute::Kind::Chunk || hasLengths || !outputsOutliveSaved)
    return -1;
  return cell.stateOutputs[state];
}

std::vector<int64_t> SequenceDriver::keptOutputs(Recompute mode, bool hasLengths,
                                                 bool outputsOutliveSaved) const {
  std::vector<int64_t> outputs;
  for (size_t i = 0; i < cell.states.size(); ++i)
    outputs.push_back(keptOutput(i, mode, hasLengths, outputsOutliveSaved));
  return outputs;
}

std::vector<KeptBuffer> SequenceDriver::keptLayout(Recompute mode, bool hasLengths,
                                                   bool outputsOutliveSaved) const {
  std::vector<KeptBuffer> layout;
  bool chunked = mode.kind == Recompute::Kind::Chunk;
  for (size_t i = 0; i < cell.states.size(); ++i)
    if (keptOutput(i, mode, hasLengths, outputsOutliveSaved) < 0)
      layout.push_back({chunked, cell.states[i].shape[0],
                        chunked ? cell.compute : cell.storage});
  if (mode.kind == Recompute::Kind::None)
    layout.push_back({false, cell.gatesWidth, cell.storage});
  return layout;
}

Status SequenceDriver::makeSaved(const Sequence &seq, Recompute mode,
                                 const std::vector<View> &outputs,
                                 bool outputsOutliveSaved, const std::vector<View> *kept,
                                 SavedPtr &out) {
  int64_t T = seq.steps, B = seq.batch;
  SavedPtr s(new Saved());
  s->mode = mode;
  s->steps = T;
  s->batch = B;
  s->chunkSteps = mode.kind == Recompute::Kind::Chunk ? std::min(mode.chunk, T) : T;
  s->lengths = seq.lengths;
  int64_t chunks = (T + s->chunkSteps - 1) / s->chunkSteps;
  std::vector<KeptBuffer> layout =
      keptLayout(mode, !seq.lengths.empty(), outputsOutliveSaved);
  if (kept && kept->size() != layout.size())
    return Status::error("expected " + std::to_string(layout.size()) +
                         " kept buffers for recompute " + mode.str() + ", got " +
                         std::to_string(kept->size()));
  size_t next = 0;
  // The next kept buffer: the caller's, checked, or the driver's.
  auto take = [&](View &view) {
    const KeptBuffer &b = layout[next];
    std::vector<int64_t> shape = {b.perChunk ? chunks : T, B, b.width};
    std::string what = "kept buffer " + std::to_string(next++);
    if (kept) {
      view = (*kept)[next - 1];
      if (Status e = check(view, shape, what))
        return e;
      if (view.element() != b.element)
        return Status::error(what + " has the wrong element type");
      s->callerBytes += view.size() * bytesOf(b.element);
    } else {
      s->owned.emplace_back();
      if (Status e = scratch(shape, b.element, false, s->owned.back()))
        return e;
      view = s->owned.back().view();
    }
    s->keptBytes += view.size() * bytesOf(b.element);
    return Status();
  };
  for (size_t i = 0; i < cell.states.size(); ++i) {
    int64_t o = keptOutput(i, mode, !seq.lengths.empty(), outputsOutliveSaved);
    s->states.emplace_back();
    if (o >= 0) {
      s->states.back() = outputs[o];
      s->outputsRead.push_back(o);
    } else if (Status e = take(s->states.back())) {
      return e;
    }
  }
  if (mode.kind == Recompute::Kind::None)
    if (Status e = take(s->gates))
      return e;
  if (s->callerBytes) {
    s->ledger = ledger;
    ledger->add(s->callerBytes);
  }
  out = std::move(s);
  return Status();
}

Status SequenceDriver::adopt(const Sequence &seq, Recompute mode,
                             const std::vector<View> &outputs,
                             const std::vector<View> &kept, SavedPtr &out) {
  if (outputs.size() != cell.outputs.size())
    return Status::error("expected " + std::to_string(cell.outputs.size()) + " outputs");
  if (Status e = checkExtent(seq.steps, seq.batch))
    return e;
  // Only the outputs kept as states' histories are read; the others may be
  // absent.
  std::vector<int64_t> read = keptOutputs(mode, !seq.lengths.empty(), true);
  for (size_t i = 0; i < cell.outputs.size(); ++i)
    if (Status e = check(outputs[i], {seq.steps, seq.batch, cell.outputs[i].shape[0]},
                         "output '" + cell.outputs[i].name + "'",
                         /*optional=*/std::find(read.begin(), read.end(), int64_t(i)) == read.end()))
      return e;
  return makeSaved(seq, mode, outputs, /*outputsOutliveSaved=*/true, &kept, out);
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
                               int64_t t0, int64_t len, const View &out) {
  int64_t B = seq.batch;
  // The rows start as the biases' sum, and the GEMM adds to them: no pass
  // over the result adds the biases afterwards.
  std::vector<View> biases;
  for (size_t b : p.biases)
    biases.push_back(seq.params[b]);
  if (!biases.empty())
    if (Status e = backend->fillRows(out, len * B, p.rows, biases))
      return e;
  View x = seq.inputs[p.input].at(t0 * B * p.cols, {len * B, p.cols});
  int64_t m = p.rows / p.blocks, n = p.cols / p.blocks;
  return blockGemm(*backend, p.blocks, false, true, len * B, m, n, x, p.cols, n,
                   seq.params[p.weight], n, m * n, biases.empty() ? 0.0 : 1.0, out,
                   p.rows, m);
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
  size_t projection = 0;
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
      size_t p = projection++;
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

Status SequenceDriver::launch(const Kernel &kernel, bool backward, bool saveGates,
                              const std::vector<Arg> &args, int64_t rows) {
  // The kernel's own buffers, in each instance that runs at once.
  int64_t bytes = kernel.scratchBytes[saveGates] * backend->instances(rows);
  ledger->add(bytes);
  Status e = backend->launch(backward, saveGates, args, rows);
  ledger->remove(bytes);
  if (!e && !kernel.profileSites.empty())
    drainProfile(kernel, backward, args);
  return e;
}

Status SequenceDriver::launchOn(const Kernel &kernel, bool backward, bool saveGates,
                                std::vector<Arg> &args, int64_t rows,
                                KernelBuffers &buffers) {
  bool reused = false;
  if (Status e = workspace(kernel, rows, args, buffers.scratch, &reused))
    return e;
  // The groups' parts hold the weights packed by the last launch in the
  // same groups (as many as these rows make), and that launch packed what
  // this variant reads: a replay packs the replayed products' weights too.
  bool packed = reused && buffers.packedFor == int(saveGates);
  for (size_t a = 0; a < kernel.args.size(); ++a)
    if (kernel.args[a].kind == ArgKind::Packed)
      args[a].index = packed ? 1 : 0;
  buffers.packedFor = -1;
  if (Status e = launch(kernel, backward, saveGates, args, rows))
    return e;
  buffers.packedFor = int(saveGates);
  return Status();
}

void SequenceDriver::drainProfile(const Kernel &kernel, bool backward,
                                  const std::vector<Arg> &args) {
  auto words = std::find_if(kernel.args.begin(), kernel.args.end(), [](const KernelArg &a) {
    return a.kind == ArgKind::GridBarrier;
  });
  if (words == kernel.args.end())
    return;
  const View &view = args[words - kernel.args.begin()].view;
  auto *word = static_cast<uint32_t *>(view.pointer());
  if (!word)
    return;
  PhaseProfile &profile = profiles[backward];
  size_t sites = kernel.profileSites.size();
  profile.sites = kernel.profileSites;
  ++profile.launches;
  int64_t groups = view.size() / kernel.barrierWords;
  // The counters of group g, site s, slice k: after the group's 16 barrier
  // words, at [s][k][work, wait].
  int64_t first = kernel.barrierWords - int64_t(sites) * kernel.profileSlices * 2;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < kernel.profileSlices; ++k) {
      uint32_t *at = word + g * kernel.barrierWords + first + 2 * k;
      bool ran = false;
      for (size_t s = 0; s < sites; ++s)
        ran |= at[s * kernel.profileSlices * 2] || at[s * kernel.profileSlices * 2 + 1];
      if (!ran)
        continue;
      auto thread = std::find_if(profile.threads.begin(), profile.threads.end(),
                                 [&](const PhaseProfile::Thread &t) {
                                   return t.group == g && t.slice == k;
                                 });
      if (thread == profile.threads.end()) {
        profile.threads.push_back({g, k, {}});
        thread = std::prev(profile.threads.end());
      }
      thread->cycles.resize(sites, {0, 0});
      for (size_t s = 0; s < sites; ++s)
        for (int w : {0, 1}) {
          uint32_t &counter = at[s * kernel.profileSlices * 2 + w];
          thread->cycles[s][w] += uint64_t(counter) << kernel.profileShift;
          counter = 0;
        }
    }
}

void SequenceDriver::resetPhaseProfile() {
  for (PhaseProfile &profile : profiles)
    profile = PhaseProfile();
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
      written.push_back({arg.kind, arg.name, v});
  }
  if (Status e = launchOn(kernel, /*backward=*/true, /*saveGates=*/!w.replay, args,
                          piece.rows, w.backwardKernel))
    return e;
  return fold(seq, piece.t0, count, written, w, g);
}

Status SequenceDriver::fold(const Sequence &seq, int64_t first, int64_t count,
                            const std::vector<Written> &written, Workspace &work,
                            Gradients &g) {
  int64_t B = seq.batch;
  // Fold what the kernel wrote into the gradients, with the GEMMs for the
  // weight, bias and input gradients.
  size_t projectionGrad = 0;
  for (size_t w = 0; w < written.size(); ++w) {
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
      size_t index = projectionGrad++;
      const Interface::Projection &p = cell.projections[index];
      View rows = r.at(0, {count * B, p.rows});
      View x = seq.inputs[p.input].at(first * B * p.cols, {count * B, p.cols});
      int64_t m = p.rows / p.blocks, n = p.cols / p.blocks;
      if (Status e = blockGemm(*backend, p.blocks, true, false, m, n, count * B, rows,
                               p.rows, m, x, p.cols, n, 1.0, g.params[p.weight], n,
                               m * n))
        return e;
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
    case ArgKind::Output:
    case ArgKind::StateHistory:
    case ArgKind::Gates:
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

//===----------------------------------------------------------------------===//
// The plan
//===----------------------------------------------------------------------===//

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
