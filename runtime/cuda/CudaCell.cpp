//===- CudaCell.cpp - A CUDA package, run through the sequence driver -----===//

#include "runtime/cuda/CudaCell.h"

#include "runtime/cuda/GpuDevice.h"
#include "runtime/emu/EmuDevice.h"

#include <algorithm>
#include <fstream>
#include <sys/stat.h>
#include <sstream>
#include <tuple>

using namespace cellc;
using namespace cellc::cuda;
using driver::Element;
using driver::Recompute;
using driver::View;

namespace {

const char *nameOf(Element e) {
  switch (e) {
  case Element::F32:
    return "float32";
  case Element::F64:
    return "float64";
  case Element::BF16:
    return "bfloat16";
  case Element::U8:
    return "uint8";
  case Element::I32:
    return "int32";
  }
  return "?";
}

Status readText(const std::string &path, std::string &out) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return Status::error("cannot read " + path);
  std::stringstream text;
  text << file.rdbuf();
  out = text.str();
  return Status();
}

/// Whether the file at `path` exists and was written no earlier than `than`.
bool newerOrSame(const std::string &path, const std::string &than) {
  struct stat a, b;
  if (stat(path.c_str(), &a) != 0 || stat(than.c_str(), &b) != 0)
    return false;
  return std::make_pair(a.st_mtim.tv_sec, a.st_mtim.tv_nsec) >=
         std::make_pair(b.st_mtim.tv_sec, b.st_mtim.tv_nsec);
}

/// `a * b`, or false where it passes int64.
bool multiply(int64_t a, int64_t b, int64_t &out) { return !__builtin_mul_overflow(a, b, &out); }

} // namespace

Status CudaCell::open(const driver::PackageInfo &package, int deviceIndex, uint64_t shuffleSeed,
                      std::unique_ptr<CudaCell> &out) {
  if (package.target != "cuda")
    return Status::error(package.directory + " is a " + package.target +
                         " package, not a CUDA one");
  std::unique_ptr<CudaCell> cell(new CudaCell());
  cell->info = package;
  try {
    if (deviceIndex == kEmulator) {
      if (package.simtObjects[0].empty() || package.simtObjects[1].empty())
        return Status::error(package.directory + ": the package has no kernels for the SIMT "
                             "emulator (cellc --emit=package --simt)");
      cell->device = std::make_shared<emu::EmuDevice>(
          package.directory + "/" + package.simtObjects[0],
          package.directory + "/" + package.simtObjects[1], shuffleSeed);
    } else {
      // Each variant's PTX, or the cubin that ptxas made of it beside it
      // (`<variant>.ptx.cubin`, bench/gpu/run.sh): loaded as it is, where
      // it is for this GPU, instead of the driver compiling the PTX. A cubin
      // older than its PTX is another PTX's (its parameters may differ):
      // not loaded.
      std::string ptx[2], cubin[2];
      for (int v = 0; v < 2; ++v) {
        std::string path = package.directory + "/" + package.objects[v];
        if (Status e = readText(path, ptx[v]))
          return e;
        if (!newerOrSame(path + ".cubin", path) || readText(path + ".cubin", cubin[v]))
          cubin[v].clear();
      }
      std::vector<std::string> kernels = {package.cell + "_fwd", package.cell + "_bwd"};
      if (!cubin[0].empty() && !cubin[1].empty()) {
        try {
          cell->device = std::make_shared<GpuDevice>(deviceIndex, cubin[0], cubin[1], kernels);
        } catch (const CudaError &) {
          cell->device = nullptr; // another GPU's: the PTX, below
        }
      }
      if (!cell->device)
        cell->device = std::make_shared<GpuDevice>(deviceIndex, ptx[0], ptx[1], kernels);
    }
  } catch (const std::exception &e) {
    return Status::error(e.what());
  }
  cell->backend = std::make_shared<CudaBackend>(
      cell->device, package.cell, cell->info.interface,
      CudaBackend::gemmsFor(package.arch, package.precision));
  cell->driver = std::make_unique<driver::SequenceDriver>(cell->info.interface, cell->backend);
  out = std::move(cell);
  return Status();
}

std::vector<driver::KeptBuffer> CudaCell::keptLayout(Recompute mode, bool hasLengths) const {
  return driver->keptLayout(mode, hasLengths, /*outputsOutliveSaved=*/true);
}

std::vector<int64_t> CudaCell::keptOutputs(Recompute mode, bool hasLengths) const {
  return driver->keptOutputs(mode, hasLengths, /*outputsOutliveSaved=*/true);
}

