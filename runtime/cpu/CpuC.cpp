//===- CpuC.cpp - The CPU runtime's C interface ---------------------------===//

#include "runtime/cpu/CpuC.h"

#include "runtime/cpu/Buffers.h"
#include "runtime/cpu/ChunkCore.h"
#include "runtime/cpu/CpuCell.h"
#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/ThreadPool.h"
#include "runtime/driver/CErrors.h"

#include <atomic>
#include <dlfcn.h>
#include <memory>
#include <new>

using namespace cellc;
using namespace cellc::runtime;
using cellc::driver::catchErrors;
using cellc::driver::check;
using cellc::driver::Failure;

namespace {

/// The CPU runtime's recompute mode a C caller names (its own type, beside
/// driver::modeOf's).
Recompute modeOf(const char *text) {
  Recompute mode;
  check(Recompute::parse(text ? text : "", mode));
  return mode;
}

/// Reads the lists of a call's tensors off `lists` (CpuC.h) in order.
class Lists {
public:
  explicit Lists(const int64_t *lists) : at(lists) {
    if (!at)
      throw Failure("a call without its tensors");
  }
  int64_t scalar() { return *at++; }
  std::vector<Array> next() {
    int64_t count = *at++;
    if (count < 0 || count > kMaxCount)
      throw Failure("a list of " + std::to_string(count) + " tensors");
    std::vector<Array> arrays(count);
    for (Array &a : arrays) {
      a.data = reinterpret_cast<void *>(static_cast<uintptr_t>(*at++));
      int64_t rank = *at++;
      if (rank < 0 || rank > kMaxRank)
        throw Failure("a tensor of rank " + std::to_string(rank));
      a.shape.assign(at, at + rank);
      at += rank;
    }
    return arrays;
  }

private:
  static constexpr int64_t kMaxCount = 1 << 16, kMaxRank = 16;
  const int64_t *at;
};

CpuCell &cellOf(void *cell) {
  if (!cell)
    throw Failure("no cell");
  return *static_cast<CpuCell *>(cell);
}

/// A call's sequence off `call`: the resets, steps, batch, [batch first,
/// training,] lengths and then the inputs, params and initial states.
CpuCell::Sequence sequenceOf(Lists &call, bool forward, bool &training) {
  CpuCell::Sequence seq;
  seq.resets = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(call.scalar()));
  seq.steps = call.scalar();
  seq.batch = call.scalar();
  if (forward) {
    seq.batchFirst = call.scalar() != 0;
    training = call.scalar() != 0;
  }
  int64_t lengths = call.scalar();
  if (lengths < 0 || lengths > (int64_t(1) << 32))
    throw Failure("a call with " + std::to_string(lengths) + " lengths");
  for (int64_t i = 0; i < lengths; ++i)
    seq.lengths.push_back(call.scalar());
  seq.inputs = call.next();
  seq.params = call.next();
  seq.initialStates = call.next();
  return seq;
}

/// The one-step sequence of a step's [B, n] inputs, params and states.
CpuCell::Sequence stepSequence(Lists &lists) {
  CpuCell::Sequence seq;
  seq.inputs = lists.next();
  seq.params = lists.next();
  seq.initialStates = lists.next();
  seq.steps = 1;
  seq.batch = seq.inputs.empty() || seq.inputs[0].shape.empty() ? -1 : seq.inputs[0].shape[0];
  return seq;
}

std::vector<int64_t> versionsOf(const int64_t *versions, int64_t count) {
  if (count > 0 && !versions)
    throw Failure("versions without their values");
  return count > 0 ? std::vector<int64_t>(versions, versions + count) : std::vector<int64_t>();
}

/// DLPack's tensor as torch.utils.dlpack reads it (dlpack.h, version 0.x).
struct DLDevice {
  int32_t deviceType; // kDLCPU = 1
  int32_t deviceId;
};
struct DLDataType {
  uint8_t code; // kDLFloat = 2
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byteOffset;
};
struct DLManagedTensor {
  DLTensor tensor;
  void *context;
  void (*deleter)(DLManagedTensor *);
};

/// A dense buffer of the runtime's (allocateBuffer) lent to torch.
struct LentBuffer {
  DLManagedTensor managed;
  std::vector<int64_t> shape, strides;
  int64_t bytes;
};

/// The bytes of lent buffers that torch holds.
std::atomic<int64_t> lentBytes{0};

void returnLent(DLManagedTensor *managed) {
  auto *lent = static_cast<LentBuffer *>(managed->context);
  releaseBuffer(managed->tensor.data, lent->bytes);
  lentBytes -= lent->bytes;
  delete lent;
}

