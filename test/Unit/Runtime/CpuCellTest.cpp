//===- CpuCellTest.cpp - The CPU runtime against the reference ------------===//
//
// Runs cells through the CPU runtime (BLAS projections and weight gradients,
// JIT-compiled recurrent kernels, batch tiles on threads) in every recompute
// mode, and compares outputs, final states and every gradient with the
// reference interpreter, whose gradients match finite differences.
//
//===----------------------------------------------------------------------===//

#include "Support/Reference.h"
#include "Support/TestCells.h"
#include "jit/CpuJit.h"

#include "gtest/gtest.h"

using namespace cellc;
using namespace cellc::testing;
using namespace cellc::runtime;
using namespace cellc::jit;

namespace {





std::string source(const std::string &name) {
  if (name == "peephole")
    return kPeephole;
  if (name == "mgu")
    return kMgu;
  if (name == "two")
    return kTwo;
  if (name == "indrnn")
    return kIndRnn;
  if (name == "tied")
    return kTied;
  if (name == "groupnorm")
    return kGroupNorm;
  return readExample((name + ".cell").c_str());
}

/// Data in the runtime's layout, for a batch of reference problems.
struct Batch {
  int64_t T, B;
  bool f32;
  std::vector<std::vector<double>> inputs, params, states;
  std::vector<std::vector<double>> outputWeights, finalWeights;
  std::vector<uint8_t> resets;

