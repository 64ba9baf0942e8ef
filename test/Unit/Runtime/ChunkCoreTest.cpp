//===- ChunkCoreTest.cpp - The chunk form's core on the CPU ---------------===//
//
// runtime/cpu/ChunkCore against the recurrences it computes in chunks, step
// by step in double (the reads and the end state), and its backward against
// central differences of a random linear functional of them. Shapes with a
// partial last chunk, a chunk of one step, K != V, row and scalar gates.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/ChunkCore.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace cellc::runtime;

namespace {

struct Problem {
  chunk::Shape s;
  bool delta = false;
  // Time-major [T, BH, X]; a and beta [T, BH] (scalar gates, the delta rule) or
  // a [T, BH, K].
  std::vector<double> a, k, v, beta, S0, q;
};

Problem make(int64_t BH, int64_t T, int64_t K, int64_t V, int64_t L, bool rows, bool delta,
             unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Problem p;
  p.s.BH = BH, p.s.T = T, p.s.K = K, p.s.V = V, p.s.L = L, p.s.rows = rows, p.s.reads = 1;
  p.delta = delta;
  int64_t gates = delta ? T * BH : T * BH * K;
  for (int64_t i = 0; i < gates; ++i)
    p.a.push_back(-0.8 * u(gen));
  if (!delta && !rows)
    for (int64_t i = 0; i < T * BH; ++i)
      for (int64_t x = 1; x < K; ++x)
        p.a[i * K + x] = p.a[i * K];
  for (int64_t i = 0; i < T * BH * K; ++i)
    p.k.push_back(0.5 * n(gen)), p.q.push_back(n(gen));
  for (int64_t i = 0; i < T * BH * V; ++i)
    p.v.push_back(n(gen));
  for (int64_t i = 0; i < T * BH; ++i)
    p.beta.push_back(u(gen));
  for (int64_t i = 0; i < BH * K * V; ++i)
    p.S0.push_back(n(gen));
  return p;
}

/// The recurrence step by step: the reads [T, BH, V] then the end state.
std::vector<double> reference(const Problem &p) {
  const auto &s = p.s;
  std::vector<double> out(s.T * s.BH * s.V + s.BH * s.K * s.V);
  for (int64_t b = 0; b < s.BH; ++b) {
    std::vector<double> S(p.S0.begin() + b * s.K * s.V, p.S0.begin() + (b + 1) * s.K * s.V);
    for (int64_t t = 0; t < s.T; ++t) {
      const double *k = &p.k[(t * s.BH + b) * s.K], *v = &p.v[(t * s.BH + b) * s.V],
                   *q = &p.q[(t * s.BH + b) * s.K];
      std::vector<double> u(v, v + s.V);
      if (p.delta) {
        double g = std::exp(p.a[t * s.BH + b]), beta = p.beta[t * s.BH + b];
        for (int64_t y = 0; y < s.V; ++y) {
          double kS = 0;
          for (int64_t x = 0; x < s.K; ++x)
            kS += k[x] * S[x * s.V + y];
          u[y] = beta * (v[y] - g * kS);
        }
      }
      for (int64_t x = 0; x < s.K; ++x) {
        double g = std::exp(p.delta ? p.a[t * s.BH + b] : p.a[(t * s.BH + b) * s.K + x]);
        for (int64_t y = 0; y < s.V; ++y)
          S[x * s.V + y] = g * S[x * s.V + y] + k[x] * u[y];
      }
      for (int64_t y = 0; y < s.V; ++y) {
        double o = 0;
        for (int64_t x = 0; x < s.K; ++x)
          o += q[x] * S[x * s.V + y];
        out[(t * s.BH + b) * s.V + y] = o;
      }
    }
    std::copy(S.begin(), S.end(), out.begin() + s.T * s.BH * s.V + b * s.K * s.V);
  }
  return out;
}

/// The kernels' forward: the reads then the end state, as `reference`.
std::vector<double> forward(const Problem &p, std::vector<double> *starts = nullptr,
                            std::vector<double> *pairs = nullptr) {
  const auto &s = p.s;
  std::vector<double> out(s.T * s.BH * s.V + s.BH * s.K * s.V);
  std::vector<double> st(s.BH * s.chunks() * s.K * s.V), pr(s.BH * s.chunks() * s.L * s.L);
  const void *qs[] = {p.q.data()};
  void *outs[] = {out.data()};
  double *end = out.data() + s.T * s.BH * s.V;
  if (p.delta)
    chunk::deltaForward(DType::F64, s, p.a.data(), p.k.data(), p.v.data(), p.beta.data(),
                        p.S0.data(), qs, outs, st.data(), end, 1);
  else
    chunk::forward(DType::F64, s, p.a.data(), p.k.data(), p.v.data(), p.S0.data(), qs, outs,
                   st.data(), end, pr.data(), 1);
  if (starts)
    *starts = st;
  if (pairs)
    *pairs = pr;
  return out;
}

void expectForwardMatches(const Problem &p) {
  std::vector<double> want = reference(p), got = forward(p);
  double scale = 0;
  for (double x : want)
    scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-11 * scale) << "element " << i;
}

