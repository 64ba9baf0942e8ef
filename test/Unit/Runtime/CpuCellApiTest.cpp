//===- CpuCellApiTest.cpp - The CPU runtime's interface -------------------===//
//
// What the CPU runtime promises beyond matching the reference: errors, not
// crashes, for bad cells and buffers; gradients that agree with finite
// differences of the runtime itself; batch-first as the transpose of
// time-major; matrix states in their declared dims; the one-step kernels as
// the forward step by step, with packed weights that follow the params.
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

TEST(CpuCellErrors, BadCellsAndBadBuffersAreErrorsNotCrashes) {
  auto bad = compileCpu("cell t { state h: [H]\n h = q }", "t.cell",
                              {{"H", 4}}, DType::F32);
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_NE(llvm::toString(bad.takeError()).find("t.cell:2:6: error: unknown name 'q'"),
            std::string::npos);

  auto mode = parseRecompute("chunk:0");
  ASSERT_FALSE(static_cast<bool>(mode));
  EXPECT_NE(llvm::toString(mode.takeError()).find("recompute must be 'none', 'full' or 'chunk:K' with K > 0, not 'chunk:0'"),
            std::string::npos);

  auto cell = compileCpu(readExample("elman.cell"), "elman.cell",
                               {{"H", 4}, {"I", 3}}, DType::F32);
  ASSERT_TRUE(static_cast<bool>(cell));
  std::vector<float> x(2 * 3 * 3), wih(4 * 3), whh(16), bih(4), bhh(4);
  std::vector<float> out(2 * 3 * 4), fin(3 * 4);
  CpuCell::Sequence seq;
  seq.inputs = {{x.data(), {2, 3, 3}}};
  seq.params = {{wih.data(), {4, 3}}, {whh.data(), {4, 4}},
                {bih.data(), {4}}, {bhh.data(), {4}}};
  std::vector<Array> outs = {{out.data(), {2, 3, 4}}};
  std::vector<Array> finals = {{fin.data(), {3, 4}}};
  auto expectError = [&](const std::string &what) {
    llvm::Error e = errorOf((*cell)->forward(seq, outs, finals, {}, nullptr));
    ASSERT_TRUE(static_cast<bool>(e));
    std::string message = llvm::toString(std::move(e));
    EXPECT_NE(message.find(what), std::string::npos) << message;
  };
  {
    llvm::Error ok = errorOf((*cell)->forward(seq, outs, finals, {}, nullptr));
    EXPECT_FALSE(static_cast<bool>(ok)) << llvm::toString(std::move(ok));
  }
  seq.params[1].shape = {4, 3};
  expectError("param 'W_hh' has shape [4, 3], expected [4, 4]");
  seq.params[1].shape = {4, 4};
  seq.params[2].data = nullptr;
  expectError("no tensor for param 'b_ih'");
  seq.params[2].data = bih.data();
  seq.inputs[0].data = reinterpret_cast<char *>(x.data()) + 1;
  expectError("input 'x' is not aligned to its 4-byte elements");
  seq.inputs[0].data = x.data();
  outs[0].shape = {2, 3, 5};
  expectError("output 'h' has shape [2, 3, 5], expected [2, 3, 4]");
  outs[0].shape = {2, 3, 4};
  seq.params.pop_back();
  expectError("expected 4 params, got 3");
}

