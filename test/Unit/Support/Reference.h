//===- Reference.h - Reference runs of cells for numeric tests --*- C++ -*-===//
//
// Compiles a cell in double precision and runs sequences of it with the
// reference interpreter: the loss, and its gradient through the derived
// backward step, run the way the backward kernel runs it.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_TEST_UNIT_SUPPORT_REFERENCE_H
#define CELLC_TEST_UNIT_SUPPORT_REFERENCE_H

#include "Support/CellInterpreter.h"

#include "compiler/Frontend/IRGen.h"
#include "compiler/Frontend/Sizes.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "gtest/gtest.h"

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <memory>
#include <string>
#include <vector>

namespace cellc::testing {

using namespace mlir;

/// A cell compiled through cell-plan-saves, in f64.
struct Compiled {
  MLIRContext context;
  OwningOpRef<ModuleOp> module;
  cell::DefOp def;
  func::FuncOp grad;
  std::string diagnostics;
};

/// Runs `c`'s module through the pipeline up to `stage`, and finds its cell
/// and backward step.
inline void lower(Compiled &c, Stage stage, const PipelineOptions &options) {
  PassManager pm(&c.context);
  buildPipeline(pm, stage, options);
  if (failed(pm.run(*c.module))) {
    c.module = nullptr;
    return;
  }
  if (stage <= Stage::Plan) {
    c.def = *c.module->getOps<cell::DefOp>().begin();
    if (stage >= Stage::Grad)
      c.grad = *c.module->getOps<func::FuncOp>().begin();
  }
}

inline std::unique_ptr<Compiled>
compile(const std::string &source, const SizeBindings &sizes,
        Stage stage = Stage::Plan, const PipelineOptions &options = {}) {
  auto c = std::make_unique<Compiled>();
  CellSource src(source, "t.cell");
  c->module = compileCellSource(c->context, sizes,
                                Float64Type::get(&c->context), src.diag);
  c->diagnostics = src.diagnostics();
  if (c->module)
    lower(*c, stage, options);
  return c;
}

/// A cell written in the dialect (for ops no language construct builds
/// yet), compiled as `compile` does.
inline std::unique_ptr<Compiled> compileIR(const std::string &text, Stage stage = Stage::Plan) {
  auto c = std::make_unique<Compiled>();
  c->context.loadDialect<cell::CellDialect, func::FuncDialect>();
  c->module = parseSourceString<ModuleOp>(text, &c->context);
  if (c->module)
    lower(*c, stage, {});
  return c;
}

inline std::string readExample(const char *name) {
  std::ifstream in(std::string(CELLC_SOURCE_DIR) + "/examples/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline int64_t sizeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getDimSize(0);
}

/// Everything the loss depends on, and the gradients of the loss.
struct Point {
  std::vector<std::vector<Tensor>> inputs; // [t][input]
  std::vector<Tensor> states;              // initial states
  ParamValues params;
};

inline double dot(const Tensor &a, const Tensor &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

inline void addTo(Tensor &acc, const Tensor &g) {
  acc.resize(g.size(), 0.0);
  for (size_t i = 0; i < g.size(); ++i)
    acc[i] += g[i];
}

/// A sequence problem: a cell, T steps with resets, and a random linear loss.
class SequenceProblem {
public:
  SequenceProblem(Compiled &c, int steps, std::vector<bool> resets,
                  unsigned seed)
      : c(c), steps(steps), resets(std::move(resets)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    auto random = [&](int64_t n) {
      Tensor t(n);
      for (double &v : t)
        v = dist(rng);
      return t;
    };
    auto &body = c.def.getBody().front();
    for (int t = 0; t < steps; ++t) {
      std::vector<Tensor> step;
      for (Value in : c.def.getInputs())
        step.push_back(random(sizeOf(in)));
      point.inputs.push_back(step);
      std::vector<Tensor> w;
      for (Value out : c.def.getYield().getOutputs())
        w.push_back(random(sizeOf(out)));
      outputWeights.push_back(w);
    }
    for (Value s : c.def.getStates()) {
      point.states.push_back(random(sizeOf(s)));
      finalWeights.push_back(random(sizeOf(s)));
    }
    for (auto param : body.getOps<cell::ParamOp>())
      point.params[param.getName().str()] =
          random(cast<RankedTensorType>(param.getType()).getNumElements());
  }

  /// The blocks of the param `name`: G of a `[G, M, N]` param, else 1.
  size_t blocksOf(const std::string &name) {
    for (auto param : c.def.getBody().front().getOps<cell::ParamOp>()) {
      auto type = cast<RankedTensorType>(param.getType());
      if (param.getName() == name && type.getRank() == 3)
        return type.getDimSize(0);
    }
    return 1;
  }

  /// The loss: outputs and final states, weighted.
  double loss(const Point &p) {
    CellInterpreter interp(p.params);
    std::vector<Tensor> state = p.states;
    double total = 0;
    size_t numStates = state.size();
    for (int t = 0; t < steps; ++t) {
      std::vector<Tensor> args = p.inputs[t];
      for (size_t s = 0; s < numStates; ++s)
        args.push_back(resets[t] ? p.states[s] : state[s]);
      std::vector<Tensor> results = interp.run(c.def.getBody().front(), args);
      for (size_t s = 0; s < numStates; ++s)
        state[s] = results[s];
      for (size_t o = 0; o + numStates < results.size(); ++o)
        total += dot(outputWeights[t][o], results[numStates + o]);
    }
    for (size_t s = 0; s < numStates; ++s)
      total += dot(finalWeights[s], state[s]);
    return total;
  }

  /// The gradient through the derived backward step, run as the backward
  /// kernel runs it; `saved` reads the forward's saved values (SAVE_GATES=1)
  /// instead of replaying.
  Point gradient(bool saved) {
    const Point &p = point;
    CellInterpreter fwd(p.params);
    size_t numStates = p.states.size();
    std::vector<std::vector<Tensor>> prevs, gates;
    std::vector<Tensor> state = p.states;
    for (int t = 0; t < steps; ++t) {
      std::vector<Tensor> prev;
      for (size_t s = 0; s < numStates; ++s)
        prev.push_back(resets[t] || t == 0 ? p.states[s] : state[s]);
      std::vector<Tensor> args = p.inputs[t];
      args.insert(args.end(), prev.begin(), prev.end());
      std::vector<Tensor> results = fwd.run(c.def.getBody().front(), args);
      for (size_t s = 0; s < numStates; ++s)
        state[s] = results[s];
      prevs.push_back(prev);
      gates.push_back(fwd.saved);
    }

    Point g;
    g.inputs.assign(steps, {});
    for (int t = 0; t < steps; ++t)
      for (const Tensor &x : p.inputs[t])
        g.inputs[t].push_back(Tensor(x.size(), 0.0));
    for (const Tensor &s : p.states)
      g.states.push_back(Tensor(s.size(), 0.0));
    for (auto &[name, value] : p.params)
      g.params[name] = Tensor(value.size(), 0.0);

    SmallVector<mlir::cell::GradResultAttr> info = mlir::cell::gradResultsOf(c.grad);
    auto inputIndex = [&](StringRef name) {
      for (auto [i, n] : llvm::enumerate(c.def.getInputNames()))
        if (cast<StringAttr>(n).getValue() == name)
          return i;
      ADD_FAILURE() << "no input " << name.str();
      return size_t(0);
    };

    CellInterpreter bwd(p.params);
    std::vector<Tensor> carried = finalWeights;
    for (int t = steps - 1; t >= 0; --t) {
      std::vector<Tensor> args = p.inputs[t];
      args.insert(args.end(), prevs[t].begin(), prevs[t].end());
      args.insert(args.end(), outputWeights[t].begin(), outputWeights[t].end());
      args.insert(args.end(), carried.begin(), carried.end());
      if (saved)
        bwd.restoreFrom = gates[t];
      std::vector<Tensor> r = bwd.run(c.grad.getBody().front(), args);

      size_t stateIndex = 0;
      for (size_t k = 0; k < r.size(); ++k) {
        mlir::cell::GradResultAttr result = info[k];
        cellc::GradKind kind = result.getKind();
        if (kind == cellc::GradKind::State) {
          Tensor &dPrev = r[k];
          if (resets[t] || t == 0) {
            addTo(g.states[stateIndex], dPrev);
            carried[stateIndex] = Tensor(dPrev.size(), 0.0);
          } else {
            carried[stateIndex] = dPrev;
          }
          ++stateIndex;
        } else if (kind == cellc::GradKind::Input) {
          size_t i = inputIndex(result.getName());
          addTo(g.inputs[t][i], r[k]);
        } else if (kind == cellc::GradKind::Projection) {
          std::string w = result.getName().str();
          size_t i = inputIndex(result.getInput());
          const Tensor &x = p.inputs[t][i];
          const Tensor &weight = p.params.at(w);
          // Block by block: a dense weight is one block.
          size_t blocks = blocksOf(w), cols = x.size() / blocks,
                 rows = r[k].size() / blocks;
          for (size_t q = 0; q < blocks; ++q)
            for (size_t a = 0; a < rows; ++a)
              for (size_t b = 0; b < cols; ++b) {
                size_t at = (q * rows + a) * cols + b;
                g.params[w][at] += r[k][q * rows + a] * x[q * cols + b];
                g.inputs[t][i][q * cols + b] += weight[at] * r[k][q * rows + a];
              }
          for (StringAttr bias : result.getBiases())
            addTo(g.params[bias.str()], r[k]);
        } else if (kind == cellc::GradKind::WeightRows) {
          std::string w = result.getName().str();
          const Tensor &rows = r[k], &vec = r[k + 1];
          size_t blocks = blocksOf(w), m = rows.size() / blocks, n = vec.size() / blocks;
          for (size_t q = 0; q < blocks; ++q)
            for (size_t a = 0; a < m; ++a)
              for (size_t b = 0; b < n; ++b)
                g.params[w][(q * m + a) * n + b] += rows[q * m + a] * vec[q * n + b];
        } else if (kind == cellc::GradKind::Param) {
          addTo(g.params[result.getName().str()], r[k]);
        }
      }
    }
    return g;
  }

  /// Checks the gradient against central finite differences, element by
  /// element, and returns the largest error seen.
  double checkAgainstFiniteDifferences(const Point &g) {
    const double eps = 1e-6;
    double worst = 0;
    auto check = [&](double &value, double analytic, const std::string &what) {
      double saved = value;
      value = saved + eps;
      double up = loss(point);
      value = saved - eps;
      double down = loss(point);
      value = saved;
      double numeric = (up - down) / (2 * eps);
      double err = std::fabs(analytic - numeric) / std::max(1.0, std::fabs(numeric));
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-6) << what << ": derived " << analytic
                           << ", finite differences " << numeric;
    };
    for (int t = 0; t < steps; ++t)
      for (size_t i = 0; i < point.inputs[t].size(); ++i)
        for (size_t j = 0; j < point.inputs[t][i].size(); ++j)
          check(point.inputs[t][i][j], g.inputs[t][i][j],
                "input " + std::to_string(i) + " at t=" + std::to_string(t) +
                    "[" + std::to_string(j) + "]");
    for (size_t s = 0; s < point.states.size(); ++s)
      for (size_t j = 0; j < point.states[s].size(); ++j)
        check(point.states[s][j], g.states[s][j],
              "initial state " + std::to_string(s) + "[" + std::to_string(j) + "]");
    for (auto &[name, value] : point.params)
      for (size_t j = 0; j < value.size(); ++j)
        check(value[j], g.params.at(name)[j], "param " + name + "[" + std::to_string(j) + "]");
    return worst;
  }

  Point point;
  Compiled &c;
  int steps;
  std::vector<bool> resets;
  std::vector<std::vector<Tensor>> outputWeights;
  std::vector<Tensor> finalWeights;
};

} // namespace cellc::testing

#endif // CELLC_TEST_UNIT_SUPPORT_REFERENCE_H
