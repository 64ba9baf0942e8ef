"""The language as papers write it: powers, the activations they use,
comparisons and where, max, softmax and logsumexp over units. Each cell here
against a float64 PyTorch reference, forward and every gradient, on the CPU
(float64 and float32) and in the SIMT emulator (batch-tiled and persistent),
in every recompute mode."""

import os

import pytest
import torch
import torch.nn.functional as F

import cellc

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")

#: Every new form at once.
EVERYTHING = """
cell everything {
  input x: [I]
  state h: [H]
  param W: [H, I], U: [H, H], L: [H]
  s = W @ x + U @ h
  r = sigmoid(L) ** (2 * sigmoid(s))
  p = softmax(s)
  g = where(s >= 0, s + 0.5, sigmoid(s))
  q = where(s != s * 0.5, elu(s), 0) + gelu_tanh(s) * (s < 1)
  h = tanh(r * h + (1 - r) * silu(g) * p * 4 + 0.1 * max(s) - 0.1 * min(s) + 0.05 * logsumexp(s) + clamp(s, -1, 1) * 0.1 + (s * s) ** 0.5 * 0.1 + s ** 2 * 0.01 + gelu(q) * 0.1 + 0.01 * pow(2, s) + 0.1 * sin(s) * cos(s) + 0.1 * log1p(s * s) + 0.1 * rsqrt(1 + s * s) + 0.1 * erf(s))
}
"""


def everything_step(p, x, h):
    s = x @ p["W"].T + h @ p["U"].T
    r = torch.sigmoid(p["L"]) ** (2 * torch.sigmoid(s))
    prob = torch.softmax(s, -1)
    g = torch.where(s >= 0, s + 0.5, torch.sigmoid(s))
    q = torch.where(s != s * 0.5, F.elu(s), torch.zeros_like(s)) + \
        F.gelu(s, approximate="tanh") * (s < 1).to(s.dtype)
    return torch.tanh(r * h + (1 - r) * F.silu(g) * prob * 4 + 0.1 * s.max(-1, keepdim=True).values
            - 0.1 * s.min(-1, keepdim=True).values
            + 0.05 * torch.logsumexp(s, -1, keepdim=True) + torch.clamp(s, -1, 1) * 0.1
            + (s * s) ** 0.5 * 0.1 + s ** 2 * 0.01 + F.gelu(q) * 0.1 + 0.01 * torch.pow(2, s)
            + 0.1 * torch.sin(s) * torch.cos(s) + 0.1 * torch.log1p(s * s)
            + 0.1 * torch.rsqrt(1 + s * s) + 0.1 * torch.erf(s))


def rglru_step(p, x, h):
    r = torch.sigmoid(x @ p["W_a"].T + p["b_a"])
    i = torch.sigmoid(x @ p["W_x"].T + p["b_x"])
    a = torch.sigmoid(p["L"]) ** (8 * r)
    h = a * h + torch.sqrt(1 - a ** 2) * (i * x)
    return F.gelu(x @ p["W_y"].T) * h, h


def reference(step, params, x, outputs_state):
    """The loop in float64: the outputs at each step."""
    B = x.shape[1]
    n = next(t for name, t in params.items() if t.dim() == 2).shape[0]
    h = torch.zeros(B, n, dtype=x.dtype)
    outs = []
    for t in range(x.shape[0]):
        if outputs_state:
            h = step(params, x[t], h)
            outs.append(h)
        else:
            y, h = step(params, x[t], h)
            outs.append(y)
    return torch.stack(outs)


CASES = {
    "everything": (EVERYTHING, everything_step, {"H": 8, "I": 4}, True),
    "rglru": (os.path.join(EXAMPLES, "rglru.cell"), rglru_step, {"D": 8}, False),
}
TARGETS = [("cpu", torch.float64, None, 1e-10), ("cpu", torch.float32, None, 2e-5),
           ("cuda-emu", torch.float32, {"strategy": "batch-tiled"}, 2e-5),
           ("cuda-emu", torch.float32, {"strategy": "persistent", "ctas": 2}, 2e-5)]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}-{t[2]}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_paper_cell_matches_float64_torch(name, target):
    source, step, sizes, outputs_state = CASES[name]
    where, dtype, cuda, tol = target
    cell = (cellc.compile(source, target="cuda-emu", cuda=cuda) if where == "cuda-emu"
            else cellc.compile(source))
    g = torch.Generator().manual_seed(len(name))
    params = {n: 0.5 * torch.randn(*cell.shape(n, sizes), generator=g, dtype=torch.float64)
              for n, _ in cell.params}
    (xname, _), = cell.inputs
    T, B = 5, 3
    x = torch.randn(T, B, cell.shape(xname, sizes)[0], generator=g, dtype=torch.float64)
    weight = torch.randn(T, B, cell.shape(xname, sizes)[0] if not outputs_state
                         else sizes["H"], generator=g, dtype=torch.float64)
    leaves = {n: t.clone().requires_grad_() for n, t in params.items()}
    x0 = x.clone().requires_grad_()
    want = reference(step, leaves, x0, outputs_state)
    (want * weight).sum().backward()
    for mode in ("none", "full", "chunk:2"):
        ps = {n: t.to(dtype).clone().requires_grad_() for n, t in params.items()}
        xs = x.to(dtype).clone().requires_grad_()
        out, _ = cell(xs, ps, recompute=mode)
        (out.double() * weight).sum().backward()
        pairs = [("out", out, want), ("dx", xs.grad, x0.grad)]
        pairs += [("d" + n, ps[n].grad, leaves[n].grad) for n in params]
        for what, got, ref in pairs:
            error = (got.double() - ref).abs().max().item()
            scale = ref.abs().max().item() + 1e-12
            assert error <= tol * scale, f"{mode} {what}: {error:.2e} of {scale:.2e}"


