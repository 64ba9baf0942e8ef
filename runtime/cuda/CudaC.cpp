//===- CudaC.cpp - The CUDA runtime's C interface -------------------------===//

#include "runtime/cuda/CudaC.h"

#include "runtime/cuda/CudaCell.h"
#include "runtime/driver/CErrors.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

using namespace cellc;
using cellc::driver::catchErrors;
using cellc::driver::check;
using cellc::driver::Failure;
using cellc::driver::modeOf;
using cellc::driver::reportError;
using driver::Element;
using driver::View;

namespace {

Element elementOf(int32_t code) {
  if (code < 0 || code > int32_t(Element::I32))
    throw Failure("unknown element code " + std::to_string(code));
  return Element(code);
}

View viewOf(const cellc_tensor &t) {
  View v;
  if (!t.data)
    return v;
  if (t.rank < 0 || t.rank > 4)
    throw Failure("a tensor of rank " + std::to_string(t.rank) + ": cellc takes at most 4");
  v.buffer.data = t.data;
  v.buffer.element = elementOf(t.element);
  v.shape.assign(t.shape, t.shape + t.rank);
  return v;
}

std::vector<View> viewsOf(const cellc_tensors &list) {
  std::vector<View> views;
  if (list.count < 0 || (list.count && !list.items))
    throw Failure("a list of tensors without its items");
  for (int64_t i = 0; i < list.count; ++i)
    views.push_back(viewOf(list.items[i]));
  return views;
}

cuda::CudaCell::Call callOf(const cellc_call &c) {
  cuda::CudaCell::Call call;
  call.mode = modeOf(c.mode);
  call.seq.steps = c.steps;
  call.seq.batch = c.batch;
  call.seq.inputs = viewsOf(c.inputs);
  call.seq.params = viewsOf(c.params);
  call.seq.initialStates = viewsOf(c.initial);
  call.seq.resets = viewOf(c.resets);
  if (c.num_lengths < 0 || (c.num_lengths && !c.lengths))
    throw Failure("lengths without their values");
  call.seq.lengths.assign(c.lengths, c.lengths + c.num_lengths);
  call.outputs = viewsOf(c.outputs);
  call.finals = viewsOf(c.finals);
  call.kept = viewsOf(c.kept);
  call.training = c.training != 0;
  call.gradOutputs = viewsOf(c.grad_outputs);
  call.gradFinals = viewsOf(c.grad_finals);
  call.gradInputs = viewsOf(c.grad_inputs);
  call.gradParams = viewsOf(c.grad_params);
  call.gradInitial = viewsOf(c.grad_initial);
  call.workspace = c.workspace;
  call.workspaceBytes = c.workspace_bytes;
  call.stream = c.stream;
  return call;
}

/// Runs a forward or backward: 0, 1 with the error, or
/// CELLC_WORKSPACE_TOO_SMALL with `needed` set.
int run(void *cell, cellc_call *c, bool backward, char *error, size_t size) {
  bool tooSmall = false;
  int status = catchErrors(error, size, [&] {
    if (!cell || !c)
      throw Failure("no cell or no call");
    cuda::CudaCell::Call call = callOf(*c);
    auto *cuda = static_cast<cuda::CudaCell *>(cell);
    check(backward ? cuda->backward(call, tooSmall) : cuda->forward(call, tooSmall));
    c->needed = call.needed;
  });
  return status ? status : tooSmall ? CELLC_WORKSPACE_TOO_SMALL : 0;
}

} // namespace