  template <typename E>
  static std::vector<E> cast(const std::vector<double> &v) {
    return std::vector<E>(v.begin(), v.end());
  }
};

/// Runs one configuration and checks it; returns the gradients for
/// comparisons across configurations.
struct Result {
  std::vector<std::vector<double>> outputs, finals, dInputs, dParams, dInitial;
  int64_t savedBytes = 0;
};

/// Two runs' results are the same, bit for bit.
void expectSameResults(const Result &a, const Result &b) {
  EXPECT_EQ(a.outputs, b.outputs);
  EXPECT_EQ(a.finals, b.finals);
  EXPECT_EQ(a.dInputs, b.dInputs);
  EXPECT_EQ(a.dInitial, b.dInitial);
  EXPECT_EQ(a.dParams, b.dParams);
}

template <typename E>
Result runCell(CpuCell &cell, SequenceProblem &first,
               std::vector<std::unique_ptr<SequenceProblem>> &samples,
               const std::vector<std::vector<bool>> &resets, int64_t T,
               Recompute mode, const std::vector<int64_t> &lengths = {},
               bool outputsOutliveSaved = false) {
  int64_t B = samples.size();
  Compiled &ref = first.c;
  auto names = [](ArrayAttr a, StringRef n) {
    for (auto [i, x] : llvm::enumerate(a))
      if (cast<StringAttr>(x).getValue() == n)
        return i;
    return size_t(0);
  };
  // Inputs [T, B, n].
  std::vector<std::vector<E>> inputs, params, initial;
  for (const Slot &slot : cell.inputs()) {
    size_t k = names(ref.def.getInputNames(), slot.name);
    std::vector<E> v(T * B * slot.shape[0]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < slot.shape[0]; ++j)
          v[(t * B + b) * slot.shape[0] + j] = samples[b]->point.inputs[t][k][j];
    inputs.push_back(v);
  }
  for (const Slot &slot : cell.params())
    params.push_back(Batch::cast<E>(first.point.params.at(slot.name)));
  for (const Slot &slot : cell.states()) {
    size_t k = names(ref.def.getStateNames(), slot.name);
    std::vector<E> v(B * slot.shape[0]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < slot.shape[0]; ++j)
        v[b * slot.shape[0] + j] = samples[b]->point.states[k][j];
    initial.push_back(v);
  }
  std::vector<uint8_t> resetBytes(T * B);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      resetBytes[t * B + b] = resets[b][t];

  CpuCell::Sequence seq;
  for (auto [i, slot] : llvm::enumerate(cell.inputs()))
    seq.inputs.push_back({inputs[i].data(), {T, B, slot.shape[0]}});
  for (auto [i, slot] : llvm::enumerate(cell.params()))
    seq.params.push_back({params[i].data(), slot.shape});
  for (auto [i, slot] : llvm::enumerate(cell.states()))
    seq.initialStates.push_back({initial[i].data(), {B, slot.shape[0]}});
  seq.resets = resetBytes.data();
  seq.lengths = lengths;
  seq.outputsOutliveSaved = outputsOutliveSaved;

  std::vector<std::vector<E>> outputs, finals, dOut, dFinal, dIn, dPar, dInit;
  std::vector<Array> outArrays, finalArrays, dOutArrays, dFinalArrays, dInArrays,
      dParArrays, dInitArrays;
  for (const Slot &slot : cell.outputs()) {
    size_t o = names(ref.def.getOutputNames(), slot.name);
    outputs.emplace_back(T * B * slot.shape[0]);
    std::vector<E> w(T * B * slot.shape[0]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < slot.shape[0]; ++j)
          w[(t * B + b) * slot.shape[0] + j] = samples[b]->outputWeights[t][o][j];
    dOut.push_back(w);
  }
  for (const Slot &slot : cell.states()) {
    size_t k = names(ref.def.getStateNames(), slot.name);
    finals.emplace_back(B * slot.shape[0]);
    std::vector<E> w(B * slot.shape[0]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < slot.shape[0]; ++j)
        w[b * slot.shape[0] + j] = samples[b]->finalWeights[k][j];
    dFinal.push_back(w);
    dInit.emplace_back(B * slot.shape[0]);
  }
  for (const Slot &slot : cell.inputs())
    dIn.emplace_back(T * B * slot.shape[0]);
  for (const Slot &slot : cell.params())
    dPar.emplace_back(first.point.params.at(slot.name).size());
  for (auto [i, slot] : llvm::enumerate(cell.outputs())) {
    outArrays.push_back({outputs[i].data(), {T, B, slot.shape[0]}});
    dOutArrays.push_back({dOut[i].data(), {T, B, slot.shape[0]}});
  }
  for (auto [i, slot] : llvm::enumerate(cell.states())) {
    finalArrays.push_back({finals[i].data(), {B, slot.shape[0]}});
    dFinalArrays.push_back({dFinal[i].data(), {B, slot.shape[0]}});
    dInitArrays.push_back({dInit[i].data(), {B, slot.shape[0]}});
  }
  for (auto [i, slot] : llvm::enumerate(cell.inputs()))
    dInArrays.push_back({dIn[i].data(), {T, B, slot.shape[0]}});
  for (auto [i, slot] : llvm::enumerate(cell.params()))
    dParArrays.push_back({dPar[i].data(), slot.shape});

  SavedPtr saved;
  Result r;
  llvm::Error fwd = errorOf(cell.forward(seq, outArrays, finalArrays, mode, &saved));
  EXPECT_FALSE(static_cast<bool>(fwd)) << llvm::toString(std::move(fwd));
  if (!saved)
    return r;
  r.savedBytes = CpuCell::savedBytes(*saved);
  llvm::Error bwd = errorOf(cell.backward(seq, *saved, dOutArrays, dFinalArrays,
                                  dInArrays, dParArrays, dInitArrays));
  EXPECT_FALSE(static_cast<bool>(bwd)) << llvm::toString(std::move(bwd));
  auto toDouble = [](std::vector<std::vector<E>> &v) {
    std::vector<std::vector<double>> d;
    for (auto &x : v)
      d.emplace_back(x.begin(), x.end());
    return d;
  };
  r.outputs = toDouble(outputs);
  r.finals = toDouble(finals);
  r.dInputs = toDouble(dIn);
  r.dParams = toDouble(dPar);
  r.dInitial = toDouble(dInit);
  return r;
}

/// Compares a runtime result with the reference, sample by sample.
/// Expects two runs to agree within `tolerance` (relative, at least 1):
/// outputs, final states and every gradient.
void expectSameResults(const Result &got, const Result &want, double tolerance) {
  for (auto [what, a, b] : {std::tuple{"outputs", &got.outputs, &want.outputs},
                            std::tuple{"final states", &got.finals, &want.finals},
                            std::tuple{"input gradients", &got.dInputs, &want.dInputs},
                            std::tuple{"param gradients", &got.dParams, &want.dParams},
                            std::tuple{"initial-state gradients", &got.dInitial,
                                       &want.dInitial}}) {
    ASSERT_EQ(a->size(), b->size()) << what;
    for (size_t i = 0; i < a->size(); ++i)
      for (size_t j = 0; j < (*a)[i].size(); ++j)
        EXPECT_NEAR((*a)[i][j], (*b)[i][j], tolerance * std::max(1.0, std::fabs((*b)[i][j])))
            << what << " " << i << "[" << j << "]";
  }
}

void compareWithReference(CpuCell &cell, Compiled &ref,
                          std::vector<std::unique_ptr<SequenceProblem>> &samples,
                          const std::vector<std::vector<bool>> &resets,
                          int64_t T, const Result &r, double tol) {
  int64_t B = samples.size();
  auto near = [&](double got, double want, const std::string &what) {
    EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want)))
        << what << ": runtime " << got << ", reference " << want;
  };
  auto names = [](ArrayAttr a, StringRef n) {
    for (auto [i, x] : llvm::enumerate(a))
      if (cast<StringAttr>(x).getValue() == n)
        return i;
    return size_t(0);
  };
  ParamValues wantParams;
  for (int64_t b = 0; b < B; ++b) {
    // Forward, by the interpreter.
    const Point &p = samples[b]->point;
    CellInterpreter interp(p.params);
    std::vector<Tensor> state = p.states;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<Tensor> args = p.inputs[t];
      for (size_t s = 0; s < state.size(); ++s)
        args.push_back(resets[b][t] ? p.states[s] : state[s]);
      std::vector<Tensor> res = interp.run(ref.def.getBody().front(), args);
      for (size_t s = 0; s < state.size(); ++s)
        state[s] = res[s];
      for (auto [i, slot] : llvm::enumerate(cell.outputs())) {
        size_t o = names(ref.def.getOutputNames(), slot.name);
        for (int64_t j = 0; j < slot.shape[0]; ++j)
          near(r.outputs[i][(t * B + b) * slot.shape[0] + j],
               res[state.size() + o][j], "output " + slot.name);
      }
    }
    for (auto [i, slot] : llvm::enumerate(cell.states())) {
      size_t k = names(ref.def.getStateNames(), slot.name);
      for (int64_t j = 0; j < slot.shape[0]; ++j)
        near(r.finals[i][b * slot.shape[0] + j], state[k][j], "final " + slot.name);
    }
    // Gradients.
    Point g = samples[b]->gradient(/*saved=*/false);
    for (auto [i, slot] : llvm::enumerate(cell.states())) {
      size_t k = names(ref.def.getStateNames(), slot.name);
      for (int64_t j = 0; j < slot.shape[0]; ++j)
        near(r.dInitial[i][b * slot.shape[0] + j], g.states[k][j],
             "d initial " + slot.name);
    }
    for (auto [i, slot] : llvm::enumerate(cell.inputs())) {
      size_t k = names(ref.def.getInputNames(), slot.name);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < slot.shape[0]; ++j)
          near(r.dInputs[i][(t * B + b) * slot.shape[0] + j], g.inputs[t][k][j],
               "d input " + slot.name);
    }
    for (auto &[n, v] : g.params)
      addTo(wantParams[n], v);
  }
  for (auto [i, slot] : llvm::enumerate(cell.params()))
    for (size_t j = 0; j < r.dParams[i].size(); ++j)
      near(r.dParams[i][j], wantParams[slot.name][j],
           "d param " + slot.name + "[" + std::to_string(j) + "]");
}

