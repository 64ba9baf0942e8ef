//===- KernelExecutionTest.cpp - JIT-compiled kernels against the reference -===//
//
// Compiles the forward and backward sequence kernels of a cell for the host
// CPU, runs them on a small batch with resets, and compares every output,
// state and gradient with the reference interpreter (whose gradients the
// autodiff tests check against finite differences). Both SAVE_GATES
// specializations run, in f64 and in f32.
//
//===----------------------------------------------------------------------===//

#include "Support/Reference.h"
#include "Support/TestCells.h"
#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "compiler/Pipelines/Pipelines.h"
#include "runtime/cpu/Kernels.h"

#include "mlir/Parser/Parser.h"
#include "llvm/Support/FileSystem.h"

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

using namespace cellc;
using namespace cellc::testing;
using cellc::runtime::KernelArg;
using cellc::runtime::SharedObject;
using mlir::cell::GradResultAttr;
using mlir::cell::gradResultsOf;

namespace {

constexpr int kSteps = 5, kBatch = 3;

/// A [T, B, n] or [B, n] buffer in the kernels' element type.
struct Buffer {
  std::vector<int64_t> shape;
  std::vector<double> f64;
  std::vector<float> f32;
  bool isF32 = false;

  Buffer(std::vector<int64_t> shape, bool isF32) : shape(shape), isF32(isF32) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    (isF32 ? f32.resize(n) : f64.resize(n));
  }
  size_t size() const { return isF32 ? f32.size() : f64.size(); }
  double get(size_t i) const { return isF32 ? f32[i] : f64[i]; }
  void set(size_t i, double v) {
    if (isF32)
      f32[i] = static_cast<float>(v);
    else
      f64[i] = v;
  }
  void *data() { return isF32 ? static_cast<void *>(f32.data()) : f64.data(); }
};

/// The kinds and names of a kernel's arguments, and their memref shapes with
/// T and B filled in.
struct Signature {
  std::vector<cellc::ArgKind> kinds;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  /// The earlier argument whose buffer a result shares (same_as), or -1.
  std::vector<int64_t> sameAs;
  /// The batched kernels' workspace and barrier words, for one group.
  int64_t workspaceBytes = 0, barrierWords = 0;
};

Signature signatureOf(ModuleOp kernels, StringRef name) {
  Signature sig;
  auto func = kernels.lookupSymbol<func::FuncOp>(name);
  for (auto [attr, type] :
       llvm::zip(mlir::cell::kernelArgsOf(func), func.getArgumentTypes())) {
    sig.kinds.push_back(attr.getKind());
    sig.names.push_back(attr.getName().str());
    sig.sameAs.push_back(attr.getSameAs());
    std::vector<int64_t> shape;
    if (auto memref = dyn_cast<MemRefType>(type)) {
      bool perStep = memref.getRank() == 3 || sig.kinds.back() == cellc::ArgKind::Resets;
      for (auto [i, d] : llvm::enumerate(memref.getShape())) {
        if (!ShapedType::isDynamic(d))
          shape.push_back(d);
        else
          shape.push_back(perStep && i == 0 ? kSteps : kBatch);
      }
    }
    sig.shapes.push_back(shape);
  }
  if (auto n = func->getAttrOfType<IntegerAttr>("cell.workspace_bytes"))
    sig.workspaceBytes = n.getInt();
  if (auto n = func->getAttrOfType<IntegerAttr>("cell.barrier_words"))
    sig.barrierWords = n.getInt();
  return sig;
}

/// Runs one cell's kernels, built with `strategy` and then changed by
/// `mutate` when given, and checks them against the reference.
/// `text` with every `ELEM` replaced by `element`: a cell in the dialect
/// written once for f32 and f64.
std::string withElement(std::string text, const std::string &element) {
  for (size_t at = text.find("ELEM"); at != std::string::npos; at = text.find("ELEM", at))
    text.replace(at, 4, element);
  return text;
}

