//===- RuntimeModule.cpp - The _cellc_runtime Python extension ------------===//
//
// A thin pybind11 layer over the CPU runtime alone (runtime/cpu, the
// driver): it loads CPU packages and runs them. It links neither MLIR nor
// LLVM, so that `cellc.load_package` runs where only the runtime is; the
// JIT (the _cellc extension) builds packages that this module loads. Tensors
// cross as (data pointer, shape) pairs: no torch headers.
//
//===----------------------------------------------------------------------===//

#include "python/src/PlanDict.h"
#include "runtime/cpu/Buffers.h"
#include "runtime/cpu/ChunkCore.h"
#include "runtime/cpu/CpuCell.h"
#include "runtime/cpu/HostBlas.h"
#include "runtime/cpu/ThreadPool.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <new>
#include <optional>

namespace py = pybind11;
using namespace cellc;
using namespace cellc::runtime;

namespace {

/// (pointer, shape) pairs from Python.
using Buffers = std::vector<std::pair<uintptr_t, std::vector<int64_t>>>;

std::vector<Array> arrays(const Buffers &buffers) {
  std::vector<Array> result;
  for (const auto &[ptr, shape] : buffers)
    result.push_back({reinterpret_cast<void *>(ptr), shape});
  return result;
}

void check(const Status &status) {
  if (status)
    throw py::value_error(status.message());
}

struct PyCell {
  std::unique_ptr<CpuCell> cell;

  static py::list slots(const std::vector<Slot> &slots) {
    py::list list;
    for (const Slot &s : slots)
      list.append(py::make_tuple(s.name, s.shape));
    return list;
  }

  CpuCell::Sequence sequence(const Buffers &inputs, const Buffers &params,
                             const Buffers &states, uintptr_t resets,
                             int64_t steps, int64_t batch, bool batchFirst,
                             const std::vector<int64_t> &lengths) {
    CpuCell::Sequence seq;
    seq.inputs = arrays(inputs);
    seq.params = arrays(params);
    seq.initialStates = arrays(states);
    seq.resets = reinterpret_cast<const uint8_t *>(resets);
    seq.steps = steps;
    seq.batch = batch;
    seq.batchFirst = batchFirst;
    seq.lengths = lengths;
    return seq;
  }

  /// The forward. With `kept` (buffers laid out as kept_layout says), a
  /// training forward that leaves in them what backward_kept reads: Python
  /// keeps them as torch tensors, and the driver's own Saved goes with the
  /// call.
  void forward(const Buffers &inputs, const Buffers &params, const Buffers &states,
               uintptr_t resets, int64_t steps, int64_t batch, bool batchFirst,
               const Buffers &outputs, const Buffers &finals, const std::string &mode,
               const std::vector<int64_t> &lengths, const std::optional<Buffers> &kept) {
    CpuCell::Sequence seq =
        sequence(inputs, params, states, resets, steps, batch, batchFirst, lengths);
    seq.outputsOutliveSaved = true;
    Recompute parsed = parseMode(mode);
    std::vector<Array> keptArrays = kept ? arrays(*kept) : std::vector<Array>();
    SavedPtr saved;
    Status status;
    {
      py::gil_scoped_release release;
      status = cell->forward(seq, arrays(outputs), arrays(finals), parsed,
                             kept ? &saved : nullptr, kept ? &keptArrays : nullptr);
    }
    check(status);
  }

  /// The one-step sequence of a step's [B, n] inputs, params and states.
  static CpuCell::Sequence stepSequence(const Buffers &inputs, const Buffers &params,
                                        const Buffers &states) {
    CpuCell::Sequence seq;
    seq.inputs = arrays(inputs);
    seq.params = arrays(params);
    seq.initialStates = arrays(states);
    seq.steps = 1;
    seq.batch = seq.inputs.empty() || seq.inputs[0].shape.empty() ? -1
                                                                  : seq.inputs[0].shape[0];
    return seq;
  }

  /// One step of inference: [B, n] inputs, states, outputs and new states;
  /// the params' versions (torch's `_version`) when the caller has them.
  void step(const Buffers &inputs, const Buffers &params, const Buffers &states,
            const Buffers &outputs, const Buffers &newStates,
            const std::optional<std::vector<int64_t>> &paramVersions) {
    CpuCell::Sequence seq = stepSequence(inputs, params, states);
    Status status;
    {
      py::gil_scoped_release release;
      status = cell->step(seq, arrays(outputs), arrays(newStates),
                          paramVersions ? &*paramVersions : nullptr);
    }
    check(status);
  }