struct Problems {
  std::unique_ptr<Compiled> ref;
  std::vector<std::unique_ptr<SequenceProblem>> samples;
  std::vector<std::vector<bool>> resets;
};

Problems makeProblems(const std::string &src, const SizeBindings &sizes, int64_t T,
                int64_t B) {
  Problems s;
  s.ref = compile(src, sizes);
  EXPECT_TRUE(s.ref->module) << s.ref->diagnostics;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<bool> r(T, false);
    // Resets in the middle, at a different step per row; some rows none.
    if (T > 2 && b % 3 != 2)
      r[1 + (b % (T - 1))] = true;
    s.resets.push_back(r);
    s.samples.push_back(std::make_unique<SequenceProblem>(*s.ref, T, r, 500 + b));
    s.samples[b]->point.params = s.samples[0]->point.params;
  }
  return s;
}

// G, D and NH: the blocks of block_gru and slstm.
const SizeBindings kSizes = {{"H", 5}, {"I", 3}, {"G", 2}, {"D", 3}, {"NH", 2}};

class CpuCellTest
    : public ::testing::TestWithParam<std::tuple<const char *, const char *>> {
protected:
  /// The parameters' cell and mode, and reference problems over T x B.
  const char *name = std::get<0>(GetParam());
  static constexpr int64_t T = 6, B = 5;
  Problems s = makeProblems(source(name), kSizes, T, B);
  Recompute mode = llvm::cantFail(parseRecompute(std::get<1>(GetParam())));

  /// The cell compiled in f64 with `options`, run on the problems and
  /// checked against the reference (null after a failure).
  std::unique_ptr<CpuCell> checked(const CpuOptions &options, Result &r) {
    auto cell = compileCpu(source(name), "t.cell", kSizes, DType::F64, options);
    EXPECT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
    if (!cell)
      return nullptr;
    r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
    compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 1e-10);
    return std::move(*cell);
  }
};

