//===- DriverC.cpp - The sequence driver's C interface --------------------===//

#include "runtime/driver/DriverC.h"

#include "runtime/driver/CErrors.h"
#include "runtime/driver/SequenceDriver.h"

#include <cstdio>
#include <cstring>
#include <exception>

using namespace cellc;
using namespace cellc::driver;

namespace {


View viewOf(const cellc_view &v) {
  View view;
  if (v.buffer < 0)
    return view;
  view.buffer.id = v.buffer;
  view.buffer.element = static_cast<Element>(v.element);
  view.offset = v.offset;
  view.shape.assign(v.shape, v.shape + v.rank);
  return view;
}

cellc_view viewOf(const View &view) {
  cellc_view v{};
  v.buffer = view.valid() ? view.buffer.id : -1;
  v.offset = view.offset;
  v.element = static_cast<int32_t>(view.element());
  v.rank = static_cast<int32_t>(view.shape.size());
  for (size_t i = 0; i < view.shape.size() && i < 4; ++i)
    v.shape[i] = view.shape[i];
  return v;
}

std::vector<View> viewsOf(const cellc_view *views, size_t n) {
  std::vector<View> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(viewOf(views[i]));
  return out;
}

/// A backend that is the caller's callbacks.
class CallbackBackend : public Backend {
public:
  explicit CallbackBackend(const cellc_callbacks &cb) : cb(cb) {}

  Status allocate(int64_t elements, Element element, bool zero, Buffer &out) override {
    int64_t id = -1;
    if (cb.allocate(elements, static_cast<int32_t>(element), zero, &id) || id < 0)
      return failed("allocate");
    out.id = id;
    out.element = element;
    return Status();
  }
  void release(const Buffer &buffer) override { cb.release(buffer.id); }
  Status launch(bool backward, bool saveGates, const std::vector<Arg> &args,
                int64_t batch) override {
    std::vector<cellc_arg> c(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      c[i].is_index = args[i].index.has_value();
      c[i].index = args[i].index.value_or(0);
      c[i].view = viewOf(args[i].view);
    }
    if (cb.launch(backward, saveGates, static_cast<int32_t>(c.size()), c.data(), batch))
      return failed("launch");
    return Status();
  }
  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const View &a,
              int64_t lda, const View &b, int64_t ldb, double beta, const View &c,
              int64_t ldc) override {
    cellc_view va = viewOf(a), vb = viewOf(b), vc = viewOf(c);
    if (cb.gemm(transA, transB, m, n, k, &va, lda, &vb, ldb, beta, &vc, ldc))
      return failed("gemm");
    return Status();
  }
  Status columnSums(const View &m, int64_t rows, int64_t cols, const View &acc) override {
    cellc_view vm = viewOf(m), va = viewOf(acc);
    if (cb.column_sums(&vm, rows, cols, &va))
      return failed("column sums");
    return Status();
  }
  Status fillRows(const View &m, int64_t rows, int64_t cols,
                  const std::vector<View> &vectors) override {
    cellc_view vm = viewOf(m);
    std::vector<cellc_view> vs;
    for (const View &v : vectors)
      vs.push_back(viewOf(v));
    if (cb.fill_rows(&vm, rows, cols, static_cast<int32_t>(vs.size()), vs.data()))
      return failed("fill rows");
    return Status();
  }
  Status copy(const View &from, const View &to) override {
    cellc_view vf = viewOf(from), vt = viewOf(to);
    if (cb.copy(&vf, &vt))
      return failed("copy");
    return Status();
  }
  Status add(const View &from, const View &to) override {
    cellc_view vf = viewOf(from), vt = viewOf(to);
    if (cb.add(&vf, &vt))
      return failed("add");
    return Status();
  }

private:
  /// The callback raised; the caller holds its exception.
  static Status failed(const char *what) {
    return Status::error(std::string("the backend's ") + what + " callback failed");
  }
  cellc_callbacks cb;
};

struct DriverHandle {
  Interface interface;
  std::shared_ptr<CallbackBackend> backend;
  std::unique_ptr<SequenceDriver> driver;
};

template <typename F> int guarded(char *error, size_t size, F &&f) {
  try {
    Status s = f();
    return s ? reportError(error, size, s.message()) : 0;
  } catch (const std::exception &e) {
    return reportError(error, size, e.what());
  }
}

} // namespace

/// The driver's sequence over a caller's views.
static Sequence sequenceOf(const Interface &cell, int64_t steps, int64_t batch,
                           const cellc_view *inputs, const cellc_view *params,
                           const cellc_view *initial, const cellc_view *resets,
                           const int64_t *lengths, int64_t numLengths) {
  Sequence seq;
  seq.steps = steps;
  seq.batch = batch;
  seq.inputs = viewsOf(inputs, cell.inputs.size());
  seq.params = viewsOf(params, cell.params.size());
  seq.initialStates = viewsOf(initial, cell.states.size());
  seq.resets = viewOf(*resets);
  if (numLengths > 0)
    seq.lengths.assign(lengths, lengths + numLengths);
  return seq;
}

