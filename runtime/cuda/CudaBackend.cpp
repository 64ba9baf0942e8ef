//===- CudaBackend.cpp - The sequence driver's CUDA backend ---------------===//

#include "runtime/cuda/CudaBackend.h"

#include "runtime/cpu/Kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

using namespace cellc;
using namespace cellc::cuda;
using driver::Buffer;
using driver::elementName;
using driver::View;

//===----------------------------------------------------------------------===//
// Arena
//===----------------------------------------------------------------------===//

void Arena::reset(int64_t bytes) {
  capacity = bytes;
  top = highWater = 0;
  free.clear();
  used.clear();
}

int64_t Arena::allocate(int64_t bytes) {
  bytes = std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (it->second < bytes)
      continue;
    int64_t at = it->first, left = it->second - bytes;
    free.erase(it);
    if (left)
      free[at + bytes] = left;
    used[at] = bytes;
    return at;
  }
  if (capacity >= 0 && top + bytes > capacity)
    return -1;
  int64_t at = top;
  top += bytes;
  highWater = std::max(highWater, top);
  used[at] = bytes;
  return at;
}

void Arena::release(int64_t offset) {
  auto it = used.find(offset);
  if (it == used.end())
    return;
  int64_t at = it->first, bytes = it->second;
  used.erase(it);
  // Merged with the free ranges on either side; the top comes down over a
  // free range that ends at it.
  auto next = free.find(at + bytes);
  if (next != free.end()) {
    bytes += next->second;
    free.erase(next);
  }
  auto prev = free.lower_bound(at);
  if (prev != free.begin()) {
    --prev;
    if (prev->first + prev->second == at) {
      at = prev->first;
      bytes += prev->second;
      free.erase(prev);
    }
  }
  if (at + bytes == top)
    top = at;
  else
    free[at] = bytes;
}

//===----------------------------------------------------------------------===//
// The backend
//===----------------------------------------------------------------------===//

namespace {

/// An address that a dry call's buffers start from: never dereferenced,
/// never null (a null view reads as absent).
char *const kDryBase = reinterpret_cast<char *>(uintptr_t(1) << 20);

bool floating(Element e) { return e == Element::F32 || e == Element::BF16; }

Status internal(const std::string &what) {
  return Status::error("internal error in the CUDA backend: " + what);
}

} // namespace

CudaBackend::CudaBackend(std::shared_ptr<Device> device, std::string name,
                         const driver::Interface &cell, Gemms gemms)
    : dev(std::move(device)), names{name + "_fwd", name + "_bwd"}, cell(cell), gemms(gemms) {}

CudaBackend::Gemms CudaBackend::gemmsFor(const std::string &arch, const std::string &precision) {
  Gemms g;
  int sm = 0;
  if (arch.rfind("sm_", 0) == 0)
    sm = std::atoi(arch.c_str() + 3);
  g.workspaceBytes = sm >= 90 ? kHopperGemmWorkspaceBytes : kGemmWorkspaceBytes;
  g.tf32 = precision == "tf32";
  return g;
}

void CudaBackend::beginDry() {
  dry = true;
  inCall = true;
  base = kDryBase;
  arena.reset(-1);
  gemmWorkspace = -1;
  converted.clear();
}

Status CudaBackend::beginCall(void *workspace, int64_t bytes, void *stream) {
  dry = false;
  inCall = true;
  base = static_cast<char *>(workspace);
  arena.reset(workspace ? bytes : 0);
  gemmWorkspace = -1;
  converted.clear();
  Status begun = dev->begin(stream);
  onDevice = !begun;
  return begun;
}

Status CudaBackend::endCall() {
  if (gemmWorkspace >= 0)
    arena.release(gemmWorkspace);
  gemmWorkspace = -1;
  for (const auto &[key, offset] : converted)
    arena.release(offset);
  converted.clear();
  inCall = false;
  if (onDevice)
    dev->end();
  onDevice = false;
  if (arena.live())
    return internal(std::to_string(arena.live()) +
                    " buffers outlive the call that placed them");
  return Status();
}

Status CudaBackend::place(int64_t bytes, void *&data, int64_t &offset) {
  if (!inCall)
    return internal("a buffer asked for outside a call");
  offset = arena.allocate(bytes);
  if (offset < 0)
    return Status::error("the call's workspace is too small: it holds " +
                         std::to_string(arena.high()) + " bytes and needs " +
                         std::to_string(bytes) + " more (its size comes from a dry run of "
                         "the same call)");
  data = base + offset;
  return Status();
}