def test_an_integer_power_is_exact_for_a_negative_base():
    # (-2) ** 3 is -8, where exp(3 log|-2|) would need the sign put back; a
    # non-integer power of a negative number is NaN, as in PyTorch.
    cell = cellc.compile("""
cell powers {
  input x: [N]
  state h: [N]
  h = x ** 3 + x ** -2 + 0 * h
}
""")
    x = torch.tensor([[[-2.0, -0.5, 3.0]]], dtype=torch.float64)
    out, _ = cell(x, {})
    torch.testing.assert_close(out, x ** 3 + x ** -2)
    half = cellc.compile("""
cell half {
  input x: [N]
  state h: [N]
  h = x ** 0.5 + 0 * h
}
""")
    out, _ = half(x, {})
    assert torch.isnan(out[0, 0, :2]).all() and out[0, 0, 2].item() == pytest.approx(3 ** 0.5)


def test_max_splits_its_gradient_among_ties():
    # max over units sends the gradient to the elements equal to it, split
    # evenly among ties (torch's amax does the same).
    cell = cellc.compile("""
cell tied {
  input x: [N]
  state h: [N]
  h = max(x) + 0 * h
}
""")
    x = torch.tensor([[[1.0, 3.0, 3.0, 2.0]]], dtype=torch.float64, requires_grad=True)
    out, _ = cell(x, {})
    out.sum().backward()
    ref = x.detach().clone().requires_grad_()
    (ref.amax(-1, keepdim=True).expand(-1, -1, 4)).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)
    assert x.grad[0, 0].tolist() == [0.0, 2.0, 2.0, 0.0]


def test_softmax_is_stable_for_large_scores():
    # Scores near 1000: exp overflows unless the max is subtracted first.
    cell = cellc.compile("""
cell attend {
  input x: [N]
  state h: [N]
  h = softmax(x * 1000) + 0 * h
}
""")
    x = torch.tensor([[[1.0, 0.999, 0.5]]], dtype=torch.float64)
    out, _ = cell(x, {})
    torch.testing.assert_close(out, torch.softmax(x * 1000, -1))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("target", [("cpu", None), ("cuda-emu", {"strategy": "batch-tiled"}),
                                    ("cuda-emu", {"strategy": "persistent"})],
                         ids=["cpu", "emulated batch-tiled", "emulated persistent"])