/// Checks the kernels of `source`: a cell in the language, or with `isIR`
/// one in the dialect whose element type is spelled `ELEM`.
void checkKernels(const std::string &source, bool f32, bool saveGates,
                  KernelStrategy strategy,
                  function_ref<void(ModuleOp)> mutate = nullptr, bool isIR = false) {
  SCOPED_TRACE(std::string(f32 ? "f32" : "f64") +
               (saveGates ? ", SAVE_GATES=1" : ", SAVE_GATES=0") +
               (strategy == KernelStrategy::Batched ? ", batched" : ", per-row"));
  SizeBindings sizes = {{"H", 5}, {"I", 3}};
  auto ref = isIR ? compileIR(withElement(source, "f64")) : compile(source, sizes);
  ASSERT_TRUE(ref->module) << ref->diagnostics;

  // The kernels, for their signatures, and lowered to LLVM for the JIT.
  MLIRContext context;
  OwningOpRef<ModuleOp> kernels;
  if (isIR) {
    context.loadDialect<mlir::cell::CellDialect, func::FuncDialect>();
    kernels = parseSourceString<ModuleOp>(withElement(source, f32 ? "f32" : "f64"), &context);
    ASSERT_TRUE(kernels);
  } else {
    CellSource src(source, "t.cell");
    FloatType element = f32 ? FloatType(Float32Type::get(&context))
                            : FloatType(Float64Type::get(&context));
    kernels = compileCellSource(context, sizes, element, src.diag);
    ASSERT_TRUE(kernels) << src.diagnostics();
  }
  PipelineOptions options;
  options.saveGates = saveGates;
  options.strategy = strategy;
  // Tiles of 2 rows over the batch of 3, blocks of 2 rows.
  options.batchTile = 2;
  options.productRows = 2;
  PassManager toKernels(&context);
  buildPipeline(toKernels, Stage::Kernels, options);
  ASSERT_TRUE(succeeded(toKernels.run(*kernels)));
  if (mutate)
    mutate(*kernels);
  std::string name = ref->def.getSymName().str();
  Signature fwdSig = signatureOf(*kernels, name + "_fwd");
  Signature bwdSig = signatureOf(*kernels, name + "_bwd");
  PassManager toLLVM(&context);
  toLLVM.addPass(mlir::cell::createConvertKernelsToLLVM());
  ASSERT_TRUE(succeeded(toLLVM.run(*kernels)));
  // Compiled as a CPU package's kernels are, and called the same way.
  llvm::SmallString<128> object;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("cellc-test-kernels", "so", object));
  llvm::Error built = writeHostSharedObject(*kernels, object);
  ASSERT_FALSE(static_cast<bool>(built)) << llvm::toString(std::move(built));
  SharedObject jit;
  cellc::driver::Status opened = jit.open(object.str().str());
  llvm::sys::fs::remove(object);
  ASSERT_FALSE(static_cast<bool>(opened)) << opened.message();

  // One reference problem per sample, sharing the first one's params; each
  // sample resets at other steps.
  std::vector<std::vector<bool>> resets = {{false, false, true, false, false},
                                           {false, true, false, false, true},
                                           {false, false, false, false, false}};
  std::vector<std::unique_ptr<SequenceProblem>> samples;
  for (int b = 0; b < kBatch; ++b) {
    samples.push_back(std::make_unique<SequenceProblem>(*ref, kSteps, resets[b],
                                                        /*seed=*/77 + b));
    samples[b]->point.params = samples[0]->point.params;
  }
  const ParamValues &params = samples[0]->point.params;
  SmallVector<GradResultAttr> info = gradResultsOf(ref->grad);
  std::vector<GradResultAttr> projections;
  for (GradResultAttr a : info)
    if (a.getKind() == cellc::GradKind::Projection)
      projections.push_back(a);
  auto indexIn = [](ArrayAttr names, StringRef n) {
    for (auto [i, in] : llvm::enumerate(names))
      if (cast<StringAttr>(in).getValue() == n)
        return i;
    ADD_FAILURE() << "no " << n.str();
    return size_t(0);
  };
  auto inputIndex = [&](StringRef n) {
    return indexIn(ref->def.getInputNames(), n);
  };

  // Buffers by (kind, name), filled from the reference problems.
  std::map<std::pair<cellc::ArgKind, std::string>, std::unique_ptr<Buffer>> buffers;
  std::vector<uint8_t> resetBytes(kSteps * kBatch);
  for (int t = 0; t < kSteps; ++t)
    for (int b = 0; b < kBatch; ++b)
      resetBytes[t * kBatch + b] = resets[b][t];
  // Results passed as an earlier result's buffer (same_as): that key.
  std::map<std::pair<cellc::ArgKind, std::string>, std::pair<cellc::ArgKind, std::string>>
      aliases;
  auto bufferAt = [&](const std::pair<cellc::ArgKind, std::string> &key) -> Buffer & {
    auto alias = aliases.find(key);
    return *buffers.at(alias == aliases.end() ? key : alias->second);
  };
  auto makeArgs = [&](const Signature &sig) {
    std::vector<KernelArg> args;
    std::vector<std::pair<cellc::ArgKind, std::string>> keys(sig.kinds.size());
    unsigned projection = 0;
    for (size_t i = 0; i < sig.kinds.size(); ++i) {
      cellc::ArgKind kind = sig.kinds[i];
      const std::string &n = sig.names[i];
      if (kind == cellc::ArgKind::BatchBegin) {
        args.push_back(KernelArg::indexValue(0));
        continue;
      }
      if (kind == cellc::ArgKind::BatchEnd) {
        args.push_back(KernelArg::indexValue(kBatch));
        continue;
      }
      if (kind == cellc::ArgKind::Resets) {
        args.push_back(KernelArg::buffer(resetBytes.data(), sig.shapes[i]));
        continue;
      }
      // One group of one slice: its workspace and (zero) barrier words.
      if (kind == cellc::ArgKind::Group || kind == cellc::ArgKind::Slice ||
          kind == cellc::ArgKind::Slices || kind == cellc::ArgKind::Packed ||
          kind == cellc::ArgKind::Stream) {
        args.push_back(KernelArg::indexValue(kind == cellc::ArgKind::Slices ? 1 : 0));
        continue;
      }
      if (kind == cellc::ArgKind::Workspace || kind == cellc::ArgKind::GridBarrier) {
        int64_t bytes = kind == cellc::ArgKind::Workspace ? sig.workspaceBytes
                                                          : 4 * sig.barrierWords;
        auto &slot = buffers[{kind, n}];
        slot = std::make_unique<Buffer>(std::vector<int64_t>{bytes / (f32 ? 4 : 8) + 1}, f32);
        args.push_back(KernelArg::buffer(slot->data(), slot->shape));
        continue;
      }
      auto key = std::make_pair(kind, n + "#" + std::to_string(
                                              kind == cellc::ArgKind::Projection ? projection : 0));
      keys[i] = key;
      // A result the same as an earlier one is its buffer, as the driver
      // passes it: the kernel writes it once.
      if (sig.sameAs[i] >= 0) {
        aliases[key] = keys[size_t(sig.sameAs[i])];
        args.push_back(args[size_t(sig.sameAs[i])]);
        continue;
      }
      auto &slot = buffers[key];
      if (!slot) {
        slot = std::make_unique<Buffer>(sig.shapes[i], f32);
        Buffer &buf = *slot;
        int64_t width = sig.shapes[i].back();
        if (kind == cellc::ArgKind::Input) {
          size_t k = inputIndex(n);
          for (int t = 0; t < kSteps; ++t)
            for (int b = 0; b < kBatch; ++b)
              for (int64_t j = 0; j < width; ++j)
                buf.set((t * kBatch + b) * width + j, samples[b]->point.inputs[t][k][j]);
        } else if (kind == cellc::ArgKind::Projection) {
          // The hoisted GEMM, done here naively: W x + biases.
          GradResultAttr p = projections[projection];
          const Tensor &w = params.at(p.getName().str());
          size_t k = inputIndex(p.getInput());
          for (int t = 0; t < kSteps; ++t)
            for (int b = 0; b < kBatch; ++b) {
              const Tensor &x = samples[b]->point.inputs[t][k];
              for (int64_t r = 0; r < width; ++r) {
                double v = 0;
                for (size_t c = 0; c < x.size(); ++c)
                  v += w[r * x.size() + c] * x[c];
                for (StringAttr bias : p.getBiases())
                  v += params.at(bias.str())[r];
                buf.set((t * kBatch + b) * width + r, v);
              }
            }
        } else if (kind == cellc::ArgKind::InitialState || kind == cellc::ArgKind::StartState) {
          for (int b = 0; b < kBatch; ++b)
            for (int64_t j = 0; j < width; ++j)
              buf.set(b * width + j,
                      samples[b]->point.states[indexIn(ref->def.getStateNames(), n)][j]);
        } else if (kind == cellc::ArgKind::Param) {
          const Tensor &v = params.at(n);
          for (size_t j = 0; j < v.size(); ++j)
            buf.set(j, v[j]);
        } else if (kind == cellc::ArgKind::OutputGrad) {
          for (int t = 0; t < kSteps; ++t)
            for (int b = 0; b < kBatch; ++b)
              for (int64_t j = 0; j < width; ++j)
                buf.set((t * kBatch + b) * width + j,
                        samples[b]->outputWeights[t][indexIn(
                            ref->def.getOutputNames(), n)][j]);
        } else if (kind == cellc::ArgKind::FinalStateGrad) {
          for (int b = 0; b < kBatch; ++b)
            for (int64_t j = 0; j < width; ++j)
              buf.set(b * width + j,
                      samples[b]->finalWeights[indexIn(ref->def.getStateNames(), n)][j]);
        }
      }
      if (kind == cellc::ArgKind::Projection)
        ++projection;
      args.push_back(KernelArg::buffer(slot->data(), sig.shapes[i]));
    }
    return args;
  };

  ASSERT_TRUE(jit.entry(name + "_fwd") && jit.entry(name + "_bwd"));
  cellc::runtime::callPacked(jit.entry(name + "_fwd"), makeArgs(fwdSig));
  cellc::runtime::callPacked(jit.entry(name + "_bwd"), makeArgs(bwdSig));

  double tol = f32 ? 2e-4 : 1e-10;
  auto near = [&](double got, double want, const std::string &what) {
    EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want)))
        << what << ": kernel " << got << ", reference " << want;
  };

  // Forward: every output and state history entry.
  for (int b = 0; b < kBatch; ++b) {
    CellInterpreter interp(params);
    const Point &p = samples[b]->point;
    std::vector<Tensor> state = p.states;
    for (int t = 0; t < kSteps; ++t) {
      std::vector<Tensor> args = p.inputs[t];
      for (size_t s = 0; s < state.size(); ++s)
        args.push_back(resets[b][t] ? p.states[s] : state[s]);
      std::vector<Tensor> results = interp.run(ref->def.getBody().front(), args);
      for (size_t s = 0; s < state.size(); ++s) {
        state[s] = results[s];
        std::string stateName =
            cast<StringAttr>(ref->def.getStateNames()[s]).str();
        Buffer &hist = bufferAt({cellc::ArgKind::StateHistory, stateName + "#0"});
        int64_t width = hist.shape.back();
        for (int64_t j = 0; j < width; ++j)
          near(hist.get((t * kBatch + b) * width + j), state[s][j],
               "history of " + stateName);
      }
      for (size_t o = state.size(); o < results.size(); ++o) {
        std::string outName = cast<StringAttr>(
            ref->def.getOutputNames()[o - state.size()]).str();
        Buffer &out = bufferAt({cellc::ArgKind::Output, outName + "#0"});
        int64_t width = out.shape.back();
        for (int64_t j = 0; j < width; ++j)
          near(out.get((t * kBatch + b) * width + j), results[o][j],
               "output " + outName);
      }
    }
  }

  // Backward: the gradients, assembled as the runtime will, per sample.
  for (int b = 0; b < kBatch; ++b) {
    SCOPED_TRACE("sample " + std::to_string(b));
    Point want = samples[b]->gradient(/*saved=*/false);
    for (size_t s = 0; s < want.states.size(); ++s) {
      std::string stateName = cast<StringAttr>(ref->def.getStateNames()[s]).str();
      // The sequence started from its initial state: both gradients are its.
      Buffer &g = bufferAt({cellc::ArgKind::InitialStateGrad, stateName + "#0"});
      Buffer &gs = bufferAt({cellc::ArgKind::StartStateGrad, stateName + "#0"});
      int64_t width = g.shape.back();
      for (int64_t j = 0; j < width; ++j)
        near(g.get(b * width + j) + gs.get(b * width + j), want.states[s][j],
             "d initial " + stateName);
    }
    // Direct input gradients plus the projections' W^T dP.
    for (int t = 0; t < kSteps; ++t)
      for (size_t k = 0; k < want.inputs[t].size(); ++k) {
        std::string inName = cast<StringAttr>(ref->def.getInputNames()[k]).str();
        Buffer &g = bufferAt({cellc::ArgKind::InputGrad, inName + "#0"});
        int64_t width = g.shape.back();
        for (int64_t j = 0; j < width; ++j) {
          double total = g.get((t * kBatch + b) * width + j);
          unsigned pi = 0;
          for (GradResultAttr p : projections) {
            if (p.getInput() == inName) {
              const Tensor &w = params.at(p.getName().str());
              Buffer &dp = bufferAt({cellc::ArgKind::ProjectionGrad,
                                        p.getName().str() + "#0"});
              int64_t rows = dp.shape.back();
              for (int64_t r = 0; r < rows; ++r)
                total += w[r * width + j] * dp.get((t * kBatch + b) * rows + r);
            }
            ++pi;
          }
          near(total, want.inputs[t][k][j], "d " + inName);
        }
      }
  }
  // Param gradients, summed over the batch.
  ParamValues wantParams;
  for (int b = 0; b < kBatch; ++b)
    for (auto &[n, g] : samples[b]->gradient(false).params)
      addTo(wantParams[n], g);
  ParamValues got;
  for (auto &[n, v] : params)
    got[n] = Tensor(v.size(), 0.0);
  for (GradResultAttr a : info) {
    cellc::GradKind kind = a.getKind();
    if (kind == cellc::GradKind::Param) {
      std::string n = a.getName().str();
      Buffer &g = bufferAt({cellc::ArgKind::ParamGrad, n + "#0"});
      int64_t width = g.shape.back();
      for (int b = 0; b < kBatch; ++b)
        for (int64_t j = 0; j < width; ++j)
          got[n][j] += g.get(b * width + j);
    } else if (kind == cellc::GradKind::Projection || kind == cellc::GradKind::WeightRows) {
      std::string w = a.getName().str();
      Buffer &rows = bufferAt({cellc::argKindOf(kind), w + "#0"});
      int64_t m = rows.shape.back();
      int64_t cols = params.at(w).size() / m;
      for (int t = 0; t < kSteps; ++t)
        for (int b = 0; b < kBatch; ++b) {
          Tensor vec(cols);
          if (kind == cellc::GradKind::Projection) {
            vec = samples[b]->point.inputs[t][inputIndex(a.getInput())];
          } else {
            Buffer &vecs = bufferAt({cellc::ArgKind::WeightVectors, w + "#0"});
            for (int64_t c = 0; c < cols; ++c)
              vec[c] = vecs.get((t * kBatch + b) * cols + c);
          }
          for (int64_t r = 0; r < m; ++r) {
            double dr = rows.get((t * kBatch + b) * m + r);
            for (int64_t c = 0; c < cols; ++c)
              got[w][r * cols + c] += dr * vec[c];
            if (kind == cellc::GradKind::Projection)
              for (StringAttr bias : a.getBiases())
                got[bias.str()][r] += dr;
          }
        }
    }
  }
  for (auto &[n, g] : wantParams)
    for (size_t j = 0; j < g.size(); ++j)
      near(got[n][j], g[j], "d param " + n + "[" + std::to_string(j) + "]");
}

