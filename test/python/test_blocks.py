"""Block-diagonal params: a param declared `[G, M, N]` holds G blocks, and
`R @ v` multiplies block g by part g of v. The block GRU (DreamerV3-style)
and xLSTM's sLSTM of examples/ against float64 PyTorch references written
from their formulas (forward and every gradient, block weights included,
every recompute mode, a batch that is not a multiple of the tile, resets,
one sample on the per-row kernels), gradcheck of small cells, and the
errors users meet."""

import os
import re

import pytest
import torch

import cellc
from test_functional import gradcheck_cell

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
MODES = ["none", "full", "chunk:3"]


def _blocks(W, v):
    """`W @ v` for a block-diagonal W [G, M, N] and rows v [B, G*N]."""
    G = W.shape[0]
    return torch.einsum("gmn,bgn->bgm", W, v.reshape(v.shape[0], G, -1)).reshape(v.shape[0], -1)


def _block_gru_step(p, x, h):
    y = p["g"] * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    br, bc, bu = p["b"].chunk(3)
    r = torch.sigmoid(_blocks(p["Wr"], x) + _blocks(p["Rr"], y) + br)
    c = torch.tanh(r * (_blocks(p["Wc"], x) + _blocks(p["Rc"], y) + bc))
    u = torch.sigmoid(_blocks(p["Wu"], x) + _blocks(p["Ru"], y) + bu - 1)
    return (u * c + (1 - u) * h,)


def _slstm_step(p, x, h, c, n, m):
    wz, wi, wf, wo = (x @ p["W"].t() + p["b"]).chunk(4, -1)
    z = torch.tanh(wz + _blocks(p["Rz"], h))
    li = wi + _blocks(p["Ri"], h)
    lf = -torch.nn.functional.softplus(-(wf + _blocks(p["Rf"], h)))
    o = torch.sigmoid(wo + _blocks(p["Ro"], h))
    mn = torch.maximum(lf + m, li)
    fp, ip = torch.exp(lf + m - mn), torch.exp(li - mn)
    c = fp * c + ip * z
    n = fp * n + ip
    return o * c / n, c, n, mn


CELLS = {
    "block_gru": (_block_gru_step, ["h"], {"G": 3, "D": 5}, "G*D"),
    "slstm": (_slstm_step, ["h", "c", "n", "m"], {"I": 6, "NH": 3, "D": 5}, "I"),
}


# One sample runs the per-row kernels on one thread, and the batched ones,
# its units split over the threads, on two.
@pytest.mark.parametrize("B,threads", [(70, 0), (1, 1), (1, 2)], ids=["70", "1", "1-threads2"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CELLS))
def test_block_cells_match_torch_in_every_gradient(name, mode, B, threads):
    step, state_names, sizes, input_size = CELLS[name]
    cell = cellc.compile(os.path.join(EXAMPLES, name + ".cell"), threads=threads)
    T = 5
    g = torch.Generator().manual_seed(4)
    size = lambda d: eval(d, {}, dict(sizes))
    params = {n: (0.4 * torch.randn(*cell.shape(n, sizes), generator=g, dtype=torch.float64)
                  + (1.0 if n == "g" else 0.0)).requires_grad_() for n, _ in cell.params}
    H = size("NH*D") if "NH" in sizes else size("G*D")
    x = torch.randn(T, B, size(input_size), generator=g, dtype=torch.float64,
                    requires_grad=True)
    states = {n: (torch.rand(B, H, generator=g, dtype=torch.float64) + (0.5 if n == "n" else 0))
              .requires_grad_() for n in state_names}
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 0] = True
    if B > 60:
        resets[3, 65] = True

    out, final = cell(x, params, states, resets=resets, recompute=mode)
    cur, outs = list(states.values()), []
    for t in range(T):
        cur = [torch.where(resets[t, :, None], s0, s) for s, s0 in zip(cur, states.values())]
        cur = list(step(params, x[t], *cur))
        outs.append(cur[0])
    ref = torch.stack(outs)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for n, r in zip(state_names, cur):
        torch.testing.assert_close(final[n], r, rtol=1e-10, atol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    wrt = [x, *params.values(), *states.values()]
    got = torch.autograd.grad((out * w).sum() + sum(final[n].sum() for n in state_names), wrt)
    want = torch.autograd.grad((ref * w).sum() + sum(r.sum() for r in cur), wrt)
    for n, a, b in zip(["x", *params, *states], got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"d {n}: {m}")


SMALL = {
    "a block product of the state": """cell a {
        input x: [G*N]
        state h: [G*N]
        param R: [G, N, N]
        h = tanh(R @ h + x)
    }""",
    "blocks wider than tall, of an input and a normalized value": """cell b {
        input x: [G*N]
        state h: [G*M]
        param W: [G, M, N], R: [G, M, M], U: [G, N, M]
        y = h / sqrt(mean(h * h) + 0.5)
        h = tanh(W @ x + R @ y) + 0.1 * (W @ (U @ h))
    }""",
}


@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("name", list(SMALL))
def test_small_block_cells_pass_gradcheck(name, mode):
    T, B = 3, 3
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[1, 2] = True
    sizes = {"G": 2, "N": 3, "M": 2, "G*N": 6, "G*M": 4}
    gradcheck_cell(cellc.compile(SMALL[name]), sizes, T, B, mode, resets)


def test_params_report_three_dimensions_and_a_wrong_block_is_named():
    cell = cellc.compile(os.path.join(EXAMPLES, "block_gru.cell"))
    assert dict(cell.params)["Rr"] == ["G", "D", "D"]
    assert cell.shape("Rr", {"G": 4, "D": 8}) == [4, 8, 8]
    params = {n: torch.zeros(*cell.shape(n, {"G": 2, "D": 3})) for n, _ in cell.params}
    x = torch.zeros(4, 2, 6)
    cell(x, params)
    with pytest.raises(ValueError, match=r"param 'Rc' is declared \[G, D, D\]"):
        cell(x, {**params, "Rc": torch.zeros(2, 3, 4)})
    with pytest.raises(ValueError, match=r"param 'Rc' is declared \[G, D, D\]"):
        cell(x, {**params, "Rc": torch.zeros(6, 3)})


# Each bad line, the text its error points at, and the error.
BAD = [
    ("h = tanh(R @ x)", "@",
     "size mismatch in '@': 'R' is block-diagonal, 2 blocks of [3, 3], so the right operand "
     "must have size 2 * 3 = 6; found 5"),
    ("h = tanh(h) * R", "R",
     "param 'R' is a block-diagonal matrix; it can only be the left operand of '@'"),
    ("h = tanh(sum(R) + h)", "R", "param 'R' is a block-diagonal matrix"),
]


@pytest.mark.parametrize("line, at, message", BAD)
def test_bad_block_products_are_errors_with_their_place(line, at, message):
    source = ("cell t {\n input x: [5]\n state h: [6]\n param R: [2, 3, 3]\n"
              f" {line}\n}}")
    column = line.index(at) + 2
    with pytest.raises(cellc.CellError, match=f"<cell>:5:{column}: error: {re.escape(message)}"):
        cellc.compile(source)


def test_a_param_of_four_dimensions_is_an_error():
    with pytest.raises(cellc.CellError, match=r"<cell>:3:11: error: expected a vector \[n\], a "
                                              r"matrix \[rows, cols\] or blocks \[G, rows, cols\], "
                                              r"found 4 dimensions"):
        cellc.compile("cell t {\n state h: [4]\n param R: [2, 2, 2, 2]\n h = tanh(h)\n}")
