//===- EmuDevice.cpp - The CUDA backend's leaves in the SIMT emulator -----===//

#include "runtime/emu/EmuDevice.h"

#include "runtime/cpu/HostPasses.h"

#ifdef CELLC_HAVE_CBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace cellc;
using namespace cellc::emu;
using cuda::Element;
using cuda::Status;

namespace {

/// An f32 as a TF32 tensor core reads it: the 13 low bits of the mantissa
/// dropped (as the emulator's mma.sync does).
float toTf32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u)
    bits &= ~uint32_t(0x1fff);
  std::memcpy(&value, &bits, 4);
  return value;
}

/// Element `i` of an f32 or bf16 buffer (bf16 rounded as the GPU rounds).
float load(const void *p, Element e, int64_t i) {
  return float(runtime::loadElement(p, e, i));
}

void store(void *p, Element e, int64_t i, float v) { runtime::storeElement(p, e, i, v); }

/// A view of `shape` at `p`, for the host loops of HostPasses.h.
driver::View hostView(const void *p, Element e, std::vector<int64_t> shape) {
  driver::View v;
  v.buffer.data = const_cast<void *>(p);
  v.buffer.element = e;
  v.shape = std::move(shape);
  return v;
}

/// `count` elements from `p` as f32.
std::vector<float> widened(const void *p, Element e, int64_t count) {
  std::vector<float> out(size_t(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i)
    out[size_t(i)] = load(p, e, i);
  return out;
}

/// Row-major c = op(a) op(b) + beta c in f32.
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
#ifdef CELLC_HAVE_CBLAS
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), 1.0f, a, int(lda),
              b, int(ldb), beta, c, int(ldc));
#else
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        sum += (transA ? a[p * lda + i] : a[i * lda + p]) *
               (transB ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = sum + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
    }
#endif
}

} // namespace

EmuDevice::EmuDevice(const std::string &replayObject, const std::string &saveObject,
                     uint64_t shuffleSeed)
    : shuffleSeed(shuffleSeed) {
  variants[0] = std::make_unique<Module>(replayObject);
  variants[1] = std::make_unique<Module>(saveObject);
  // A smaller GPU, for tests of grids that hold fewer CTAs than a batch
  // has tiles.
  if (const char *sms = std::getenv("CELLC_EMU_SMS"))
    if (int64_t n = std::atoll(sms); n > 0)
      model.sms = n;
}

Status EmuDevice::residency(const cuda::LaunchSpec &spec, cuda::Residency &out) {
  out = model.residency(spec.block,
                        int64_t(variants[spec.saveGates]->staticSharedBytes()) +
                            spec.sharedBytes,
                        spec.registers);
  return Status();
}

Status EmuDevice::admit(const cuda::LaunchSpec &spec) {
  return model.admit(spec, int64_t(variants[spec.saveGates]->staticSharedBytes()));
}

Status EmuDevice::launch(const cuda::LaunchSpec &spec) {
  count("launch");
  if (Status e = admit(spec))
    return e;
  Launch launch;
  launch.kernel = spec.kernel;
  launch.gridX = spec.gridX;
  launch.gridY = spec.gridY;
  launch.block = spec.block;
  launch.dynamicShared = spec.sharedBytes;
  launch.cooperative = spec.cooperative;
  launch.params = spec.params;
  for (const auto &[data, bytes] : spec.buffers)
    launch.buffers.push_back({reinterpret_cast<uintptr_t>(data), uint64_t(bytes)});
  launch.shuffleSeed = shuffleSeed;
  try {
    variants[spec.saveGates]->launch(launch);
  } catch (const std::exception &e) {
    return Status::error(e.what());
  }
  return Status();
}

