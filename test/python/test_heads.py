"""Heads: `heads(v, NH)` sees a vector as NH equal parts; `sum` and `mean`
of it give one value per head; a per-head value broadcasts over its head's
part. A recurrent cell with GroupNorm per head (xLSTM's sLSTM normalizes
that way) against float64 torch (torch.nn.functional.group_norm), every
gradient, every recompute mode, resets and lengths, on 1 and 3 threads; in
f32; in the SIMT emulator (both CUDA strategies); and the errors, at their
place."""

import re

import pytest
import torch

import cellc
from conftest import assert_sequence_matches

GROUPNORM_RNN = """cell gn_rnn {
  input x: [I]
  state h: [H]
  param W: [H, H], U: [H, I], gamma: [H], beta: [H], s: [NH]
  z = heads(W @ h + U @ x, NH)
  d = z - mean(z)
  y = d / sqrt(mean(d * d) + 0.00001) * gamma + beta
  h = tanh(y) + 0.1 * (heads(h, NH) * sigmoid(s))
  output h
}"""


def reference(x, h0, p, NH, resets, lengths):
    B, H = h0.shape
    h, outs = h0, []
    for t in range(x.shape[0]):
        live = (t < lengths)[:, None]
        h = torch.where(resets[t][:, None] & live, h0, h)
        z = h @ p["W"].t() + x[t] @ p["U"].t()
        y = torch.nn.functional.group_norm(z, NH, p["gamma"], p["beta"], eps=1e-5)
        gate = torch.sigmoid(p["s"])[None, :, None]
        new = torch.tanh(y) + 0.1 * (h.view(B, NH, H // NH) * gate).reshape(B, H)
        h = torch.where(live, new, h)
        outs.append(torch.where(live, new, torch.zeros_like(new)))
    return torch.stack(outs), h


def problem(dtype, T=6, B=5, I=4, H=12, NH=3, seed=0):
    torch.manual_seed(seed)
    p = {"W": 0.4 * torch.randn(H, H, dtype=dtype), "U": torch.randn(H, I, dtype=dtype),
         "gamma": torch.randn(H, dtype=dtype), "beta": torch.randn(H, dtype=dtype),
         "s": torch.randn(NH, dtype=dtype)}
    p = {n: v.requires_grad_() for n, v in p.items()}
    x = torch.randn(T, B, I, dtype=dtype, requires_grad=True)
    h0 = torch.randn(B, H, dtype=dtype, requires_grad=True)
    resets = torch.rand(T, B) < 0.2
    lengths = torch.tensor([6, 2, 5, 1, 6])[:B]
    return x, h0, p, NH, resets, lengths


@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
@pytest.mark.parametrize("threads", [1, 3])
def test_groupnorm_per_head_matches_torch_in_float64(mode, threads):
    cell = cellc.compile(GROUPNORM_RNN, threads=threads)
    x, h0, p, NH, resets, lengths = problem(torch.float64)
    out, final = cell(x, p, {"h": h0}, resets=resets, lengths=lengths, recompute=mode)
    want_out, want_h = reference(x, h0, p, NH, resets, lengths)
    assert_sequence_matches(out, final["h"], want_out, want_h, [x, h0, *p.values()],
                            ["x", "h0", *p])


def test_groupnorm_per_head_in_float32():
    cell = cellc.compile(GROUPNORM_RNN)
    x, h0, p, NH, resets, lengths = problem(torch.float32, H=48, NH=4, seed=1)
    out, final = cell(x, p, {"h": h0}, resets=resets, lengths=lengths)
    p64 = {n: v.double() for n, v in p.items()}
    want_out, _ = reference(x.double(), h0.double(), p64, NH, resets, lengths)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [{"strategy": "batch-tiled", "batch_tile": 4},
                                     {"strategy": "persistent", "ctas": 3}],
                         ids=["batch-tiled", "persistent-3"])
def test_groupnorm_per_head_in_the_emulator(options):
    # The CUDA kernels in the SIMT emulator, forward and every gradient.
    cell = cellc.compile(GROUPNORM_RNN, target="cuda-emu", cuda=dict(options, precision="ieee"))
    x, h0, p, NH, _, _ = problem(torch.float32, seed=2)
    T, B = x.shape[:2]
    no_resets, full = torch.zeros(T, B, dtype=torch.bool), torch.full((B,), T)
    p64 = {n: v.detach().double().requires_grad_() for n, v in p.items()}
    x64, h64 = x.detach().double().requires_grad_(), h0.detach().double().requires_grad_()
    want_out, want_h = reference(x64, h64, p64, NH, no_resets, full)
    g = torch.randn_like(want_out)
    want = torch.autograd.grad((want_out * g).sum() + want_h.sum(), [x64, h64, *p64.values()])
    for mode in ("none", "full"):
        out, final = cell(x, p, {"h": h0}, recompute=mode)
        torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-4)
        got = torch.autograd.grad((out * g.float()).sum() + final["h"].sum(),
                                  [x, h0, *p.values()])
        for n, a, b in zip(["x", "h0", *p], got, want):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=f"{mode}: d{n}")


BAD = [
    ("h = tanh(h) + heads(x, 2)", "heads(x, 2)", "'heads' splits a vector of size 3 into 2 "
     "heads, which does not divide it"),
    ("h = tanh(h) * mean(heads(h, Q))", "Q", "'Q' is not a bound size: the head count of "
     "'heads' must be a size that a declaration uses, or a positive integer literal"),
    ("h = tanh(h) * mean(heads(mean(h), 2))", "mean(h)", "'heads' splits a vector into "
     "heads; found one value per sample"),
    ("h = heads(h, 2) * heads(h, 1)", "*", "shape mismatch in '*': the left operand is "
     "[2, 2], the right [1, 4]"),
    ("h = heads(heads(h, 2), 2)", "heads(h, 2)", "'heads' splits a vector into heads; "
     "found a value with heads already"),
]


@pytest.mark.parametrize("line,at,message", BAD)
def test_bad_heads_are_errors_with_their_place(line, at, message):
    source = f"cell t {{\n input x: [3]\n state h: [4]\n {line}\n}}"
    column = line.index(at) + 2
    with pytest.raises(cellc.CellError, match=f"<cell>:4:{column}: error: {re.escape(message)}"):
        cellc.compile(source)