/// Per-sample lengths for B = 5 rows over T = 6 steps: unsorted, where every
/// row runs; and longest first, where only the samples still running do.
const std::vector<std::vector<int64_t>> kLengths = {{3, 6, 0, 5, 1}, {6, 5, 3, 3, 0}};

/// The default (batched) kernels' results with each of kLengths: what the
/// other kernels and configs must give with them (test_lengths.py checks
/// these against torch, sample by sample).
void runWithLengths(const char *name, Problems &s, int64_t T, Recompute mode,
                    std::vector<Result> &out) {
  auto batched = compileCpu(source(name), "t.cell", kSizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(batched)) << llvm::toString(batched.takeError());
  for (const std::vector<int64_t> &l : kLengths)
    out.push_back(runCell<double>(**batched, *s.samples[0], s.samples, s.resets, T, mode,
                                  l));
}

} // namespace

TEST_P(CpuCellTest, MatchesTheReferenceInDoublePrecision) {
  auto cell = compileCpu(source(name), "t.cell", kSizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    (*cell)->setThreads(threads);
    Result r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
    compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 1e-10);
  }
}

/// With fewer batch tiles than threads, the threads of a tile split its
/// units (unit slices): every element loop, product and packing by slice,
/// and a sum's rows, meeting at barriers. On 2 and 3 threads (B = 5 in one
/// tile; H = 5 in f64 vectors of 4: slices of no vector, one, and the tail;
/// 4H = 20 gate rows in panels of 8) against the reference, with resets and
/// with per-sample lengths against one thread; and the same with slices
/// off, where the threads split the rows.
TEST_P(CpuCellTest, UnitSlicesMatchTheReference) {
  std::vector<Result> withLengths;
  ASSERT_NO_FATAL_FAILURE(runWithLengths(name, s, T, mode, withLengths));
  auto cell = compileCpu(source(name), "t.cell", kSizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
  for (int threads : {2, 3})
    for (bool slices : {true, false}) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + (slices ? " unit" : " row") +
                   " slices");
      (*cell)->setThreads(threads);
      (*cell)->setUnitSlices(slices);
      // A cell with no recurrent product (IndRNN) runs one-row tiles: five
      // tiles, which the threads split by rows either way.
      bool oneTile = (*cell)->package().interface.forward.batchTile >= B;
      auto split = (*cell)->threadSplit(B);
      EXPECT_EQ(split.first, slices && oneTile ? 1 : threads);
      EXPECT_EQ(split.second, slices && oneTile ? threads : 1);
      Result r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
      compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 1e-10);
      for (size_t k = 0; k < kLengths.size(); ++k) {
        SCOPED_TRACE(k ? "lengths longest first" : "lengths unsorted");
        expectSameResults(runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T,
                                          mode, kLengths[k]),
                          withLengths[k], 1e-12);
      }
    }
}

TEST_P(CpuCellTest, MatchesTheReferenceInSinglePrecision) {
  auto cell = compileCpu(source(name), "t.cell", kSizes, DType::F32, {2});
  ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
  Result r = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
  compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 3e-4);
}

