//===- CudaBackendTest.cpp - The CUDA backend's host side -----------------===//
//
// The workspace's placements, the dry run that sizes it, and what the
// backend asks of a Device: launches with their grids, GEMMs in one element
// type, column sums in parts. The Device here records its calls (the leaves
// that a GPU or the emulator carry out); the backend above it is the real
// one.
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CudaBackend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <vector>

using namespace cellc;
using namespace cellc::cuda;
using driver::Buffer;
using driver::View;

namespace {

TEST(ArenaTest, PlacesFirstFitAlignedAndComesDownAtTheTop) {
  Arena arena;
  arena.reset(-1);
  int64_t a = arena.allocate(10), b = arena.allocate(300), c = arena.allocate(1);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 256);
  EXPECT_EQ(c, 768);
  EXPECT_EQ(arena.high(), 1024);
  // A freed range is used again by a request that fits in it.
  arena.release(b);
  EXPECT_EQ(arena.allocate(256), 256);
  EXPECT_EQ(arena.allocate(256), 512);
  // Neighbours merge; the top comes down over a free range that ends there.
  arena.release(256);
  arena.release(512);
  EXPECT_EQ(arena.allocate(512), 256);
  arena.release(256);
  arena.release(c);
  EXPECT_EQ(arena.allocate(700), 256);
  EXPECT_EQ(arena.high(), 1024);
  arena.release(a);
  arena.release(256);
  EXPECT_EQ(arena.live(), 0u);
  EXPECT_EQ(arena.allocate(2048), 0);
  EXPECT_EQ(arena.high(), 2048);
}

TEST(ArenaTest, AWorkspaceOfFixedSizeRefusesWhatDoesNotFit) {
  Arena arena;
  arena.reset(1024);
  EXPECT_EQ(arena.allocate(1000), 0);
  EXPECT_EQ(arena.allocate(1), -1);
  arena.release(0);
  EXPECT_EQ(arena.allocate(1024), 0);
}

/// A Device that records what it is asked, on host memory.
class RecordingDevice : public Device {
public:
  struct Gemm {
    Element ab, ce;
    int64_t m, n, k;
    const void *a, *b;
    bool tf32;
    int64_t workspaceBytes;
  };
  std::vector<LaunchSpec> launches;
  /// Each launch's parameters' words (each param is a word: a pointer or
  /// an int64), read while the launch's arguments live.
  std::vector<std::vector<int64_t>> words;
  std::vector<Gemm> gemms;
  std::vector<std::pair<Element, Element>> conversions;
  std::vector<std::pair<int64_t, int64_t>> columnParts;
  int zeros = 0;

  /// What the device keeps resident of any kernel.
  Residency fits{1, 1000};
  int admitted = 0;

  bool onHost() const override { return true; }
  Status begin(void *) override { return Status(); }
  Status residency(const LaunchSpec &, Residency &out) override {
    out = fits;
    return Status();
  }
  Status admit(const LaunchSpec &) override {
    ++admitted;
    return Status();
  }
  Status launch(const LaunchSpec &spec) override {
    launches.push_back(spec);
    words.emplace_back();
    for (size_t i = 0; i < spec.numParams; ++i)
      words.back().push_back(*static_cast<const int64_t *>(spec.params[i]));
    launches.back().params = nullptr;
    return Status();
  }
  Status gemm(bool, bool, int64_t m, int64_t n, int64_t k, const void *a, int64_t,
              const void *b, int64_t, Element ab, double, void *, int64_t, Element ce,
              bool tf32, void *, int64_t workspaceBytes) override {
    gemms.push_back({ab, ce, m, n, k, a, b, tf32, workspaceBytes});
    return Status();
  }
  Status zero(void *data, int64_t bytes) override {
    std::memset(data, 0, size_t(bytes));
    ++zeros;
    return Status();
  }
  Status copyBytes(const void *, void *, int64_t) override { return Status(); }
  Status convert(const void *, Element from, void *, Element to, int64_t) override {
    conversions.push_back({from, to});
    return Status();
  }
  Status accumulate(const void *, Element, void *, Element, int64_t) override {
    return Status();
  }
  Status fillRows(void *, Element, int64_t, int64_t, const std::vector<const float *> &) override {
    return Status();
  }
  Status columnSums(const void *, Element, int64_t, int64_t, int64_t parts, int64_t per,
                    float *, float *) override {
    columnParts.push_back({parts, per});
    return Status();
  }
  Status upload(const void *, void *, int64_t) override { return Status(); }
  Status transpose(const void *, void *, int64_t, int64_t, Element) override {
    return Status();
  }
  Status maskPastLengths(void *, Element, int64_t, int64_t, int64_t, const int32_t *,
                         int64_t) override {
    return Status();
  }
  Status gatherAtLengths(const void *, Element, int64_t, int64_t, int64_t, int64_t,
                         const int32_t *, void *, Element) override {
    return Status();
  }
  Status addAtLengths(const float *, int64_t, int64_t, const int32_t *, int64_t,
                      float *) override {
    return Status();
  }
};

