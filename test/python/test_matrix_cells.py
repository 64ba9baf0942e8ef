"""The six matrix-state examples (mLSTM, DeltaNet, gated DeltaNet, GLA,
RetNet, Mamba's S6 step) against float64 references written from the papers'
formulas with torch: outputs, final states and every gradient, in every
recompute mode, with resets and lengths, at state sizes that are not a
multiple of any tile (NH*K*V = 30, D*N = 15); on 1, 3 and 4 threads; in
float32; in the SIMT emulator; and the states' shapes and errors."""

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

import cellc
from conftest import assert_sequence_matches

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
SIZES = dict(I=4, NH=2, K=3, V=5, D=5, N=3)
# The last dims (V, N) a multiple of every vector width: the kernels read
# an expand's input in whole vectors rather than unit by unit.
WIDE = dict(I=4, NH=2, K=3, V=16, D=5, N=16)


def heads(t, NH):
    return t.view(t.shape[0], NH, -1)


def l2norm(t):
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def mlstm(x, s, p, NH, K, V, **_):
    C, n, m = s["C"], s["n"], s["m"]
    q = heads(x @ p["W_q"].t(), NH)
    k = heads(x @ p["W_k"].t(), NH) / math.sqrt(K)
    v = heads(x @ p["W_v"].t(), NH)
    log_f = F.logsigmoid(x @ p["w_f"].t() + p["b_f"])
    log_i = x @ p["w_i"].t() + p["b_i"]
    m_new = torch.maximum(log_f + m, log_i)
    f, i = torch.exp(log_f + m - m_new), torch.exp(log_i - m_new)
    C = f[..., None, None] * C + i[..., None, None] * torch.einsum("bhk,bhv->bhkv", k, v)
    n = f[..., None] * n + i[..., None] * k
    num = torch.einsum("bhkv,bhk->bhv", C, q)
    den = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m_new))
    h = torch.sigmoid(x @ p["W_o"].t()) * (num / den[..., None]).flatten(1)
    return h, {"C": C, "n": n, "m": m_new}


def delta_rule(x, C, p, NH, alpha=None):
    q = l2norm(heads(x @ p["W_q"].t(), NH))
    k = l2norm(heads(x @ p["W_k"].t(), NH))
    v = heads(x @ p["W_v"].t(), NH)
    beta = torch.sigmoid(x @ p["w_b"].t())
    # S = α S (I - β k kᵀ) + β v kᵀ, with S = Cᵀ, as the papers write it.
    S = C.transpose(-1, -2)
    if alpha is not None:
        S = alpha[..., None, None] * S
    eye = torch.eye(k.shape[-1], dtype=x.dtype)
    S = (S @ (eye - beta[..., None, None] * k[..., :, None] * k[..., None, :])
         + beta[..., None, None] * v[..., :, None] * k[..., None, :])
    o = (S @ q[..., None])[..., 0]
    return o.flatten(1), S.transpose(-1, -2)


def deltanet(x, s, p, NH, **_):
    o, C = delta_rule(x, s["C"], p, NH)
    return o, {"C": C}


def gated_deltanet(x, s, p, NH, **_):
    alpha = torch.exp(-torch.exp(p["A_log"]) * F.softplus(x @ p["w_a"].t() + p["dt_bias"]))
    o, C = delta_rule(x, s["C"], p, NH, alpha)
    return o, {"C": C}


def gla(x, s, p, NH, K, **_):
    q = heads(x @ p["W_q"].t(), NH)
    k = heads(x @ p["W_k"].t(), NH) / math.sqrt(K)
    v = heads(x @ p["W_v"].t(), NH)
    alpha = torch.sigmoid(heads(x @ p["W_a"].t(), NH)) ** (1 / 16)
    S = alpha[..., None] * s["S"] + k[..., :, None] * v[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q, S).flatten(1), {"S": S}


def retnet(x, s, p, NH, K, **_):
    q = heads(x @ p["W_q"].t(), NH)
    k = heads(x @ p["W_k"].t(), NH) / math.sqrt(K)
    v = heads(x @ p["W_v"].t(), NH)
    S = p["gamma"][:, None, None] * s["S"] + k[..., :, None] * v[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q, S).flatten(1), {"S": S}


def mamba_s6(u, s, p, D, N, **_):
    # selective_scan_ref's loop body (mamba_ssm/ops/selective_scan_interface.py).
    delta = F.softplus(u @ p["W_dt"].t() + p["dt_bias"])
    A = -torch.exp(p["A_log"].view(D, N))
    B, C = u @ p["W_B"].t(), u @ p["W_C"].t()
    deltaA = torch.exp(torch.einsum("bd,dn->bdn", delta, A))
    deltaB_u = torch.einsum("bd,bn,bd->bdn", delta, B, u)
    h = deltaA * s["h"] + deltaB_u
    y = torch.einsum("bdn,bn->bd", h, C) + u * p["skip"]
    return y, {"h": h}


