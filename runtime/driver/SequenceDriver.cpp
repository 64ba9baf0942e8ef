//===- SequenceDriver.cpp - One sequence driver for every backend -----------===//
//
// The driver's common parts: its buffers and ledger, a kernel's workspace
// and arguments bound to a chunk, the projections' GEMMs, the launches, the
// checks of a call's sizes, and what the forward and the backward both use.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/DriverParts.h"

using namespace cellc;
using namespace cellc::driver;
using namespace cellc::driver::detail;

void SavedDeleter::operator()(Saved *saved) const { delete saved; }

int64_t cellc::driver::savedBytes(const Saved &saved) { return saved.keptBytes; }

const std::vector<size_t> &cellc::driver::savedOutputsRead(const Saved &saved) {
  return saved.outputsRead;
}

int64_t cellc::driver::savedSteps(const Saved &saved) { return saved.steps; }

int64_t cellc::driver::savedBatch(const Saved &saved) { return saved.batch; }

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

Status SequenceDriver::workspace(const Kernel &kernel, bool backward, bool saveGates,
                                 int64_t batch, std::vector<Arg> &args,
                                 std::vector<Scratch> &keep, bool *reused) {
  // The kernels' global buffers: a workspace per tile that runs at once
  // (CUDA's persistent strategy: a grid row's) or per group of threads (the
  // CPU's batched kernels), and the barrier words (zero before the launch;
  // each launch leaves them so). Buffers that `keep` already holds, of the
  // sizes needed, are used again (the step keeps them between calls).
  int64_t tiles = (batch + kernel.batchTile - 1) / std::max<int64_t>(kernel.batchTile, 1);
  int64_t parts = kernel.perGroup() ? backend->instances(batch)
                                    : backend->tilesAtOnce(backward, saveGates, batch, tiles);
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
    case ArgKind::ParamTransposed: {
      size_t i = indexOf(cell.params, arg.name);
      if (i >= transposed.size() || !transposed[i].valid())
        return Status::error("internal error: no transposed copy of param '" + arg.name + "'");
      v = transposed[i];
      break;
    }
    case ArgKind::StateHistory:
      v = chunk.history[indexOf(cell.states, arg.name)];
      break;
    case ArgKind::Gates:
      v = chunk.gates;
      break;
    case ArgKind::EndState:
      if (backward)
        return misplaced(arg, backward);
      if (chunk.end.size() != cell.states.size())
        return Status::error("internal error: a forward launch with no buffer for its end "
                             "states");
      v = chunk.end[indexOf(cell.states, arg.name)];
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

Status SequenceDriver::beginCall(const Sequence &seq, CallBuffers &keep) {
  if (Status e = uploadLengths(seq.lengths, keep.lengths))
    return e;
  return transposeParams(seq, keep.transposed);
}

Status SequenceDriver::uploadLengths(const std::vector<int64_t> &lengths, Scratch &keep) {
  lengthsOnBackend = View();
  if (lengths.empty())
    return Status();
  int64_t B = int64_t(lengths.size());
  if (Status e = scratch({B}, Element::I32, false, keep))
    return e;
  // checkLengths bounds each by T, which int32 holds where a call's buffers
  // fit in memory.
  std::vector<int32_t> narrow(lengths.begin(), lengths.end());
  if (Status e = backend->upload(narrow.data(), B * 4, keep.view()))
    return e;
  lengthsOnBackend = keep.view();
  return Status();
}

Status SequenceDriver::transposeParams(const Sequence &seq, std::vector<Scratch> &keep) {
  transposed.assign(cell.params.size(), View());
  keep.clear();
  for (const Kernel *kernel : {&cell.forward, &cell.backward})
    for (const KernelArg &arg : kernel->args) {
      if (arg.kind != ArgKind::ParamTransposed)
        continue;
      size_t i = indexOf(cell.params, arg.name);
      if (i >= cell.params.size() || cell.params[i].shape.size() != 2)
        return Status::error("a kernel takes param '" + arg.name +
                             "' transposed, and the cell has no such matrix param");
      if (transposed[i].valid())
        continue;
      const std::vector<int64_t> &shape = cell.params[i].shape;
      keep.emplace_back();
      if (Status e = scratch({shape[1], shape[0]}, seq.params[i].element(), false,
                             keep.back()))
        return e;
      if (Status e = backend->transpose(seq.params[i], keep.back().view()))
        return e;
      transposed[i] = keep.back().view();
    }
  return Status();
}

Status SequenceDriver::zeroPastLengths(const std::vector<int64_t> &lengths,
                                      int64_t first, const std::vector<View> &views) {
  for (const View &v : views) {
    if (!v.valid() || v.size() == 0)
      continue;
    // Whether any row of these steps is past its length.
    int64_t len = v.shape[0];
    bool any = std::any_of(lengths.begin(), lengths.end(),
                           [&](int64_t length) { return length < first + len; });
    if (any)
      if (Status e = backend->maskPastLengths(v, lengthsOnBackend, first))
        return e;
  }
  return Status();
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

/// `c = op(a) op(b) + beta c` for each of `blocks` diagonal blocks of a
/// block-diagonal weight (one for a dense weight): block g of a, b and c
/// starts g times `aStep`, `bStep` and `cStep` elements in. One GEMM a
/// block, each over all the rows.
Status cellc::driver::detail::blockGemm(Backend &backend, int64_t blocks, bool transA, bool transB,
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
  if (Status e = workspace(kernel, backward, saveGates, rows, args, buffers.scratch, &reused))
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