namespace {
/// An LSTM problem held as plain arrays in the runtime's time-major layout.
struct RawLstm {
  int64_t T = 4, B = 3, H = 5, I = 3;
  std::vector<double> x, wih, whh, bih, bhh, h0, c0, wOut, wH, wC;
  std::vector<uint8_t> resets;
  RawLstm() {
    std::mt19937 rng(9);
    std::uniform_real_distribution<double> d(-1, 1);
    auto fill = [&](std::vector<double> &v, int64_t n) {
      v.resize(n);
      for (double &e : v)
        e = d(rng);
    };
    fill(x, T * B * I);
    fill(wih, 4 * H * I);
    fill(whh, 4 * H * H);
    fill(bih, 4 * H);
    fill(bhh, 4 * H);
    fill(h0, B * H);
    fill(c0, B * H);
    fill(wOut, T * B * H);
    fill(wH, B * H);
    fill(wC, B * H);
    resets.assign(T * B, 0);
    resets[2 * B + 1] = 1; // row 1 restarts at t = 2
  }
  CpuCell::Sequence sequence() {
    CpuCell::Sequence seq;
    seq.inputs = {{x.data(), {T, B, I}}};
    seq.params = {{wih.data(), {4 * H, I}}, {whh.data(), {4 * H, H}},
                  {bih.data(), {4 * H}}, {bhh.data(), {4 * H}}};
    seq.initialStates = {{h0.data(), {B, H}}, {c0.data(), {B, H}}};
    seq.resets = resets.data();
    return seq;
  }
  double loss(CpuCell &cell) {
    std::vector<double> out(T * B * H), hT(B * H), cT(B * H);
    llvm::Error e = errorOf(cell.forward(sequence(), {{out.data(), {T, B, H}}},
                                 {{hT.data(), {B, H}}, {cT.data(), {B, H}}}, {},
                                 nullptr));
    EXPECT_FALSE(static_cast<bool>(e)) << llvm::toString(std::move(e));
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i)
      l += wOut[i] * out[i];
    for (size_t i = 0; i < hT.size(); ++i)
      l += wH[i] * hT[i] + wC[i] * cT[i];
    return l;
  }
};
} // namespace

TEST(CpuCellGradients, AgreeWithFiniteDifferencesOfTheRuntimeItself) {
  RawLstm p;
  auto cell = compileCpu(readExample("lstm.cell"), "lstm.cell",
                               {{"H", p.H}, {"I", p.I}}, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell));
  for (const char *m : {"none", "full", "chunk:3"}) {
    SCOPED_TRACE(m);
    std::vector<double> out(p.T * p.B * p.H), hT(p.B * p.H), cT(p.B * p.H);
    SavedPtr saved;
    ASSERT_FALSE(static_cast<bool>((*cell)->forward(
        p.sequence(), {{out.data(), {p.T, p.B, p.H}}},
        {{hT.data(), {p.B, p.H}}, {cT.data(), {p.B, p.H}}}, *parseRecompute(m),
        &saved)));
    std::vector<double> dx(p.x.size()), dwih(p.wih.size()), dwhh(p.whh.size()),
        dbih(p.bih.size()), dbhh(p.bhh.size()), dh0(p.h0.size()), dc0(p.c0.size());
    llvm::Error e = errorOf((*cell)->backward(
        p.sequence(), *saved, {{p.wOut.data(), {p.T, p.B, p.H}}},
        {{p.wH.data(), {p.B, p.H}}, {p.wC.data(), {p.B, p.H}}},
        {{dx.data(), {p.T, p.B, p.I}}},
        {{dwih.data(), {4 * p.H, p.I}}, {dwhh.data(), {4 * p.H, p.H}},
         {dbih.data(), {4 * p.H}}, {dbhh.data(), {4 * p.H}}},
        {{dh0.data(), {p.B, p.H}}, {dc0.data(), {p.B, p.H}}}));
    ASSERT_FALSE(static_cast<bool>(e)) << llvm::toString(std::move(e));
    auto check = [&](std::vector<double> &values, const std::vector<double> &grad,
                     const char *what) {
      for (size_t i = 0; i < values.size(); i += 3) {
        double keep = values[i], eps = 1e-6;
        values[i] = keep + eps;
        double up = p.loss(**cell);
        values[i] = keep - eps;
        double down = p.loss(**cell);
        values[i] = keep;
        double fd = (up - down) / (2 * eps);
        EXPECT_NEAR(grad[i], fd, 1e-6 * std::max(1.0, std::fabs(fd)))
            << what << "[" << i << "]";
      }
    };
    check(p.x, dx, "x");
    check(p.wih, dwih, "W_ih");
    check(p.whh, dwhh, "W_hh");
    check(p.bih, dbih, "b_ih");
    check(p.bhh, dbhh, "b_hh");
    check(p.h0, dh0, "h0");
    check(p.c0, dc0, "c0");
  }
}

