//===- CpuCell.cpp - Run a CPU package: forward, backward, modes ----------===//
//
// Loads a cell's CPU package (dlopen of its two shared objects, kernels.json
// through the driver's reader) and runs it through the sequence driver over
// the CPU backend (CpuBackend.h), batch-first sequences time-major
// (TimeMajor.h): the CpuCell API, its steps and its bound steps.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/CpuCell.h"
#include "runtime/cpu/CpuBackend.h"
#include "runtime/cpu/TimeMajor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

using namespace cellc;
using namespace cellc::runtime;
using driver::View;

namespace {

/// The caller's arrays as the driver's views (null data and no shape: an
/// invalid view, not given), named after their slots. The driver checks
/// their count and shapes; here only what a pointer can get wrong, the
/// alignment.
Status viewsOf(const std::vector<Array> &arrays, const std::vector<Slot> &slots,
               driver::Element element, const std::string &what, std::vector<View> &out,
               const std::map<std::string, std::vector<int64_t>> *dims = nullptr) {
  int64_t eb = driver::bytesOf(element);
  out.clear();
  for (size_t i = 0; i < arrays.size(); ++i) {
    Array array = arrays[i];
    // A state of several dims (a matrix state's [NH, K, V]) may come in
    // them, [B, NH, K, V]: the kernels' [B, NH*K*V] is the same memory.
    const std::vector<int64_t> *declared = nullptr;
    if (dims && i < slots.size())
      if (auto it = dims->find(slots[i].name); it != dims->end())
        declared = &it->second;
    if (declared && array.shape.size() == declared->size() + 1) {
      if (!std::equal(declared->begin(), declared->end(), array.shape.begin() + 1))
        return Status::error(what + " '" + slots[i].name + "' has shape " +
                             driver::shapeString(array.shape) + ", expected [" +
                             std::to_string(array.shape[0]) + ", " +
                             std::to_string(slots[i].shape[0]) + "] or [" +
                             std::to_string(array.shape[0]) + ", " +
                             driver::shapeString(*declared).substr(1));
      array.shape = {array.shape[0], slots[i].shape[0]};
    }
    void *data = array.data;
    // An array of no elements (the gates of a cell that saves none) may
    // have no address, as torch's empty tensors have none; it is given all
    // the same.
    static double nothing;
    if (!data && !array.shape.empty() &&
        std::find(array.shape.begin(), array.shape.end(), 0) != array.shape.end())
      data = &nothing;
    View v;
    if (data) {
      if (reinterpret_cast<uintptr_t>(data) % eb != 0)
        return Status::error(what + " '" + (i < slots.size() ? slots[i].name : "?") +
                             "' is not aligned to its " + std::to_string(eb) +
                             "-byte elements");
      v.buffer.data = data;
      v.buffer.element = element;
      v.shape = array.shape;
    }
    out.push_back(v);
  }
  return Status();
}

/// The driver's view of per-step reset bytes [T, B] (none: invalid).
View resetsOf(const uint8_t *resets, int64_t T, int64_t B) {
  View v;
  if (resets) {
    v.buffer.data = const_cast<uint8_t *>(resets);
    v.buffer.element = driver::Element::U8;
    v.shape = {T, B};
  }
  return v;
}

driver::Element elementOf(DType dtype) {
  return dtype == DType::F32 ? driver::Element::F32 : driver::Element::F64;
}

/// The driver's sequence over a time-major `seq` of T steps of B rows.
Status driverSequence(const CpuCell &cell, const CpuCell::Sequence &seq, int64_t T,
                      int64_t B, driver::Element e, driver::Sequence &s) {
  s.steps = T;
  s.batch = B;
  s.resets = resetsOf(seq.resets, T, B);
  s.lengths = seq.lengths;
  if (Status err = viewsOf(seq.inputs, cell.inputs(), e, "input", s.inputs))
    return err;
  if (Status err = viewsOf(seq.params, cell.params(), e, "param", s.params))
    return err;
  // Every declared param, in the slots' order; the kernels' own, by name.
  if (Status err = driver::kernelParams(cell.package(), s.params, "param", true, s.params))
    return err;
  return viewsOf(seq.initialStates, cell.states(), e, "initial state", s.initialStates,
                 &cell.package().stateDims);
}

/// The caller's kept buffers as the driver's views, in the layout's element
/// types.
Status keptViews(const std::vector<driver::KeptBuffer> &layout,
                 const std::vector<Array> &kept, std::vector<View> &out) {
  if (kept.size() != layout.size())
    return Status::error("expected " + std::to_string(layout.size()) +
                         " kept buffers, got " + std::to_string(kept.size()));
  out.clear();
  for (size_t i = 0; i < kept.size(); ++i) {
    std::vector<Slot> names = {{"#" + std::to_string(i), {}}};
    std::vector<View> one;
    if (Status e = viewsOf({kept[i]}, names, layout[i].element, "kept buffer", one))
      return e;
    out.push_back(one[0]);
  }
  return Status();
}

/// A token per param that changes when its contents do: its version, mixed
/// with a hash of 16 elements spread over it. The version sees every write
/// that torch counts; the elements see what it does not (a write through
/// `.data`, as RL's soft target updates make) wherever it changes them.
std::vector<int64_t> contentTokens(const std::vector<Array> &params,
                                   const std::vector<int64_t> &versions, int64_t bytes) {
  constexpr int64_t kProbes = 16;
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < params.size(); ++i) {
    uint64_t hash = 1469598103934665603ull ^ uint64_t(i < versions.size() ? versions[i] : -1);
    int64_t n = 1;
    for (int64_t d : params[i].shape)
      n *= d;
    const auto *data = static_cast<const unsigned char *>(params[i].data);
    for (int64_t p = 0; data && n > 0 && p < std::min(n, kProbes); ++p) {
      int64_t at = n <= kProbes ? p : p * (n - 1) / (kProbes - 1);
      uint64_t word = 0;
      std::memcpy(&word, data + at * bytes, size_t(bytes));
      hash = (hash ^ word) * 1099511628211ull;
    }
    tokens.push_back(int64_t(hash));
  }
  return tokens;
}

} // namespace