/// A cell whose forward kernel takes an input [T, B, 4], a workspace and
/// the grid barrier words, and b_begin, b_end.
driver::Interface interface(int64_t ctas, int64_t heads) {
  driver::Interface cell;
  auto arg = [](ArgKind kind, std::string name, std::vector<int64_t> shape,
                std::optional<Element> element) {
    driver::KernelArg a;
    a.kind = kind;
    a.name = std::move(name);
    a.shape = std::move(shape);
    a.element = element;
    return a;
  };
  for (driver::Kernel *k : {&cell.forward, &cell.backward}) {
    k->args = {arg(ArgKind::Input, "x", {-1, -1, 4}, Element::F32),
               arg(ArgKind::BatchBegin, "b_begin", {}, std::nullopt),
               arg(ArgKind::BatchEnd, "b_end", {}, std::nullopt)};
    k->batchTile = 4;
    k->threads = 128;
    k->dynamicSharedBytes = 1024;
    k->ctas = ctas;
    k->heads = heads;
  }
  return cell;
}

View viewOf(Buffer buffer, std::vector<int64_t> shape) {
  View v;
  v.buffer = buffer;
  v.shape = std::move(shape);
  return v;
}

TEST(CudaBackendTest, ADryRunPlacesWhatTheRealRunPlaces) {
  driver::Interface cell = interface(0, 0);
  auto device = std::make_shared<RecordingDevice>();
  CudaBackend backend(device, "c", cell);
  auto calls = [&](std::vector<int64_t> &offsets) -> Status {
    offsets.clear();
    Buffer a, b, c;
    if (Status e = backend.allocate(100, Element::F32, true, a))
      return e;
    if (Status e = backend.allocate(3000, Element::BF16, false, b))
      return e;
    offsets.push_back(a.id);
    offsets.push_back(b.id);
    backend.release(a);
    if (Status e = backend.allocate(50, Element::U8, true, c))
      return e;
    offsets.push_back(c.id);
    backend.release(b);
    backend.release(c);
    return Status();
  };
  std::vector<int64_t> dry, real;
  backend.beginDry();
  ASSERT_FALSE(calls(dry));
  ASSERT_FALSE(backend.endCall());
  int64_t needed = backend.used();
  EXPECT_EQ(needed, 512 + 6144);
  EXPECT_EQ(device->zeros, 0); // nothing runs dry
  std::vector<char> workspace(static_cast<size_t>(needed));
  ASSERT_FALSE(backend.beginCall(workspace.data(), needed, nullptr));
  ASSERT_FALSE(calls(real));
  ASSERT_FALSE(backend.endCall());
  EXPECT_EQ(dry, real);
  EXPECT_EQ(device->zeros, 2);
  // A workspace one alignment short fails at the buffer that does not fit.
  ASSERT_FALSE(backend.beginCall(workspace.data(), needed - 256, nullptr));
  Status e = calls(real);
  ASSERT_TRUE(e);
  EXPECT_NE(e.message().find("the call's workspace is too small"), std::string::npos);
  backend.endCall();
}