TEST(CpuCellLayout, BatchFirstIsTheTransposeOfTimeMajor) {
  RawLstm p;
  auto cell = compileCpu(readExample("lstm.cell"), "lstm.cell",
                               {{"H", p.H}, {"I", p.I}}, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell));
  auto transpose = [&](const std::vector<double> &v, int64_t a, int64_t c,
                       int64_t n) {
    std::vector<double> r(v.size());
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < c; ++j)
        for (int64_t k = 0; k < n; ++k)
          r[(j * a + i) * n + k] = v[(i * c + j) * n + k];
    return r;
  };
  int64_t T = p.T, B = p.B, H = p.H, I = p.I;
  // Time-major.
  std::vector<double> out(T * B * H), hT(B * H), cT(B * H), dx(T * B * I),
      dwhh(4 * H * H), dh0(B * H);
  SavedPtr saved;
  ASSERT_FALSE(static_cast<bool>((*cell)->forward(
      p.sequence(), {{out.data(), {T, B, H}}},
      {{hT.data(), {B, H}}, {cT.data(), {B, H}}}, {}, &saved)));
  ASSERT_FALSE(static_cast<bool>((*cell)->backward(
      p.sequence(), *saved, {{p.wOut.data(), {T, B, H}}},
      {{p.wH.data(), {B, H}}, {p.wC.data(), {B, H}}}, {{dx.data(), {T, B, I}}},
      {{}, {dwhh.data(), {4 * H, H}}, {}, {}}, {{dh0.data(), {B, H}}, {}})));
  // Batch-first, from transposed copies of the same data.
  std::vector<double> xb = transpose(p.x, T, B, I), wOutB = transpose(p.wOut, T, B, H);
  std::vector<uint8_t> resetsB(T * B);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      resetsB[b * T + t] = p.resets[t * B + b];
  CpuCell::Sequence seq = p.sequence();
  seq.batchFirst = true;
  seq.inputs = {{xb.data(), {B, T, I}}};
  seq.resets = resetsB.data();
  std::vector<double> outB(T * B * H), hTB(B * H), cTB(B * H), dxB(T * B * I),
      dwhhB(4 * H * H), dh0B(B * H);
  SavedPtr savedB;
  ASSERT_FALSE(static_cast<bool>((*cell)->forward(
      seq, {{outB.data(), {B, T, H}}}, {{hTB.data(), {B, H}}, {cTB.data(), {B, H}}},
      {}, &savedB)));
  ASSERT_FALSE(static_cast<bool>((*cell)->backward(
      seq, *savedB, {{wOutB.data(), {B, T, H}}},
      {{p.wH.data(), {B, H}}, {p.wC.data(), {B, H}}}, {{dxB.data(), {B, T, I}}},
      {{}, {dwhhB.data(), {4 * H, H}}, {}, {}}, {{dh0B.data(), {B, H}}, {}})));
  EXPECT_EQ(transpose(outB, B, T, H), out);
  EXPECT_EQ(hTB, hT);
  EXPECT_EQ(transpose(dxB, B, T, I), dx);
  EXPECT_EQ(dh0B, dh0);
  for (size_t i = 0; i < dwhh.size(); ++i)
    EXPECT_NEAR(dwhhB[i], dwhh[i], 1e-12);

  // A batch-first output of the wrong shape is an error, not a stray write.
  llvm::Error e = errorOf((*cell)->forward(seq, {{outB.data(), {T, B, H}}},
                                   {{hTB.data(), {B, H}}, {cTB.data(), {B, H}}},
                                   {}, nullptr));
  ASSERT_TRUE(static_cast<bool>(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("batch-first output has shape [4, 3, 5]"),
            std::string::npos);
}