int64_t CudaCell::pieceRows(Recompute mode, int64_t steps, int64_t batch,
                            bool hasLengths) const {
  int64_t all = 0;
  if (!multiply(std::max<int64_t>(steps, 1), std::max<int64_t>(batch, 1), all))
    all = INT64_MAX;
  if (mode.kind != Recompute::Kind::Full)
    return all;
  // Full keeps the states of every step (those that are not outputs): a
  // piece's projections may take as much.
  const driver::Interface &cell = info.interface;
  int64_t kept = 0, projected = 0;
  for (const driver::KeptBuffer &b : keptLayout(mode, hasLengths))
    kept += b.width * driver::bytesOf(b.element);
  for (const driver::Interface::Projection &p : cell.projections)
    projected += p.rows * driver::bytesOf(p.element);
  if (projected == 0)
    return all;
  // A floor: a piece of at least kPieceRows rows (GEMMs worth a launch) and
  // at most kMaxPieces pieces a sequence, so that the launches and GEMMs of
  // a call do not grow with T, even where full keeps nothing beside the
  // outputs (a GRU's, whose states are all outputs).
  int64_t rows = std::max<int64_t>(batch, 1);
  int64_t floor = std::max((driver::SequenceDriver::kPieceRows + rows - 1) / rows,
                           (steps + kMaxPieces - 1) / kMaxPieces);
  int64_t pieceSteps = std::clamp<int64_t>(std::max(steps * kept / projected, floor), 1, steps);
  return pieceSteps * rows;
}

Status CudaCell::checkElements(const Call &call, bool backward) const {
  const driver::Interface &cell = info.interface;
  Element storage = cell.storage, compute = cell.compute;
  auto each = [&](const std::vector<View> &views, const std::vector<driver::Slot> &slots,
                  Element element, const std::string &what) -> Status {
    for (size_t i = 0; i < views.size() && i < slots.size(); ++i)
      if (views[i].valid() && views[i].element() != element)
        return Status::error(what + " '" + slots[i].name + "' is " +
                             nameOf(views[i].element()) + ", but this package takes " +
                             nameOf(element) + (element == storage && storage != compute
                                                    ? " (its storage, cellc --storage)"
                                                    : ""));
    return Status();
  };
  const driver::Sequence &seq = call.seq;
  if (seq.resets.valid() && seq.resets.element() != Element::U8)
    return Status::error(std::string("resets are ") + nameOf(seq.resets.element()) +
                         ", not uint8");
  using Check = std::tuple<const std::vector<View> *, const std::vector<driver::Slot> *,
                           Element, const char *>;
  std::vector<Check> checks = {{&seq.inputs, &cell.inputs, storage, "input"},
                               {&seq.params, &cell.params, compute, "param"},
                               {&seq.initialStates, &cell.states, compute, "initial state"},
                               {&call.outputs, &cell.outputs, storage, "output"}};
  if (!backward)
    checks.push_back({&call.finals, &cell.states, compute, "final state"});
  else
    checks.insert(checks.end(),
                  {{&call.gradOutputs, &cell.outputs, storage, "the gradient of output"},
                   {&call.gradFinals, &cell.states, compute, "the gradient of final state"},
                   {&call.gradInputs, &cell.inputs, storage, "the gradient of input"},
                   {&call.gradParams, &cell.params, compute, "the gradient of param"},
                   {&call.gradInitial, &cell.states, compute,
                    "the gradient of initial state"}});
  for (const auto &[views, slots, element, what] : checks)
    if (Status e = each(*views, *slots, element, what))
      return e;
  return Status();
}

std::string CudaCell::layoutKey(const Call &call, bool backward) {
  // What decides the buffers a call places and their order: the kind of
  // call, its extent and lengths, which tensors are given (and their types
  // and shapes), and which params are the same tensor (a weight converted
  // once a call, CudaBackend::gemm).
  std::ostringstream key;
  key << backward << ' ' << call.mode.str() << ' ' << call.seq.steps << ' ' << call.seq.batch
      << ' ' << call.training << ' ' << call.seq.resets.valid() << " L";
  for (int64_t length : call.seq.lengths)
    key << ' ' << length;
  auto views = [&](const char *what, const std::vector<View> &list, bool pointers) {
    key << ' ' << what;
    for (const View &v : list) {
      key << ' ' << v.valid();
      if (!v.valid())
        continue;
      key << ':' << int(v.element());
      for (int64_t d : v.shape)
        key << 'x' << d;
      if (pointers)
        key << '@' << v.pointer();
    }
  };
  views("i", call.seq.inputs, false);
  views("p", call.seq.params, true);
  views("s", call.seq.initialStates, false);
  views("o", call.outputs, false);
  views("f", call.finals, false);
  views("k", call.kept, false);
  views("go", call.gradOutputs, false);
  views("gf", call.gradFinals, false);
  views("gi", call.gradInputs, false);
  views("gp", call.gradParams, false);
  views("gs", call.gradInitial, false);
  views("u", call.unreadGrads, false);
  return key.str();
}

