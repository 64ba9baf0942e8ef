//===- CpuBackend.h - The sequence driver's CPU backend ---------*- C++ -*-===//
//
// How a launch over a batch's rows runs on the runtime's threads (Split), a
// package's shared object with its two kernels (KernelObject), and the
// driver's CPU backend over them: memory from the pool, OpenBLAS's GEMMs
// (HostBlas.h), the kernels on groups of threads. CpuCell runs it.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_CPUBACKEND_H
#define CELLC_RUNTIME_CPU_CPUBACKEND_H

#include "runtime/cpu/Buffers.h"
#include "runtime/cpu/CpuCell.h"
#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/HostPasses.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <thread>

namespace cellc::runtime {

using driver::View;

/// How a launch over `batch` rows runs on `threads` threads, with tiles of
/// `tile` rows: `groups` ranges of rows, each run by `slices` threads that
/// split the units. With fewer tiles than threads and unit slices on (1, or
/// -1 where CpuCell::splitsRows says no), a group is a tile's range and its
/// threads split the units; otherwise each thread runs an even share of the
/// rows (a part of a tile, when there are more threads than tiles).
struct Split {
  int64_t groups = 1, slices = 1;
  bool byTiles = false;

  bool operator==(const Split &o) const {
    return groups == o.groups && slices == o.slices && byTiles == o.byTiles;
  }

  static Split of(int64_t batch, int threads, int64_t tile, int unitSlices,
                  int64_t weightBytes) {
    Split s;
    int64_t tiles = (batch + tile - 1) / std::max<int64_t>(tile, 1);
    bool units = unitSlices > 0 ||
                 (unitSlices < 0 && !CpuCell::splitsRows(batch, threads, weightBytes));
    if (units && tiles < threads && threads / std::max<int64_t>(tiles, 1) > 1) {
      s.groups = std::max<int64_t>(tiles, 1);
      s.slices = threads / s.groups;
      s.byTiles = true;
    } else {
      s.groups = std::max<int64_t>(1, std::min<int64_t>(threads, batch));
    }
    return s;
  }
  /// The rows of group `g`: whole tiles when split by tiles.
  std::pair<int64_t, int64_t> rows(int64_t g, int64_t batch, int64_t tile) const {
    if (!byTiles)
      return {batch * g / groups, batch * (g + 1) / groups};
    return {std::min(batch, g * tile), std::min(batch, (g + 1) * tile)};
  }
};

/// A package's shared object, open, with its two kernels' entries.
struct KernelObject {
  SharedObject object;
  Entry forward = nullptr, backward = nullptr;

  Status open(const std::string &path, const std::string &cell) {
    if (Status s = object.open(path))
      return s;
    forward = object.entry(cell + "_fwd");
    backward = object.entry(cell + "_bwd");
    if (!forward || !backward)
      return Status::error(path + " has no kernels cellc_packed_" + cell +
                           "_fwd and _bwd: not a cellc CPU package");
    return Status();
  }
};

/// The sequence driver's CPU backend: memory from the pool, OpenBLAS's GEMMs
/// split over the threads, and the package's kernels on groups of threads
/// (Split); what its step kernels packed (PackedWeights). `threads` and `unitSlices` must not change while a call runs:
/// the driver sizes a launch's workspace from `instances` just before it.
/// The weights that the step kernels packed into their workspace (their
/// `packed` argument): the params, and a token of each one's contents
/// (CpuCell's contentTokens: its version and sampled elements). Read and
/// written under the driver's step lock.
struct PackedWeights {
  std::vector<void *> params;
  std::vector<int64_t> tokens;

  /// A step's view of the record, with the step's own tokens (null: the
  /// caller gave no versions; nothing is used again, and what the launch
  /// packs is not recorded, only that the workspace holds what it held no
  /// more).
  struct Step : driver::StepPacking {
    PackedWeights &record;
    const std::vector<int64_t> *tokens;
    Step(PackedWeights &record, const std::vector<int64_t> *tokens)
        : record(record), tokens(tokens) {}

