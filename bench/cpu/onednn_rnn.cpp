//===- onednn_rnn.cpp - oneDNN's LSTM and GRU training, for the benchmark -===//
//
// A C entry point that bench/cpu/compare.py loads with ctypes, so that
// oneDNN runs in the same process as cellc and torch: it sets up oneDNN's
// LSTM (or linear-before-reset GRU, which is PyTorch's GRU) training
// primitives from PyTorch-layout weights, computes the outputs and the
// gradients of `out.sum()` once (for the benchmark to check against torch
// before timing anything), then times forward training and forward plus
// backward. oneDNN is a benchmark dependency only (libdnnl-dev).
//
//===----------------------------------------------------------------------===//

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A buffer in oneDNN's preferred layout for `want`, filled from (or read
/// back into) a user buffer in layout `user`.
struct Tensor {
  memory user, inner;
  Tensor(const engine &eng, const memory::desc &userDesc, void *data,
         const memory::desc &want)
      : user(userDesc, eng, data), inner(want == userDesc ? user : memory(want, eng)) {}
  void in(stream &s) {
    if (inner != user)
      reorder(user, inner).execute(s, user, inner);
  }
  void out(stream &s) {
    if (inner != user)
      reorder(inner, user).execute(s, inner, user);
  }
};

int run(const std::string &cell, int T, int B, int I, int H, const float *x,
        const float *wIh, const float *wHh, const float *bIh, const float *bHh,
        float *out, float *dx, float *dwIh, float *dwHh, float *db, int repeats,
        double *fwdMs, double *bothMs) {
  bool lstm = cell == "lstm";
  int G = lstm ? 4 : 3;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);

  // PyTorch's layouts: x [T, B, I], W [G*H, I] (ldgoi), states [B, H].
  memory::dims xDims = {T, B, I}, yDims = {T, B, H}, stDims = {1, 1, B, H};
  memory::dims wlDims = {1, 1, I, G, H}, wiDims = {1, 1, H, G, H};
  memory::dims bDims = {1, 1, lstm ? 4 : 4, H};
  auto md = [](const memory::dims &d, tag t) { return memory::desc(d, dt::f32, t); };
  auto any = [](const memory::dims &d) { return memory::desc(d, dt::f32, tag::any); };

  // Gates in oneDNN's order. LSTM: i, f, c, o, as PyTorch. GRU: u (PyTorch's
  // z), r, o (PyTorch's n); the linear-before-reset bias has a fourth, the
  // hidden part of o (b_hn).
  std::vector<int> order = lstm ? std::vector<int>{0, 1, 2, 3}
                                 : std::vector<int>{1, 0, 2};
  auto permute = [&](const float *w, int cols) {
    std::vector<float> p(size_t(G) * H * cols);
    for (int g = 0; g < G; ++g)
      std::memcpy(&p[size_t(g) * H * cols], &w[size_t(order[g]) * H * cols],
                  sizeof(float) * H * cols);
    return p;
  };
  std::vector<float> wl = permute(wIh, I), wi = permute(wHh, H);
  std::vector<float> bias(4 * size_t(H));
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < H; ++j) {
      int k = order[g] * H + j;
      bias[g * H + j] = bIh[k] + (lstm || g < 2 ? bHh[k] : 0.0f);
    }
  if (!lstm)
    for (int j = 0; j < H; ++j)
      bias[3 * H + j] = bHh[2 * H + j];

  std::vector<float> xs(x, x + size_t(T) * B * I), ys(size_t(T) * B * H);
  std::vector<float> zeros(size_t(B) * H, 0.0f), hT(size_t(B) * H), cT(size_t(B) * H);
  memory::desc none;

  auto direction = rnn_direction::unidirectional_left2right;
  std::unique_ptr<primitive> fwd, bwd;
  memory::desc wlWant, wiWant, bWant, wsDesc, wlBwd, wiBwd, dwlDesc, dwiDesc, dbDesc;
  if (lstm) {
    lstm_forward::desc fd(prop_kind::forward_training, direction,
                          md(xDims, tag::tnc), md(stDims, tag::ldnc),
                          md(stDims, tag::ldnc), any(wlDims), any(wiDims),
                          md(bDims, tag::ldgo), md(yDims, tag::tnc),
                          md(stDims, tag::ldnc), md(stDims, tag::ldnc));
    lstm_forward::primitive_desc fpd(fd, eng);
    lstm_backward::desc bd(
        prop_kind::backward, direction, md(xDims, tag::tnc), md(stDims, tag::ldnc),
        md(stDims, tag::ldnc), any(wlDims), any(wiDims), md(bDims, tag::ldgo),
        md(yDims, tag::tnc), md(stDims, tag::ldnc), md(stDims, tag::ldnc),
        md(xDims, tag::tnc), md(stDims, tag::ldnc), md(stDims, tag::ldnc),
        any(wlDims), any(wiDims), md(bDims, tag::ldgo), md(yDims, tag::tnc),
        md(stDims, tag::ldnc), md(stDims, tag::ldnc));
    lstm_backward::primitive_desc bpd(bd, eng, fpd);
    fwd = std::make_unique<lstm_forward>(fpd);
    bwd = std::make_unique<lstm_backward>(bpd);
    wlWant = fpd.weights_layer_desc(), wiWant = fpd.weights_iter_desc();
    wsDesc = fpd.workspace_desc();
    wlBwd = bpd.weights_layer_desc(), wiBwd = bpd.weights_iter_desc();
    dwlDesc = bpd.diff_weights_layer_desc(), dwiDesc = bpd.diff_weights_iter_desc();
  } else {
    lbr_gru_forward::desc fd(prop_kind::forward_training, direction,
                             md(xDims, tag::tnc), md(stDims, tag::ldnc), any(wlDims),
                             any(wiDims), md(bDims, tag::ldgo), md(yDims, tag::tnc),
                             md(stDims, tag::ldnc));
    lbr_gru_forward::primitive_desc fpd(fd, eng);
    lbr_gru_backward::desc bd(
        prop_kind::backward, direction, md(xDims, tag::tnc), md(stDims, tag::ldnc),
        any(wlDims), any(wiDims), md(bDims, tag::ldgo), md(yDims, tag::tnc),
        md(stDims, tag::ldnc), md(xDims, tag::tnc), md(stDims, tag::ldnc),
        any(wlDims), any(wiDims), md(bDims, tag::ldgo), md(yDims, tag::tnc),
        md(stDims, tag::ldnc));
    lbr_gru_backward::primitive_desc bpd(bd, eng, fpd);
    fwd = std::make_unique<lbr_gru_forward>(fpd);
    bwd = std::make_unique<lbr_gru_backward>(bpd);
    wlWant = fpd.weights_layer_desc(), wiWant = fpd.weights_iter_desc();
    wsDesc = fpd.workspace_desc();
    wlBwd = bpd.weights_layer_desc(), wiBwd = bpd.weights_iter_desc();
    dwlDesc = bpd.diff_weights_layer_desc(), dwiDesc = bpd.diff_weights_iter_desc();
  }

  // Weights in each primitive's layout, reordered once (as a training loop
  // would after each optimizer step, which is not timed here either).
  Tensor wlF(eng, md(wlDims, tag::ldgoi), wl.data(), wlWant);
  Tensor wiF(eng, md(wiDims, tag::ldgoi), wi.data(), wiWant);
  Tensor wlB(eng, md(wlDims, tag::ldgoi), wl.data(), wlBwd);
  Tensor wiB(eng, md(wiDims, tag::ldgoi), wi.data(), wiBwd);
  wlF.in(s), wiF.in(s), wlB.in(s), wiB.in(s);
  memory biasM(md(bDims, tag::ldgo), eng, bias.data());
  memory xM(md(xDims, tag::tnc), eng, xs.data()), yM(md(yDims, tag::tnc), eng, ys.data());
  memory h0(md(stDims, tag::ldnc), eng, zeros.data()), c0(md(stDims, tag::ldnc), eng, zeros.data());
  memory hTM(md(stDims, tag::ldnc), eng, hT.data()), cTM(md(stDims, tag::ldnc), eng, cT.data());
  memory ws(wsDesc, eng);

  std::vector<float> dxs(xs.size()), dys(ys.size(), 1.0f), dzeros(zeros.size(), 0.0f);
  std::vector<float> dh0(zeros.size()), dc0(zeros.size());
  std::vector<float> dwl(wl.size()), dwi(wi.size()), dbias(bias.size());
  memory dxM(md(xDims, tag::tnc), eng, dxs.data()), dyM(md(yDims, tag::tnc), eng, dys.data());
  memory dhT(md(stDims, tag::ldnc), eng, dzeros.data()), dcT(md(stDims, tag::ldnc), eng, dzeros.data());
  memory dh0M(md(stDims, tag::ldnc), eng, dh0.data()), dc0M(md(stDims, tag::ldnc), eng, dc0.data());
  Tensor dwlT(eng, md(wlDims, tag::ldgoi), dwl.data(), dwlDesc);
  Tensor dwiT(eng, md(wiDims, tag::ldgoi), dwi.data(), dwiDesc);
  memory dbM(md(bDims, tag::ldgo), eng, dbias.data());

  auto forward = [&] {
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC_LAYER, xM},        {DNNL_ARG_SRC_ITER, h0},
        {DNNL_ARG_WEIGHTS_LAYER, wlF.inner}, {DNNL_ARG_WEIGHTS_ITER, wiF.inner},
        {DNNL_ARG_BIAS, biasM},          {DNNL_ARG_DST_LAYER, yM},
        {DNNL_ARG_DST_ITER, hTM},        {DNNL_ARG_WORKSPACE, ws}};
    if (lstm) {
      args[DNNL_ARG_SRC_ITER_C] = c0;
      args[DNNL_ARG_DST_ITER_C] = cTM;
    }
    fwd->execute(s, args);
  };
  auto backward = [&] {
    // oneDNN accumulates the weight gradients: zero them first.
    for (memory *m : {&dwlT.inner, &dwiT.inner, &dbM})
      std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC_LAYER, xM},         {DNNL_ARG_SRC_ITER, h0},
        {DNNL_ARG_WEIGHTS_LAYER, wlB.inner}, {DNNL_ARG_WEIGHTS_ITER, wiB.inner},
        {DNNL_ARG_BIAS, biasM},           {DNNL_ARG_DST_LAYER, yM},
        {DNNL_ARG_DST_ITER, hTM},         {DNNL_ARG_WORKSPACE, ws},
        {DNNL_ARG_DIFF_SRC_LAYER, dxM},   {DNNL_ARG_DIFF_SRC_ITER, dh0M},
        {DNNL_ARG_DIFF_WEIGHTS_LAYER, dwlT.inner},
        {DNNL_ARG_DIFF_WEIGHTS_ITER, dwiT.inner}, {DNNL_ARG_DIFF_BIAS, dbM},
        {DNNL_ARG_DIFF_DST_LAYER, dyM},   {DNNL_ARG_DIFF_DST_ITER, dhT}};
    if (lstm) {
      args[DNNL_ARG_SRC_ITER_C] = c0;
      args[DNNL_ARG_DST_ITER_C] = cTM;
      args[DNNL_ARG_DIFF_SRC_ITER_C] = dc0M;
      args[DNNL_ARG_DIFF_DST_ITER_C] = dcT;
    }
    bwd->execute(s, args);
  };

  // Once, for the results the benchmark checks.
  forward();
  backward();
  s.wait();
  dwlT.out(s), dwiT.out(s);
  s.wait();
  std::memcpy(out, ys.data(), sizeof(float) * ys.size());
  std::memcpy(dx, dxs.data(), sizeof(float) * dxs.size());
  for (int g = 0; g < G; ++g) {
    std::memcpy(&dwIh[size_t(order[g]) * H * I], &dwl[size_t(g) * H * I],
                sizeof(float) * H * I);
    std::memcpy(&dwHh[size_t(order[g]) * H * H], &dwi[size_t(g) * H * H],
                sizeof(float) * H * H);
    std::memcpy(&db[size_t(order[g]) * H], &dbias[size_t(g) * H], sizeof(float) * H);
  }

  std::vector<double> f, both;
  for (int r = 0; r <= repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    forward();
    s.wait();
    auto t1 = std::chrono::steady_clock::now();
    forward();
    backward();
    s.wait();
    auto t2 = std::chrono::steady_clock::now();
    if (r == 0)
      continue;
    f.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    both.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  *fwdMs = median(f);
  *bothMs = median(both);
  return 0;
}

} // namespace

/// PyTorch-layout LSTM or GRU (`cell` "lstm" or "gru"), zero initial states:
/// writes the outputs, the gradients of `out.sum()` with respect to x and
/// the weights (db: the bias gradient, which is b_ih's), and the median
/// times. Returns 0, or 1 with the error in `error`.
extern "C" int cellc_onednn_rnn(const char *cell, int T, int B, int I, int H,
                                const float *x, const float *wIh, const float *wHh,
                                const float *bIh, const float *bHh, float *out,
                                float *dx, float *dwIh, float *dwHh, float *db,
                                int repeats, double *fwdMs, double *bothMs,
                                char *error, size_t errorSize) {
  try {
    return run(cell, T, B, I, H, x, wIh, wHh, bIh, bHh, out, dx, dwIh, dwHh, db,
               repeats, fwdMs, bothMs);
  } catch (const std::exception &e) {
    std::snprintf(error, errorSize, "%s", e.what());
    return 1;
  }
}