//===----------------------------------------------------------------------===//
// CpuCell
//===----------------------------------------------------------------------===//

Status Recompute::parse(const std::string &text, Recompute &out) {
  return driver::Recompute::parse(text, static_cast<driver::Recompute &>(out));
}

struct CpuCell::Impl {
  /// The variants that replay (0) and save gates (1).
  KernelObject variants[2];
  std::shared_ptr<CpuBackend> backend;
  std::unique_ptr<driver::SequenceDriver> driver;
  int64_t pieceRows = driver::SequenceDriver::kPieceRows;
};

CpuCell::CpuCell() : impl(std::make_unique<Impl>()) {}
CpuCell::~CpuCell() = default;

int64_t CpuCell::savedBytes(const Saved &saved) { return driver::savedBytes(saved); }

Status CpuCell::load(const std::string &dir, const Options &options,
                     std::unique_ptr<CpuCell> &out) {
  std::unique_ptr<CpuCell> cell(new CpuCell());
  if (Status s = driver::readPackage(dir, cell->info))
    return s;
  driver::PackageInfo &info = cell->info;
  if (info.target != "cpu")
    return Status::error(dir + " is a " + info.target +
                         " package; load it with its own runtime (cellc.cuda)");
  // Code for a CPU this one is not would fault on its first instruction.
  for (const std::string &feature : info.cpuFeatures)
    if (!hostHas(feature))
      return Status::error(dir + " was compiled for a CPU with " + feature +
                           ", which this one lacks; compile the cell on this machine");
  // The batched kernels' index arguments changed with cellc: a package
  // built before one of them would be called with the wrong arguments.
  if (info.interface.forward.perGroup())
    for (const driver::Kernel *kernel : {&info.interface.forward, &info.interface.backward})
      for (ArgKind kind : {ArgKind::Group, ArgKind::Slice, ArgKind::Slices, ArgKind::Packed,
                           ArgKind::Stream})
        if (std::none_of(kernel->args.begin(), kernel->args.end(),
                         [&](const driver::KernelArg &a) { return a.kind == kind; }))
          return Status::error(dir + " was built by an older cellc: its kernels take no '" +
                               std::string(name(kind)) +
                               "' argument; build it again with this one");
  cell->elementType = info.dtype == "f64" ? DType::F64 : DType::F32;
  for (int variant : {0, 1})
    if (Status s = cell->impl->variants[variant].open(dir + "/" + info.objects[variant],
                                                       info.cell))
      return s;
  cell->setThreads(options.threads);
  std::vector<std::vector<int64_t>> paramShapes;
  for (const Slot &param : info.params)
    paramShapes.push_back(param.shape);
  Impl &impl = *cell->impl;
  impl.backend = std::make_shared<CpuBackend>(cell->elementType, impl.variants,
                                              cell->numThreads,
                                              info.interface.forward.batchTile,
                                              info.interface.forward.perGroup(),
                                              matrixBytes(paramShapes, cell->elementBytes()));
  impl.driver = std::make_unique<driver::SequenceDriver>(info.interface, impl.backend);
  impl.pieceRows =
      options.pieceRows > 0 ? options.pieceRows : driver::SequenceDriver::kPieceRows;
  impl.driver->setPieceRows(impl.pieceRows);
  out = std::move(cell);
  return Status();
}

