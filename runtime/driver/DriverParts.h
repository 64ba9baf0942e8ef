//===- DriverParts.h - What the sequence driver's files share -*- C++ -*-===//
//
// The driver's own buffers (Scratch, counted in a Ledger), what a forward
// keeps (Saved), what a stream's steps keep (StepBuffers), and the checks
// that every part of the driver makes, for the files that implement
// SequenceDriver by job: SequenceDriver.cpp (the buffers, the binding of a
// kernel's arguments and the launches), Forward.cpp, Step.cpp, Kept.cpp,
// Backward.cpp, Profile.cpp and Plan.cpp. Private to runtime/driver.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_DRIVER_DRIVERPARTS_H
#define CELLC_RUNTIME_DRIVER_DRIVERPARTS_H

#include "runtime/driver/SequenceDriver.h"

#include "dialects/Cell/IR/Checked.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace cellc::driver {

namespace detail {

/// Checks a caller's view: present (unless optional) and of `shape`.
inline Status check(const View &view, const std::vector<int64_t> &shape,
             const std::string &what, bool optional = false) {
  if (!view.valid())
    return optional ? Status() : Status::error(what + " is missing");
  if (view.shape != shape)
    return Status::error(what + " has shape " + shapeString(view.shape) +
                         ", expected " + shapeString(shape));
  return Status();
}

/// Checks per-sample lengths: none, or B of them in [0, T].
inline Status checkLengths(const std::vector<int64_t> &lengths, int64_t T, int64_t B) {
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

/// `c = op(a) op(b) + beta c` for each of `blocks` diagonal blocks of a
/// block-diagonal weight (SequenceDriver.cpp).
Status blockGemm(Backend &backend, int64_t blocks, bool transA, bool transB, int64_t m,
                 int64_t n, int64_t k, const View &a, int64_t lda, int64_t aStep,
                 const View &b, int64_t ldb, int64_t bStep, double beta, const View &c,
                 int64_t ldc, int64_t cStep);

} // namespace detail

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

class Saved {
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
};

/// A call's buffers that its launches read (SequenceDriver::beginCall).
struct SequenceDriver::CallBuffers {
  Scratch lengths;
  std::vector<Scratch> transposed;
};

/// The rows that run change in steps of this many: each change splits the
/// forward into one more launch, and a launch over few steps and rows costs
/// more than the rows it saves (bench/cpu/lengths.py).
inline constexpr int64_t kRowGranule = 16;

} // namespace cellc::driver

#endif // CELLC_RUNTIME_DRIVER_DRIVERPARTS_H
