"""Reductions over the units: `sum(v)` and `mean(v)` give one value per
sample, broadcast where they meet a vector. The LayerNorm LSTM and the
RMS-normalized GRU of examples/ against float64 PyTorch references written
from their formulas (forward and every gradient, every recompute mode, a
batch that is not a multiple of the tile, resets), gradcheck of small cells,
and the errors users meet."""

import json
import os
import re
import subprocess

import pytest
import torch

import cellc
from conftest import TOOLS
from test_functional import gradcheck_cell

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
MODES = ["none", "full", "chunk:2", "chunk:3"]


def _example(name):
    return cellc.compile(os.path.join(EXAMPLES, name + ".cell"))


def _norm(v, eps):
    d = v - v.mean(-1, keepdim=True)
    return d / torch.sqrt((d * d).mean(-1, keepdim=True) + eps)


def _layernorm_lstm_step(p, x, h, c):
    """Haste's LayerNormLSTM step, gate order (i, g, f, o)."""
    v = (p["gamma_x"] * _norm(x @ p["W"].t(), 1e-5)
         + p["gamma_r"] * _norm(h @ p["R"].t(), 1e-5) + p["b"])
    i, g, f, o = v.chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(p["gamma_h"] * _norm(c, 1e-5) + p["beta_h"])
    return h, c


def _rmsnorm_gru_step(p, x, h):
    y = p["g"] * h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    xr, xz, xn = (x @ p["W_ih"].t() + p["b_ih"]).chunk(3, -1)
    hr, hz, hn = (y @ p["W_hh"].t() + p["b_hh"]).chunk(3, -1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return ((1 - z) * n + z * h,)


def _run_reference(step, p, x, states, resets):
    outs, cur = [], list(states)
    for t in range(x.shape[0]):
        cur = [torch.where(resets[t, :, None], s0, s) for s, s0 in zip(cur, states)]
        cur = list(step(p, x[t], *cur))
        outs.append(cur[0])
    return torch.stack(outs), cur


CELLS = {
    "layernorm_lstm": (_layernorm_lstm_step, ["h", "c"]),
    "rmsnorm_gru": (_rmsnorm_gru_step, ["h"]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("H", [8, 5])
def test_normalized_cells_match_torch_in_every_gradient(name, mode, H):
    step, state_names = CELLS[name]
    cell = _example(name)
    # 70 rows: one full tile of 64 and a partial one. H = 5 leaves a unit
    # after the vectors of 4 doubles, and puts the gates' parts across them.
    T, B, I = 5, 70, 6
    g = torch.Generator().manual_seed(3)
    size = {"I": I, "H": H}
    shape = lambda dims: [eval(d, {}, size) for d in dims]
    params = {n: (0.5 * torch.randn(*shape(s), generator=g, dtype=torch.float64)
                  + (1.0 if n.startswith("gamma") or n == "g" else 0.0)).requires_grad_()
              for n, s in cell.params}
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64, requires_grad=True)
    states = {n: torch.randn(B, H, generator=g, dtype=torch.float64, requires_grad=True)
              for n in state_names}
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 0] = resets[3, 65] = resets[1, 7] = True

    out, final = cell(x, params, states, resets=resets, recompute=mode)
    ref_out, ref_final = _run_reference(step, params, x, list(states.values()), resets)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for n, r in zip(state_names, ref_final):
        torch.testing.assert_close(final[n], r, rtol=1e-10, atol=1e-12)

    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    w_fin = [torch.randn(B, H, generator=g, dtype=torch.float64) for _ in state_names]
    wrt = [x, *params.values(), *states.values()]
    loss = lambda o, f: (o * w_out).sum() + sum((s * w).sum() for s, w in zip(f, w_fin))
    got = torch.autograd.grad(loss(out, [final[n] for n in state_names]), wrt)
    want = torch.autograd.grad(loss(ref_out, ref_final), wrt)
    names = ["x", *params, *states]
    for n, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"d {n}: {m}")


