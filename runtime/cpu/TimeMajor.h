//===- TimeMajor.h - Batch-first sequences, run time-major ------*- C++ -*-===//
//
// The kernels run time-major ([T, B, n]); a batch-first call ([B, T, n]) runs
// on time-major copies of its inputs and outputs, made and copied back here.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_TIMEMAJOR_H
#define CELLC_RUNTIME_CPU_TIMEMAJOR_H

#include "runtime/cpu/CpuCell.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace cellc::runtime {

/// Copies `src` laid out [A, C, n] into `dst` laid out [C, A, n].
inline void swapLeadingDims(const void *src, void *dst, int64_t a, int64_t c,
                            int64_t rowBytes) {
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < c; ++j)
      std::memcpy(static_cast<char *>(dst) + (j * a + i) * rowBytes,
                  static_cast<const char *>(src) + (i * c + j) * rowBytes,
                  rowBytes);
}

/// Batch-first buffers turned time-major ([B, T, n] → [T, B, n]): owns the
/// copies.
class TimeMajor {
public:
  explicit TimeMajor(int64_t elementBytes) : eb(elementBytes) {}

  /// The time-major view of a batch-first sequence, after checking its
  /// inputs; T and B come from them.
  Status sequence(const CpuCell::Sequence &seq, CpuCell::Sequence &inner) {
    if (seq.inputs.empty() || seq.inputs[0].shape.size() != 3)
      return Status::error("batch-first sequences need inputs of shape [B, T, n]");
    B = seq.inputs[0].shape[0];
    T = seq.inputs[0].shape[1];
    inner = seq;
    inner.batchFirst = false;
    if (Status e = convert(seq.inputs, "input", /*copy=*/true, inner.inputs))
      return e;
    if (seq.resets) {
      resets.resize(T * B);
      swapLeadingDims(seq.resets, resets.data(), B, T, 1);
      inner.resets = resets.data();
    }
    return Status();
  }

  /// Time-major buffers for batch-first `arrays` (missing ones stay
  /// missing), holding their values when `copy`.
  Status convert(const std::vector<Array> &arrays, const char *what, bool copy,
                 std::vector<Array> &out) {
    out.clear();
    for (const Array &a : arrays) {
      if (!a.data) {
        out.push_back(a);
        continue;
      }
      if (a.shape.size() != 3 || a.shape[0] != B || a.shape[1] != T)
        return Status::error(std::string("batch-first ") + what + " has shape " +
                             driver::shapeString(a.shape) + ", expected [" + std::to_string(B) +
                             ", " + std::to_string(T) + ", n]");
      int64_t n = a.shape[2];
      storage.emplace_back((B * T * n * eb + 7) / 8 + 1);
      if (copy)
        swapLeadingDims(a.data, storage.back().data(), B, T, n * eb);
      out.push_back({storage.back().data(), {T, B, n}});
    }
    return Status();
  }

  /// Copies what the kernels wrote into `inner` back to the batch-first
  /// `arrays` it was converted from.
  void copyBack(const std::vector<Array> &inner, const std::vector<Array> &arrays) {
    for (size_t i = 0; i < arrays.size(); ++i)
      if (arrays[i].data)
        swapLeadingDims(inner[i].data, arrays[i].data, T, B, arrays[i].shape[2] * eb);
  }

private:
  int64_t eb, T = 0, B = 0;
  std::vector<std::vector<double>> storage;
  std::vector<uint8_t> resets;
};

/// `seq` time-major: itself, or a copy made by `tm` when batch-first.
inline Status timeMajor(const CpuCell::Sequence &seq, int64_t eb, std::optional<TimeMajor> &tm,
                 CpuCell::Sequence &out) {
  if (!seq.batchFirst) {
    out = seq;
    return Status();
  }
  tm.emplace(eb);
  return tm->sequence(seq, out);
}

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_TIMEMAJOR_H