    bool holds(const std::vector<void *> &params, bool reused) const override {
      return tokens && reused && !params.empty() && params == record.params &&
             *tokens == record.tokens;
    }
    void packed(std::vector<void *> params) override {
      record.params.clear();
      if (tokens && !params.empty()) {
        record.params = std::move(params);
        record.tokens = *tokens;
      }
    }
  };
};

class CpuBackend : public driver::Backend {
public:
  /// `grouped`: the kernels take a group, slice and slices (the batched
  /// kernels do; the per-row ones take only b_begin and b_end).
  CpuBackend(DType dtype, const KernelObject *variants, int threads, int64_t tile,
             bool grouped, int64_t weightBytes)
      : threads(threads), dtype(dtype), variants(variants), tile(tile), grouped(grouped),
        weightBytes(weightBytes) {}

  /// Threads for the kernels, from CpuCell::setThreads.
  std::atomic<int> threads;
  /// Whether the threads split a tile's units (CpuCell::setUnitSlices).
  std::atomic<int> unitSlices{-1};

  Split split(int64_t batch) const {
    return Split::of(batch, threads, tile, grouped ? int(unitSlices) : 0, weightBytes);
  }

  driver::Status allocate(int64_t elements, driver::Element element, bool zero,
                          driver::Buffer &out) override {
    int64_t bytes = elements * driver::bytesOf(element);
    out.data = allocateBuffer(bytes, zero);
    if (!out.data)
      return driver::Status::error("out of memory: a buffer of " + std::to_string(bytes) +
                                   " bytes");
    // The id keeps the size, for release.
    out.id = bytes;
    out.element = element;
    return driver::Status();
  }
  void release(const driver::Buffer &buffer) override {
    releaseBuffer(buffer.data, buffer.id);
  }
  /// The groups of a launch, each with its part of the workspace.
  int64_t instances(int64_t batch) const override { return split(batch).groups; }

  /// Runs each group's rows on its slices' threads. The index arguments are
  /// b_begin, b_end, then group, slice, slices, packed and stream (the last
  /// two the driver sets).
  driver::Status launch(bool backward, bool saveGates,
                        const std::vector<driver::Arg> &args,
                        int64_t batch) override {
    std::vector<KernelArg> base;
    std::vector<size_t> indices;
    for (const driver::Arg &arg : args) {
      if (arg.index)
        indices.push_back(base.size());
      base.push_back(arg.index ? KernelArg::indexValue(*arg.index)
                               : KernelArg::buffer(arg.view.pointer(), arg.view.shape));
    }
    if (indices.size() != (grouped ? 7u : 2u))
      return driver::Status::error(
          "internal error: a kernel without b_begin, b_end" +
          std::string(grouped ? ", group, slice, slices, packed and stream" : ""));
    const KernelObject &object = variants[saveGates ? 1 : 0];
    Entry entry = backward ? object.backward : object.forward;
    Split s = split(batch);
    if (Launch *record = recording.load();
        record && std::this_thread::get_id() == recordingThread)
      *record = {entry, base, indices, s, batch};
    int tasks = int(s.groups * s.slices);
    runTasks(tasks, [&](int task) {
      // One task runs on the launch's own arguments; more copy them.
      std::optional<std::vector<KernelArg>> copy;
      if (tasks > 1)
        copy.emplace(base);
      std::vector<KernelArg> &mine = copy ? *copy : base;
      setTask(mine, indices, s, task, batch);
      callPacked(entry, mine);
    });
    return driver::Status();
  }

  /// Sets the index arguments (at `indices`) of task `task` of a launch over
  /// `batch` rows split by `s`: b_begin and b_end, then (grouped) the
  /// group, slice and slices.
  void setTask(std::vector<KernelArg> &args, const std::vector<size_t> &indices,
               const Split &s, int task, int64_t batch) const {
    int64_t g = task / s.slices;
    auto [b0, b1] = s.rows(g, batch, tile);
    args[indices[0]].index = b0;
    args[indices[1]].index = b1;
    if (!grouped)
      return;
    args[indices[2]].index = g;
    args[indices[3]].index = task % s.slices;
    args[indices[4]].index = s.slices;
  }