CELLS = {"mlstm": mlstm, "deltanet": deltanet, "gated_deltanet": gated_deltanet,
         "gla": gla, "retnet": retnet, "mamba_s6": mamba_s6}


def source(name):
    with open(os.path.join(EXAMPLES, name + ".cell")) as f:
        return f.read()


def problem(cell, name, dtype, T=6, B=5, seed=0, sizes=SIZES):
    torch.manual_seed(seed)
    params = {}
    for n, _ in cell.params:
        shape = cell.shape(n, sizes)
        scale = 1 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.5
        params[n] = (scale * torch.randn(*shape, dtype=dtype)).requires_grad_()
    if name == "retnet":  # decays in (0, 1), as the paper's
        params["gamma"] = torch.rand(sizes["NH"], dtype=dtype).mul(0.5).add(0.45).requires_grad_()
    states = {n: (0.5 * torch.randn(B, *cell.shape(n, sizes), dtype=dtype)).requires_grad_()
              for n, _ in cell.states}
    width = cell.shape(cell.inputs[0][0], sizes)[0]
    x = torch.randn(T, B, width, dtype=dtype, requires_grad=True)
    resets = torch.rand(T, B) < 0.2
    lengths = torch.tensor([6, 2, 5, 1, 6])[:B]
    return x, params, states, resets, lengths


def reference(name, x, params, states, resets, lengths, sizes=SIZES):
    """The float64 loop of the step `name` (one of CELLS, or a function): a
    reset restarts a sample from its initial states; a sample past its length
    keeps its states and outputs zeros."""
    step = CELLS[name] if isinstance(name, str) else name
    s, outs = dict(states), []
    for t in range(x.shape[0]):
        live = t < lengths
        mask = lambda v, m: m.view(-1, *([1] * (v.dim() - 1)))
        s = {n: torch.where(mask(v, resets[t] & live), states[n], v) for n, v in s.items()}
        out, new = step(x[t], s, params, **sizes)
        s = {n: torch.where(mask(v, live), new[n], v) for n, v in s.items()}
        outs.append(torch.where(live[:, None], out, torch.zeros_like(out)))
    return torch.stack(outs), s


def flat(states):
    return torch.cat([t.flatten(1) for t in states.values()], 1)


def check_float64(cell, step, seed=0, sizes=SIZES, B=5, **call):
    """`cell` called on float64 data with resets and lengths (`call`: the
    recompute mode) against the float64 loop of `step` (a CELLS name or a
    function): outputs, final states in their declared shapes, and every
    gradient."""
    x, p, s, resets, lengths = problem(cell, step, torch.float64, B=B, seed=seed, sizes=sizes)
    out, final = cell(x, p, s, resets=resets, lengths=lengths, **call)
    for n, t in s.items():
        assert final[n].shape == t.shape, n
    want_out, want_final = reference(step, x, p, s, resets, lengths, sizes)
    assert_sequence_matches(out, flat(final), want_out, flat(want_final),
                            [x, *s.values(), *p.values()], ["x", *s, *p])


