//===- GpuDevice.cpp - The CUDA backend's leaves on a GPU -----------------===//

#include "runtime/cuda/GpuDevice.h"

#include "runtime/cuda/Cublas.h"

#include <algorithm>
#include <map>
#include <mutex>

using namespace cellc;
using namespace cellc::cuda;

namespace {

/// The PTX of the runtime's own kernels (scripts/gen-host-kernels.sh).
const char *const kHostKernels =
#include "runtime/cuda/HostKernels.ptx.inc"
    ;

/// The runtime's kernels on `device`, loaded with the first cell there and
/// kept, every kernel resolved. Kept to the end of the process, and not
/// unloaded then: the driver may be gone before static destructors run.
Module &hostKernels(int device) {
  static std::mutex lock;
  static auto *modules = new std::map<int, std::unique_ptr<Module>>();
  std::lock_guard<std::mutex> guard(lock);
  std::unique_ptr<Module> &module = (*modules)[device];
  if (!module)
    module = std::make_unique<Module>(device, kHostKernels, ptxEntries(kHostKernels));
  return *module;
}

const char *suffix(Element e) { return e == Element::BF16 ? "bf16" : "f32"; }

/// Runs `body`, turning a CudaError into a Status.
template <typename F> Status guarded(F &&body) {
  try {
    body();
    return Status();
  } catch (const std::exception &e) {
    return Status::error(e.what());
  }
}

constexpr unsigned kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

} // namespace

GpuDevice::GpuDevice(int device, const std::string &replayPtx, const std::string &savePtx,
                     const std::vector<std::string> &kernels)
    : device(device) {
  variants[0] = std::make_shared<Module>(device, replayPtx, kernels);
  variants[1] = std::make_shared<Module>(device, savePtx, kernels);
  host = &hostKernels(device);
}

GpuDevice::GpuDevice(int device, const std::string &ptx,
                     const std::vector<std::string> &kernels)
    : device(device) {
  variants[0] = variants[1] = std::make_shared<Module>(device, ptx, kernels);
  host = &hostKernels(device);
}

int GpuDevice::registers(const std::string &kernel, bool saveGates) {
  ContextScope scope(device);
  return variants[saveGates]->registers(kernel);
}

Status GpuDevice::begin(void *callStream) {
  stream = callStream;
  return guarded([&] {
    Driver &d = Driver::get();
    d.push(d.primaryContext(device));
    current = true;
  });
}

void GpuDevice::end() {
  if (!current)
    return;
  current = false;
  try {
    Driver::get().pop();
  } catch (const CudaError &) {
  }
}

Status GpuDevice::residency(const LaunchSpec &spec, Residency &out) {
  return guarded([&] {
    ContextScope scope(device);
    auto [perSm, sms] =
        variants[spec.saveGates]->residency(spec.kernel, spec.block, spec.sharedBytes);
    out.perSm = perSm;
    out.sms = sms;
  });
}

Status GpuDevice::admit(const LaunchSpec &spec) {
  // The driver's answer for the block and shared memory (cuFuncSetAttribute
  // and the occupancy query, asked once a shape), before the launch.
  Residency fits;
  if (Status e = residency(spec, fits))
    return e;
  if (fits.perSm < 1)
    return Status::error("kernel " + spec.kernel + ": a CTA of " + std::to_string(spec.block) +
                         " threads and " + std::to_string(spec.sharedBytes) +
                         " bytes of dynamic shared memory: the device keeps none resident");
  if (spec.cooperative && int64_t(spec.gridX) * spec.gridY > fits.total())
    return cooperativeTooLarge(spec, fits);
  return Status();
}

Status GpuDevice::launch(const LaunchSpec &spec) {
  if (Status e = admit(spec))
    return e;
  return guarded([&] {
    variants[spec.saveGates]->launch(spec.kernel, spec.gridX, spec.gridY, spec.block,
                                     spec.sharedBytes, spec.cooperative, stream, spec.params);
  });
}

Status GpuDevice::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                       const void *a, int64_t lda, const void *b, int64_t ldb, Element ab,
                       double beta, void *c, int64_t ldc, Element ce, bool tf32,
                       void *workspace, int64_t workspaceBytes) {
  return guarded([&] {
    Cublas::get().gemm(device, stream, transA, transB, m, n, k, a, lda, b, ldb,
                       ab == Element::BF16, beta, c, ldc, ce == Element::BF16, tf32,
                       workspace, workspaceBytes);
  });
}

Status GpuDevice::zero(void *data, int64_t bytes) {
  return guarded([&] { Driver::get().zero(data, size_t(bytes), stream); });
}