def test_softmax_per_head_over_a_matrix_state_product(target):
    # softmax(q @ S) per head: each head's scores normalised on their own
    # (the persistent strategy puts each head on its own CTA).
    where, cuda = target
    source = """
cell read {
  input q: [NH*K], v: [NH*V]
  state S: [NH, K, V]
  qh = heads(q, NH)
  S = S + outer(qh, heads(v, NH))
  p = softmax(qh @ S)
  output p
}
"""
    cell = (cellc.compile(source, target="cuda-emu", cuda=cuda) if where == "cuda-emu"
            else cellc.compile(source))
    dtype = torch.float64 if where == "cpu" else torch.float32
    tol = 1e-10 if where == "cpu" else 1e-5
    g = torch.Generator().manual_seed(0)
    T, B = 3, 2
    q = torch.randn(T, B, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(T, B, 8, generator=g, dtype=torch.float64, requires_grad=True)
    S = torch.zeros(B, 2, 3, 4, dtype=torch.float64)
    want = []
    for t in range(T):
        qh, vh = q[t].view(B, 2, 3), v[t].view(B, 2, 4)
        S = S + qh[..., :, None] * vh[..., None, :]
        want.append(torch.softmax(torch.einsum("bhk,bhkv->bhv", qh, S), -1).reshape(B, 8))
    want = torch.stack(want)
    w = torch.randn_like(want)
    wq, wv = torch.autograd.grad((want * w).sum(), (q, v))
    qs = q.detach().to(dtype).requires_grad_()
    vs = v.detach().to(dtype).requires_grad_()
    out, _ = cell({"q": qs, "v": vs}, {}, {"S": torch.zeros(B, 2, 3, 4, dtype=dtype)})
    out = out["p"] if isinstance(out, dict) else out
    gq, gv = torch.autograd.grad((out.double() * w).sum(), (qs, vs))
    for got, ref in ((out, want), (gq, wq), (gv, wv)):
        assert (got.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


PRODUCTS = """
cell prod {
  input x: [I]
  state S: [NH, K, V]
  param W_k: [NH*K, I], W_v: [NH*V, I]
  S = 0.9 * S + outer(heads(W_k @ x, NH), heads(W_v @ x, NH))
  output S
}
"""


def test_sizes_that_the_tensors_leave_open_come_from_sizes():
    # The params carry only products (NH*K, NH*V): without states, the call
    # cannot bind NH, K and V, and says which tensors would and how to give
    # them; sizes= on the call (or on compile) binds them, and the initial
    # states are zeros of the bound shape.
    cell = cellc.compile(PRODUCTS)
    g = torch.Generator().manual_seed(0)
    ps = {"W_k": torch.randn(6, 5, generator=g, dtype=torch.float64),
          "W_v": torch.randn(8, 5, generator=g, dtype=torch.float64)}
    x = torch.randn(4, 2, 5, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"cannot bind the sizes K, NH, V from the tensors "
                       r"given \(K: in state 'S' \[NH, K, V\] \(not given\), param 'W_k' "
                       r"\[NH\*K, I\];.*or pass sizes=\{'K': \.\.\., 'NH': \.\.\., 'V': \.\.\.\}"):
        cell(x, ps)
    _, final = cell(x, ps, sizes={"NH": 2, "K": 3})
    _, want = cell(x, ps, {"S": torch.zeros(2, 2, 3, 4, dtype=torch.float64)})
    torch.testing.assert_close(final["S"], want["S"])
    _, again = cellc.compile(PRODUCTS, sizes={"NH": 2})(x, ps, sizes={"K": 3})
    torch.testing.assert_close(again["S"], want["S"])
    with pytest.raises(ValueError, match="sizes names 'Q', which the cell does not use"):
        cell(x, ps, sizes={"Q": 1})
    with pytest.raises(ValueError, match=r"param 'W_k' is declared \[NH\*K, I\] \(with K=3 from "
                       r"sizes=, NH=3 from sizes=\) but the tensor for it has shape \[6, 5\]"):
        cell(x, ps, sizes={"NH": 3, "K": 3})


def test_a_matrix_state_output_has_its_declared_shape():
    # `output S` of `state S: [NH, K, V]` comes as [T, B, NH, K, V] (batch
    # first: [B, T, ...]), and a step's as [B, NH, K, V], as the final state
    # comes; on the CPU, in the emulator and through a step.
    sizes = {"NH": 2, "K": 3}
    g = torch.Generator().manual_seed(1)
    ps = {"W_k": torch.randn(6, 5, generator=g), "W_v": torch.randn(8, 5, generator=g)}
    x = torch.randn(4, 2, 5, generator=g)
    for target in (None, "cuda-emu"):
        cell = cellc.compile(PRODUCTS, target=target)
        out, final = cell(x, ps, sizes=sizes)
        assert out.shape == (4, 2, 2, 3, 4) and final["S"].shape == (2, 2, 3, 4)
        torch.testing.assert_close(out[-1], final["S"])
        first, _ = cell(x.transpose(0, 1).contiguous(), ps, sizes=sizes, batch_first=True)
        torch.testing.assert_close(first.transpose(0, 1), out)
    cell = cellc.compile(PRODUCTS)
    with torch.no_grad():
        states = {"S": torch.zeros(2, 2, 3, 4)}
        for t in range(4):  # the checked path, then a stream's short one
            y, states = cell.step(x[t], ps, states)
            assert y.shape == (2, 2, 3, 4)
            torch.testing.assert_close(y, out[t])
    # The old flat shape, while code that reads it is changed: deprecated.
    from cellc import _ops
    _ops.flat_matrix_outputs = True
    try:
        with pytest.warns(DeprecationWarning, match="flat_matrix_outputs is deprecated"):
            flat, _ = cell(x, ps, sizes=sizes)
        assert flat.shape == (4, 2, 24)
    finally:
        _ops.flat_matrix_outputs = False
