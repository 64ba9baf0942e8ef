#!/usr/bin/env python3
"""Cells that need reductions or block-diagonal weights, on the CPU, side by
side in one process: forward plus backward (of a weighted sum of the
outputs) of

- the LayerNorm LSTM (examples/layernorm_lstm.cell, Haste's formulation):
  cellc.nn.LayerNormLSTM against the same step as a PyTorch loop written
  from the formulas, and against a loop with torch.nn.functional.layer_norm;
- the RMS-normalized GRU (examples/rmsnorm_gru.cell): cellc against its
  PyTorch loop;
- the DreamerV3-style block GRU (examples/block_gru.cell, G = 4 blocks of
  H / 4): cellc against its PyTorch loop, whose block products are batched
  matrix products (torch.bmm over the blocks).

cellc's outputs and gradients are checked against the loops' before any
timing. Run it pinned, one BLAS thread:

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/cells.py
"""

import torch
import torch.nn.functional as F

import cellc
from shape import parse_shape, side_by_side


def _norm(v, eps):
    d = v - v.mean(-1, keepdim=True)
    return d / torch.sqrt((d * d).mean(-1, keepdim=True) + eps)


def layernorm_lstm_loop(p, x, h, c, torch_layer_norm):
    """The LayerNorm LSTM step by step; the products of the inputs as one
    matrix product first, as cellc hoists them."""
    H = h.shape[1]
    ln = ((lambda v, g, b=None: F.layer_norm(v, v.shape[-1:], g, b, 1e-5))
          if torch_layer_norm else (lambda v, g, b=None: g * _norm(v, 1e-5) + (0 if b is None else b)))
    wx = x @ p["W"].t()
    outs = []
    for t in range(x.shape[0]):
        v = ln(wx[t], p["gamma_x"]) + ln(h @ p["R"].t(), p["gamma_r"]) + p["b"]
        i, g, f, o = v.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(ln(c, p["gamma_h"], p["beta_h"]))
        outs.append(h)
    return torch.stack(outs)


def rmsnorm_gru_loop(p, x, h):
    xs = (x @ p["W_ih"].t() + p["b_ih"]).chunk(3, -1)
    outs = []
    for t in range(x.shape[0]):
        y = p["g"] * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
        hr, hz, hn = (y @ p["W_hh"].t() + p["b_hh"]).chunk(3, -1)
        r, z = torch.sigmoid(xs[0][t] + hr), torch.sigmoid(xs[1][t] + hz)
        h = (1 - z) * torch.tanh(xs[2][t] + r * hn) + z * h
        outs.append(h)
    return torch.stack(outs)


def _blocks(W, v):
    """`W @ v` for a block-diagonal W [G, M, N] and rows v [..., G*N]: one
    batched product over the blocks."""
    G, N = W.shape[0], W.shape[2]
    rows = v.reshape(-1, G, N).transpose(0, 1)               # [G, rows, N]
    return torch.bmm(rows, W.transpose(1, 2)).transpose(0, 1).reshape(*v.shape[:-1], -1)


def block_gru_loop(p, x, h):
    br, bc, bu = p["b"].chunk(3)
    xr, xc, xu = _blocks(p["Wr"], x) + br, _blocks(p["Wc"], x) + bc, _blocks(p["Wu"], x) + bu
    outs = []
    for t in range(x.shape[0]):
        y = p["g"] * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
        r = torch.sigmoid(xr[t] + _blocks(p["Rr"], y))
        c = torch.tanh(r * (xc[t] + _blocks(p["Rc"], y)))
        u = torch.sigmoid(xu[t] + _blocks(p["Ru"], y) - 1)
        h = u * c + (1 - u) * h
        outs.append(h)
    return torch.stack(outs)