driver::MemoryStats CpuCell::memoryStats() const { return impl->driver->stats(); }

const driver::PhaseProfile &CpuCell::phaseProfile(bool backward) const {
  return impl->driver->phaseProfile(backward);
}

void CpuCell::resetPhaseProfile() { impl->driver->resetPhaseProfile(); }

Status CpuCell::memoryPlan(int64_t steps, int64_t batch, Recompute mode,
                           driver::MemoryPlan &plan) const {
  if (steps < 1 || batch < 1)
    return Status::error("a memory plan needs steps >= 1 and batch >= 1");
  return driver::SequenceDriver::plan(impl->driver->interface(), steps, batch, mode, plan,
                                      impl->pieceRows, impl->backend->instances(batch));
}

std::string CpuCell::config() const {
  std::vector<std::string> knobs = {"threads=" + std::to_string(numThreads),
                                    "unit_slices=" + std::to_string(int(unitSlices()))};
  for (size_t begin = 0; begin < info.config.size();) {
    size_t comma = std::min(info.config.find(',', begin), info.config.size());
    knobs.push_back(info.config.substr(begin, comma - begin));
    begin = comma + 1;
  }
  std::sort(knobs.begin(), knobs.end());
  std::string text;
  for (const std::string &knob : knobs)
    text += (text.empty() ? "" : ",") + knob;
  return text;
}

bool CpuCell::splitsRows(int64_t batch, int threads, int64_t weightBytes) {
  return batch >= kRowsPerThread * threads && (threads - 1) * weightBytes <= kRowSplitBytes;
}

int64_t CpuCell::matrixBytes(const std::vector<std::vector<int64_t>> &shapes,
                             int64_t elementBytes) {
  int64_t bytes = 0;
  for (const std::vector<int64_t> &shape : shapes)
    if (shape.size() >= 2) {
      int64_t n = elementBytes;
      for (int64_t d : shape)
        n *= d;
      bytes += n;
    }
  return bytes;
}

void CpuCell::setUnitSlices(int mode) { impl->backend->unitSlices = mode < 0 ? -1 : mode > 0; }
int CpuCell::unitSlices() const { return impl->backend->unitSlices; }
std::pair<int64_t, int64_t> CpuCell::threadSplit(int64_t batch) const {
  Split s = impl->backend->split(batch);
  return {s.groups, s.slices};
}

void CpuCell::setThreads(int threads) {
  numThreads = threads > 0 ? threads : cores();
  if (impl->backend)
    impl->backend->threads = numThreads;
}

std::vector<driver::KeptBuffer> CpuCell::keptLayout(Recompute mode,
                                                   bool hasLengths) const {
  return impl->driver->keptLayout(mode, hasLengths, /*outputsOutliveSaved=*/true);
}

std::vector<size_t> CpuCell::keptOutputs(Recompute mode, bool hasLengths) const {
  std::vector<size_t> outputs;
  for (int64_t o : impl->driver->keptOutputs(mode, hasLengths, /*outputsOutliveSaved=*/true))
    if (o >= 0)
      outputs.push_back(size_t(o));
  return outputs;
}