Status CudaBackend::allocate(int64_t elements, Element element, bool zero, Buffer &out) {
  int64_t bytes = std::max<int64_t>(elements, 1) * driver::bytesOf(element);
  void *data = nullptr;
  int64_t offset = 0;
  if (Status e = place(bytes, data, offset))
    return e;
  out.data = data;
  out.id = offset;
  out.element = element;
  if (zero && !dry)
    return dev->zero(data, bytes);
  return Status();
}

void CudaBackend::release(const Buffer &buffer) {
  if (buffer.id >= 0)
    arena.release(buffer.id);
}

Status CudaBackend::launch(bool backward, bool saveGates, const std::vector<driver::Arg> &args,
                           int64_t batch) {
  const driver::Kernel &kernel = backward ? cell.backward : cell.forward;
  const std::string &kernelName = names[backward];
  if (args.size() != kernel.args.size())
    return internal(kernelName + " takes " + std::to_string(kernel.args.size()) +
                    " arguments, not " + std::to_string(args.size()));
  std::vector<runtime::KernelArg> words;
  std::vector<std::pair<const void *, int64_t>> buffers;
  for (size_t i = 0; i < args.size(); ++i) {
    const driver::KernelArg &declared = kernel.args[i];
    const driver::Arg &arg = args[i];
    if (!declared.element) {
      if (!arg.index)
        return internal(kernelName + ": argument " + std::to_string(i) + " is an index");
      words.push_back(runtime::KernelArg::indexValue(*arg.index));
      continue;
    }
    const View &v = arg.view;
    // Named only on failure: a launch has tens of arguments.
    auto what = [&] {
      return kernelName + ": argument " + std::string(cellc::name(declared.kind)) + " " +
             declared.name;
    };
    if (arg.index || !v.valid())
      return internal(what() + " is not given a buffer");
    if (v.element() != *declared.element)
      return internal(what() + " is " + elementName(*declared.element) + ", given " +
                      elementName(v.element()));
    bool fits = v.shape.size() == declared.shape.size();
    for (size_t d = 0; fits && d < v.shape.size(); ++d)
      fits = declared.shape[d] < 0 || declared.shape[d] == v.shape[d];
    if (!fits)
      return internal(what() + " needs shape " + driver::shapeString(declared.shape) +
                      ", given " + driver::shapeString(v.shape));
    words.push_back(runtime::KernelArg::buffer(v.pointer(), v.shape));
    // A view of no elements grants no access (and may start where another
    // argument's buffer does: chunk:K's dead projections).
    if (v.size())
      buffers.push_back({v.pointer(), v.size() * driver::bytesOf(v.element())});
  }
  if (dry)
    return Status();
  LaunchSpec spec;
  if (Status e = plan(backward, saveGates, batch, spec))
    return e;
  spec.buffers = std::move(buffers);
  runtime::PackedArgs packed(words);
  std::vector<void *> params = packed.eachWord();
  spec.params = params.data();
  spec.numParams = params.size();
  return dev->launch(spec);
}

Status CudaBackend::plan(bool backward, bool saveGates, int64_t batch, LaunchSpec &spec) {
  const driver::Kernel &kernel = backward ? cell.backward : cell.forward;
  spec.kernel = names[backward];
  spec.saveGates = saveGates;
  spec.block = unsigned(kernel.threads);
  spec.sharedBytes = unsigned(kernel.dynamicSharedBytes);
  spec.registers = int(kernel.registers[saveGates]);
  // Persistent kernels loop over batch tiles by the grid's rows (CTAs per
  // tile along x): a grid of fewer rows than tiles runs every tile.
  int64_t tiles = std::max<int64_t>(1, (batch + kernel.batchTile - 1) /
                                           std::max<int64_t>(kernel.batchTile, 1));
  if (kernel.ctas == 0) {
    // Batch-tiled: a CTA a tile.
    if (tiles > INT32_MAX)
      return Status::error(spec.kernel + ": " + std::to_string(tiles) +
                           " batch tiles, past the 2^31 - 1 a grid's x holds");
    spec.gridX = unsigned(tiles);
    return Status();
  }
  spec.gridX = unsigned(kernel.ctas);
  spec.cooperative = kernel.heads == 0;
  // Split by heads, a tile's CTAs do not wait for each other: any grid.
  int64_t rows = 65535;
  if (spec.cooperative) {
    // Every CTA of a grid barrier resident at once: as many tiles at a time
    // as the device holds, at least one.
    Residency fits;
    if (Status e = dev->residency(spec, fits))
      return e;
    rows = fits.total() / std::max<int64_t>(kernel.ctas, 1);
    if (rows == 0) {
      // Not one tile's CTAs: the device's own refusal where it has a more
      // particular one (shared memory past what a CTA may have).
      if (Status e = dev->admit(spec))
        return e;
      return cooperativeTooLarge(spec, fits);
    }
  }
  spec.gridY = unsigned(std::min(tiles, rows));
  return Status();
}