TEST(CudaBackendTest, ABufferThatOutlivesItsCallIsAnError) {
  driver::Interface cell = interface(0, 0);
  CudaBackend backend(std::make_shared<RecordingDevice>(), "c", cell);
  backend.beginDry();
  Buffer a;
  ASSERT_FALSE(backend.allocate(10, Element::F32, false, a));
  Status e = backend.endCall();
  ASSERT_TRUE(e);
  EXPECT_NE(e.message().find("1 buffers outlive the call"), std::string::npos);
}

TEST(CudaBackendTest, LaunchesTileTheBatchAndPersistentGridsAreCooperative) {
  std::vector<float> x(2 * 10 * 4);
  for (auto [ctas, heads] : {std::pair<int64_t, int64_t>{0, 0}, {3, 0}, {2, 2}}) {
    driver::Interface cell = interface(ctas, heads);
    auto device = std::make_shared<RecordingDevice>();
    CudaBackend backend(device, "c", cell);
    std::vector<driver::Arg> args(3);
    args[0].view = viewOf({x.data(), -1, Element::F32}, {2, 10, 4});
    args[1].index = 0;
    args[2].index = 10;
    ASSERT_FALSE(backend.beginCall(nullptr, 0, nullptr));
    ASSERT_FALSE(backend.launch(/*backward=*/true, /*saveGates=*/false, args, 10));
    ASSERT_FALSE(backend.endCall());
    ASSERT_EQ(device->launches.size(), 1u);
    const LaunchSpec &spec = device->launches[0];
    EXPECT_EQ(spec.kernel, "c_bwd");
    EXPECT_FALSE(spec.saveGates);
    EXPECT_EQ(spec.block, 128u);
    EXPECT_EQ(spec.sharedBytes, 1024u);
    // 10 rows in tiles of 4: 3 tiles; persistent: its CTAs along x.
    EXPECT_EQ(spec.gridX, unsigned(ctas ? ctas : 3));
    EXPECT_EQ(spec.gridY, unsigned(ctas ? 3 : 1));
    EXPECT_EQ(spec.cooperative, ctas > 0 && heads == 0);
    // A memref's descriptor word by word (pointers, offset, 3 sizes, 3
    // strides), then the two indices.
    const std::vector<int64_t> &w = device->words[0];
    ASSERT_EQ(w.size(), 11u);
    EXPECT_EQ(w[0], reinterpret_cast<int64_t>(x.data()));
    EXPECT_EQ(w[1], reinterpret_cast<int64_t>(x.data()));
    EXPECT_EQ(w[2], 0);
    EXPECT_EQ((std::vector<int64_t>(w.begin() + 3, w.begin() + 6)),
              (std::vector<int64_t>{2, 10, 4}));
    EXPECT_EQ((std::vector<int64_t>(w.begin() + 6, w.begin() + 9)),
              (std::vector<int64_t>{40, 4, 1}));
    EXPECT_EQ(w[9], 0);
    EXPECT_EQ(w[10], 10);
    ASSERT_EQ(spec.buffers.size(), 1u);
    EXPECT_EQ(spec.buffers[0].second, int64_t(x.size() * 4));
  }
}

TEST(CudaBackendTest, ACooperativeGridHoldsAsManyTilesAsTheDeviceKeepsResident) {
  // 3 CTAs a tile, 100 rows in tiles of 4: 25 tiles.
  for (auto [resident, heads, rows] :
       {std::tuple<int64_t, int64_t, unsigned>{1000, 0, 25}, {7, 0, 2}, {3, 0, 1},
        {2, 0, 0}, {2, 3, 25}}) {
    driver::Interface cell = interface(3, heads);
    auto device = std::make_shared<RecordingDevice>();
    device->fits = {1, resident};
    CudaBackend backend(device, "c", cell);
    LaunchSpec spec;
    Status e = backend.admitLaunch(/*backward=*/false, /*saveGates=*/true, 100, spec);
    if (rows == 0) {
      // Not one tile's CTAs fit: the driver's refusal, before any launch.
      ASSERT_TRUE(e);
      EXPECT_NE(e.message().find("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"), std::string::npos)
          << e.message();
      EXPECT_NE(e.message().find("this GPU keeps 2 resident"), std::string::npos);
      EXPECT_TRUE(device->launches.empty());
      continue;
    }
    ASSERT_FALSE(e) << e.message();
    EXPECT_EQ(spec.gridX, 3u);
    // Split by heads, the CTAs never wait for each other: every tile at
    // once, whatever the device holds.
    EXPECT_EQ(spec.gridY, rows);
    EXPECT_EQ(spec.cooperative, heads == 0);
    EXPECT_EQ(device->admitted, 1);
  }
}