extern "C" {

int32_t cellc_element(const char *name) {
  std::optional<Element> e = parseElement(name ? name : "");
  return e ? static_cast<int32_t>(*e) : -1;
}

void *cellc_interface_new(const char *compute) {
  auto *interface = new Interface();
  interface->compute = parseElement(compute ? compute : "f32").value_or(Element::F32);
  return interface;
}

int cellc_interface_arg(void *handle, int32_t backward, const char *kind,
                        const char *name, const char *input, const char *biases,
                        int64_t sameAs, int32_t zero, const char *element,
                        int32_t rank, const int64_t *shape, char *error, size_t size) {
  return guarded(error, size, [&] {
    auto *interface = static_cast<Interface *>(handle);
    KernelArg arg;
    std::optional<ArgKind> k = parse<ArgKind>(kind ? kind : "");
    if (!k)
      return Status::error(std::string("unknown kernel argument kind '") +
                           (kind ? kind : "") + "'; expected " +
                           Words<ArgKind>::expected());
    arg.kind = *k;
    arg.name = name ? name : "";
    arg.input = input ? input : "";
    for (std::string_view rest = biases ? biases : ""; !rest.empty();) {
      size_t comma = rest.find(',');
      arg.biases.emplace_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    }
    arg.sameAs = sameAs;
    arg.zero = zero != 0;
    if (element && *element) {
      arg.element = parseElement(element);
      if (!arg.element)
        return Status::error(std::string("unknown element type '") + element + "'");
      arg.shape.assign(shape, shape + rank);
    }
    (backward ? interface->backward : interface->forward).args.push_back(arg);
    return Status();
  });
}

void cellc_interface_kernel(void *handle, int32_t backward, int64_t batchTile,
                            int64_t workspaceBytes) {
  auto *interface = static_cast<Interface *>(handle);
  Kernel &kernel = backward ? interface->backward : interface->forward;
  kernel.batchTile = batchTile;
  kernel.workspaceBytes = workspaceBytes;
}

void cellc_interface_free(void *handle) { delete static_cast<Interface *>(handle); }

void *cellc_driver_new(void *handle, const cellc_callbacks *callbacks, char *error,
                       size_t size) {
  auto driver = std::make_unique<DriverHandle>();
  driver->interface = *static_cast<Interface *>(handle);
  if (Status s = driver->interface.finish()) {
    reportError(error, size, s.message());
    return nullptr;
  }
  driver->backend = std::make_shared<CallbackBackend>(*callbacks);
  driver->driver = std::make_unique<SequenceDriver>(driver->interface, driver->backend);
  return driver.release();
}

void cellc_driver_free(void *driver) { delete static_cast<DriverHandle *>(driver); }

namespace {
Status parseMode(const char *mode, Recompute &out) {
  std::optional<Recompute> parsed = Recompute::parse(mode ? mode : "");
  if (!parsed)
    return Status::error(std::string("unknown recompute mode '") + (mode ? mode : "") +
                         "'; expected none, full or chunk:K with K > 0");
  out = *parsed;
  return Status();
}

/// What each sequence entry point starts from: the driver, the parsed mode
/// and the sequence.
struct Call {
  DriverHandle *driver = nullptr;
  Recompute mode;
  Sequence seq;
};

/// Runs `fn(call, interface)` on the call that the arguments make, guarded:
/// the preamble of every entry point that takes a sequence and a mode.
/// (C++ linkage: a template, inside the C entry points' block.)
extern "C++" template <typename Fn>
int withCall(void *handle, const char *mode, int64_t steps, int64_t batch,
             const cellc_view *inputs, const cellc_view *params, const cellc_view *initial,
             const cellc_view *resets, const int64_t *lengths, int64_t numLengths,
             char *error, size_t size, Fn fn) {
  return guarded(error, size, [&] {
    Call c;
    c.driver = static_cast<DriverHandle *>(handle);
    if (Status e = parseMode(mode, c.mode))
      return e;
    c.seq = sequenceOf(c.driver->interface, steps, batch, inputs, params, initial, resets,
                       lengths, numLengths);
    return fn(c, c.driver->interface);
  });
}
} // namespace

int cellc_driver_kept_layout(void *handle, const char *mode, int32_t hasLengths,
                             int64_t *layout, int64_t capacity, int64_t *count,
                             int64_t *outputsRead, int64_t *numRead, char *error,
                             size_t size) {
  return guarded(error, size, [&] {
    auto *d = static_cast<DriverHandle *>(handle);
    Recompute parsed;
    if (Status e = parseMode(mode, parsed))
      return e;
    std::vector<KeptBuffer> kept = d->driver->keptLayout(parsed, hasLengths != 0, true);
    *count = int64_t(kept.size());
    for (size_t i = 0; i < kept.size() && int64_t(i) < capacity; ++i) {
      layout[3 * i] = kept[i].perChunk;
      layout[3 * i + 1] = kept[i].width;
      layout[3 * i + 2] = int64_t(kept[i].element);
    }
    *numRead = 0;
    for (int64_t o : d->driver->keptOutputs(parsed, hasLengths != 0, true))
      if (o >= 0)
        outputsRead[(*numRead)++] = o;
    return Status();
  });
}

int cellc_driver_forward_kept(void *handle, const char *mode, int64_t steps,
                              int64_t batch, const cellc_view *inputs,
                              const cellc_view *params, const cellc_view *initial,
                              const cellc_view *resets, const int64_t *lengths,
                              int64_t numLengths, const cellc_view *outputs,
                              const cellc_view *finals, const cellc_view *kept,
                              int64_t numKept, char *error, size_t size) {
  return withCall(handle, mode, steps, batch, inputs, params, initial, resets, lengths,
                  numLengths, error, size, [&](Call &c, const Interface &cell) {
    std::vector<View> keptViews = viewsOf(kept, size_t(numKept));
    SavedPtr saved;
    return c.driver->driver->forward(c.seq, viewsOf(outputs, cell.outputs.size()),
                                     viewsOf(finals, cell.states.size()), c.mode, &saved,
                                     /*outputsOutliveSaved=*/true, &keptViews);
  });
}

int cellc_driver_adopt(void *handle, const char *mode, int64_t steps, int64_t batch,
                       const cellc_view *inputs, const cellc_view *params,
                       const cellc_view *initial, const cellc_view *resets,
                       const int64_t *lengths, int64_t numLengths,
                       const cellc_view *outputs, const cellc_view *kept, int64_t numKept,
                       void **saved, char *error, size_t size) {
  return withCall(handle, mode, steps, batch, inputs, params, initial, resets, lengths,
                  numLengths, error, size, [&](Call &c, const Interface &cell) {
    SavedPtr adopted;
    Status s = c.driver->driver->adopt(c.seq, c.mode, viewsOf(outputs, cell.outputs.size()),
                                       viewsOf(kept, size_t(numKept)), adopted);
    if (!s)
      *saved = adopted.release();
    return s;
  });
}

int cellc_driver_forward(void *handle, const char *mode, int64_t steps, int64_t batch,
                         const cellc_view *inputs, const cellc_view *params,
                         const cellc_view *initial, const cellc_view *resets,
                         const int64_t *lengths, int64_t numLengths,
                         const cellc_view *outputs, const cellc_view *finals,
                         void **saved, int32_t outputsOutliveSaved, char *error,
                         size_t size) {
  return withCall(handle, mode, steps, batch, inputs, params, initial, resets, lengths,
                  numLengths, error, size, [&](Call &c, const Interface &cell) {
    SavedPtr kept;
    Status s = c.driver->driver->forward(c.seq, viewsOf(outputs, cell.outputs.size()),
                                         viewsOf(finals, cell.states.size()), c.mode,
                                         saved ? &kept : nullptr, outputsOutliveSaved != 0);
    if (!s && saved)
      *saved = kept.release();
    return s;
  });
}

int cellc_driver_backward(void *handle, void *saved, const cellc_view *inputs,
                          const cellc_view *params, const cellc_view *initial,
                          const cellc_view *resets, const int64_t *lengths,
                          int64_t numLengths, const cellc_view *gradOutputs,
                          const cellc_view *gradFinals, const cellc_view *gradInputs,
                          const cellc_view *gradParams, const cellc_view *gradInitial,
                          char *error, size_t size) {
  return guarded(error, size, [&] {
    auto *d = static_cast<DriverHandle *>(handle);
    const Interface &cell = d->interface;
    const Saved &kept = *static_cast<Saved *>(saved);
    Sequence seq = sequenceOf(cell, savedSteps(kept), savedBatch(kept), inputs, params,
                              initial, resets, lengths, numLengths);
    return d->driver->backward(seq, kept, viewsOf(gradOutputs, cell.outputs.size()),
                               viewsOf(gradFinals, cell.states.size()),
                               viewsOf(gradInputs, cell.inputs.size()),
                               viewsOf(gradParams, cell.params.size()),
                               viewsOf(gradInitial, cell.states.size()));
  });
}

int64_t cellc_saved_bytes(void *saved) {
  return savedBytes(*static_cast<Saved *>(saved));
}

int64_t cellc_saved_outputs_read(void *saved, int64_t *indices, int64_t capacity) {
  const std::vector<size_t> &read = savedOutputsRead(*static_cast<Saved *>(saved));
  for (size_t i = 0; i < read.size() && int64_t(i) < capacity; ++i)
    indices[i] = int64_t(read[i]);
  return int64_t(read.size());
}

void cellc_driver_memory_stats(void *driver, int64_t *out) {
  MemoryStats s = static_cast<DriverHandle *>(driver)->driver->stats();
  out[0] = s.kept;
  out[1] = s.forwardPeak;
  out[2] = s.backwardPeak;
  out[3] = s.live;
}

void cellc_saved_free(void *saved) { SavedDeleter()(static_cast<Saved *>(saved)); }
}