chunk::Shape chunkShape(const int64_t *shape, bool rows, int32_t reads) {
  if (!shape)
    throw Failure("a chunk core without its shape");
  chunk::Shape s;
  s.BH = shape[0], s.T = shape[1], s.K = shape[2], s.V = shape[3], s.L = shape[4];
  s.rows = rows;
  s.reads = reads;
  return s;
}

DType dtypeOf(int32_t f64) { return f64 ? DType::F64 : DType::F32; }

/// A bound step. Its runs' failures go to the thread that ran it
/// (cellc_cpu_bound_error): two threads may step one binding.
struct BoundStep {
  std::unique_ptr<CpuCell::BoundStep> step;
};
thread_local std::string boundError;

} // namespace

extern "C" {

const char *cellc_runtime_version(void) { return CELLC_VERSION; }

void *cellc_cpu_load(const char *directory, int32_t threads, int32_t from_cache,
                     const char *origin, char *error, size_t size) {
  std::unique_ptr<CpuCell> cell;
  int failed = catchErrors(error, size, [&] {
    CpuCell::Options options;
    options.threads = threads;
    check(CpuCell::load(directory ? directory : "", options, cell));
    cell->setOrigin(from_cache != 0, origin ? origin : "default");
  });
  return failed ? nullptr : cell.release();
}

void cellc_cpu_free(void *cell) { delete static_cast<CpuCell *>(cell); }

char *cellc_cpu_describe(void *cell) {
  const CpuCell &c = cellOf(cell);
  return driver::mallocText("{\"package\": " + driver::describePackage(c.package()) +
                            ", \"config\": " + driver::jsonQuoted(c.config()) +
                            ", \"config_source\": " + driver::jsonQuoted(c.configSource()) +
                            ", \"loaded_from_cache\": " +
                            (c.loadedFromCache() ? "true" : "false") + "}");
}

void cellc_cpu_free_text(char *text) { std::free(text); }

int32_t cellc_cpu_threads(void *cell) { return cellOf(cell).threads(); }
void cellc_cpu_set_threads(void *cell, int32_t threads) { cellOf(cell).setThreads(threads); }
int32_t cellc_cpu_unit_slices(void *cell) { return cellOf(cell).unitSlices(); }
void cellc_cpu_set_unit_slices(void *cell, int32_t mode) { cellOf(cell).setUnitSlices(mode); }

void cellc_cpu_thread_split(void *cell, int64_t batch, int64_t *out) {
  auto [groups, slices] = cellOf(cell).threadSplit(batch);
  out[0] = groups;
  out[1] = slices;
}

int cellc_cpu_forward(void *cell, const int64_t *call, const char *mode, char *error,
                      size_t size) {
  return catchErrors(error, size, [&] {
    Lists in(call);
    bool training = false;
    CpuCell::Sequence seq = sequenceOf(in, true, training);
    seq.outputsOutliveSaved = true;
    std::vector<Array> outputs = in.next(), finals = in.next();
    std::vector<Array> kept = training ? in.next() : std::vector<Array>();
    // The driver's own Saved goes with the call: the caller holds the kept
    // buffers, and backward_kept rebuilds it from them.
    driver::SavedPtr saved;
    check(cellOf(cell).forward(seq, outputs, finals, modeOf(mode), training ? &saved : nullptr,
                               training ? &kept : nullptr));
  });
}

int cellc_cpu_step(void *cell, const int64_t *lists, const int64_t *versions,
                   int64_t num_versions, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    Lists in(lists);
    CpuCell::Sequence seq = stepSequence(in);
    std::vector<Array> outputs = in.next(), news = in.next();
    std::vector<int64_t> given = versionsOf(versions, num_versions);
    check(cellOf(cell).step(seq, outputs, news, num_versions >= 0 ? &given : nullptr));
  });
}

int cellc_cpu_bind_step(void *cell, const int64_t *lists, const int64_t *versions,
                        int64_t num_versions, void **bound, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    if (!bound)
      throw Failure("nowhere to put the bound step");
    *bound = nullptr;
    Lists in(lists);
    CpuCell::Sequence seq = stepSequence(in);
    std::vector<Array> outputs = in.next(), news = in.next();
    std::unique_ptr<CpuCell::BoundStep> made;
    check(cellOf(cell).bindStep(seq, outputs, news, versionsOf(versions, num_versions), made));
    if (made)
      *bound = new BoundStep{std::move(made)};
  });
}