Status EmuDevice::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                       const void *a, int64_t lda, const void *b, int64_t ldb, Element ab,
                       double beta, void *c, int64_t ldc, Element ce, bool tf32, void *,
                       int64_t) {
  count("gemm");
  // The operands as f32 (bf16 widens exactly; f32 in TF32 keeps 10 bits of
  // mantissa, as the tensor cores read it), the product accumulated in
  // f32, and stored in c's type.
  int64_t spanA = ((transA ? k : m) - 1) * lda + (transA ? m : k);
  int64_t spanB = ((transB ? n : k) - 1) * ldb + (transB ? k : n);
  std::vector<float> wideA, wideB;
  const float *pa = static_cast<const float *>(a), *pb = static_cast<const float *>(b);
  if (ab == Element::BF16 || tf32) {
    wideA = widened(a, ab, spanA);
    wideB = widened(b, ab, spanB);
    if (ab == Element::F32)
      for (std::vector<float> *v : {&wideA, &wideB})
        for (float &x : *v)
          x = toTf32(x);
    pa = wideA.data();
    pb = wideB.data();
  }
  if (ce == Element::F32) {
    sgemm(transA, transB, m, n, k, pa, lda, pb, ldb, float(beta), static_cast<float *>(c),
          ldc);
    return Status();
  }
  std::vector<float> wideC(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      wideC[size_t(i * n + j)] = load(c, ce, i * ldc + j);
  sgemm(transA, transB, m, n, k, pa, lda, pb, ldb, float(beta), wideC.data(), n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      store(c, ce, i * ldc + j, wideC[size_t(i * n + j)]);
  return Status();
}

Status EmuDevice::zero(void *data, int64_t bytes) {
  count("zero");
  std::memset(data, 0, size_t(bytes));
  return Status();
}

Status EmuDevice::copyBytes(const void *from, void *to, int64_t bytes) {
  count("copy");
  std::memmove(to, from, size_t(bytes));
  return Status();
}

Status EmuDevice::convert(const void *from, Element fromElement, void *to, Element toElement,
                          int64_t n) {
  count("convert");
  for (int64_t i = 0; i < n; ++i)
    store(to, toElement, i, load(from, fromElement, i));
  return Status();
}

Status EmuDevice::accumulate(const void *from, Element fromElement, void *to,
                             Element toElement, int64_t n) {
  count("accumulate");
  for (int64_t i = 0; i < n; ++i)
    store(to, toElement, i, load(to, toElement, i) + load(from, fromElement, i));
  return Status();
}

Status EmuDevice::fillRows(void *m, Element element, int64_t rows, int64_t cols,
                           const std::vector<const float *> &vectors) {
  count("fill_rows");
  for (int64_t j = 0; j < cols; ++j) {
    float sum = 0.0f;
    for (const float *v : vectors)
      sum += v[j];
    for (int64_t r = 0; r < rows; ++r)
      store(m, element, r * cols + j, sum);
  }
  return Status();
}

Status EmuDevice::columnSums(const void *m, Element element, int64_t rows, int64_t cols,
                             int64_t parts, int64_t per, float *partials, float *acc) {
  count("column_sums");
  // The GPU's order: per part, 8 strided row sums added in turn; then the
  // parts in turn.
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t j = 0; j < cols; ++j) {
      float strides[8] = {};
      int64_t r0 = p * per, r1 = std::min(rows, r0 + per);
      for (int64_t r = r0; r < r1; ++r)
        strides[(r - r0) % 8] += load(m, element, r * cols + j);
      float total = 0.0f;
      for (float s : strides)
        total += s;
      partials[p * cols + j] = total;
    }
  for (int64_t j = 0; j < cols; ++j) {
    float total = 0.0f;
    for (int64_t p = 0; p < parts; ++p)
      total += partials[p * cols + j];
    acc[j] += total;
  }
  return Status();
}

Status EmuDevice::upload(const void *host, void *to, int64_t bytes) {
  count("upload");
  std::memcpy(to, host, size_t(bytes));
  return Status();
}

Status EmuDevice::maskPastLengths(void *v, Element e, int64_t len, int64_t B, int64_t n,
                                  const int32_t *lengths, int64_t first) {
  count("mask_past_lengths");
  runtime::maskPastLengths(hostView(v, e, {len, B, n}), lengths, first);
  return Status();
}

Status EmuDevice::gatherAtLengths(const void *from, Element fromElement, int64_t len,
                                  int64_t B, int64_t n, int64_t t0, const int32_t *lengths,
                                  void *to, Element toElement) {
  count("gather_at_lengths");
  return runtime::gatherAtLengths(hostView(from, fromElement, {len, B, n}), t0, lengths,
                                  hostView(to, toElement, {B, n}));
}

Status EmuDevice::addAtLengths(const float *from, int64_t B, int64_t n,
                               const int32_t *lengths, int64_t step, float *to) {
  count("add_at_lengths");
  return runtime::addAtLengths(hostView(from, Element::F32, {B, n}), lengths, step,
                               hostView(to, Element::F32, {B, n}));
}

std::vector<std::pair<std::string, int64_t>> EmuDevice::calls(bool reset) {
  std::vector<std::pair<std::string, int64_t>> out(counts.begin(), counts.end());
  if (reset)
    counts.clear();
  return out;
}

Status EmuDevice::transpose(const void *from, void *to, int64_t rows, int64_t cols,
                            Element element) {
  count("transpose");
  return runtime::transpose(hostView(from, element, {rows, cols}),
                            hostView(to, element, {cols, rows}));
}