class KernelExecutionTest
    : public ::testing::TestWithParam<
          std::tuple<const char *, bool, bool, KernelStrategy>> {};

std::string sourceOf(const char *name) {
  std::string n = name;
  if (n == "peephole")
    return kPeephole;
  if (n == "mgu")
    return kMgu;
  return readExample((n + ".cell").c_str());
}

} // namespace

TEST_P(KernelExecutionTest, MatchesTheReference) {
  auto [cell, f32, saveGates, strategy] = GetParam();
  checkKernels(sourceOf(cell), f32, saveGates, strategy);
}

INSTANTIATE_TEST_SUITE_P(
    Cells, KernelExecutionTest,
    ::testing::Combine(::testing::Values("lstm", "gru", "elman", "peephole", "mgu"),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(KernelStrategy::PerRow,
                                         KernelStrategy::Batched)));

/// A matrix state per head, in the dialect (the language has no syntax for
/// it yet): C [2 heads, 3, 5] decays by a gate per head and adds the outer
/// product of k [2, 3] and v [2, 5]; the output is C q [2, 3] times a
/// function of its sum per head. Every cell.expand and cell.reduce on the
/// batched and the per-row kernels, forward and backward, with and without
/// saved gates, against the reference. V = 5 runs a vector and a tail along
/// the last dim of the batched kernels in f64 (4 lanes), the tail only in
/// f32 (8).
constexpr const char *kMatrixState = R"(
  cell.def @mstate inputs(%k: tensor<6xELEM>, %v: tensor<10xELEM>, %q: tensor<10xELEM>)
      states(%C: tensor<30xELEM>) outputs("h") {
    %u = cell.param "u" : tensor<2xELEM>
    %f = cell.sigmoid %u : tensor<2xELEM>
    %fe = cell.expand %f {shape = array<i64: 2, 3, 5>, kept = array<i64: 0>} : tensor<2xELEM> -> tensor<30xELEM>
    %ke = cell.expand %k {shape = array<i64: 2, 3, 5>, kept = array<i64: 0, 1>} : tensor<6xELEM> -> tensor<30xELEM>
    %ve = cell.expand %v {shape = array<i64: 2, 3, 5>, kept = array<i64: 0, 2>} : tensor<10xELEM> -> tensor<30xELEM>
    %kv = cell.mul %ke, %ve : tensor<30xELEM>
    %fc = cell.mul %fe, %C : tensor<30xELEM>
    %next = cell.add %fc, %kv : tensor<30xELEM>
    %qe = cell.expand %q {shape = array<i64: 2, 3, 5>, kept = array<i64: 0, 2>} : tensor<10xELEM> -> tensor<30xELEM>
    %cq = cell.mul %next, %qe : tensor<30xELEM>
    %h = cell.reduce %cq {shape = array<i64: 2, 3, 5>, kept = array<i64: 0, 1>} : tensor<30xELEM> -> tensor<6xELEM>
    %n = cell.reduce %h {shape = array<i64: 2, 3>, kept = array<i64: 0>} : tensor<6xELEM> -> tensor<2xELEM>
    %t = cell.tanh %n : tensor<2xELEM>
    %te = cell.expand %t {shape = array<i64: 2, 3>, kept = array<i64: 0>} : tensor<2xELEM> -> tensor<6xELEM>
    %out = cell.mul %h, %te : tensor<6xELEM>
    cell.yield states(%next : tensor<30xELEM>) outputs(%out : tensor<6xELEM>)
  }
)";

