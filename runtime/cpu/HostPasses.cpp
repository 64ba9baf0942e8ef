//===- HostPasses.cpp - Passes over views in host memory ------------------===//

#include "runtime/cpu/HostPasses.h"

#include <cstring>

using namespace cellc;
using namespace cellc::runtime;
using driver::Element;
using driver::Status;
using driver::View;

uint16_t runtime::toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float runtime::fromBf16(uint16_t value) {
  uint32_t bits = uint32_t(value) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double runtime::loadElement(const void *p, Element e, int64_t i) {
  switch (e) {
  case Element::F32:
    return static_cast<const float *>(p)[i];
  case Element::F64:
    return static_cast<const double *>(p)[i];
  case Element::BF16:
    return fromBf16(static_cast<const uint16_t *>(p)[i]);
  case Element::U8:
    return static_cast<const uint8_t *>(p)[i];
  case Element::I32:
    return static_cast<const int32_t *>(p)[i];
  }
  return 0.0;
}

void runtime::storeElement(void *p, Element e, int64_t i, double v) {
  switch (e) {
  case Element::F32:
    static_cast<float *>(p)[i] = float(v);
    return;
  case Element::F64:
    static_cast<double *>(p)[i] = v;
    return;
  case Element::BF16:
    static_cast<uint16_t *>(p)[i] = toBf16(float(v));
    return;
  case Element::U8:
    static_cast<uint8_t *>(p)[i] = uint8_t(v);
    return;
  case Element::I32:
    static_cast<int32_t *>(p)[i] = int32_t(v);
    return;
  }
}

void runtime::maskPastLengths(const View &v, const int32_t *lengths, int64_t first) {
  int64_t len = v.shape[0], B = v.shape[1], n = v.shape[2];
  size_t row = size_t(n * driver::bytesOf(v.element()));
  auto *data = static_cast<char *>(v.pointer());
  // Zero bits are 0.0 in every floating type.
  for (int64_t s = 0; s < len; ++s)
    for (int64_t b = 0; b < B; ++b)
      if (lengths[b] <= first + s)
        std::memset(data + (s * B + b) * row, 0, row);
}

Status runtime::gatherAtLengths(const View &from, int64_t t0, const int32_t *lengths,
                                const View &to) {
  bool steps = from.shape.size() == 3;
  int64_t len = steps ? from.shape[0] : 1, B = to.shape[0], n = to.shape[1];
  if (from.shape[steps ? 1 : 0] != B || from.shape.back() != n)
    return Status::error("internal error: rows gathered from " +
                         driver::shapeString(from.shape) + " into " +
                         driver::shapeString(to.shape));
  for (int64_t b = 0; b < B; ++b) {
    int64_t s = int64_t(lengths[b]) - 1 - t0;
    if (s < 0 || s >= len)
      continue;
    for (int64_t j = 0; j < n; ++j)
      storeElement(to.pointer(), to.element(), b * n + j,
                   loadElement(from.pointer(), from.element(), (s * B + b) * n + j));
  }
  return Status();
}

Status runtime::addAtLengths(const View &from, const int32_t *lengths, int64_t step,
                             const View &to) {
  int64_t B = to.shape[0], n = to.shape[1];
  if (from.shape != to.shape)
    return Status::error("internal error: rows added from " +
                         driver::shapeString(from.shape) + " into " +
                         driver::shapeString(to.shape));
  for (int64_t b = 0; b < B; ++b) {
    if (int64_t(lengths[b]) - 1 != step)
      continue;
    for (int64_t j = 0; j < n; ++j)
      storeElement(to.pointer(), to.element(), b * n + j,
                   loadElement(to.pointer(), to.element(), b * n + j) +
                       loadElement(from.pointer(), from.element(), b * n + j));
  }
  return Status();
}

Status runtime::transpose(const View &from, const View &to) {
  if (from.shape.size() != 2 || to.shape.size() != 2 || from.shape[0] != to.shape[1] ||
      from.shape[1] != to.shape[0] || from.element() != to.element())
    return Status::error("internal error: a transpose of " + driver::shapeString(from.shape) +
                         " into " + driver::shapeString(to.shape));
  int64_t rows = from.shape[0], cols = from.shape[1];
  size_t bytes = size_t(driver::bytesOf(from.element()));
  const char *src = static_cast<const char *>(from.pointer());
  char *dst = static_cast<char *>(to.pointer());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * bytes, src + (r * cols + c) * bytes, bytes);
  return Status();
}