SMALL = {
    "sum": """cell s {
        input x: [N]
        state h: [N]
        param u: [N]
        h = tanh(u * h + x) * sum(h * x)
    }""",
    "mean through a per-sample chain": """cell m {
        input x: [N]
        state h: [N]
        param W: [N, N]
        a = W @ h + x
        s = sqrt(mean(a * a) + 0.5) * 2 - 1
        h = a / s + mean(x)
    }""",
    # The gradient of `a` adds the broadcast gradient of the mean to the
    # joined gradients of its parts, computed in one phase.
    "a mean of a chunked vector": """cell c {
        input x: [N]
        state h: [N]
        param W: [2*N, N], R: [2*N, N]
        a = W @ x + R @ h
        g, o = chunk(a, 2)
        h = sigmoid(o) * tanh(g) + mean(a)
    }""",
    "a state normalized before its product": """cell n {
        input x: [N]
        state h: [N]
        param W: [N, N], g: [N]
        y = g * (h - mean(h))
        h = tanh(W @ y + x)
    }""",
}


@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
@pytest.mark.parametrize("name", list(SMALL))
def test_small_reduction_cells_pass_gradcheck(name, mode):
    T, B = 4, 3
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 1] = True
    gradcheck_cell(cellc.compile(SMALL[name]), {"N": 5, "2*N": 10}, T, B, mode, resets)


def test_the_batched_and_per_row_kernels_agree():
    # One sample runs the per-row kernels on one thread; more run the
    # batched ones.
    cell = cellc.compile(os.path.join(EXAMPLES, "layernorm_lstm.cell"), threads=1)
    g = torch.Generator().manual_seed(1)
    params = {n: torch.randn(*[eval(d, {}, {"I": 5, "H": 12}) for d in s], generator=g,
                             dtype=torch.float64) for n, s in cell.params}
    x = torch.randn(6, 3, 5, generator=g, dtype=torch.float64)
    states = {"h": torch.randn(3, 12, dtype=torch.float64),
              "c": torch.randn(3, 12, dtype=torch.float64)}
    out, _ = cell(x, params, states)
    for b in range(3):
        one, _ = cell(x[:, b:b + 1], params, {k: v[b:b + 1] for k, v in states.items()})
        torch.testing.assert_close(one[:, 0], out[:, b], rtol=1e-12, atol=1e-14)


def test_the_plan_shows_the_per_sample_values():
    cell = _example("layernorm_lstm")
    plan = cell.emit("plan", {"I": 4, "H": 8})
    assert "cell.sum" in plan or "cell.sqrt" in plan
    assert " 1  cell." in plan  # a saved per-sample value takes one element
    ir = cell.emit("mlir", {"I": 4, "H": 8})
    assert "cell.sum" in ir and "cell.broadcast" in ir


# Each bad line, the text its error points at, and the error.
BAD = [
    ("h = tanh(h) * sum(W)", "W", "param 'W' is a matrix"),
    ("h = tanh(h) * mean(2)", "2",
     "'mean' reduces a vector to one value per sample; found a constant"),
    ("h = tanh(h) * sum(mean(h))", "mean",
     "'sum' reduces a vector to one value per sample; found one value per sample"),
    ("h = W @ mean(h)", "mean",
     "the right operand of '@' must be a vector, found one value per sample"),
    ("h = tanh(h) * sum(h, h)", "sum", "'sum' takes 1 argument, found 2"),
    ("a, b = chunk(sum(h), 2)", "sum", "'chunk' needs a vector, found one value per sample"),
]


@pytest.mark.parametrize("line, at, message", BAD)
def test_bad_reductions_are_errors_with_their_place(line, at, message):
    source = f"cell t {{\n input x: [N]\n state h: [N]\n param W: [N, N]\n {line}\n}}"
    column = line.index(at) + 2
    with pytest.raises(cellc.CellError, match=f"<cell>:5:{column}: error: {re.escape(message)}"):
        cellc.compile(source)


def test_an_output_must_be_a_vector_not_a_per_sample_value():
    source = "cell t {\n state h: [N]\n m = mean(h)\n h = tanh(h) * m\n output h, m\n}"
    with pytest.raises(cellc.CellError, match="<cell>:5:12: error: output 'm' must be a vector, "
                                              "found one value per sample"):
        cellc.compile(source)