/// The batched kernels (the CPU's default) where their loops have edges, in
/// f64 against the reference and against the per-row kernels:
/// - tiles of 2 and 3 rows over B = 5: a partial last tile;
/// - register blocks of 3 rows by 1 vector and 2 by 2: rows left over in
///   blocks of 2 and 1, and the weights' zero columns past the last panel;
/// - 4 lanes over H = 5: one vector and a unit left over, and 8 lanes: none.
/// The default block (the host's) and 2 threads run in the first config.
TEST_P(CpuCellTest, BatchedKernelsMatchTheReferenceAndThePerRowKernels) {
  CpuOptions perRow;
  perRow.kernels = CpuOptions::Kernels::PerRow;
  perRow.threads = 1;
  auto reference = compileCpu(source(name), "t.cell", kSizes, DType::F64, perRow);
  ASSERT_TRUE(static_cast<bool>(reference)) << llvm::toString(reference.takeError());
  Result want = runCell<double>(**reference, *s.samples[0], s.samples, s.resets, T, mode);
  compareWithReference(**reference, *s.ref, s.samples, s.resets, T, want, 1e-10);
  struct Config {
    const char *what;
    int64_t tile, rows, vectors, lanes;
    int threads;
  };
  for (Config c : {Config{"tile 64, the host's block, 2 threads", 0, 0, 0, 0, 2},
                   Config{"tile 2, block 3x1, 4 lanes", 2, 3, 1, 4, 1},
                   Config{"tile 3, block 2x2, 8 lanes", 3, 2, 2, 8, 1}}) {
    SCOPED_TRACE(c.what);
    CpuOptions options;
    options.kernels = CpuOptions::Kernels::Batched;
    options.threads = c.threads;
    options.batchTile = c.tile;
    options.productRows = c.rows;
    options.productVectors = c.vectors;
    options.vectorWidth = c.lanes;
    Result r;
    ASSERT_TRUE(checked(options, r));
    expectSameResults(r, want, 1e-12);
  }
}

/// The kernels that CUDA runs, emulated on the host: the same element code,
/// phases and buffers, with a CTA's threads run one after another.
/// - Batch-tiled, tiles of 2 and 4 rows over B = 5: a partial last tile.
/// - Persistent, 1 and 3 CTAs per tile of 2 rows: the CTAs split every loop
///   and every matvec's rows unevenly (for H = 5: slices of 2, 2 and 1
///   elements; of 7, 7 and 6 gate rows), read their weights from slices
///   cached before the time loop, and exchange states and products through
///   the workspace.
/// Then with the driver's per-sample lengths, against the batched kernels
/// (checked against torch per sample in test_lengths.py): unsorted, where
/// every row runs; and longest first, where only the samples still running
/// do (b_end below B, in partial tiles and across the CTAs).
TEST_P(CpuCellTest, GpuKernelsEmulatedMatchTheReference) {
  std::vector<Result> withLengths;
  ASSERT_NO_FATAL_FAILURE(runWithLengths(name, s, T, mode, withLengths));
  struct Config {
    const char *what;
    int64_t tile, ctas;
    bool persistent;
  };
  for (Config c : {Config{"batch-tiled, 2 rows", 2, 0, false},
                   Config{"batch-tiled, 4 rows", 4, 0, false},
                   Config{"persistent, 1 CTA", 2, 1, true},
                   Config{"persistent, 3 CTAs", 2, 3, true}}) {
    SCOPED_TRACE(c.what);
    CpuOptions options;
    options.threads = 2;
    options.batchTiled = true;
    options.batchTile = c.tile;
    options.persistent = c.persistent;
    options.ctas = c.ctas;
    Result r;
    std::unique_ptr<CpuCell> cell = checked(options, r);
    ASSERT_TRUE(cell);
    for (size_t k = 0; k < kLengths.size(); ++k) {
      SCOPED_TRACE(k ? "lengths longest first" : "lengths unsorted");
      expectSameResults(runCell<double>(*cell, *s.samples[0], s.samples, s.resets, T, mode,
                                        kLengths[k]),
                        withLengths[k], 1e-10);
    }
  }
}