int64_t CudaBackend::tilesAtOnce(bool backward, bool saveGates, int64_t batch,
                                 int64_t tiles) {
  const driver::Kernel &kernel = backward ? cell.backward : cell.forward;
  if (kernel.ctas == 0)
    return tiles;
  // The launch's grid rows, as `launch` will make them; where the device
  // refuses it, every tile (the launch then says why).
  LaunchSpec spec;
  if (plan(backward, saveGates, batch, spec))
    return tiles;
  return std::min<int64_t>(tiles, spec.gridY);
}

Status CudaBackend::admitLaunch(bool backward, bool saveGates, int64_t batch,
                                LaunchSpec &spec) {
  if (Status e = plan(backward, saveGates, batch, spec))
    return e;
  return dev->admit(spec);
}

Status CudaBackend::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                         const View &a, int64_t lda, const View &b, int64_t ldb, double beta,
                         const View &c, int64_t ldc) {
  if (m == 0 || n == 0 || k == 0)
    return Status();
  Element ea = a.element(), eb = b.element(), ec = c.element();
  // cuBLAS (CUBLAS_COMPUTE_32F) stores f32 products as f32 only; the
  // emulator refuses what the GPU would.
  if (!floating(ea) || !floating(eb) || !floating(ec) ||
      (ea == Element::F32 && ec == Element::BF16))
    return internal(std::string("a GEMM of ") + elementName(ea) + " and " + elementName(eb) +
                    " into " + elementName(ec));
  if (gemmWorkspace < 0) {
    void *unused;
    if (Status e = place(gemms.workspaceBytes, unused, gemmWorkspace))
      return e;
  }
  // Both operands in a's type, as the products of torch's mixed-precision
  // GEMMs are: b converted into the workspace, its rows `ldb` apart as they
  // were, once a call (b is a weight, the same in every GEMM that reads it).
  const void *pb = b.pointer();
  if (eb != ea) {
    int64_t rowsB = transB ? n : k, colsB = transB ? k : n;
    int64_t span = (rowsB - 1) * ldb + colsB;
    auto key = std::make_tuple(pb, int(ea), span);
    auto known = converted.find(key);
    if (known == converted.end()) {
      void *to = nullptr;
      int64_t offset = -1;
      if (Status e = place(span * driver::bytesOf(ea), to, offset))
        return e;
      if (!dry)
        if (Status e = dev->convert(pb, eb, to, ea, span))
          return e;
      known = converted.emplace(key, offset).first;
    }
    pb = base + known->second;
  }
  if (dry)
    return Status();
  return dev->gemm(transA, transB, m, n, k, a.pointer(), lda, pb, ldb, ea, beta, c.pointer(),
                   ldc, ec, gemms.tf32, base + gemmWorkspace, gemms.workspaceBytes);
}

Status CudaBackend::columnSums(const View &m, int64_t rows, int64_t cols, const View &acc) {
  if (rows == 0 || cols == 0)
    return Status();
  if (acc.element() != Element::F32 || !floating(m.element()))
    return internal(std::string("column sums of ") + elementName(m.element()) + " into " +
                    elementName(acc.element()));
  int64_t parts = std::clamp<int64_t>((rows + kRowsPerPart - 1) / kRowsPerPart, 1, kMaxParts);
  int64_t per = (rows + parts - 1) / parts;
  void *partials = nullptr;
  int64_t offset = 0;
  if (Status e = place(parts * cols * 4, partials, offset))
    return e;
  Status status;
  if (!dry)
    status = dev->columnSums(m.pointer(), m.element(), rows, cols, parts, per,
                             static_cast<float *>(partials), static_cast<float *>(acc.pointer()));
  arena.release(offset);
  return status;
}

