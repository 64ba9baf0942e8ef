"""Transposed params, `v @ W` (W's transpose times v): the antisymmetric RNN
(examples/antisymmetric.cell, W - W^T) and a cell with `x @ U` on an input
and `h @ W` beside `W @ h`, against float64 torch written from their
formulas, every gradient, in every recompute mode, with resets and lengths,
on 1 and 3 threads, and in the SIMT emulator; their errors."""

import os
import re

import pytest
import torch

import cellc
from conftest import assert_sequence_matches

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

TIED = """cell tied {
  input x: [I]
  state h: [H]
  param W: [H, H], U: [I, H], b: [H]
  h = tanh(W @ h + 0.5 * (h @ W) + x @ U + b)
  output h
}"""


def antisymmetric_step(x, h, p):
    W = p["W"]
    return h + 0.1 * torch.tanh(h @ W.t() - h @ W - 0.01 * h + x @ p["V"].t() + p["b"])


def tied_step(x, h, p):
    W = p["W"]
    return torch.tanh(h @ W.t() + 0.5 * (h @ W) + x @ p["U"] + p["b"])


CELLS = {"antisymmetric": (os.path.join(ROOT, "examples", "antisymmetric.cell"),
                           antisymmetric_step),
         "tied": (TIED, tied_step)}


def reference(step, x, h0, params, resets, lengths):
    """[T, B, H] outputs (zero past a sample's length) and the final h."""
    h, outs = h0, []
    for t in range(x.shape[0]):
        live = (t < lengths)[:, None]
        if resets is not None:
            # A sample past its length neither steps nor restarts.
            h = torch.where(resets[t][:, None] & live, h0, h)
        new = step(x[t], h, params)
        h = torch.where(live, new, h)
        outs.append(torch.where(live, new, torch.zeros_like(new)))
    return torch.stack(outs), h


@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_torch_in_float64(name, mode, threads):
    torch.manual_seed(1)
    source, step = CELLS[name]
    cell = cellc.compile(source, threads=threads)
    T, B, I, H = 6, 7, 5, 13
    shapes = {"W": (H, H), "V": (H, I), "U": (I, H), "b": (H,)}
    params = {n: (0.4 * torch.randn(*shapes[n], dtype=torch.float64)).requires_grad_()
              for n, _ in cell.params}
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    resets = torch.rand(T, B) < 0.2
    lengths = torch.tensor([6, 3, 1, 6, 5, 2, 4])
    out, final = cell(x, params, {"h": h0}, resets=resets, lengths=lengths, recompute=mode)
    want_out, want_h = reference(step, x, h0, params, resets, lengths)
    assert_sequence_matches(out, final["h"], want_out, want_h, [x, h0, *params.values()],
                            ["x", "h0", *params])


@pytest.mark.parametrize("name", sorted(CELLS))
def test_emulated_cuda_kernels_match_torch(name):
    torch.manual_seed(2)
    source, step = CELLS[name]
    cell = cellc.compile(source, target="cuda-emu")
    T, B, I, H = 5, 3, 4, 9
    shapes = {"W": (H, H), "V": (H, I), "U": (I, H), "b": (H,)}
    params = {n: (0.4 * torch.randn(*shapes[n])).requires_grad_() for n, _ in cell.params}
    x = torch.randn(T, B, I, requires_grad=True)
    h0 = torch.randn(B, H, requires_grad=True)
    for mode in ("none", "full"):
        out, final = cell(x, params, {"h": h0}, recompute=mode)
        p64 = {n: v.double() for n, v in params.items()}
        want_out, want_h = reference(step, x.double(), h0.double(), p64, None,
                                     torch.full((B,), T))
        torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
        leaves = [x, h0, *params.values()]
        g = torch.randn_like(want_out)
        got = torch.autograd.grad((out * g.float()).sum(), leaves)
        want = torch.autograd.grad((want_out * g).sum(), leaves)
        for n, a, b in zip(["x", "h0", *params], got, want):
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-4,
                                       msg=f"d{n}")


@pytest.mark.parametrize("body,at,message", [
    ("h = tanh(x @ W) + h", "@", "size mismatch in '@': 'W' is [4, 3], so v @ W needs a "
                                 "left operand of size 4; found 3"),
    ("h = tanh(sum(h) @ W) + h", "sum", "the left operand of '@' must be a vector when its "
                                        "right operand is a matrix param"),
    ("h = tanh(W + h)", "W", "param 'W' is a matrix; it can only be an operand of '@'"),
])
def test_errors_name_the_place(body, at, message):
    source = "cell bad {\n input x: [3]\n state h: [4]\n param W: [4, 3]\n " + body + "\n}"
    column = body.index(at) + 2
    with pytest.raises(cellc.CellError, match=f"<cell>:5:{column}: error: {re.escape(message)}"):
        cellc.compile(source)