def check_float32(cell, step, seed, sizes=SIZES, **call):
    """As check_float64 for a float32 run (the CPU kernels in float32, or the
    emulated CUDA ones): outputs and final states to 1e-4 of float64."""
    x, p, s, resets, lengths = problem(cell, step, torch.float32, seed=seed, sizes=sizes)
    out, final = cell(x, p, s, resets=resets, lengths=lengths, **call)
    d = lambda ts: {n: t.detach().double() for n, t in ts.items()}
    want_out, want_final = reference(step, x.detach().double(), d(p), d(s), resets, lengths,
                                     sizes)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(flat(final).double(), flat(want_final), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_matches_its_float64_reference(name, mode):
    check_float64(cellc.compile(source(name)), name, recompute=mode)


@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_with_whole_vectors_along_the_last_dim(name):
    cell = cellc.compile(source(name))
    check_float64(cell, name, seed=5, sizes=WIDE, recompute="chunk:2")
    check_float32(cell, name, seed=5, sizes=WIDE, recompute="chunk:2")


@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_on_three_and_four_threads(name):
    """These steps have no product, so a tile is one row: at B = 5 three
    threads split the rows; at B = 2 four threads split each row's units in
    pairs (unit slices, meeting at barriers)."""
    # The compiled cell of the last call (wrapped by the operators' runner on
    # torch >= 2.4).
    compiled = lambda cell: getattr(cell._last, "compiled", cell._last)
    cell = cellc.compile(source(name), threads=3)
    check_float64(cell, name, seed=1, recompute="full")
    assert compiled(cell).thread_split(5) == (3, 1)
    cell = cellc.compile(source(name), threads=4)
    check_float64(cell, name, seed=1, B=2, recompute="none")
    assert compiled(cell).thread_split(2) == (2, 2)


@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_in_float32(name):
    check_float32(cellc.compile(source(name)), name, seed=2)


@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_step_is_the_sequence_step_by_step(name):
    # cell.step carries the states in their declared shapes.
    cell = cellc.compile(source(name))
    x, p, s, _, _ = problem(cell, name, torch.float64, seed=3)
    want_out, want_final = cell(x, p, s)
    with torch.no_grad():
        states = {n: t.detach() for n, t in s.items()}
        for t in range(x.shape[0]):
            out, states = cell.step(x[t], p, states)
            torch.testing.assert_close(out, want_out[t], rtol=1e-12, atol=1e-12)
    for n, t in states.items():
        assert t.shape == s[n].shape
        torch.testing.assert_close(t, want_final[n], rtol=1e-12, atol=1e-12)


def test_matrix_states_start_at_zero_when_not_given():
    cell = cellc.compile(source("gated_deltanet"))
    x, p, s, _, _ = problem(cell, "gated_deltanet", torch.float64)
    zeros = {n: torch.zeros_like(t) for n, t in s.items()}
    out, final = cell(x, p)
    want_out, want_final = reference("gated_deltanet", x, p, zeros,
                                     torch.zeros(x.shape[:2], dtype=torch.bool),
                                     torch.full((x.shape[1],), x.shape[0]))
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    assert final["C"].shape == (5, 2, 3, 5)
    torch.testing.assert_close(final["C"], want_final["C"], rtol=1e-12, atol=1e-12)


def test_an_empty_batch_keeps_a_matrix_states_dims():
    """B = 0: mLSTM's final C is [0, NH, K, V], and every param's gradient
    is zeros of its shape (on the CPU kernels and the emulated CUDA ones)."""
    for target, dtype in ((None, torch.float64), ("cuda-emu", torch.float32)):
        cell = cellc.compile(source("mlstm"), target=target)
        x, p, s, resets, lengths = problem(cell, "mlstm", dtype, B=0)
        out, final = cell(x, p, s, resets=resets, lengths=lengths[:0])
        assert out.shape == (6, 0, 10)
        assert {n: tuple(t.shape) for n, t in final.items()} == {
            "C": (0, 2, 3, 5), "n": (0, 2, 3), "m": (0, 2)}
        grads = torch.autograd.grad(out.sum() + sum(t.sum() for t in final.values()),
                                    list(p.values()))
        for g, t in zip(grads, p.values()):
            assert g.shape == t.shape and not g.any()


def test_a_matrix_state_of_the_wrong_shape_is_an_error():
    cell = cellc.compile(source("mlstm"))
    x, p, s, _, _ = problem(cell, "mlstm", torch.float64)
    flat_c = dict(s, C=s["C"].detach().flatten(1))
    with pytest.raises(ValueError, match=r"state 'C' must be \[B, NH, K, V\] with B=5, got "
                                         r"\[5, 30\]"):
        cell(x, p, flat_c)
    wrong_v = dict(s, C=torch.zeros(5, 2, 3, 4, dtype=torch.float64))
    # The params bind V = 5 first (W_v's 10 rows over NH = 2), so the state
    # that disagrees is named, with the params that bound its sizes.
    with pytest.raises(ValueError, match=r"state 'C' is declared \[NH, K, V\] \(with K=3 from "
                                         r"param 'W_q' \[6, 4\], NH=2 from param 'w_i' \[2, 4\], "
                                         r"V=5 from param 'W_v' \[10, 4\]\) but the tensor for "
                                         r"it has shape \[2, 3, 4\]"):
        cell(x, p, wrong_v)
    with pytest.raises(ValueError, match=r"state 'C' must be \[B, NH, K, V\] with B=5"):
        cell.step(x[0], p, flat_c)


def test_a_cuda_package_takes_a_matrix_state_in_its_dims():
    """The CUDA package's CudaCell (emulated) takes mLSTM's C as [B, NH, K, V],
    as a Cell does (one checker), and gives it back so, with its gradient."""
    cell = cellc.compile(source("mlstm"), target="cuda-emu",
                         cuda={"strategy": "batch-tiled", "batch_tile": 4, "precision": "ieee"})
    x, p, s, resets, lengths = problem(cell, "mlstm", torch.float32, seed=6)
    want_out, want_final = cell(x, p, s, recompute="full")
    want = torch.autograd.grad(want_out.sum() + want_final["C"].pow(2).sum(), [s["C"]])[0]
    cuda_cell = next(iter(cell._cuda.values()))
    out, final = cuda_cell({"x": x}, p, s, recompute="full")
    assert final["C"].shape == s["C"].shape and final["n"].shape == s["n"].shape
    torch.testing.assert_close(out["h"], want_out, rtol=0, atol=0)
    torch.testing.assert_close(final["C"], want_final["C"], rtol=0, atol=0)
    got = torch.autograd.grad(out["h"].sum() + final["C"].pow(2).sum(), [s["C"]])[0]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"state 'C' must be \[B, 2, 3, 5\] with B=5, got "
                                         r"\[5, 2, 15\]"):
        cuda_cell({"x": x}, p, {**s, "C": s["C"].reshape(5, 2, 15)})