Status CpuCell::adopt(const Sequence &seq, Recompute mode, const std::vector<Array> &outputs,
                      const std::vector<Array> &kept, SavedPtr &saved) const {
  if (seq.batchFirst)
    return Status::error("kept buffers are time-major only");
  if (seq.inputs.empty() || seq.inputs[0].shape.size() != 3)
    return Status::error("adopt needs the forward's inputs, [T, B, n]");
  int64_t T = seq.inputs[0].shape[0], B = seq.inputs[0].shape[1];
  driver::Element e = elementOf(elementType);
  driver::Sequence s;
  if (Status err = driverSequence(*this, seq, T, B, e, s))
    return err;
  std::vector<View> outs, keptIn;
  if (Status err = viewsOf(outputs, info.outputs, e, "output", outs))
    return err;
  if (Status err = keptViews(keptLayout(mode, !seq.lengths.empty()), kept, keptIn))
    return err;
  return impl->driver->adopt(s, mode, outs, keptIn, saved);
}

Status CpuCell::forward(const Sequence &batchFirstOrNot,
                        const std::vector<Array> &callerOutputs,
                        const std::vector<Array> &finalStates, Recompute mode,
                        SavedPtr *saved, const std::vector<Array> *kept) {
  if (kept && (batchFirstOrNot.batchFirst || !saved))
    return Status::error("kept buffers need a time-major training forward");
  // Batch-first sequences run time-major, on copies.
  std::optional<TimeMajor> tm;
  Sequence seq;
  if (Status e = timeMajor(batchFirstOrNot, elementBytes(), tm, seq))
    return e;
  std::vector<Array> outputs = callerOutputs;
  if (tm)
    if (Status e = tm->convert(callerOutputs, "output", /*copy=*/false, outputs))
      return e;

  // T and B come from the first input, or are given.
  int64_t T = seq.steps, B = seq.batch;
  if (!seq.inputs.empty() && seq.inputs[0].shape.size() == 3) {
    T = seq.inputs[0].shape[0];
    B = seq.inputs[0].shape[1];
  }
  driver::Element e = elementOf(elementType);
  driver::Sequence s;
  if (Status err = driverSequence(*this, seq, T, B, e, s))
    return err;
  std::vector<View> outs, finals, keptIn;
  if (Status err = viewsOf(finalStates, info.states, e, "final state", finals, &info.stateDims))
    return err;
  if (Status err = viewsOf(outputs, info.outputs, e, "output", outs))
    return err;
  if (kept)
    if (Status err = keptViews(keptLayout(mode, !seq.lengths.empty()), *kept, keptIn))
      return err;
  if (Status err = impl->driver->forward(s, outs, finals, mode, saved,
                                         (seq.outputsOutliveSaved || kept) && !tm,
                                         kept ? &keptIn : nullptr))
    return err;
  if (tm)
    tm->copyBack(outputs, callerOutputs);
  return Status();
}

Status CpuCell::step(const Sequence &seq, const std::vector<Array> &outputs,
                     const std::vector<Array> &newStates,
                     const std::vector<int64_t> *paramVersions) {
  if (seq.batchFirst || seq.resets || !seq.lengths.empty())
    return Status::error("a step takes no resets, lengths or batch-first layout");
  if (seq.inputs.empty() || seq.inputs[0].shape.size() != 2)
    return Status::error("a step's inputs are [B, n]");
  int64_t B = seq.inputs[0].shape[0];
  // The driver's [1, B, n] sequences over the caller's [B, n] rows.
  auto oneStep = [&](std::vector<Array> &arrays, const char *what) -> Status {
    for (Array &a : arrays) {
      if (a.shape.size() != 2 || a.shape[0] != B)
        return Status::error(std::string("a step's ") + what + " is " +
                             driver::shapeString(a.shape) + ", not [" + std::to_string(B) +
                             ", n]");
      a.shape.insert(a.shape.begin(), 1);
    }
    return Status();
  };
  Sequence inner = seq;
  std::vector<Array> outs = outputs;
  if (Status e = oneStep(inner.inputs, "input"))
    return e;
  if (Status e = oneStep(outs, "output"))
    return e;
  driver::Element e = elementOf(elementType);
  driver::Sequence s;
  if (Status err = driverSequence(*this, inner, 1, B, e, s))
    return err;
  std::vector<View> outViews, newViews;
  if (Status err = viewsOf(outs, info.outputs, e, "output", outViews))
    return err;
  if (Status err = viewsOf(newStates, info.states, e, "new state", newViews, &info.stateDims))
    return err;
  std::vector<int64_t> tokens;
  if (paramVersions)
    tokens = contentTokens(inner.params, *paramVersions, elementBytes());
  PackedWeights::Step packing(impl->backend->packedWeights,
                              paramVersions ? &tokens : nullptr);
  return impl->driver->step(s, outViews, newViews, &packing);
}

