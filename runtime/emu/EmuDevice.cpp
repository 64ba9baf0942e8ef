//===- EmuDevice.cpp - The CUDA backend's leaves in the SIMT emulator -----===//

#include "runtime/emu/EmuDevice.h"

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

/// bf16 as the GPU converts it: round to nearest even (NaN stays NaN).
uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float fromBf16(uint16_t value) {
  uint32_t bits = uint32_t(value) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float load(const void *p, Element e, int64_t i) {
  return e == Element::BF16 ? fromBf16(static_cast<const uint16_t *>(p)[i])
                            : static_cast<const float *>(p)[i];
}

void store(void *p, Element e, int64_t i, float v) {
  if (e == Element::BF16)
    static_cast<uint16_t *>(p)[i] = toBf16(v);
  else
    static_cast<float *>(p)[i] = v;
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
                       double beta, void *c, int64_t ldc, Element ce, void *, int64_t) {
  // The operands as f32 (bf16 widens exactly), the product accumulated in
  // f32, and stored in c's type.
  int64_t spanA = ((transA ? k : m) - 1) * lda + (transA ? m : k);
  int64_t spanB = ((transB ? n : k) - 1) * ldb + (transB ? k : n);
  std::vector<float> wideA, wideB;
  const float *pa = static_cast<const float *>(a), *pb = static_cast<const float *>(b);
  if (ab == Element::BF16) {
    wideA = widened(a, ab, spanA);
    wideB = widened(b, ab, spanB);
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
  std::memset(data, 0, size_t(bytes));
  return Status();
}

Status EmuDevice::copyBytes(const void *from, void *to, int64_t bytes) {
  std::memmove(to, from, size_t(bytes));
  return Status();
}

Status EmuDevice::convert(const void *from, Element fromElement, void *to, Element toElement,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    store(to, toElement, i, load(from, fromElement, i));
  return Status();
}

Status EmuDevice::accumulate(const void *from, Element fromElement, void *to,
                             Element toElement, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    store(to, toElement, i, load(to, toElement, i) + load(from, fromElement, i));
  return Status();
}

Status EmuDevice::fillRows(void *m, Element element, int64_t rows, int64_t cols,
                           const std::vector<const float *> &vectors) {
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