template <typename F>
Status CudaCell::twice(Call &call, bool backward, bool &tooSmall, F &&body) {
  tooSmall = false;
  if (Status e = driver->checkExtent(call.seq.steps, call.seq.batch))
    return e;
  // Every declared param, in the slots' order; the kernels' own, by name.
  if (Status e = driver::kernelParams(info, call.seq.params, "param", true, call.seq.params))
    return e;
  if (backward)
    if (Status e = driver::kernelParams(info, call.gradParams, "gradient of param", false,
                                        call.gradParams, &call.unreadGrads))
      return e;
  if (Status e = checkElements(call, backward))
    return e;
  std::lock_guard<std::mutex> guard(lock);
  driver->setPieceRows(pieceRows(call.mode, call.seq.steps, call.seq.batch,
                                 !call.seq.lengths.empty()));
  // The dry run's measure, once per kind of call: a call like one before it
  // places the same buffers in the same order, wherever its workspace is.
  std::string key = layoutKey(call, backward);
  auto known = layouts.find(key);
  if (known != layouts.end()) {
    call.needed = known->second;
  } else {
    backend->beginDry();
    Status dry;
    try {
      dry = body();
    } catch (const std::exception &e) {
      dry = Status::error(e.what());
    }
    Status ended = backend->endCall();
    if (dry)
      return dry;
    if (ended)
      return ended;
    call.needed = backend->used();
    if (layouts.size() >= kLayouts)
      layouts.clear();
    layouts.emplace(std::move(key), call.needed);
  }
  if (call.needed > call.workspaceBytes) {
    tooSmall = true;
    return Status();
  }
  Status ended;
  Status run = backend->beginCall(call.workspace, call.workspaceBytes, call.stream);
  // An exception from the host code (out of memory) still ends the call:
  // the context it pushed is popped.
  if (!run) {
    try {
      run = body();
    } catch (const std::exception &e) {
      run = Status::error(e.what());
    }
  }
  ended = backend->endCall();
  lastWorkspace[backward] = backend->used();
  return run ? run : ended;
}

Status CudaCell::forward(Call &call, bool &tooSmall) {
  return twice(call, /*backward=*/false, tooSmall, [&]() -> Status {
    if (!call.training)
      return driver->forward(call.seq, call.outputs, call.finals, call.mode, nullptr);
    driver::SavedPtr saved;
    return driver->forward(call.seq, call.outputs, call.finals, call.mode, &saved,
                           /*outputsOutliveSaved=*/true, &call.kept);
  });
}

Status CudaCell::backward(Call &call, bool &tooSmall) {
  return twice(call, /*backward=*/true, tooSmall, [&]() -> Status {
    // A param the cell does not read has a zero gradient.
    for (const View &v : call.unreadGrads)
      if (Status e = backend->fillRows(v, 1, v.size(), {}))
        return e;
    driver::SavedPtr saved;
    if (Status e = driver->adopt(call.seq, call.mode, call.outputs, call.kept, saved))
      return e;
    return driver->backward(call.seq, *saved, call.gradOutputs, call.gradFinals,
                            call.gradInputs, call.gradParams, call.gradInitial);
  });
}