/// A bound step: its launch's arguments laid out per task, and where the
/// caller's tensors go in them.
struct CpuCell::BoundStep::Impl {
  CpuCell *cell = nullptr;
  Entry entry = nullptr;
  int64_t batch = 0, epoch = 0;
  Split split;
  /// The arguments of each task.
  std::vector<std::unique_ptr<PackedArgs>> tasks;
  /// Each buffer argument that is a caller's tensor, with its place in the
  /// data `run` takes.
  std::vector<std::pair<size_t, size_t>> patches;
  /// The kernel's `packed` argument, if it has one.
  std::optional<size_t> packedArg;
  /// Where the params and the states stepped from and to are in the data,
  /// and the params as arrays (their content is sampled with the versions).
  size_t firstParam = 0, firstState = 0, firstNewState = 0, numStates = 0;
  std::vector<Array> params;
};

CpuCell::BoundStep::~BoundStep() = default;

Status CpuCell::bindStep(const Sequence &seq, const std::vector<Array> &outputs,
                         const std::vector<Array> &newStates,
                         const std::vector<int64_t> &paramVersions,
                         std::unique_ptr<BoundStep> &bound) {
  bound.reset();
  CpuBackend::Launch launch;
  impl->backend->recordingThread = std::this_thread::get_id();
  impl->backend->recording = &launch;
  Status e = step(seq, outputs, newStates, &paramVersions);
  impl->backend->recording = nullptr;
  // A step whose projections run as GEMMs around the kernel is not bound:
  // a bound step runs the kernel alone.
  if (e || !launch.entry || !info.interface.projections.empty())
    return e;
  // The caller's tensors in step's order; tensors that share data would
  // make a patch ambiguous, so they are not bound.
  std::vector<const void *> data;
  for (const auto *arrays : {&seq.inputs, &seq.params, &seq.initialStates, &outputs, &newStates})
    for (const Array &a : *arrays)
      data.push_back(a.data);
  std::vector<const void *> sorted = data;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      std::find(sorted.begin(), sorted.end(), nullptr) != sorted.end())
    return Status();
  auto b = std::make_unique<BoundStep::Impl>();
  b->cell = this;
  b->entry = launch.entry;
  b->batch = launch.batch;
  b->epoch = impl->driver->stepEpoch();
  b->split = launch.split;
  b->firstParam = seq.inputs.size();
  b->firstState = b->firstParam + seq.params.size();
  b->numStates = seq.initialStates.size();
  b->firstNewState = b->firstState + b->numStates + outputs.size();
  b->params = seq.params;
  const std::vector<driver::KernelArg> &kinds = info.interface.forward.args;
  for (size_t a = 0; a < launch.args.size(); ++a) {
    if (a < kinds.size() && kinds[a].kind == ArgKind::Packed)
      b->packedArg = a;
    if (launch.args[a].isIndex)
      continue;
    auto at = std::find(data.begin(), data.end(), launch.args[a].data);
    if (at != data.end())
      b->patches.push_back({a, size_t(at - data.begin())});
  }
  int tasks = int(launch.split.groups * launch.split.slices);
  for (int task = 0; task < tasks; ++task) {
    impl->backend->setTask(launch.args, launch.indices, launch.split, task, launch.batch);
    b->tasks.push_back(std::make_unique<PackedArgs>(launch.args));
  }
  bound.reset(new BoundStep());
  bound->impl = std::move(b);
  return Status();
}