def kernels_of(cell, sizes, **options):
    path = cell.cuda_package(sizes, **options)
    with open(os.path.join(path, "kernels.json")) as f:
        return json.load(f)["kernels"]


@pytest.mark.parametrize("name", list(CELLS))
def test_a_cta_keeps_whole_heads_in_shared_memory(name):
    # Every cell but Mamba's keeps its heads apart, so a persistent CTA takes
    # whole heads, its buffers in dynamic shared memory (no workspace), and
    # launches without grid barriers. Mamba's B_t and C_t are read by every
    # channel, and its backward sums their gradients over the channels.
    # With no CTA count given, Mamba's step has no weights to cache, so one
    # CTA owns its rows whole, in shared memory.
    cell = cellc.compile(source(name))
    kernels = kernels_of(cell, SIZES, strategy="persistent", ctas=2)
    owned = kernels_of(cell, SIZES, strategy="persistent")
    for kernel in (name + "_fwd", name + "_bwd"):
        info = kernels[kernel]
        if name == "mamba_s6":
            assert "heads" not in info and info["workspace_bytes"] > 0
            assert (owned[kernel]["heads"], owned[kernel]["ctas"]) == (1, 1)
            assert owned[kernel]["workspace_bytes"] == 0
            continue
        assert info["heads"] == SIZES["NH"] and info["ctas"] == 2, kernel
        assert info["workspace_bytes"] == 0
        assert 0 < info["dynamic_shared_bytes"] <= 49152
    if name == "mamba_s6":
        return
    # At the benchmark's sizes, on an H100 (sm_90: 227 KiB of shared memory a
    # CTA), a CTA a head in both directions: a head's 64 x 64 matrix and
    # what the step buffers beside it fit.
    big = dict(I=256, NH=4, K=64, V=64)
    kernels = kernels_of(cell, big)
    for kernel in (name + "_fwd", name + "_bwd"):
        info = kernels[kernel]
        assert (info["heads"], info["ctas"]) == (4, 4), kernel
        assert 64 * 64 * 4 * 2 < info["dynamic_shared_bytes"] <= 232448


@pytest.mark.parametrize("options", [{"strategy": "batch-tiled", "batch_tile": 4},
                                     {"strategy": "persistent", "ctas": 3},
                                     {"strategy": "persistent", "ctas": 2},
                                     {"strategy": "persistent"}],
                         ids=["batch-tiled", "persistent-3", "heads-2", "persistent"])
@pytest.mark.parametrize("name", list(CELLS))
def test_matrix_cell_in_the_emulator(name, options):
    # The CUDA kernels in the SIMT emulator, forward and every gradient, with
    # resets and lengths, saving the gates and replaying them.
    check_emulated(name, options)


@pytest.mark.parametrize("name", ["gated_deltanet", "mlstm"])
def test_heads_of_16_by_16_split_over_ctas_by_themselves(name):
    # With no CTA count given, a head's 256 elements give each of 256
    # threads one: a CTA a head, chosen by the plan (headsPerCta).
    sizes = dict(SIZES, K=16, V=16)
    cell = check_emulated(name, {"strategy": "persistent"}, sizes=sizes, B=3)
    # Named, or chosen: its heads make two CTAs a tile, so cellc picks them
    # over the batch-tiled CTA that would fit as well.
    for options in ({"strategy": "persistent"}, {}):
        kernels = kernels_of(cellc.compile(source(name)), sizes, **options)
        for kernel in (name + "_fwd", name + "_bwd"):
            assert (kernels[kernel]["heads"], kernels[kernel]["ctas"]) == (2, 2), kernel
    assert kernels_of(cellc.compile(source(name)), SIZES)[name + "_fwd"]["strategy"] == \
        "batch-tiled"  # a head too small to fill a CTA