  /// `step`, then the step bound to these tensors' shapes (None where it
  /// cannot be).
  py::object bindStep(const Buffers &inputs, const Buffers &params, const Buffers &states,
                      const Buffers &outputs, const Buffers &newStates,
                      const std::vector<int64_t> &paramVersions) {
    CpuCell::Sequence seq = stepSequence(inputs, params, states);
    std::unique_ptr<CpuCell::BoundStep> bound;
    Status status;
    {
      py::gil_scoped_release release;
      status = cell->bindStep(seq, arrays(outputs), arrays(newStates), paramVersions, bound);
    }
    check(status);
    if (!bound)
      return py::none();
    return py::cast(std::shared_ptr<CpuCell::BoundStep>(std::move(bound)));
  }

  static Recompute parseMode(const std::string &mode) {
    Recompute parsed;
    check(Recompute::parse(mode, parsed));
    return parsed;
  }

  /// What a training forward in `mode` keeps: (per chunk, width, dtype)
  /// buffers `[T or chunks, B, width]` that the caller allocates, and the
  /// outputs (indices) it keeps as states' histories.
  py::tuple keptLayout(const std::string &mode, bool hasLengths) {
    Recompute parsed = parseMode(mode);
    py::list layout;
    for (const driver::KeptBuffer &b : cell->keptLayout(parsed, hasLengths))
      layout.append(py::make_tuple(b.perChunk, b.width,
                                   b.element == driver::Element::F64 ? "f64" : "f32"));
    return py::make_tuple(layout, cell->keptOutputs(parsed, hasLengths));
  }

  /// The backward of a forward whose kept buffers (and outputs) the caller
  /// holds.
  void backwardKept(const Buffers &inputs, const Buffers &params, const Buffers &states,
                    uintptr_t resets, int64_t steps, int64_t batch,
                    const std::string &mode, const std::vector<int64_t> &lengths,
                    const Buffers &outputs, const Buffers &kept,
                    const Buffers &gradOutputs, const Buffers &gradFinals,
                    const Buffers &gradInputs, const Buffers &gradParams,
                    const Buffers &gradStates) {
    CpuCell::Sequence seq =
        sequence(inputs, params, states, resets, steps, batch, false, lengths);
    Recompute parsed = parseMode(mode);
    SavedPtr saved;
    Status status;
    {
      py::gil_scoped_release release;
      status = cell->adopt(seq, parsed, arrays(outputs), arrays(kept), saved);
      if (!status)
        status = cell->backward(seq, *saved, arrays(gradOutputs), arrays(gradFinals),
                                arrays(gradInputs), arrays(gradParams), arrays(gradStates));
    }
    check(status);
  }
};

/// DLPack's tensor as torch.utils.dlpack reads it (dlpack.h, version 0.x:
/// a capsule named "dltensor", renamed "used_dltensor" by the consumer).
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

void dropUnusedCapsule(PyObject *capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor"))
    return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed)
    managed->deleter(managed);
  else
    PyErr_WriteUnraisable(capsule);
  PyErr_Restore(type, value, traceback);
}

/// A DLPack capsule of a dense `shape` buffer of f32 or f64 from the
/// runtime's buffers: torch.utils.dlpack.from_dlpack makes it a tensor whose
/// pages go back to the runtime's cache when torch frees it, so that the
/// next call of the same sizes runs on pages it had instead of faulting in
/// fresh ones.
py::object lendBuffer(const std::vector<int64_t> &shape, const std::string &element) {
  if (element != "f32" && element != "f64")
    throw py::value_error("buffer: element must be 'f32' or 'f64', got '" + element + "'");
  int64_t width = element == "f64" ? 8 : 4, bytes = width;
  for (int64_t d : shape) {
    if (d < 0)
      throw py::value_error("buffer: a negative dimension");
    if (__builtin_mul_overflow(bytes, d, &bytes))
      throw py::value_error("buffer: more bytes than an int64 counts");
  }
  auto lent = std::make_unique<LentBuffer>();
  lent->shape = shape;
  lent->strides.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    lent->strides[i - 1] = lent->strides[i] * shape[i];
  lent->bytes = bytes;
  void *data = allocateBuffer(lent->bytes, false);
  if (!data)
    throw std::bad_alloc();
  DLManagedTensor &m = lent->managed;
  m.tensor = {data, {1, 0}, int32_t(shape.size()), {2, uint8_t(width * 8), 1},
              lent->shape.data(), lent->strides.data(), 0};
  m.context = lent.get();
  m.deleter = returnLent;
  PyObject *capsule = PyCapsule_New(&m, "dltensor", dropUnusedCapsule);
  if (!capsule) {
    releaseBuffer(data, lent->bytes);
    throw py::error_already_set();
  }
  lentBytes += lent->bytes;
  lent.release();
  return py::reinterpret_steal<py::object>(capsule);
}

} // namespace