Status CudaBackend::fillRows(const View &m, int64_t rows, int64_t cols,
                             const std::vector<View> &vectors) {
  if (!floating(m.element()) && !vectors.empty())
    return internal(std::string("rows of ") + elementName(m.element()) +
                    " filled from vectors");
  if (vectors.size() > Device::kMaxVectors)
    return internal("rows filled from more than " + std::to_string(Device::kMaxVectors) +
                    " vectors");
  std::vector<const float *> pointers;
  for (const View &v : vectors) {
    if (v.element() != Element::F32 || v.size() != cols)
      return internal("rows filled from a vector that is not " + std::to_string(cols) +
                      " f32");
    pointers.push_back(static_cast<const float *>(v.pointer()));
  }
  if (dry || rows == 0 || cols == 0)
    return Status();
  if (pointers.empty())
    return dev->zero(m.pointer(), rows * cols * driver::bytesOf(m.element()));
  return dev->fillRows(m.pointer(), m.element(), rows, cols, pointers);
}

Status CudaBackend::copy(const View &from, const View &to) {
  if (from.size() != to.size())
    return internal("a copy of " + std::to_string(from.size()) + " elements into " +
                    std::to_string(to.size()));
  if (dry || from.size() == 0)
    return Status();
  if (from.element() == to.element())
    return dev->copyBytes(from.pointer(), to.pointer(),
                          from.size() * driver::bytesOf(from.element()));
  if (!floating(from.element()) || !floating(to.element()))
    return internal(std::string("a copy of ") + elementName(from.element()) + " into " +
                    elementName(to.element()));
  return dev->convert(from.pointer(), from.element(), to.pointer(), to.element(), from.size());
}

Status CudaBackend::add(const View &from, const View &to) {
  if (from.size() != to.size() || !floating(from.element()) || !floating(to.element()))
    return internal(std::string("a sum of ") + std::to_string(from.size()) + " " +
                    elementName(from.element()) + " into " + std::to_string(to.size()) + " " +
                    elementName(to.element()));
  if (dry || from.size() == 0)
    return Status();
  return dev->accumulate(from.pointer(), from.element(), to.pointer(), to.element(),
                         from.size());
}

Status CudaBackend::upload(const void *host, int64_t bytes, const View &to) {
  if (dry || bytes == 0)
    return Status();
  return dev->upload(host, to.pointer(), bytes);
}

Status CudaBackend::maskPastLengths(const View &v, const View &lengths, int64_t first) {
  if (v.shape.size() != 3 || lengths.element() != Element::I32)
    return internal("rows masked past lengths in a view of " + driver::shapeString(v.shape));
  if (dry || v.size() == 0)
    return Status();
  return dev->maskPastLengths(v.pointer(), v.element(), v.shape[0], v.shape[1], v.shape[2],
                              static_cast<const int32_t *>(lengths.pointer()), first);
}

Status CudaBackend::gatherAtLengths(const View &from, int64_t t0, const View &lengths,
                                    const View &to) {
  bool steps = from.shape.size() == 3;
  if (to.shape.size() != 2 || from.shape.size() < 2 || lengths.element() != Element::I32 ||
      from.shape[steps ? 1 : 0] != to.shape[0] || from.shape.back() != to.shape[1] ||
      !floating(from.element()) || !floating(to.element()))
    return internal("rows gathered from " + driver::shapeString(from.shape) + " into " +
                    driver::shapeString(to.shape));
  if (dry || to.size() == 0)
    return Status();
  return dev->gatherAtLengths(from.pointer(), from.element(), steps ? from.shape[0] : 1,
                              to.shape[0], to.shape[1], t0,
                              static_cast<const int32_t *>(lengths.pointer()), to.pointer(),
                              to.element());
}

Status CudaBackend::addAtLengths(const View &from, const View &lengths, int64_t step,
                                 const View &to) {
  if (from.shape != to.shape || to.shape.size() != 2 || from.element() != Element::F32 ||
      to.element() != Element::F32 || lengths.element() != Element::I32)
    return internal("rows added at lengths from " + driver::shapeString(from.shape) + " " +
                    elementName(from.element()) + " into " + driver::shapeString(to.shape));
  if (dry || to.size() == 0)
    return Status();
  return dev->addAtLengths(static_cast<const float *>(from.pointer()), to.shape[0],
                           to.shape[1], static_cast<const int32_t *>(lengths.pointer()), step,
                           static_cast<float *>(to.pointer()));
}

Status CudaBackend::transpose(const View &from, const View &to) {
  if (from.shape.size() != 2 || to.shape.size() != 2 || from.shape[0] != to.shape[1] ||
      from.shape[1] != to.shape[0] || from.element() != to.element() ||
      !floating(from.element()))
    return internal("a transpose of " + driver::shapeString(from.shape) + " into " +
                    driver::shapeString(to.shape));
  if (dry || from.size() == 0)
    return Status();
  return dev->transpose(from.pointer(), to.pointer(), from.shape[0], from.shape[1],
                        from.element());
}