Status GpuDevice::copyBytes(const void *from, void *to, int64_t bytes) {
  return guarded([&] { Driver::get().copy(from, to, size_t(bytes), stream); });
}

Status GpuDevice::runHostKernel(const std::string &kernel, int64_t n, void **params,
                                unsigned gridY) {
  int64_t blocks = std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks);
  return guarded([&] {
    host->launch(kernel, unsigned(blocks), gridY, kThreads, 0, false, stream, params);
  });
}

Status GpuDevice::convert(const void *from, Element fromElement, void *to, Element toElement,
                          int64_t n) {
  long long count = n;
  void *params[] = {&from, &to, &count};
  return runHostKernel(std::string("cellc_rt_convert_") + suffix(fromElement) + "_" +
                           suffix(toElement),
                       n, params);
}

Status GpuDevice::accumulate(const void *from, Element fromElement, void *to,
                             Element toElement, int64_t n) {
  long long count = n;
  void *params[] = {&from, &to, &count};
  return runHostKernel(std::string("cellc_rt_accumulate_") + suffix(fromElement) + "_" +
                           suffix(toElement),
                       n, params);
}

Status GpuDevice::fillRows(void *m, Element element, int64_t rows, int64_t cols,
                           const std::vector<const float *> &vectors) {
  // As HostKernels.cu's Vectors: eight pointers and a count.
  struct {
    const float *at[kMaxVectors];
    int count;
  } v = {};
  for (size_t i = 0; i < vectors.size(); ++i)
    v.at[i] = vectors[i];
  v.count = int(vectors.size());
  long long r = rows, c = cols;
  void *params[] = {&m, &r, &c, &v};
  return runHostKernel(std::string("cellc_rt_fill_rows_") + suffix(element), rows * cols,
                       params);
}

Status GpuDevice::columnSums(const void *m, Element element, int64_t rows, int64_t cols,
                             int64_t parts, int64_t per, float *partials, float *acc) {
  long long r = rows, c = cols, p = per, count = parts;
  void *first[] = {&m, &r, &c, &p, &partials};
  int64_t tiles = (cols + 31) / 32;
  if (Status e = guarded([&] {
        host->launch(std::string("cellc_rt_column_parts_") + suffix(element), unsigned(tiles),
                     unsigned(parts), kThreads, 0, false, stream, first);
      }))
    return e;
  void *second[] = {&partials, &count, &c, &acc};
  return runHostKernel("cellc_rt_column_fold", cols, second);
}

Status GpuDevice::upload(const void *host, void *to, int64_t bytes) {
  // From pageable memory: the driver stages it before returning, with no
  // wait on the device.
  return guarded([&] { Driver::get().upload(host, to, size_t(bytes), stream); });
}

Status GpuDevice::maskPastLengths(void *v, Element e, int64_t len, int64_t B, int64_t n,
                                  const int32_t *lengths, int64_t first) {
  long long l = len, b = B, c = n, from = first;
  void *params[] = {&v, &l, &b, &c, &lengths, &from};
  return runHostKernel(std::string("cellc_rt_mask_past_lengths_") + suffix(e), len * B * n,
                       params);
}

Status GpuDevice::gatherAtLengths(const void *from, Element fromElement, int64_t len,
                                  int64_t B, int64_t n, int64_t t0, const int32_t *lengths,
                                  void *to, Element toElement) {
  if (toElement != Element::F32)
    return Status::error("internal error: final states gathered into bf16");
  long long l = len, b = B, c = n, first = t0;
  void *params[] = {&from, &l, &b, &c, &first, &lengths, &to};
  return runHostKernel(std::string("cellc_rt_gather_at_lengths_") + suffix(fromElement) +
                           "_f32",
                       B * n, params);
}

Status GpuDevice::addAtLengths(const float *from, int64_t B, int64_t n, const int32_t *lengths,
                               int64_t step, float *to) {
  long long b = B, c = n, at = step;
  void *params[] = {&from, &b, &c, &lengths, &at, &to};
  return runHostKernel("cellc_rt_add_at_lengths", B * n, params);
}

Status GpuDevice::transpose(const void *from, void *to, int64_t rows, int64_t cols,
                            Element element) {
  // 32 x 32 tiles through shared memory: both sides read and written along
  // rows.
  long long r = rows, c = cols;
  void *params[] = {&from, &to, &r, &c};
  int64_t tiles = (cols + 31) / 32;
  return guarded([&] {
    host->launch(std::string("cellc_rt_transpose_") + suffix(element), unsigned(tiles),
                 unsigned(std::min<int64_t>((rows + 31) / 32, 65535)), kThreads, 0, false,
                 stream, params);
  });
}