bool CpuCell::BoundStep::run(const std::vector<uintptr_t> &data,
                             const std::vector<int64_t> &versions, Status &status) {
  Impl &b = *impl;
  CpuCell::Impl &cell = *b.cell->impl;
  status = Status();
  if (data.size() != b.firstNewState + b.numStates) {
    status = Status::error("internal error: a bound step takes " +
                           std::to_string(b.firstNewState + b.numStates) +
                           " tensors, not " + std::to_string(data.size()));
    return true;
  }
  for (size_t i = 0; i < b.numStates; ++i)
    if (data[b.firstState + i] == data[b.firstNewState + i]) {
      status = Status::error("a step's new state '" + b.cell->info.states[i].name +
                             "' must not be the state it steps from");
      return true;
    }
  std::unique_lock<std::mutex> lock = cell.driver->lockStep();
  if (cell.driver->stepEpoch() != b.epoch || !(cell.backend->split(b.batch) == b.split))
    return false;
  for (auto &task : b.tasks)
    for (auto [arg, at] : b.patches)
      task->setData(arg, reinterpret_cast<const void *>(data[at]));
  // The weights the last step packed serve where the params, their
  // versions and sampled contents are the same (as in `step`). Kernels
  // that read the params as they are (the per-row ones) pack nothing.
  std::vector<void *> params;
  std::vector<int64_t> tokens;
  if (b.packedArg) {
    for (size_t p = 0; p < b.params.size(); ++p) {
      b.params[p].data = reinterpret_cast<void *>(data[b.firstParam + p]);
      params.push_back(b.params[p].data);
    }
    tokens = contentTokens(b.params, versions, b.cell->elementBytes());
    bool packed = PackedWeights::Step(cell.backend->packedWeights, &tokens)
                      .holds(params, /*reused=*/true);
    for (auto &task : b.tasks)
      task->setIndex(*b.packedArg, packed ? 1 : 0);
  }
  if (b.tasks.size() == 1)
    b.tasks[0]->call(b.entry);
  else
    runTasks(int(b.tasks.size()), [&](int task) { b.tasks[size_t(task)]->call(b.entry); });
  if (b.packedArg)
    PackedWeights::Step(cell.backend->packedWeights, &tokens).packed(std::move(params));
  return true;
}

Status CpuCell::backward(const Sequence &batchFirstOrNot, const Saved &saved,
                         const std::vector<Array> &gradOutputs,
                         const std::vector<Array> &gradFinalStates,
                         const std::vector<Array> &callerGradInputs,
                         const std::vector<Array> &gradParams,
                         const std::vector<Array> &gradInitialStates) {
  // Batch-first sequences run time-major, on copies.
  std::optional<TimeMajor> tm;
  Sequence seq;
  if (Status e = timeMajor(batchFirstOrNot, elementBytes(), tm, seq))
    return e;
  std::vector<Array> dOutputs = gradOutputs, gradInputs = callerGradInputs;
  if (tm) {
    if (Status e = tm->convert(gradOutputs, "output gradient", /*copy=*/true, dOutputs))
      return e;
    if (Status e = tm->convert(callerGradInputs, "input gradient", /*copy=*/false,
                               gradInputs))
      return e;
  }

  driver::Element e = elementOf(elementType);
  int64_t T = driver::savedSteps(saved), B = driver::savedBatch(saved);
  driver::Sequence s;
  if (Status err = driverSequence(*this, seq, T, B, e, s))
    return err;
  std::vector<View> dOut, dFinal, dIn, dPar, dInit;
  using Named = std::tuple<const std::vector<Array> *, const std::vector<Slot> *,
                           const char *, std::vector<View> *>;
  for (auto [arrays, slots, what, views] :
       {Named{&dOutputs, &info.outputs, "gradient of output", &dOut},
        Named{&gradFinalStates, &info.states, "gradient of final state", &dFinal},
        Named{&gradInputs, &info.inputs, "gradient of input", &dIn},
        Named{&gradParams, &info.params, "gradient of param", &dPar},
        Named{&gradInitialStates, &info.states, "gradient of initial state", &dInit}})
    if (Status err = viewsOf(*arrays, *slots, e, what, *views,
                             slots == &info.states ? &info.stateDims : nullptr))
      return err;
  // A param the cell does not read has a zero gradient.
  std::vector<View> unread;
  if (Status err = driver::kernelParams(info, dPar, "gradient of param", false, dPar, &unread))
    return err;
  for (const View &v : unread)
    std::memset(v.pointer(), 0, size_t(v.size() * driver::bytesOf(v.element())));
  if (Status err = impl->driver->backward(s, saved, dOut, dFinal, dIn, dPar, dInit))
    return err;
  if (tm)
    tm->copyBack(gradInputs, callerGradInputs);
  return Status();
}