/// The driver's pieces: the forward's projections, and the backward with its
/// projections, output gradients and gradient GEMMs, over pieces of one step
/// (1 row a piece) and of two (10 rows), against the reference and, with
/// lengths, against one piece; each with outputs that are states kept as
/// their histories (what Python asks for) and without.
TEST_P(CpuCellTest, PiecesMatchTheReference) {
  std::vector<Result> withLengths;
  ASSERT_NO_FATAL_FAILURE(runWithLengths(name, s, T, mode, withLengths));
  int64_t copied = 0;
  for (int64_t rows : {1, 10}) {
    CpuOptions options;
    options.pieceRows = rows;
    options.threads = 2;
    auto cell = compileCpu(source(name), "t.cell", kSizes, DType::F64, options);
    ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
    for (bool keep : {false, true}) {
      SCOPED_TRACE("rows a piece " + std::to_string(rows) +
                   (keep ? ", outputs kept" : ", outputs copied"));
      Result r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T, mode,
                                 {}, keep);
      compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 1e-10);
      if (!keep)
        copied = r.savedBytes;
      // An output that is a state (each of these cells has one) is not kept
      // twice in none and full; chunk:K keeps states before chunks only.
      if (keep && mode.kind != Recompute::Kind::Chunk)
        EXPECT_LT(r.savedBytes, copied);
      else
        EXPECT_EQ(r.savedBytes, copied);
      for (size_t k = 0; k < kLengths.size(); ++k) {
        SCOPED_TRACE(k ? "lengths longest first" : "lengths unsorted");
        expectSameResults(runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T,
                                          mode, kLengths[k], keep),
                          withLengths[k], 1e-12);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cells, CpuCellTest,
    ::testing::Combine(::testing::Values("lstm", "gru", "elman", "peephole",
                                         "mgu", "two", "indrnn", "peephole_lstm",
                                         "layernorm_lstm", "rmsnorm_gru", "block_gru",
                                         "slstm", "antisymmetric", "tied", "groupnorm"),
                       ::testing::Values("none", "full", "chunk:2", "chunk:4")));

/// The autotuner's per-row knobs: the recurrent matvec in pieces of 2 and 4
/// lanes, 2 and 4 rows at a time, forward and replaying backward.
TEST(CpuCellKnobs, MatvecWidthAndUnrollMatchTheReference) {
  const int64_t T = 5, B = 3;
  const SizeBindings sizes = {{"H", 4}, {"I", 3}};
  for (const char *name : {"lstm", "gru", "elman", "peephole", "mgu", "two", "indrnn"}) {
    Problems s = makeProblems(source(name), sizes, T, B);
    for (int64_t knob : {2, 4}) {
      SCOPED_TRACE(std::string(name) + " width/unroll " + std::to_string(knob));
      CpuOptions options;
      options.kernels = CpuOptions::Kernels::PerRow;
      options.threads = 2;
      options.matvecWidth = knob;
      options.matvecUnroll = knob;
      auto cell = compileCpu(source(name), "t.cell", sizes, DType::F64, options);
      ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
      for (const char *modeText : {"none", "full"}) {
        auto mode = parseRecompute(modeText);
        ASSERT_TRUE(static_cast<bool>(mode));
        Result r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, T, *mode);
        compareWithReference(**cell, *s.ref, s.samples, s.resets, T, r, 1e-10);
      }
    }
  }
}

/// A knob that does not divide the weights is an error that names it.
TEST(CpuCellKnobs, AWidthThatDoesNotDivideIsAnError) {
  CpuOptions options;
  options.kernels = CpuOptions::Kernels::PerRow;
  options.matvecWidth = 3;
  auto cell = compileCpu(source("lstm"), "t.cell", {{"H", 4}, {"I", 3}},
                               DType::F32, options);
  ASSERT_FALSE(static_cast<bool>(cell));
  std::string message = llvm::toString(cell.takeError());
  EXPECT_NE(message.find("matvec-width=3"), std::string::npos) << message;
}