extern "C" {

void *cellc_cuda_package_open(const char *directory, char *error, size_t size) {
  auto package = std::make_unique<driver::PackageInfo>();
  if (driver::Status s = driver::readPackage(directory ? directory : "", *package)) {
    reportError(error, size, s.message());
    return nullptr;
  }
  if (package->target != "cuda") {
    reportError(error, size,
                package->directory + " is a " + package->target + " package, not a CUDA one");
    return nullptr;
  }
  return package.release();
}

void cellc_cuda_package_free(void *package) {
  delete static_cast<driver::PackageInfo *>(package);
}

char *cellc_cuda_package_describe(void *package) {
  std::string text = driver::describePackage(*static_cast<driver::PackageInfo *>(package));
  return driver::mallocText(text);
}

void cellc_cuda_free_text(char *text) { std::free(text); }

void *cellc_cuda_cell_open(void *package, int32_t device, uint64_t shuffle_seed, char *error,
                           size_t size) {
  std::unique_ptr<cuda::CudaCell> cell;
  if (driver::Status s = cuda::CudaCell::open(*static_cast<driver::PackageInfo *>(package),
                                              device, shuffle_seed, cell)) {
    reportError(error, size, s.message());
    return nullptr;
  }
  return cell.release();
}

void cellc_cuda_cell_free(void *cell) { delete static_cast<cuda::CudaCell *>(cell); }

int cellc_cuda_forward(void *cell, cellc_call *call, char *error, size_t size) {
  return run(cell, call, /*backward=*/false, error, size);
}

int cellc_cuda_backward(void *cell, cellc_call *call, char *error, size_t size) {
  return run(cell, call, /*backward=*/true, error, size);
}

int cellc_cuda_kept_layout(void *cell, const char *mode, int32_t has_lengths, int64_t *layout,
                           int64_t capacity, int64_t *count, int64_t *outputs_read,
                           int64_t read_capacity, int64_t *num_read, char *error,
                           size_t size) {
  return catchErrors(error, size, [&] {
    auto *c = static_cast<cuda::CudaCell *>(cell);
    driver::Recompute parsed = modeOf(mode);
    std::vector<driver::KeptBuffer> kept = c->keptLayout(parsed, has_lengths != 0);
    *count = int64_t(kept.size());
    for (size_t i = 0; i < kept.size() && int64_t(i) < capacity; ++i) {
      layout[3 * i] = kept[i].perChunk;
      layout[3 * i + 1] = kept[i].width;
      layout[3 * i + 2] = int64_t(kept[i].element);
    }
    *num_read = 0;
    for (int64_t o : c->keptOutputs(parsed, has_lengths != 0))
      if (o >= 0 && (*num_read)++ < read_capacity)
        outputs_read[*num_read - 1] = o;
  });
}

int cellc_cuda_plan(void *cell, const char *mode, int64_t steps, int64_t batch, int64_t *out,
                    char *error, size_t size) {
  return catchErrors(error, size, [&] {
    driver::MemoryPlan plan;
    check(static_cast<cuda::CudaCell *>(cell)->plan(steps, batch, modeOf(mode), plan));
    std::array<int64_t, 12> values = plan.figures();
    std::copy(values.begin(), values.end(), out);
  });
}

void cellc_cuda_memory_stats(void *cell, int64_t *out) {
  auto *c = static_cast<cuda::CudaCell *>(cell);
  driver::MemoryStats s = c->stats();
  int64_t values[] = {s.kept, s.forwardPeak, s.backwardPeak, s.live, c->workspaceUsed(false),
                      c->workspaceUsed(true)};
  std::memcpy(out, values, sizeof values);
}

int cellc_cuda_launch(void *cell, int32_t backward, int32_t save_gates,
                      const cellc_tensor *args, int64_t num_args, int64_t batch, void *stream,
                      char *error, size_t size) {
  return catchErrors(error, size, [&] {
    std::vector<driver::Arg> list;
    for (int64_t i = 0; i < num_args; ++i) {
      driver::Arg arg;
      if (args[i].rank < 0)
        arg.index = args[i].shape[0];
      else
        arg.view = viewOf(args[i]);
      list.push_back(arg);
    }
    check(static_cast<cuda::CudaCell *>(cell)->launch(backward != 0, save_gates != 0, list,
                                                       batch, stream));
  });
}

int cellc_cuda_launch_plan(void *cell, int32_t backward, int32_t save_gates, int64_t batch,
                           int64_t *out, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    cuda::LaunchSpec spec;
    cuda::Residency fits;
    check(static_cast<cuda::CudaCell *>(cell)->admitLaunch(backward != 0, save_gates != 0,
                                                            batch, spec, fits));
    int64_t values[6] = {spec.gridX, spec.gridY, spec.block, spec.sharedBytes,
                         spec.cooperative ? 1 : 0, fits.perSm};
    std::copy(values, values + 6, out);
  });
}

char *cellc_cuda_device_calls(void *cell, int32_t reset) {
  std::string text = "{";
  for (const auto &[kind, count] : static_cast<cuda::CudaCell *>(cell)->deviceCalls(reset != 0))
    text += (text.size() > 1 ? ", " : "") + driver::jsonQuoted(kind) + ": " + std::to_string(count);
  text += "}";
  return driver::mallocText(text);
}

int cellc_cuda_registers(void *cell, const char *kernel, int32_t save_gates,
                         int32_t *registers, char *error, size_t size) {
  return catchErrors(error, size, [&] {
    int n = 0;
    check(static_cast<cuda::CudaCell *>(cell)->registers(kernel ? kernel : "", save_gates != 0,
                                                          n));
    *registers = n;
  });
}
}