namespace {

/// The data of the step tests: uniform values in [-0.5, 0.5) from `seed`,
/// first a param of each of the cell's shapes (and the arrays over them).
struct StepData {
  StepData(const CpuCell &cell, unsigned seed) : rng(seed) {
    for (const Slot &p : cell.params()) {
      int64_t n = 1;
      for (int64_t d : p.shape)
        n *= d;
      params.push_back(random(n));
    }
    for (size_t i = 0; i < params.size(); ++i)
      arrays.push_back({params[i].data(), cell.params()[i].shape});
  }
  std::vector<double> random(int64_t n) {
    std::vector<double> v(n);
    for (double &x : v)
      x = uniform(rng);
    return v;
  }
  std::mt19937 rng;
  std::uniform_real_distribution<double> uniform{-0.5, 0.5};
  std::vector<std::vector<double>> params;
  std::vector<Array> arrays;
};

/// A state of several dims may come in them: mLSTM's C as [B, NH, K, V] is
/// the same memory as [B, NH*K*V], in the forward, the backward and a step;
/// other dims are an error that says both shapes it takes.
TEST(CpuCellShapes, MatrixStatesInTheirDeclaredDims) {
  const int64_t T = 3, B = 2, I = 4, NH = 2, K = 3, V = 5;
  SizeBindings sizes = {{"I", I}, {"NH", NH}, {"K", K}, {"V", V}};
  auto cell = compileCpu(readExample("mlstm.cell"), "mlstm.cell", sizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell));
  CpuCell &c = **cell;
  ASSERT_EQ(c.package().stateDims.at("C"), (std::vector<int64_t>{NH, K, V}));
  StepData data(c, 11);
  const std::vector<Slot> &states = c.states();
  std::vector<double> x = data.random(T * B * I);
  std::vector<std::vector<double>> starts, dFinals;
  for (const Slot &st : states) {
    starts.push_back(data.random(B * st.shape[0]));
    dFinals.push_back(data.random(B * st.shape[0]));
  }
  // C in its dims or flat; n and m flat.
  auto shapeOf = [&](size_t i, bool dims) {
    return i == 0 && dims ? std::vector<int64_t>{B, NH, K, V}
                          : std::vector<int64_t>{B, states[i].shape[0]};
  };
  struct Run {
    std::vector<double> out;
    std::vector<std::vector<double>> finals, dStarts, stepped;
  };
  auto run = [&](bool dims) {
    Run r;
    r.out.resize(T * B * NH * V);
    CpuCell::Sequence seq;
    seq.inputs = {{x.data(), {T, B, I}}};
    seq.params = data.arrays;
    std::vector<Array> finals, dFinal, dStart, news;
    for (size_t i = 0; i < states.size(); ++i) {
      int64_t n = B * states[i].shape[0];
      r.finals.emplace_back(n);
      r.dStarts.emplace_back(n);
      r.stepped.emplace_back(n);
      seq.initialStates.push_back({starts[i].data(), shapeOf(i, dims)});
      dFinal.push_back({dFinals[i].data(), shapeOf(i, dims)});
    }
    for (size_t i = 0; i < states.size(); ++i) {
      finals.push_back({r.finals[i].data(), shapeOf(i, dims)});
      dStart.push_back({r.dStarts[i].data(), shapeOf(i, dims)});
      news.push_back({r.stepped[i].data(), shapeOf(i, dims)});
    }
    SavedPtr saved;
    Status f = c.forward(seq, {{r.out.data(), {T, B, NH * V}}}, finals,
                         *parseRecompute("full"), &saved);
    EXPECT_FALSE(f) << f.message();
    std::vector<double> dOut(T * B * NH * V, 0.25), dIn(T * B * I);
    std::vector<std::vector<double>> dPar;
    std::vector<Array> dParArrays;
    for (const Slot &p : c.params()) {
      int64_t n = 1;
      for (int64_t d : p.shape)
        n *= d;
      dPar.emplace_back(n);
    }
    for (size_t i = 0; i < dPar.size(); ++i)
      dParArrays.push_back({dPar[i].data(), c.params()[i].shape});
    Status b = c.backward(seq, *saved, {{dOut.data(), {T, B, NH * V}}}, dFinal,
                          {{dIn.data(), {T, B, I}}}, dParArrays, dStart);
    EXPECT_FALSE(b) << b.message();
    CpuCell::Sequence one = seq;
    one.inputs = {{x.data(), {B, I}}};
    std::vector<double> o(B * NH * V);
    Status st = c.step(one, {{o.data(), {B, NH * V}}}, news);
    EXPECT_FALSE(st) << st.message();
    return r;
  };
  Run flat = run(false), dims = run(true);
  EXPECT_EQ(flat.out, dims.out);
  EXPECT_EQ(flat.finals, dims.finals);
  EXPECT_EQ(flat.dStarts, dims.dStarts);
  EXPECT_EQ(flat.stepped, dims.stepped);
  EXPECT_NE(flat.dStarts[0], std::vector<double>(B * NH * K * V, 0.0));