TEST(KernelExecutionMatrixState, CpuKernelsMatchTheReference) {
  for (KernelStrategy strategy : {KernelStrategy::Batched, KernelStrategy::PerRow})
    for (bool f32 : {false, true})
      for (bool saveGates : {false, true})
        checkKernels(kMatrixState, f32, saveGates, strategy, nullptr, /*isIR=*/true);
}

/// The tests above catch a product phase that reads another row of the tile
/// than the one it computes: here each row of every product's left operand
/// is read one row further on (the neighbouring sample, or the tile's first
/// row for its last), and the comparison with the reference must fail, forward and backward.
TEST(KernelExecutionMutation, AProductThatReadsTheWrongRowFails) {
  auto readNextRow = [](ModuleOp module) {
    unsigned changed = 0;
    module.walk([&](vector::FMAOp fma) {
      auto broadcast = fma.getLhs().getDefiningOp<vector::BroadcastOp>();
      auto load = broadcast ? broadcast.getSource().getDefiningOp<memref::LoadOp>()
                            : memref::LoadOp();
      if (!load || load->getAttr("mutated"))
        return;
      OpBuilder b(load);
      SmallVector<Value> indices(load.getIndices());
      Value &row = indices[indices.size() - 2];
      int64_t tile = load.getMemRefType().getShape()[indices.size() - 2];
      Location loc = load.getLoc();
      row = b.create<arith::RemUIOp>(
          loc,
          b.create<arith::AddIOp>(loc, row, b.create<arith::ConstantIndexOp>(loc, 1)),
          b.create<arith::ConstantIndexOp>(loc, tile));
      auto moved = b.create<memref::LoadOp>(load.getLoc(), load.getMemRef(), indices);
      moved->setAttr("mutated", b.getUnitAttr());
      load.replaceAllUsesWith(moved.getResult());
      load.erase();
      ++changed;
    });
    ASSERT_GT(changed, 0u) << "no product to break";
  };
  for (bool saveGates : {true, false}) {
    ::testing::TestPartResultArray failures;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD,
          &failures);
      checkKernels(sourceOf("lstm"), /*f32=*/false, saveGates, KernelStrategy::Batched,
                   readNextRow);
    }
    EXPECT_GT(failures.size(), 0) << "a product that reads the wrong row passed";
  }
}