TEST(CudaBackendTest, AMismatchedArgumentIsAnInternalError) {
  driver::Interface cell = interface(0, 0);
  CudaBackend backend(std::make_shared<RecordingDevice>(), "c", cell);
  std::vector<uint16_t> x(40);
  std::vector<driver::Arg> args(3);
  args[0].view = viewOf({x.data(), -1, Element::BF16}, {1, 10, 4});
  args[1].index = 0;
  args[2].index = 10;
  ASSERT_FALSE(backend.beginCall(nullptr, 0, nullptr));
  Status e = backend.launch(false, false, args, 10);
  backend.endCall();
  ASSERT_TRUE(e);
  EXPECT_NE(e.message().find("c_fwd: argument input x is f32, given bf16"), std::string::npos);
}

TEST(CudaBackendTest, AMixedGemmConvertsItsSecondOperandIntoTheWorkspace) {
  driver::Interface cell = interface(0, 0);
  auto device = std::make_shared<RecordingDevice>();
  CudaBackend backend(device, "c", cell);
  std::vector<uint16_t> a(6 * 8);
  std::vector<float> b(8 * 5), c(6 * 5);
  View va = viewOf({a.data(), -1, Element::BF16}, {6, 8});
  View vb = viewOf({b.data(), -1, Element::F32}, {8, 5});
  View vc = viewOf({c.data(), -1, Element::F32}, {6, 5});
  backend.beginDry();
  ASSERT_FALSE(backend.gemm(false, false, 6, 5, 8, va, 8, vb, 5, 0.0, vc, 5));
  ASSERT_FALSE(backend.endCall());
  int64_t needed = backend.used();
  // The GEMM library's workspace, then b in bf16.
  EXPECT_EQ(needed, CudaBackend::kGemmWorkspaceBytes + 256);
  EXPECT_TRUE(device->gemms.empty());
  std::vector<char> workspace(static_cast<size_t>(needed));
  ASSERT_FALSE(backend.beginCall(workspace.data(), needed, nullptr));
  ASSERT_FALSE(backend.gemm(false, false, 6, 5, 8, va, 8, vb, 5, 0.0, vc, 5));
  ASSERT_FALSE(backend.endCall());
  ASSERT_EQ(device->gemms.size(), 1u);
  EXPECT_EQ(device->gemms[0].ab, Element::BF16);
  EXPECT_EQ(device->gemms[0].ce, Element::F32);
  EXPECT_EQ(device->gemms[0].a, a.data());
  EXPECT_EQ(device->gemms[0].b, workspace.data() + CudaBackend::kGemmWorkspaceBytes);
  ASSERT_EQ(device->conversions.size(), 1u);
  EXPECT_EQ(device->conversions[0], std::make_pair(Element::F32, Element::BF16));
}