  /// The last launch from `recordingThread`, while `recording` points here
  /// (CpuCell::bindStep).
  struct Launch {
    Entry entry = nullptr;
    std::vector<KernelArg> args;
    std::vector<size_t> indices;
    Split split;
    int64_t batch = 0;
  };
  std::atomic<Launch *> recording{nullptr};
  std::thread::id recordingThread;

  /// What the step kernels packed (CpuCell::step and its bound steps).
  PackedWeights packedWeights;

  driver::Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                      const View &a, int64_t lda, const View &b, int64_t ldb,
                      double beta, const View &c, int64_t ldc) override {
    host::parallelGemm(dtype, transA, transB, m, n, k, a.pointer(), lda, b.pointer(), ldb, beta,
                 c.pointer(), ldc, threads);
    return driver::Status();
  }
  driver::Status gemmPair(bool transA, bool transB, int64_t m, int64_t n1, int64_t n2,
                          int64_t k, const View &a, int64_t lda, const View &b1, int64_t ldb1,
                          const View &b2, int64_t ldb2, double beta, const View &c1,
                          int64_t ldc1, const View &c2, int64_t ldc2) override {
    host::parallelGemmPair(dtype, transA, transB, m, n1, n2, k, a.pointer(), lda, b1.pointer(),
                           ldb1, b2.pointer(), ldb2, beta, c1.pointer(), ldc1, c2.pointer(),
                           ldc2, threads);
    return driver::Status();
  }
  driver::Status columnSums(const View &m, int64_t rows, int64_t cols,
                            const View &acc) override {
    host::addColumnSums(dtype, m.pointer(), rows, cols, acc.pointer(), threads);
    return driver::Status();
  }
  driver::Status fillRows(const View &m, int64_t rows, int64_t cols,
                          const std::vector<View> &vectors) override {
    std::vector<const void *> pointers;
    for (const View &v : vectors)
      pointers.push_back(v.pointer());
    host::fillRows(dtype, m.pointer(), rows, cols, pointers, threads);
    return driver::Status();
  }
  driver::Status copy(const View &from, const View &to) override {
    if (from.element() != to.element())
      return driver::Status::error("internal error: the CPU backend copies one type");
    auto *dst = static_cast<char *>(to.pointer());
    auto *src = static_cast<const char *>(from.pointer());
    parallelRanges(from.size() * driver::bytesOf(from.element()), threads, 4 * host::kHostGrain,
                   [&](int64_t b0, int64_t b1) { std::memcpy(dst + b0, src + b0, b1 - b0); });
    return driver::Status();
  }
  driver::Status add(const View &from, const View &to) override {
    host::addColumnSums(dtype, from.pointer(), 1, from.size(), to.pointer());
    return driver::Status();
  }
  driver::Status transpose(const View &from, const View &to) override {
    return runtime::transpose(from, to);
  }
  driver::Status upload(const void *from, int64_t bytes, const View &to) override {
    std::memcpy(to.pointer(), from, size_t(bytes));
    return driver::Status();
  }
  driver::Status maskPastLengths(const View &v, const View &lengths, int64_t first) override {
    runtime::maskPastLengths(v, static_cast<const int32_t *>(lengths.pointer()), first);
    return driver::Status();
  }
  driver::Status gatherAtLengths(const View &from, int64_t t0, const View &lengths,
                                 const View &to) override {
    return runtime::gatherAtLengths(from, t0, static_cast<const int32_t *>(lengths.pointer()),
                                 to);
  }
  driver::Status addAtLengths(const View &from, const View &lengths, int64_t step,
                              const View &to) override {
    return runtime::addAtLengths(from, static_cast<const int32_t *>(lengths.pointer()), step, to);
  }

private:
  DType dtype;
  const KernelObject *variants;
  int64_t tile;
  bool grouped;
  /// The cell's matrix params' bytes (CpuCell::matrixBytes).
  int64_t weightBytes;
};

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_CPUBACKEND_H