/// The backward against central differences of sum(w * forward) in every
/// input's first elements.
void expectBackwardMatches(Problem p) {
  const auto &s = p.s;
  std::mt19937 gen(7);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> w(s.T * s.BH * s.V + s.BH * s.K * s.V);
  for (double &x : w)
    x = n(gen);
  auto loss = [&](const Problem &at) {
    std::vector<double> o = forward(at);
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i)
      sum += w[i] * o[i];
    return sum;
  };
  std::vector<double> starts, pairs;
  std::vector<double> out = forward(p, &starts, &pairs);
  const double *end = out.data() + s.T * s.BH * s.V;
  std::vector<double> da(p.a.size()), dk(p.k.size()), dv(p.v.size()), dbeta(p.beta.size()),
      dS0(p.S0.size()), dq(p.q.size());
  const void *qs[] = {p.q.data()}, *douts[] = {w.data()};
  void *dqs[] = {dq.data()};
  const double *dEnd = w.data() + s.T * s.BH * s.V;
  if (p.delta)
    chunk::deltaBackward(DType::F64, s, p.a.data(), p.k.data(), p.v.data(), p.beta.data(),
                         starts.data(), end, qs, douts, dEnd, da.data(), dk.data(), dv.data(),
                         dbeta.data(), dS0.data(), dqs, 1);
  else
    chunk::backward(DType::F64, s, p.a.data(), p.k.data(), p.v.data(), starts.data(), end,
                    pairs.data(), qs, douts, dEnd, da.data(), dk.data(), dv.data(),
                    dS0.data(), dqs, 1);
  struct Input {
    std::vector<double> Problem::*field;
    const std::vector<double> *grad;
    const char *name;
  };
  std::vector<Input> inputs = {{&Problem::a, &da, "a"}, {&Problem::k, &dk, "k"},
                               {&Problem::v, &dv, "v"}, {&Problem::S0, &dS0, "S0"},
                               {&Problem::q, &dq, "q"}};
  if (p.delta)
    inputs.push_back({&Problem::beta, &dbeta, "beta"});
  for (const Input &in : inputs) {
    size_t count = (p.*in.field).size();
    for (size_t i = 0; i < count; i += std::max<size_t>(1, count / 23)) {
      // A scalar gate held as K equal columns moves as one.
      bool scalar = in.field == &Problem::a && !p.delta && !s.rows;
      if (scalar && i % s.K)
        continue;
      Problem up = p, down = p;
      const double h = 1e-5;
      for (int64_t x = 0; x < (scalar ? s.K : 1); ++x) {
        (up.*in.field)[i + x] += h;
        (down.*in.field)[i + x] -= h;
      }
      double numeric = (loss(up) - loss(down)) / (2 * h), analytic = 0;
      for (int64_t x = 0; x < (scalar ? s.K : 1); ++x)
        analytic += (*in.grad)[i + x];
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << in.name << "[" << i << "]";
    }
  }
}

TEST(ChunkCore, RowGatesMatchTheRecurrence) {
  expectForwardMatches(make(3, 45, 5, 4, 32, true, false, 1));
  expectForwardMatches(make(2, 7, 3, 6, 1, true, false, 2));
}

TEST(ChunkCore, ScalarGatesMatchTheRecurrence) {
  expectForwardMatches(make(3, 45, 5, 4, 16, false, false, 3));
}

TEST(ChunkCore, TheDeltaRuleMatchesTheRecurrence) {
  expectForwardMatches(make(3, 45, 5, 4, 32, false, true, 4));
  expectForwardMatches(make(2, 7, 6, 3, 1, false, true, 5));
}

TEST(ChunkCore, NoStepsLeaveTheStateAsItIs) {
  // T = 0: no chunk, and the end state is the initial one.
  expectForwardMatches(make(3, 0, 4, 3, 16, true, false, 10));
  expectForwardMatches(make(3, 0, 4, 3, 16, false, true, 11));
}

TEST(ChunkCore, TheBackwardIsTheDerivative) {
  expectBackwardMatches(make(2, 21, 4, 3, 8, true, false, 6));
  expectBackwardMatches(make(2, 21, 4, 3, 16, false, false, 7));
  expectBackwardMatches(make(2, 21, 4, 3, 8, false, true, 8));
  expectBackwardMatches(make(2, 5, 3, 4, 1, false, true, 9));
}

} // namespace