  CpuCell::Sequence seq;
  std::vector<double> out(T * B * NH * V);
  seq.inputs = {{x.data(), {T, B, I}}};
  seq.params = data.arrays;
  for (size_t i = 0; i < states.size(); ++i)
    seq.initialStates.push_back({starts[i].data(), shapeOf(i, false)});
  seq.initialStates[0].shape = {B, NH, V, K};
  EXPECT_EQ(c.forward(seq, {{out.data(), {T, B, NH * V}}}, {}, *parseRecompute("none"),
                      nullptr)
                .message(),
            "initial state 'C' has shape [2, 2, 5, 3], expected [2, 30] or [2, 2, 3, 5]");
}

/// Streaming: T steps through CpuCell::step give the bits of one forward
/// over the T steps, at B = 5 then B = 2 (new buffers) on 1 and 3 threads;
/// a step's bad arguments are errors that say what is wrong.
TEST(CpuCellStep, StepsAreTheForwardStepByStep) {
  const int64_t T = 3, I = 4, H = 9;
  SizeBindings sizes = {{"H", H}, {"I", I}};
  auto cell = compileCpu(readExample("lstm.cell"), "lstm.cell", sizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell));
  CpuCell &c = **cell;
  StepData data(c, 7);
  auto random = [&](int64_t n) { return data.random(n); };
  std::vector<Array> &paramArrays = data.arrays;
  for (int threads : {1, 3})
    for (int64_t B : {5, 2}) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " B=" + std::to_string(B));
      c.setThreads(threads);
      std::vector<double> x = random(T * B * I), h0 = random(B * H), c0 = random(B * H);
      std::vector<double> out(T * B * H), hT(B * H), cT(B * H);
      CpuCell::Sequence seq;
      seq.inputs = {{x.data(), {T, B, I}}};
      seq.params = paramArrays;
      seq.initialStates = {{h0.data(), {B, H}}, {c0.data(), {B, H}}};
      ASSERT_FALSE(c.forward(seq, {{out.data(), {T, B, H}}},
                             {{hT.data(), {B, H}}, {cT.data(), {B, H}}},
                             *parseRecompute("none"), nullptr));
      std::vector<double> h = h0, cs = c0, o(B * H), h1(B * H), c1(B * H);
      for (int64_t t = 0; t < T; ++t) {
        CpuCell::Sequence one;
        one.inputs = {{x.data() + t * B * I, {B, I}}};
        one.params = paramArrays;
        one.initialStates = {{h.data(), {B, H}}, {cs.data(), {B, H}}};
        Status s = c.step(one, {{o.data(), {B, H}}}, {{h1.data(), {B, H}}, {c1.data(), {B, H}}});
        ASSERT_FALSE(s) << s.message();
        EXPECT_EQ(o, std::vector<double>(out.begin() + t * B * H,
                                         out.begin() + (t + 1) * B * H));
        h = h1;
        cs = c1;
      }
      EXPECT_EQ(h, hT);
      EXPECT_EQ(cs, cT);
    }

  // Errors.
  const int64_t B = 2;
  std::vector<double> x = random(B * I), h = random(B * H), cs = random(B * H), o(B * H),
                      h1(B * H), c1(B * H);
  CpuCell::Sequence one;
  one.inputs = {{x.data(), {B, I}}};
  one.params = paramArrays;
  one.initialStates = {{h.data(), {B, H}}, {cs.data(), {B, H}}};
  auto message = [&](const CpuCell::Sequence &s, std::vector<Array> news) {
    return c.step(s, {{o.data(), {B, H}}}, news).message();
  };
  EXPECT_EQ(message(one, {{h.data(), {B, H}}, {c1.data(), {B, H}}}),
            "a step's new state 'h' must not be the state it steps from");
  EXPECT_EQ(message(one, {{h1.data(), {B, H + 1}}, {c1.data(), {B, H}}}),
            "final state 'h' has shape [2, 10], expected [2, 9]");
  CpuCell::Sequence bad = one;
  bad.inputs = {{x.data(), {1, B, I}}};
  EXPECT_EQ(message(bad, {{h1.data(), {B, H}}, {c1.data(), {B, H}}}),
            "a step's inputs are [B, n]");
  bad = one;
  bad.initialStates[1].data = nullptr;
  EXPECT_EQ(message(bad, {{h1.data(), {B, H}}, {c1.data(), {B, H}}}),
            "a step needs every state to step from; 'c' is missing");
  std::vector<uint8_t> resets(B, 1);
  bad = one;
  bad.resets = resets.data();
  EXPECT_EQ(message(bad, {{h1.data(), {B, H}}, {c1.data(), {B, H}}}),
            "a step takes no resets, lengths or batch-first layout");
}