TEST(CpuCellModes, AllModesGiveTheSameGradients) {
  const int64_t T = 9, B = 3;
  Problems s = makeProblems(source("lstm"), kSizes, T, B);
  auto cell = compileCpu(source("lstm"), "lstm.cell", kSizes, DType::F32, {2});
  ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
  Result none = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                               *parseRecompute("none"));
  for (const char *m : {"full", "chunk:1", "chunk:3", "chunk:4", "chunk:20"}) {
    SCOPED_TRACE(m);
    Result other = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                                  *parseRecompute(m));
    auto same = [](const std::vector<std::vector<double>> &a,
                   const std::vector<std::vector<double>> &b) {
      for (size_t i = 0; i < a.size(); ++i)
        for (size_t j = 0; j < a[i].size(); ++j)
          EXPECT_LE(std::fabs(a[i][j] - b[i][j]), 1e-6 * std::max(1.0, std::fabs(a[i][j])))
              << i << "[" << j << "]";
    };
    same(none.outputs, other.outputs);
    same(none.dParams, other.dParams);
    same(none.dInputs, other.dInputs);
    same(none.dInitial, other.dInitial);
  }
}

TEST(CpuCellModes, ThreadsDoNotChangeTheResult) {
  const int64_t T = 4, B = 7;
  Problems s = makeProblems(source("gru"), kSizes, T, B);
  std::vector<Result> results;
  auto cell = compileCpu(source("gru"), "gru.cell", kSizes, DType::F32);
  ASSERT_TRUE(static_cast<bool>(cell));
  for (int threads : {1, 2, 3}) {
    (*cell)->setThreads(threads);
    results.push_back(runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                                     *parseRecompute("full")));
  }
  for (size_t i = 1; i < results.size(); ++i)
    expectSameResults(results[0], results[i]);
}

/// Unit slices where each slice has several vectors and the tiles are
/// fewer than the threads but more than one: B = 11 in tiles of 4 (3 tiles)
/// on 7 threads is 3 groups of 2 slices; B = 3 in one tile on 3 threads, 3
/// slices. H = 37 in f32 vectors of 8 (4 vectors and 5 units left over),
/// 148 gate rows in panels of 16; layernorm_lstm's sums split by rows.
/// Results equal one thread's, bit for bit, and match the reference.
TEST(CpuCellModes, UnitSlicesWithManyVectorsAndGroups) {
  struct Case {
    int64_t B, tile;
    int threads;
    int64_t groups, slices;
  };
  for (const char *name : {"lstm", "layernorm_lstm"})
    for (Case c : {Case{11, 4, 7, 3, 2}, Case{3, 0, 3, 1, 3}}) {
      SCOPED_TRACE(std::string(name) + " B=" + std::to_string(c.B));
      const int64_t T = 5;
      SizeBindings sizes = {{"H", 37}, {"I", 6}};
      Problems s = makeProblems(source(name), sizes, T, c.B);
      CpuOptions options;
      options.batchTile = c.tile;
      options.vectorWidth = 8;
      auto cell = compileCpu(source(name), "t.cell", sizes, DType::F32, options);
      ASSERT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
      for (const char *m : {"none", "full", "chunk:2"}) {
        SCOPED_TRACE(m);
        Recompute mode = *parseRecompute(m);
        (*cell)->setThreads(1);
        Result one = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
        (*cell)->setThreads(c.threads);
        auto split = (*cell)->threadSplit(c.B);
        EXPECT_EQ(split.first, c.groups);
        EXPECT_EQ(split.second, c.slices);
        Result many = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T, mode);
        compareWithReference(**cell, *s.ref, s.samples, s.resets, T, many, 3e-4);
        expectSameResults(one, many);
      }
    }
}