int cellc_cpu_bound_run(void *bound, const int64_t *args) {
  auto *b = static_cast<BoundStep *>(bound);
  try {
    int64_t count = args[0];
    std::vector<uintptr_t> pointers(args + 1, args + 1 + count);
    const int64_t *versions = args + 1 + count;
    Status status;
    bool ran = b->step->run(pointers, std::vector<int64_t>(versions + 1, versions + 1 + *versions),
                           status);
    if (status) {
      boundError = status.message();
      return 1;
    }
    return ran ? 0 : CELLC_NOT_BOUND;
  } catch (const std::exception &e) {
    boundError = e.what();
    return 1;
  }
}

const char *cellc_cpu_bound_error(void) { return boundError.c_str(); }

void cellc_cpu_bound_free(void *bound) { delete static_cast<BoundStep *>(bound); }

int cellc_cpu_kept_layout(void *cell, const char *mode, int32_t has_lengths, char **text,
                          char *error, size_t size) {
  return catchErrors(error, size, [&] {
    if (!text)
      throw Failure("nowhere to put the layout");
    Recompute parsed = modeOf(mode);
    std::string out = "{\"buffers\": [";
    const char *sep = "";
    for (const driver::KeptBuffer &b : cellOf(cell).keptLayout(parsed, has_lengths != 0)) {
      out += sep;
      out += "[" + std::string(b.perChunk ? "true" : "false") + ", " +
             std::to_string(b.width) + ", " +
             (b.element == driver::Element::F64 ? "\"f64\"" : "\"f32\"") + "]";
      sep = ", ";
    }
    std::vector<int64_t> read;
    for (size_t i : cellOf(cell).keptOutputs(parsed, has_lengths != 0))
      read.push_back(static_cast<int64_t>(i));
    *text = driver::mallocText(out + "], \"outputs\": " + driver::jsonList(read) + "}");
    if (!*text)
      throw std::bad_alloc();
  });
}

int cellc_cpu_backward_kept(void *cell, const int64_t *call, const char *mode, char *error,
                            size_t size) {
  return catchErrors(error, size, [&] {
    Lists in(call);
    bool training = true;
    CpuCell::Sequence seq = sequenceOf(in, false, training);
    std::vector<Array> outputs = in.next(), kept = in.next();
    std::vector<Array> gradOutputs = in.next(), gradFinals = in.next();
    std::vector<Array> gradInputs = in.next(), gradParams = in.next(), gradStates = in.next();
    Recompute parsed = modeOf(mode);
    CpuCell &c = cellOf(cell);
    driver::SavedPtr saved;
    check(c.adopt(seq, parsed, outputs, kept, saved));
    check(c.backward(seq, *saved, gradOutputs, gradFinals, gradInputs, gradParams, gradStates));
  });
}

void cellc_cpu_memory_stats(void *cell, int64_t *out) {
  driver::MemoryStats s = cellOf(cell).memoryStats();
  int64_t values[4] = {s.kept, s.forwardPeak, s.backwardPeak, s.live};
  std::copy(values, values + 4, out);
}

int cellc_cpu_memory_plan(void *cell, int64_t steps, int64_t batch, const char *mode,
                          int64_t *out, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    driver::MemoryPlan p;
    check(cellOf(cell).memoryPlan(steps, batch, modeOf(mode), p));
    std::array<int64_t, 12> values = p.figures();
    std::copy(values.begin(), values.end(), out);
  });
}

int cellc_cpu_check_mode(const char *mode, char *error, size_t size) {
  return catchErrors(error, size, [&] { modeOf(mode); });
}

void *cellc_cpu_lend(const int64_t *shape, int32_t rank, int32_t f64, char *error,
                     size_t size) {
  DLManagedTensor *result = nullptr;
  catchErrors(error, size, [&] {
    if (rank < 0 || (rank && !shape))
      throw Failure("buffer: a shape without its dims");
    int64_t width = f64 ? 8 : 4, bytes = width;
    for (int32_t i = 0; i < rank; ++i) {
      if (shape[i] < 0)
        throw Failure("buffer: a negative dimension");
      if (__builtin_mul_overflow(bytes, shape[i], &bytes))
        throw Failure("buffer: more bytes than an int64 counts");
    }
    auto lent = std::make_unique<LentBuffer>();
    lent->shape.assign(shape, shape + rank);
    lent->strides.assign(rank, 1);
    for (size_t i = lent->shape.size(); i-- > 1;)
      lent->strides[i - 1] = lent->strides[i] * lent->shape[i];
    lent->bytes = bytes;
    void *data = allocateBuffer(bytes, false);
    if (!data)
      throw Failure("buffer: out of memory for " + std::to_string(bytes) + " bytes");
    DLManagedTensor &m = lent->managed;
    m.tensor = {data, {1, 0}, rank, {2, uint8_t(width * 8), 1},
                lent->shape.data(), lent->strides.data(), 0};
    m.context = lent.get();
    m.deleter = returnLent;
    lentBytes += bytes;
    result = &lent.release()->managed;
  });
  return result;
}