TEST(CudaBackendTest, AWeightIsConvertedOnceACallAndGemmsRunAsThePackageSays) {
  // A tf32 package for sm_90: cuBLAS's Hopper workspace, f32 products in
  // TF32, and the f32 weight converted to bf16 once for the call's three
  // GEMMs that read it beside bf16 sequences.
  driver::Interface cell = interface(0, 0);
  auto device = std::make_shared<RecordingDevice>();
  CudaBackend::Gemms gemms = CudaBackend::gemmsFor("sm_90", "tf32");
  EXPECT_EQ(gemms.workspaceBytes, int64_t(32) << 20);
  EXPECT_TRUE(gemms.tf32);
  EXPECT_EQ(CudaBackend::gemmsFor("sm_80", "ieee").workspaceBytes, int64_t(4) << 20);
  EXPECT_FALSE(CudaBackend::gemmsFor("sm_90", "ieee").tf32);
  CudaBackend backend(device, "c", cell, gemms);
  std::vector<uint16_t> a(6 * 8);
  std::vector<float> w(8 * 5), other(8 * 5), c(6 * 5);
  View va = viewOf({a.data(), -1, Element::BF16}, {6, 8});
  View vw = viewOf({w.data(), -1, Element::F32}, {8, 5});
  View vo = viewOf({other.data(), -1, Element::F32}, {8, 5});
  View vc = viewOf({c.data(), -1, Element::F32}, {6, 5});
  auto calls = [&] {
    for (const View *b : {&vw, &vo, &vw, &vw})
      if (Status e = backend.gemm(false, false, 6, 5, 8, va, 8, *b, 5, 0.0, vc, 5))
        return e;
    return Status();
  };
  backend.beginDry();
  ASSERT_FALSE(calls());
  ASSERT_FALSE(backend.endCall());
  int64_t needed = backend.used();
  // The workspace and two converted weights, not four.
  EXPECT_EQ(needed, (int64_t(32) << 20) + 2 * 256);
  std::vector<char> workspace(static_cast<size_t>(needed));
  ASSERT_FALSE(backend.beginCall(workspace.data(), needed, nullptr));
  ASSERT_FALSE(calls());
  ASSERT_FALSE(backend.endCall());
  ASSERT_EQ(device->conversions.size(), 2u);
  ASSERT_EQ(device->gemms.size(), 4u);
  EXPECT_EQ(device->gemms[0].b, device->gemms[2].b);
  EXPECT_EQ(device->gemms[0].b, device->gemms[3].b);
  EXPECT_NE(device->gemms[0].b, device->gemms[1].b);
  for (const auto &g : device->gemms) {
    EXPECT_TRUE(g.tf32);
    EXPECT_EQ(g.workspaceBytes, int64_t(32) << 20);
  }
  // A second call converts again: the conversions live for one call.
  ASSERT_FALSE(backend.beginCall(workspace.data(), needed, nullptr));
  ASSERT_FALSE(calls());
  ASSERT_FALSE(backend.endCall());
  EXPECT_EQ(device->conversions.size(), 4u);
}

TEST(CudaBackendTest, ColumnSumsRunInPartsOfRows) {
  driver::Interface cell = interface(0, 0);
  auto device = std::make_shared<RecordingDevice>();
  CudaBackend backend(device, "c", cell);
  std::vector<float> m(10000 * 3), acc(3);
  std::vector<char> workspace(1 << 16);
  ASSERT_FALSE(backend.beginCall(workspace.data(), int64_t(workspace.size()), nullptr));
  ASSERT_FALSE(backend.columnSums(viewOf({m.data(), -1, Element::F32}, {10000, 3}), 10000, 3,
                                  viewOf({acc.data(), -1, Element::F32}, {3})));
  ASSERT_FALSE(backend.endCall());
  // 10000 rows: 5 parts of 2000.
  ASSERT_EQ(device->columnParts.size(), 1u);
  EXPECT_EQ(device->columnParts[0], std::make_pair(int64_t(5), int64_t(2000)));
}

} // namespace