/// With the params' versions, a step keeps the weights it packed for the
/// next; a write that changes the version, or the values (the same
/// version: a write torch does not count), packs them again. Each step is
/// checked against a one-step forward on the params as they are then.
TEST(CpuCellStep, PackedWeightsFollowTheParams) {
  const int64_t I = 4, H = 9, B = 5;
  SizeBindings sizes = {{"H", H}, {"I", I}};
  auto cell = compileCpu(readExample("lstm.cell"), "lstm.cell", sizes, DType::F64);
  ASSERT_TRUE(static_cast<bool>(cell));
  CpuCell &c = **cell;
  StepData data(c, 11);
  auto random = [&](int64_t n) { return data.random(n); };
  std::vector<std::vector<double>> &params = data.params;
  std::vector<Array> &paramArrays = data.arrays;
  std::vector<int64_t> versions(params.size(), 0);
  std::vector<double> x = random(B * I), h = random(B * H), cs = random(B * H);
  auto check = [&](const char *what) {
    SCOPED_TRACE(what);
    std::vector<double> want(B * H), wh(B * H), wc(B * H);
    CpuCell::Sequence seq;
    seq.inputs = {{x.data(), {1, B, I}}};
    seq.params = paramArrays;
    seq.initialStates = {{h.data(), {B, H}}, {cs.data(), {B, H}}};
    ASSERT_FALSE(c.forward(seq, {{want.data(), {1, B, H}}},
                           {{wh.data(), {B, H}}, {wc.data(), {B, H}}},
                           *parseRecompute("none"), nullptr));
    std::vector<double> o(B * H), h1(B * H), c1(B * H);
    CpuCell::Sequence one;
    one.inputs = {{x.data(), {B, I}}};
    one.params = paramArrays;
    one.initialStates = {{h.data(), {B, H}}, {cs.data(), {B, H}}};
    Status s = c.step(one, {{o.data(), {B, H}}}, {{h1.data(), {B, H}}, {c1.data(), {B, H}}},
                      &versions);
    ASSERT_FALSE(s) << s.message();
    EXPECT_EQ(o, want);
    EXPECT_EQ(c1, wc);
  };
  check("the first step packs");
  check("the same params");
  for (std::vector<double> &p : params)
    for (double &v : p)
      v = -0.5 * v + 0.01;
  check("written, the same versions");
  for (double &v : params[1])
    v *= 2;
  ++versions[1];
  check("one param written, its version moved");
}

} // namespace