Status CudaCell::plan(int64_t T, int64_t B, Recompute mode, driver::MemoryPlan &out) {
  if (T < 1 || B < 1)
    return Status::error("a plan needs T >= 1 steps and B >= 1 rows");
  if (Status e = driver->checkExtent(T, B))
    return e;
  const driver::Interface &cell = info.interface;
  out = driver::MemoryPlan();
  out.pieceSteps = std::max<int64_t>(1, std::min(pieceRows(mode, T, B, false) / B, T));
  // The caller's buffers, at addresses that are never read (the calls run
  // dry), each counted where the plan counts it.
  char *next = reinterpret_cast<char *>(uintptr_t(1) << 40);
  auto caller = [&](std::vector<int64_t> shape, Element element, int64_t *bytes) {
    View v;
    v.buffer.data = next;
    v.buffer.element = element;
    v.shape = std::move(shape);
    next += (v.size() * driver::bytesOf(element) + 255) / 256 * 256 + 256;
    if (bytes)
      *bytes += v.size() * driver::bytesOf(element);
    return v;
  };
  Call call;
  call.mode = mode;
  call.training = true;
  call.seq.steps = T;
  call.seq.batch = B;
  for (const driver::Slot &s : cell.inputs)
    call.seq.inputs.push_back(caller({T, B, s.shape[0]}, cell.storage, nullptr));
  for (const driver::Slot &s : cell.params)
    call.seq.params.push_back(caller(s.shape, cell.compute, nullptr));
  for (const driver::Slot &s : cell.outputs) {
    call.outputs.push_back(caller({T, B, s.shape[0]}, cell.storage, &out.outputs));
    call.gradOutputs.push_back(caller({T, B, s.shape[0]}, cell.storage, &out.gradOutputs));
  }
  for (const driver::Slot &s : cell.states) {
    call.finals.push_back(caller({B, s.shape[0]}, cell.compute, &out.finalStates));
    call.gradFinals.emplace_back();
    call.gradInitial.emplace_back();
  }
  for (const driver::Slot &s : cell.inputs)
    call.gradInputs.push_back(caller({T, B, s.shape[0]}, cell.storage, &out.gradInputs));
  for (const driver::Slot &s : cell.params)
    call.gradParams.push_back(caller(s.shape, cell.compute, &out.gradParams));
  int64_t chunks = mode.kind == Recompute::Kind::Chunk
                       ? (T + std::min(mode.chunk, T) - 1) / std::min(mode.chunk, T)
                       : T;
  for (const driver::KeptBuffer &b : keptLayout(mode, false))
    call.kept.push_back(
        caller({b.perChunk ? chunks : T, B, b.width}, b.element, &out.driver.kept));
  for (int64_t o : keptOutputs(mode, false))
    if (o >= 0)
      out.keptOutputs += call.outputs[size_t(o)].size() * driver::bytesOf(cell.storage);
  // Both calls dry: a workspace of none is too small for any call that
  // places a buffer, and one that places none runs nothing either.
  std::lock_guard<std::mutex> guard(lock);
  driver->setPieceRows(pieceRows(mode, T, B, false));
  int64_t used[2] = {0, 0};
  for (int backward = 0; backward < 2; ++backward) {
    backend->beginDry();
    Status s;
    if (!backward) {
      driver::SavedPtr saved;
      s = driver->forward(call.seq, call.outputs, call.finals, mode, &saved, true, &call.kept);
    } else {
      driver::SavedPtr saved;
      s = driver->adopt(call.seq, mode, call.outputs, call.kept, saved);
      if (!s)
        s = driver->backward(call.seq, *saved, call.gradOutputs, call.gradFinals,
                             call.gradInputs, call.gradParams, call.gradInitial);
    }
    Status ended = backend->endCall();
    if (s)
      return s;
    if (ended)
      return ended;
    used[backward] = backend->used();
  }
  out.driver.forwardPeak = out.driver.kept + used[0];
  out.driver.backwardPeak = out.driver.kept + used[1];
  return Status();
}

Status CudaCell::launch(bool backward, bool saveGates, const std::vector<driver::Arg> &args,
                        int64_t batch, void *stream) {
  std::lock_guard<std::mutex> guard(lock);
  Status s = backend->beginCall(nullptr, 0, stream);
  if (!s)
    s = backend->launch(backward, saveGates, args, batch);
  Status ended = backend->endCall();
  return s ? s : ended;
}

Status CudaCell::admitLaunch(bool backward, bool saveGates, int64_t batch, LaunchSpec &spec,
                             Residency &fits) {
  if (batch < 1)
    return Status::error("a launch needs B >= 1 rows");
  std::lock_guard<std::mutex> guard(lock);
  if (Status e = backend->admitLaunch(backward, saveGates, batch, spec))
    return e;
  return device->residency(spec, fits);
}

std::vector<std::pair<std::string, int64_t>> CudaCell::deviceCalls(bool reset) {
  std::lock_guard<std::mutex> guard(lock);
  return device->calls(reset);
}

Status CudaCell::registers(const std::string &kernel, bool saveGates, int &out) {
  auto *gpu = dynamic_cast<GpuDevice *>(device.get());
  if (!gpu)
    return Status::error("registers are the CUDA driver's figure; the SIMT emulator has none");
  try {
    out = gpu->registers(kernel, saveGates);
  } catch (const std::exception &e) {
    return Status::error(e.what());
  }
  return Status();
}

driver::MemoryStats CudaCell::stats() const {
  std::lock_guard<std::mutex> guard(lock);
  return driver->stats();
}

int64_t CudaCell::workspaceUsed(bool backward) const {
  std::lock_guard<std::mutex> guard(lock);
  return lastWorkspace[backward];
}