/// A profiling build counts, for each slice of the group, the cycles it
/// worked before each barrier and waited in it; it computes what the plain
/// build computes, bit for bit. B = 3 in one tile on 3 threads: 3 slices.
TEST(CpuCellProfile, EverySliceCountsItsPhasesAndResultsDoNotChange) {
  const int64_t T = 5, B = 3;
  SizeBindings sizes = {{"H", 37}, {"I", 6}};
  Problems s = makeProblems(source("lstm"), sizes, T, B);
  CpuOptions options;
  options.vectorWidth = 8;
  options.threads = 3;
  auto plain = compileCpu(source("lstm"), "lstm.cell", sizes, DType::F32, options);
  options.profilePhases = true;
  auto profiled = compileCpu(source("lstm"), "lstm.cell", sizes, DType::F32, options);
  ASSERT_TRUE(static_cast<bool>(plain) && static_cast<bool>(profiled));
  ASSERT_EQ((*profiled)->threadSplit(B), std::make_pair(int64_t(1), int64_t(3)));
  for (const char *m : {"none", "full", "chunk:2"}) {
    SCOPED_TRACE(m);
    Recompute mode = *parseRecompute(m);
    (*profiled)->resetPhaseProfile();
    Result want = runCell<float>(**plain, *s.samples[0], s.samples, s.resets, T, mode);
    Result got = runCell<float>(**profiled, *s.samples[0], s.samples, s.resets, T, mode);
    compareWithReference(**profiled, *s.ref, s.samples, s.resets, T, got, 3e-4);
    expectSameResults(want, got);
    EXPECT_TRUE((*plain)->phaseProfile(false).threads.empty());
    for (bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      const driver::PhaseProfile &p = (*profiled)->phaseProfile(backward);
      std::vector<std::string> sites = {"pack", "states", "phase 1 products",
                                        "phase 1 elements"};
      if (backward)
        sites.insert(sites.end(), {"phase 2 products", "phase 2 elements"});
      EXPECT_EQ(p.sites, sites);
      EXPECT_GE(p.launches, 1);
      ASSERT_EQ(p.threads.size(), 3u);
      for (int64_t k = 0; k < 3; ++k) {
        const driver::PhaseProfile::Thread &t = p.threads[k];
        EXPECT_EQ(t.group, 0);
        EXPECT_EQ(t.slice, k);
        ASSERT_EQ(t.cycles.size(), sites.size());
        // Every slice computes its part of the element loops that write
        // the states (the forward's phase 1, the backward's phase 2).
        EXPECT_GT(t.cycles[backward ? 5 : 3][0], 0u);
      }
    }
  }
  (*profiled)->resetPhaseProfile();
  EXPECT_TRUE((*profiled)->phaseProfile(true).threads.empty());
  EXPECT_EQ((*profiled)->phaseProfile(true).launches, 0);
}

TEST(CpuCellShapes, OneStepOneRowAndOddSizes) {
  struct Case {
    int64_t T, B, H;
  };
  for (Case c : {Case{1, 1, 7}, Case{3, 1, 33}, Case{1, 5, 7}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " B=" + std::to_string(c.B) +
                 " H=" + std::to_string(c.H));
    SizeBindings sizes = {{"H", c.H}, {"I", 4}};
    Problems s = makeProblems(source("lstm"), sizes, c.T, c.B);
    for (auto kernels : {CpuOptions::Kernels::Batched,
                         CpuOptions::Kernels::PerRow}) {
      CpuOptions options;
      options.threads = 2;
      options.kernels = kernels;
      auto cell = compileCpu(source("lstm"), "lstm.cell", sizes, DType::F64,
                                   options);
      ASSERT_TRUE(static_cast<bool>(cell));
      for (const char *m : {"none", "full", "chunk:2"}) {
        Result r = runCell<double>(**cell, *s.samples[0], s.samples, s.resets, c.T,
                                   *parseRecompute(m));
        compareWithReference(**cell, *s.ref, s.samples, s.resets, c.T, r, 1e-10);
      }
    }
  }
}

TEST(CpuCellMemory, FullKeepsLessThanAThirdOfNone) {
  SizeBindings sizes = {{"H", 64}, {"I", 32}};
  const int64_t T = 16, B = 4;
  Problems s = makeProblems(source("lstm"), sizes, T, B);
  auto cell = compileCpu(source("lstm"), "lstm.cell", sizes, DType::F32, {1});
  ASSERT_TRUE(static_cast<bool>(cell));
  int64_t none = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                                *parseRecompute("none")).savedBytes;
  int64_t full = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                                *parseRecompute("full")).savedBytes;
  int64_t chunk = runCell<float>(**cell, *s.samples[0], s.samples, s.resets, T,
                                 *parseRecompute("chunk:8")).savedBytes;
  // h and c; then the four gates and tanh(c) on top.
  EXPECT_NEAR(double(full) / none, 2.0 / 7.0, 0.01);
  EXPECT_LT(chunk, full / 4);
  EXPECT_GE(full, 2 * T * B * 64 * 4);
}