def _haste_layernorm_lstm(m, x, h, c):
    """Haste's LayerNormLSTM in torch, from its parameters (kernel [I, 4H])."""
    p = {"W": m.kernel.t(), "R": m.recurrent_kernel.t(), "b": m.bias,
         "gamma_x": m.gamma[0], "gamma_r": m.gamma[1], "gamma_h": m.gamma_h,
         "beta_h": m.beta_h}
    outs = []
    for t in range(x.shape[0]):
        h, c = _layernorm_lstm_step(p, x[t], h, c)
        outs.append(h)
    return torch.stack(outs), h, c


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_layernorm_lstm_module_has_haste_parameters_and_gradients(batch_first, with_state):
    torch.manual_seed(0)
    T, B, I, H = 6, 5, 4, 7
    m = cellc.nn.LayerNormLSTM(I, H, batch_first=batch_first, recompute="full",
                               dtype=torch.float64)
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == [
        ("kernel", (I, 4 * H)), ("recurrent_kernel", (H, 4 * H)), ("bias", (4 * H,)),
        ("gamma", (2, 4 * H)), ("gamma_h", (H,)), ("beta_h", (H,))]
    # Haste's initialization: the forget gate (the third) starts at 1.
    assert torch.equal(m.bias[2 * H:3 * H], torch.ones(H, dtype=torch.float64))
    with torch.no_grad():  # away from the initial values, so every term counts
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(1, B, H, dtype=torch.float64, requires_grad=True)
    state = (h0, c0) if with_state else None
    out, (hn, cn) = m(x.transpose(0, 1) if batch_first else x, state)
    if batch_first:
        out = out.transpose(0, 1)
    zeros = torch.zeros(B, H, dtype=torch.float64)
    ref, rh, rc = _haste_layernorm_lstm(m, x, h0[0] if with_state else zeros,
                                        c0[0] if with_state else zeros)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hn[0], rh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cn[0], rc, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(out)
    wrt = [x, *m.parameters()] + ([h0, c0] if with_state else [])
    got = torch.autograd.grad((out * w).sum() + cn.sum(), wrt)
    want = torch.autograd.grad((ref * w).sum() + rc.sum(), wrt)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_layernorm_lstm_module_rejects_a_bad_state():
    m = cellc.nn.LayerNormLSTM(3, 4)
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match=r"h_0 must be \[1, 5, 4\], got \[1, 5, 3\]"):
        m(x, (torch.zeros(1, 5, 3), torch.zeros(1, 5, 4)))
    with pytest.raises(ValueError, match="a pair"):
        m(x, torch.zeros(1, 5, 4))


def test_a_cell_too_big_for_a_batch_tiled_cta_gets_the_persistent_kernels(tmp_path, monkeypatch):
    # The LayerNorm LSTM's batch-tiled backward at H = 256 needs about 125 KB
    # of shared memory per CTA; with no strategy asked for, a device package
    # is persistent, with the device's opt-in shared memory (an H100's).
    monkeypatch.setenv("CELLC_CACHE_DIR", str(tmp_path))
    sizes = {"I": 256, "H": 256}
    cell = _example("layernorm_lstm")
    path = cell._device_package(sizes, "sm_90", "f32", 232448, 132)
    meta = json.load(open(os.path.join(path, "kernels.json")))
    assert meta["kernels"]["layernorm_lstm_bwd"]["strategy"] == "persistent", meta
    # The package Python makes for no strategy named, and the one `cellc
    # --emit=package` makes with no --strategy: the same choice, to the byte
    # of shared memory (an H100's opt-in is sm_90's).
    kernels = lambda m: {k: (v["strategy"], v.get("dynamic_shared_bytes"), v["batch_tile"])
                         for k, v in m["kernels"].items()}
    plain = json.load(open(os.path.join(cell.cuda_package(sizes), "kernels.json")))
    subprocess.run([os.path.join(TOOLS, "cellc"), os.path.join(EXAMPLES, "layernorm_lstm.cell"),
                    "-D", "I=256", "-D", "H=256", "--emit=package", "-o",
                    str(tmp_path / "cli")], check=True)
    cli = json.load(open(tmp_path / "cli" / "kernels.json"))
    assert kernels(cli) == kernels(plain) == kernels(meta)
    # A strategy the user names is kept, and its error raised.
    named = cellc.compile(os.path.join(EXAMPLES, "layernorm_lstm.cell"),
                          cuda={"strategy": "batch-tiled"})
    with pytest.raises(ValueError, match="bytes of workgroup memory per CTA"):
        named._device_package(sizes, "sm_90", "f32", 232448, 132)
    # A cell that fits stays batch-tiled.
    small = _example("rmsnorm_gru")._device_package({"I": 64, "H": 64}, "sm_90", "f32", 232448, 132)
    meta = json.load(open(os.path.join(small, "kernels.json")))
    assert meta["kernels"]["rmsnorm_gru_fwd"]["strategy"] == "batch-tiled"