namespace {

/// An Elman cell's interface: x [T, B, 3], h [B, 4], W [4, 3].
driver::Interface elman() {
  driver::Interface cell = interface(0, 0);
  auto arg = [](ArgKind kind, std::string name, std::vector<int64_t> shape) {
    driver::KernelArg a;
    a.kind = kind;
    a.name = std::move(name);
    a.shape = std::move(shape);
    a.element = Element::F32;
    return a;
  };
  cell.forward.args = {arg(ArgKind::Input, "x", {-1, -1, 3}),
                       arg(ArgKind::InitialState, "h", {-1, 4}),
                       arg(ArgKind::StartState, "h", {-1, 4}),
                       arg(ArgKind::Param, "W", {4, 3}),
                       arg(ArgKind::StateHistory, "h", {-1, -1, 4}),
                       arg(ArgKind::Output, "h", {-1, -1, 4})};
  cell.backward.args = cell.forward.args;
  EXPECT_FALSE(cell.finish());
  return cell;
}

TEST(CudaBackendTest, ACallWhoseSizesOverflowIsAnErrorBeforeAnythingRuns) {
  driver::Interface cell = elman();
  auto device = std::make_shared<RecordingDevice>();
  auto backend = std::make_shared<CudaBackend>(device, "elman", cell);
  driver::SequenceDriver driver(cell, backend);
  // Views of sequences no machine holds: their data is never read.
  int64_t T = int64_t(1) << 32, B = int64_t(1) << 32;
  float data[16];
  auto view = [&](std::vector<int64_t> shape) {
    return viewOf({data, -1, Element::F32}, std::move(shape));
  };
  driver::Sequence seq;
  seq.steps = T;
  seq.batch = B;
  seq.inputs = {view({T, B, 3})};
  seq.params = {view({4, 3})};
  backend->beginDry();
  Status e = driver.forward(seq, {view({T, B, 4})}, {view({B, 4})},
                            driver::Recompute{}, nullptr);
  backend->endCall();
  ASSERT_TRUE(e);
  // h's history, start and gradients (4 x 4), x and its gradient (2 x 3),
  // the output and its gradient (2 x 4).
  EXPECT_EQ(e.message(), "the sizes overflow: T = 4294967296 steps of B = 4294967296 rows, at "
                         "the 30 values a row and step that a call's buffers hold, are more "
                         "bytes than int64 counts");
  EXPECT_TRUE(device->launches.empty());
  driver::MemoryPlan plan;
  e = driver::SequenceDriver::plan(cell, T, B, driver::Recompute{}, plan);
  ASSERT_TRUE(e);
  EXPECT_NE(e.message().find("the sizes overflow"), std::string::npos);
}

} // namespace

namespace {

TEST(CudaBackendTest, WhatTheGpuRefusesIsRefusedEverywhere) {
  // A product of f32 operands stored as bf16: cuBLAS's CUBLAS_COMPUTE_32F
  // has no such GEMM, so neither has the emulator.
  driver::Interface cell = interface(0, 0);
  auto device = std::make_shared<RecordingDevice>();
  CudaBackend backend(device, "c", cell);
  std::vector<float> a(4), b(4);
  std::vector<uint16_t> c(4);
  backend.beginDry();
  Status e = backend.gemm(false, false, 2, 2, 2, viewOf({a.data(), -1, Element::F32}, {2, 2}), 2,
                          viewOf({b.data(), -1, Element::F32}, {2, 2}), 2, 0.0,
                          viewOf({c.data(), -1, Element::BF16}, {2, 2}), 2);
  backend.endCall();
  ASSERT_TRUE(e);
  EXPECT_NE(e.message().find("a GEMM of f32 and f32 into bf16"), std::string::npos);
  // A grid's y holds at most 65535 rows; a persistent grid over more tiles
  // than that holds 65535 rows and its CTAs loop over the rest (split by
  // heads: none wait for another).
  driver::Interface persistent = interface(2, 2);
  CudaBackend tiled(device, "c", persistent);
  std::vector<float> x(4);
  std::vector<driver::Arg> args(3);
  args[0].view = viewOf({x.data(), -1, Element::F32}, {1, 1, 4});
  args[1].index = 0;
  args[2].index = 4 * 65536;
  ASSERT_FALSE(tiled.beginCall(nullptr, 0, nullptr));
  e = tiled.launch(false, false, args, 4 * 65536);
  tiled.endCall();
  ASSERT_FALSE(e) << e.message();
  ASSERT_FALSE(device->launches.empty());
  EXPECT_EQ(device->launches.back().gridY, 65535u);
}

} // namespace