def check_emulated(name, options, sizes=SIZES, B=5):
    """The cell `name` in the emulator with CUDA `options`, in f32, against
    its float64 loop: outputs and every gradient in every recompute mode."""
    cell = cellc.compile(source(name), target="cuda-emu", cuda=dict(options, precision="ieee"))
    x, p, s, resets, lengths = problem(cell, name, torch.float32, B=B, seed=4, sizes=sizes)
    d = lambda ts: {n: t.detach().double().requires_grad_() for n, t in ts.items()}
    p64, s64, x64 = d(p), d(s), x.detach().double().requires_grad_()
    want_out, want_final = reference(name, x64, p64, s64, resets, lengths, sizes=sizes)
    g, g_final = torch.randn_like(want_out), torch.randn_like(flat(want_final))
    want = torch.autograd.grad((want_out * g).sum() + (flat(want_final) * g_final).sum(),
                               [x64, *s64.values(), *p64.values()])
    for mode in ("none", "full", "chunk:2"):
        out, final = cell(x, p, s, resets=resets, lengths=lengths, recompute=mode)
        torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-4)
        got = torch.autograd.grad((out * g.float()).sum()
                                  + (flat(final) * g_final.float()).sum(),
                                  [x, *s.values(), *p.values()])
        for n, a, b in zip(["x", *s, *p], got, want):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=f"{mode}: d{n}")
    return cell


def test_recurrent_stacks_matrix_cells_and_steps_them():
    # Two mLSTM layers: the second's input is the first's output h [NH*V],
    # not its first state; the states come back per layer in their shapes.
    torch.manual_seed(6)
    rnn = cellc.nn.Recurrent(source("mlstm"), I=4, NH=2, K=3, V=5, num_layers=2,
                             dtype=torch.float64)
    assert rnn.layers[1]["W_q"].shape == (6, 10)
    x = torch.randn(6, 5, 4, dtype=torch.float64)
    out, finals = rnn(x)
    assert out.shape == (6, 5, 10)
    assert [f["C"].shape for f in finals] == [(5, 2, 3, 5)] * 2
    # The second layer is the cell run on the first layer's output.
    first, _ = rnn.cell(x, dict(rnn.layers[0].items()))
    second, final = rnn.cell(first, dict(rnn.layers[1].items()))
    torch.testing.assert_close(out, second, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(finals[1]["C"], final["C"], rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        states = None
        for t in range(x.shape[0]):
            y, states = rnn.step(x[t], states)
            torch.testing.assert_close(y, out[t], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(states[1]["n"], finals[1]["n"], rtol=1e-12, atol=1e-12)


GATED_BOTH_WAYS = """cell gla_2d {
  input x: [I]
  state S: [NH, K, V]
  param W_q: [NH*K, I], W_k: [NH*K, I], W_v: [NH*V, I], W_a: [NH*K, I], W_b: [NH*V, I]
  q = heads(W_q @ x, NH)
  k = heads(W_k @ x, NH)
  v = heads(W_v @ x, NH)
  alpha = sigmoid(heads(W_a @ x, NH))
  beta = sigmoid(heads(W_b @ x, NH))
  S = alpha * S * cols(0.5 + 0.5 * beta) + outer(k, v)
  o = q @ S
  output o
}"""


def gla_2d(x, s, p, NH, **_):
    h = lambda w: heads(x @ p[w].t(), NH)
    alpha, beta = torch.sigmoid(h("W_a")), 0.5 + 0.5 * torch.sigmoid(h("W_b"))
    S = (alpha[..., :, None] * s["S"] * beta[..., None, :]
         + h("W_k")[..., :, None] * h("W_v")[..., None, :])
    return torch.einsum("bhk,bhkv->bhv", h("W_q"), S).flatten(1), {"S": S}


@pytest.mark.parametrize("target", [None, "cuda-emu"])
def test_gates_on_rows_and_on_columns(target):
    # GateLoop's 2-D gating, diag(α) S diag(β): a [NH, K] value scales the
    # rows of each head's matrix, `cols` of a [NH, V] one its columns.
    if target is None:
        cell = cellc.compile(GATED_BOTH_WAYS)
        for mode in ("none", "chunk:2"):
            check_float64(cell, gla_2d, seed=7, recompute=mode)
        return
    cell = cellc.compile(GATED_BOTH_WAYS, target=target,
                         cuda={"strategy": "batch-tiled", "batch_tile": 4})
    check_float32(cell, gla_2d, seed=8, recompute="full")