def main():
    a = parse_shape(__doc__.splitlines()[0], steps=100)
    B, T, I, H = a.batch, a.steps, a.size, a.size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, I, generator=g)
    w_out = torch.randn(T, B, H, generator=g)
    zeros = torch.zeros(B, H)

    lnlstm = cellc.nn.LayerNormLSTM(I, H)
    with torch.no_grad():
        for q in lnlstm.parameters():
            q.add_(0.1 * torch.randn(q.shape, generator=g))
    ln_params = lambda: {"W": lnlstm.kernel.t(), "R": lnlstm.recurrent_kernel.t(),
                         "b": lnlstm.bias, "gamma_x": lnlstm.gamma[0],
                         "gamma_r": lnlstm.gamma[1], "gamma_h": lnlstm.gamma_h,
                         "beta_h": lnlstm.beta_h}
    gru = cellc.compile(cellc.nn._shipped("rmsnorm_gru"))
    bound = H ** -0.5
    gru_params = {n: (torch.empty(*gru.shape(n, {"I": I, "H": H})).uniform_(-bound, bound)
                      + (1.0 if n == "g" else 0.0)).requires_grad_() for n, _ in gru.params}
    blocks = cellc.compile(cellc.nn._shipped("block_gru"))
    block_sizes = {"G": 4, "D": H // 4}
    block_params = {n: (torch.empty(*blocks.shape(n, block_sizes)).uniform_(-bound, bound)
                        + (1.0 if n == "g" else 0.0)).requires_grad_()
                    for n, _ in blocks.params}
    runs = {
        "LayerNorm LSTM": {
            "cellc": lambda xs: lnlstm(xs)[0],
            "torch loop": lambda xs: layernorm_lstm_loop(ln_params(), xs, zeros, zeros, False),
            "torch loop, F.layer_norm":
                lambda xs: layernorm_lstm_loop(ln_params(), xs, zeros, zeros, True),
        },
        "RMSNorm GRU": {
            "cellc": lambda xs: gru(xs, gru_params, {"h": zeros})[0],
            "torch loop": lambda xs: rmsnorm_gru_loop(gru_params, xs, zeros),
        },
        "block GRU (G = 4)": {
            "cellc": lambda xs: blocks(xs, block_params, {"h": zeros})[0],
            "torch loop": lambda xs: block_gru_loop(block_params, xs, zeros),
        },
    }
    params = {"LayerNorm LSTM": list(lnlstm.parameters()),
              "RMSNorm GRU": list(gru_params.values()),
              "block GRU (G = 4)": list(block_params.values())}

    def step(f, ps):
        for q in ps:
            q.grad = None
        xs = x.clone().requires_grad_()
        out = f(xs)
        (out * w_out).sum().backward()
        return [out, xs.grad] + [q.grad for q in ps]

    print(f"B={B} T={T} I=H={H}, {a.threads} thread(s), forward+backward, "
          f"median of {a.repeats}")
    def error(a, b):
        return max(((u.double() - v).abs().max() / v.abs().max()).item() for u, v in zip(a, b))

    for cell, impls in runs.items():
        ps = params[cell]
        # Both float32 results against the torch loop in float64: cellc's
        # error must be of the order of torch's own.
        got, want = step(impls["cellc"], ps), step(impls["torch loop"], ps)
        for q in ps:
            q.data = q.data.double()
        x64, w64, z64 = x.double(), w_out.double(), zeros.double()
        x, w_out, zeros = x64, w64, z64
        exact = [t.clone() for t in step(impls["torch loop"], ps)]
        for q in ps:
            q.data = q.data.float()
        x, w_out, zeros = x64.float(), w64.float(), z64.float()
        worst, theirs = error(got, exact), error(want, exact)
        assert worst < 10 * theirs + 1e-5, f"{cell}: cellc's error {worst:.1e}, torch's {theirs:.1e}"
        medians = side_by_side({n: (lambda f=f: step(f, ps)) for n, f in impls.items()},
                               a.repeats)
        print(f"{cell}: largest difference from float64, of each tensor's largest value: "
              f"cellc {worst:.1e}, the torch loop {theirs:.1e}")
        for n, m in medians.items():
            print(f"  {n:26s} {1e3 * m:8.1f} ms   cellc {m / medians['cellc']:5.2f}x faster")

if __name__ == "__main__":
    main()