PYBIND11_MODULE(_cellc_runtime, m) {
  m.doc() = "cellc's CPU runtime: loads and runs CPU packages (use the cellc package)";

  py::class_<CpuCell::BoundStep, std::shared_ptr<CpuCell::BoundStep>>(m, "BoundStep")
      .def(
          "run",
          [](CpuCell::BoundStep &b, const std::vector<uintptr_t> &data,
             const std::vector<int64_t> &versions) {
            Status status;
            bool ran;
            {
              py::gil_scoped_release release;
              ran = b.run(data, versions, status);
            }
            check(status);
            return ran;
          },
          py::arg("data"), py::arg("versions"),
          "Steps the tensors whose data pointers `data` gives (inputs, params, "
          "states, outputs, new states), shaped as those it was bound with; False, "
          "running nothing, where it must be bound again");

  py::class_<PyCell>(m, "CompiledCell")
      .def_property_readonly("inputs", [](PyCell &c) { return PyCell::slots(c.cell->inputs()); })
      .def_property_readonly("states", [](PyCell &c) { return PyCell::slots(c.cell->states()); })
      .def_property_readonly("params", [](PyCell &c) { return PyCell::slots(c.cell->params()); })
      .def_property_readonly("outputs", [](PyCell &c) { return PyCell::slots(c.cell->outputs()); })
      .def_property_readonly(
          "state_dims", [](PyCell &c) { return c.cell->package().stateDims; },
          "The declared dims of each state of several (a matrix state's [NH, K, V])")
      .def_property_readonly("dtype", [](PyCell &c) { return c.cell->package().dtype; })
      .def_property_readonly("sizes", [](PyCell &c) { return c.cell->package().sizes; })
      .def_property_readonly("path", [](PyCell &c) { return c.cell->package().directory; })
      .def_property_readonly("loaded_from_cache",
                             [](PyCell &c) { return c.cell->loadedFromCache(); })
      .def_property_readonly("config", [](PyCell &c) { return c.cell->config(); },
                             "The kernel config, as name=value pairs")
      .def_property_readonly("config_source",
                             [](PyCell &c) { return c.cell->configSource(); },
                             "'tuned' when the config came from the tuning cache")
      .def_property("threads", [](PyCell &c) { return c.cell->threads(); },
                    [](PyCell &c, int t) { c.cell->setThreads(t); })
      .def_property(
          "unit_slices",
          [](PyCell &c) -> std::optional<bool> {
            int mode = c.cell->unitSlices();
            return mode < 0 ? std::nullopt : std::optional<bool>(mode > 0);
          },
          [](PyCell &c, std::optional<bool> on) { c.cell->setUnitSlices(on ? *on : -1); },
          "With fewer batch tiles than threads, whether a tile's threads split its "
          "units (True) or its rows (False); None, the default: its rows from 4 a "
          "thread while their copies of the weights take at most 4 MiB")
      .def("thread_split", [](PyCell &c, int64_t batch) { return c.cell->threadSplit(batch); },
           py::arg("batch"),
           "(groups, slices): how a launch over `batch` rows runs on the threads")
      .def("forward", &PyCell::forward, py::arg("inputs"), py::arg("params"),
           py::arg("states"), py::arg("resets"), py::arg("steps"), py::arg("batch"),
           py::arg("batch_first"), py::arg("outputs"), py::arg("finals"),
           py::arg("mode"), py::arg("lengths"), py::arg("kept") = py::none(),
           "The forward; with `kept` (laid out as kept_layout says), a training "
           "forward that leaves there what backward_kept reads")
      .def("step", &PyCell::step, py::arg("inputs"), py::arg("params"), py::arg("states"),
           py::arg("outputs"), py::arg("new_states"), py::arg("param_versions") = py::none(),
           "One step of inference: [B, n] inputs, states stepped from, outputs and "
           "new states. With the params' versions (torch's `_version`), the weights "
           "packed by the last step serve while the params and versions are the same")
      .def("bind_step", &PyCell::bindStep, py::arg("inputs"), py::arg("params"),
           py::arg("states"), py::arg("outputs"), py::arg("new_states"),
           py::arg("param_versions"), py::keep_alive<0, 1>(),
           "`step`, then the step bound to these tensors' shapes (a BoundStep that "
           "keeps this cell alive), or None")
      .def("kept_layout", &PyCell::keptLayout, py::arg("mode"), py::arg("has_lengths"))
      .def_static("buffer", &lendBuffer, py::arg("shape"), py::arg("element"),
                  "A DLPack capsule of a dense buffer of 'f32' or 'f64' from the "
                  "runtime's buffers, for a kept buffer (torch.utils.dlpack."
                  "from_dlpack): its pages go back to the runtime's cache when the "
                  "tensor is freed")
      .def("backward_kept", &PyCell::backwardKept)
      .def(
          "memory_stats",
          [](PyCell &c) {
            driver::MemoryStats s = c.cell->memoryStats();
            py::dict d;
            d["kept_bytes"] = s.kept;
            d["forward_peak_bytes"] = s.forwardPeak;
            d["backward_peak_bytes"] = s.backwardPeak;
            d["live_bytes"] = s.live;
            return d;
          },
          "The bytes the driver held in the last forward and backward")
      .def(
          "memory_plan",
          [](PyCell &c, int64_t steps, int64_t batch, const std::string &mode) {
            driver::MemoryPlan plan;
            check(c.cell->memoryPlan(steps, batch, PyCell::parseMode(mode), plan));
            return python::planDict(plan);
          },
          py::arg("steps"), py::arg("batch"), py::arg("mode"),
          "What a training step of steps x batch in mode holds, in bytes");

  m.def("tasks_on_openmp", &tasksOnOpenMP,
        "Whether the runtime's threads are OpenMP's (shared with torch's where "
        "both use the same OpenMP runtime) rather than a pool of its own");
  m.def("set_tasks_on_openmp", &setTasksOnOpenMP, py::arg("on"),
        "Runs the runtime's threads on OpenMP's (True) or on its own pool");
  m.def("gemm_library", &host::gemmLibrary,
        "What runs the CPU's f32 GEMMs: 'cellc-avx512' (cellc's own kernel, on "
        "a CPU with AVX-512F unless CELLC_CPU_GEMM=openblas) or 'openblas'");
  m.def(
      "check_mode", [](const std::string &mode) { PyCell::parseMode(mode); }, py::arg("mode"),
      "Raises ValueError, with the driver's one message, unless mode is a "
      "recompute mode the driver takes");
  m.def(
      "lent_bytes", [] { return lentBytes.load(); },
      "The bytes of the runtime's buffers (`buffer`) that are not given back yet");
  m.def("cached_bytes", &cachedBufferBytes,
        "The bytes of the buffers that calls released and the runtime keeps");
  m.def("empty_cache", &releaseCachedBuffers,
        "Unmaps the buffers that calls released and the runtime keeps for the "
        "next call of the same sizes");

  // The chunk form's diagonal core (cellc/_chunkcore.py): contiguous tensors
  // cross as their data pointers, checked there.
  auto chunkShape = [](int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, bool rows,
                       size_t reads) {
    chunk::Shape s;
    s.BH = BH, s.T = T, s.K = K, s.V = V, s.L = L, s.rows = rows;
    s.reads = static_cast<int>(reads);
    return s;
  };
  auto pointers = [](const std::vector<uintptr_t> &p) {
    std::vector<void *> out;
    for (uintptr_t x : p)
      out.push_back(reinterpret_cast<void *>(x));
    return out;
  };
  auto at = [](uintptr_t p) { return reinterpret_cast<void *>(p); };
  m.def(
      "chunk_forward",
      [=](bool f64, int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, bool rows,
          uintptr_t a, uintptr_t k, uintptr_t v, uintptr_t S0, std::vector<uintptr_t> qs,
          std::vector<uintptr_t> outs, uintptr_t starts, uintptr_t end, uintptr_t pairs,
          int threads) {
        chunk::Shape s = chunkShape(BH, T, K, V, L, rows, qs.size());
        std::vector<void *> q = pointers(qs), o = pointers(outs);
        py::gil_scoped_release release;
        chunk::forward(f64 ? DType::F64 : DType::F32, s, at(a), at(k), at(v), at(S0),
                       q.data(), o.data(), at(starts), at(end), at(pairs), threads);
      },
      "The chunk form's diagonal core, forward (cellc/_chunkcore.py)");
  m.def(
      "chunk_backward",
      [=](bool f64, int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, bool rows,
          uintptr_t a, uintptr_t k, uintptr_t v, uintptr_t starts, uintptr_t end,
          uintptr_t pairs, std::vector<uintptr_t> qs, std::vector<uintptr_t> douts,
          uintptr_t dEnd, uintptr_t da, uintptr_t dk, uintptr_t dv, uintptr_t dS0,
          std::vector<uintptr_t> dqs, int threads) {
        chunk::Shape s = chunkShape(BH, T, K, V, L, rows, qs.size());
        std::vector<void *> q = pointers(qs), d = pointers(douts), dq = pointers(dqs);
        py::gil_scoped_release release;
        chunk::backward(f64 ? DType::F64 : DType::F32, s, at(a), at(k), at(v), at(starts),
                        at(end), at(pairs), q.data(), d.data(), at(dEnd), at(da), at(dk), at(dv),
                        at(dS0), dq.data(), threads);
      },
      "The chunk form's diagonal core, backward (cellc/_chunkcore.py)");
  m.def(
      "delta_forward",
      [=](bool f64, int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, uintptr_t a,
          uintptr_t k, uintptr_t w, uintptr_t beta, uintptr_t S0, std::vector<uintptr_t> qs,
          std::vector<uintptr_t> outs, uintptr_t starts, uintptr_t end, int threads) {
        chunk::Shape s = chunkShape(BH, T, K, V, L, false, qs.size());
        std::vector<void *> q = pointers(qs), o = pointers(outs);
        py::gil_scoped_release release;
        chunk::deltaForward(f64 ? DType::F64 : DType::F32, s, at(a), at(k), at(w), at(beta),
                            at(S0), q.data(), o.data(), at(starts), at(end), threads);
      },
      "The chunk form's delta-rule core, forward (cellc/_chunkcore.py)");
  m.def(
      "delta_backward",
      [=](bool f64, int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, uintptr_t a,
          uintptr_t k, uintptr_t w, uintptr_t beta, uintptr_t starts, uintptr_t end,
          std::vector<uintptr_t> qs, std::vector<uintptr_t> douts, uintptr_t dEnd,
          uintptr_t da, uintptr_t dk, uintptr_t dw, uintptr_t dbeta, uintptr_t dS0,
          std::vector<uintptr_t> dqs, int threads) {
        chunk::Shape s = chunkShape(BH, T, K, V, L, false, qs.size());
        std::vector<void *> q = pointers(qs), d = pointers(douts), dq = pointers(dqs);
        py::gil_scoped_release release;
        chunk::deltaBackward(f64 ? DType::F64 : DType::F32, s, at(a), at(k), at(w), at(beta),
                             at(starts), at(end), q.data(), d.data(), at(dEnd), at(da),
                             at(dk), at(dw), at(dbeta), at(dS0), dq.data(), threads);
      },
      "The chunk form's delta-rule core, backward (cellc/_chunkcore.py)");

  m.def(
      "load",
      [](const std::string &dir, int threads, bool fromCache, const std::string &origin) {
        CpuCell::Options options;
        options.threads = threads;
        PyCell result;
        Status status;
        {
          py::gil_scoped_release release;
          status = CpuCell::load(dir, options, result.cell);
        }
        check(status);
        result.cell->setOrigin(fromCache, origin);
        return result;
      },
      py::arg("path"), py::arg("threads") = 0, py::arg("from_cache") = false,
      py::arg("config_source") = "default",
      "Loads the CPU package in `path` (kernels.json, save.so, replay.so)");
  m.attr("__version__") = CELLC_VERSION;
}