void cellc_cpu_capsule_destructor(void *capsule) {
  // Python's C API, from the process (the runtime links no Python): a
  // capsule torch took is renamed "used_dltensor" and left alone.
  using IsValid = int (*)(void *, const char *);
  using GetPointer = void *(*)(void *, const char *);
  using Fetch = void (*)(void **, void **, void **);
  using Restore = void (*)(void *, void *, void *);
  static auto isValid = reinterpret_cast<IsValid>(dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"));
  static auto pointer = reinterpret_cast<GetPointer>(dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer"));
  static auto fetch = reinterpret_cast<Fetch>(dlsym(RTLD_DEFAULT, "PyErr_Fetch"));
  static auto restore = reinterpret_cast<Restore>(dlsym(RTLD_DEFAULT, "PyErr_Restore"));
  if (!isValid || !pointer || !fetch || !restore || !isValid(capsule, "dltensor"))
    return;
  // An exception on its way (a failed from_dlpack) outlives the drop.
  void *type, *value, *traceback;
  fetch(&type, &value, &traceback);
  cellc_cpu_lent_drop(pointer(capsule, "dltensor"));
  restore(type, value, traceback);
}

void cellc_cpu_lent_drop(void *managed) {
  auto *m = static_cast<DLManagedTensor *>(managed);
  if (m && m->deleter)
    m->deleter(m);
}

int64_t cellc_cpu_lent_bytes(void) { return lentBytes.load(); }
int64_t cellc_cpu_cached_bytes(void) { return cachedBufferBytes(); }
void cellc_cpu_empty_cache(void) { releaseCachedBuffers(); }
int32_t cellc_cpu_tasks_on_openmp(void) { return tasksOnOpenMP() ? 1 : 0; }
void cellc_cpu_set_tasks_on_openmp(int32_t on) { setTasksOnOpenMP(on != 0); }
const char *cellc_cpu_gemm_library(void) { return host::gemmLibrary(); }

int cellc_cpu_chunk_forward(int32_t f64, const int64_t *shape, int32_t rows, int32_t reads,
                            const void *a, const void *k, const void *v, const void *S0,
                            const void *const *qs, void *const *outs, void *starts,
                            void *end, void *pairs, int32_t threads, char *error,
                            size_t size) {
  return catchErrors(error, size, [&] {
    chunk::forward(dtypeOf(f64), chunkShape(shape, rows != 0, reads), a, k, v, S0, qs, outs,
                   starts, end, pairs, threads);
  });
}

int cellc_cpu_chunk_backward(int32_t f64, const int64_t *shape, int32_t rows, int32_t reads,
                             const void *a, const void *k, const void *v, const void *starts,
                             const void *end, const void *pairs, const void *const *qs,
                             const void *const *douts, const void *dEnd, void *da,
                             void *dk, void *dv, void *dS0, void *const *dqs,
                             int32_t threads, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    chunk::backward(dtypeOf(f64), chunkShape(shape, rows != 0, reads), a, k, v, starts, end,
                    pairs, qs, douts, dEnd, da, dk, dv, dS0, dqs, threads);
  });
}

int cellc_cpu_delta_forward(int32_t f64, const int64_t *shape, int32_t reads, const void *a,
                            const void *k, const void *w, const void *beta, const void *S0,
                            const void *const *qs, void *const *outs, void *starts,
                            void *end, int32_t threads, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    chunk::deltaForward(dtypeOf(f64), chunkShape(shape, false, reads), a, k, w, beta, S0, qs,
                        outs, starts, end, threads);
  });
}

int cellc_cpu_delta_backward(int32_t f64, const int64_t *shape, int32_t reads, const void *a,
                             const void *k, const void *w, const void *beta,
                             const void *starts, const void *end, const void *const *qs,
                             const void *const *douts, const void *dEnd, void *da, void *dk,
                             void *dw, void *dbeta, void *dS0, void *const *dqs,
                             int32_t threads, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    chunk::deltaBackward(dtypeOf(f64), chunkShape(shape, false, reads), a, k, w, beta, starts,
                         end, qs, douts, dEnd, da, dk, dw, dbeta, dS0, dqs, threads);
  });
}

} // extern "C"
