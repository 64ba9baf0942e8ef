"""The functional API: recompute modes, resets, custom cells under gradcheck,
and the errors users meet."""

import json
import os
import subprocess

import pytest
import torch

import cellc
from conftest import TOOLS


def _lstm_params(I, H, dtype=torch.float32, requires_grad=True):
    g = torch.Generator().manual_seed(5)
    shapes = {"W_ih": (4 * H, I), "W_hh": (4 * H, H), "b_ih": (4 * H,), "b_hh": (4 * H,)}
    return {n: (0.3 * torch.randn(*s, generator=g, dtype=dtype)).requires_grad_(requires_grad)
            for n, s in shapes.items()}


LSTM = cellc.nn.LSTM_CELL


@pytest.mark.parametrize("mode", ["full", "chunk:1", "chunk:3", "chunk:16"])
def test_every_recompute_mode_gives_the_gradients_of_saved_gates(mode):
    cell = cellc.compile(LSTM)
    T, B, I, H = 7, 3, 4, 5
    x = torch.randn(T, B, I, requires_grad=True)
    params = _lstm_params(I, H)
    states = {"h": torch.randn(B, H, requires_grad=True), "c": torch.randn(B, H, requires_grad=True)}
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[3, 1] = True

    def grads(**kw):
        out, final = cell(x, params, states, resets=resets, **kw)
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + final["c"].sum()
        return torch.autograd.grad(loss, [x, *params.values(), *states.values()])

    for a, b in zip(grads(recompute=mode), grads(save_gates=True)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # save_gates=False is recompute="full".
    for a, b in zip(grads(save_gates=False), grads(recompute="full")):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_reset_equals_two_runs_split_there():
    cell = cellc.compile(LSTM)
    T, B, I, H, t = 8, 2, 3, 4, 5
    x = torch.randn(T, B, I)
    params = _lstm_params(I, H, requires_grad=False)
    h0 = {"h": torch.randn(B, H), "c": torch.randn(B, H)}
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[t] = True
    whole, final = cell(x, params, h0, resets=resets)
    first, _ = cell(x[:t], params, h0)
    second, final2 = cell(x[t:], params, h0)
    torch.testing.assert_close(whole, torch.cat([first, second]), atol=0, rtol=0)
    torch.testing.assert_close(final["c"], final2["c"], atol=0, rtol=0)


CUSTOM = {
    "elementwise recurrence": ("""cell ind {
        input x: [I]
        state h: [H]
        param W: [H, I], u: [H], b: [H]
        h = tanh(W @ x + u * h + b)
    }""", {"I": 3, "H": 4}),
    "two inputs": ("""cell two {
        input x: [I], y: [H]
        state h: [H]
        param W: [H, I], R: [H, H]
        h = tanh(W @ x + R @ h) * sigmoid(y)
    }""", {"I": 3, "H": 4}),
    "two outputs": ("""cell twoout {
        input x: [I]
        state h: [H]
        param W: [H, I], R: [H, H]
        z = W @ x + R @ h
        h = tanh(z)
        output h, z
    }""", {"I": 3, "H": 4}),
    "exp and log": ("""cell explog {
        input x: [I]
        state h: [H], n: [H]
        param W: [H, I], R: [H, H]
        a = W @ x + R @ h
        n = log(exp(a) + n * n + 1)
        h = tanh(a) / n
    }""", {"I": 3, "H": 4}),
    "matvec on a computed value": ("""cell mgu {
        input x: [I]
        state h: [H]
        param W_f: [H, I], U_f: [H, H], W_h: [H, I], U_h: [H, H]
        f = sigmoid(W_f @ x + U_f @ h)
        h = (1 - f) * h + f * tanh(W_h @ x + U_h @ (f * h))
    }""", {"I": 3, "H": 4}),
}


def gradcheck_cell(cell, sizes, T, B, mode, resets, lengths=None, seed=7):
    """gradcheck of a cell in float64 over random params, inputs and states:
    the gradients of every output and final state, by finite differences.
    Returns the tensors it checked: params, inputs, states."""
    g = torch.Generator().manual_seed(seed)
    size = lambda d: sizes[d] if d in sizes else int(d)
    params = {n: (0.5 * torch.randn(*[size(d) for d in s], generator=g,
                                    dtype=torch.float64)).requires_grad_()
              for n, s in cell.params}
    inputs = {n: torch.randn(T, B, size(s[0]), generator=g,
                             dtype=torch.float64).requires_grad_() for n, s in cell.inputs}
    states = {n: torch.rand(B, size(s[0]), generator=g,
                            dtype=torch.float64).requires_grad_() for n, s in cell.states}
    names_p, names_i, names_s = list(params), list(inputs), list(states)

    def run(*flat):
        p = dict(zip(names_p, flat[:len(names_p)]))
        xs = dict(zip(names_i, flat[len(names_p):len(names_p) + len(names_i)]))
        st = dict(zip(names_s, flat[len(names_p) + len(names_i):]))
        out, final = cell(xs if len(xs) > 1 else next(iter(xs.values())), p, st,
                          resets=resets, recompute=mode, lengths=lengths)
        outs = list(out.values()) if isinstance(out, dict) else [out]
        return (*outs, *final.values())

    assert torch.autograd.gradcheck(run, (*params.values(), *inputs.values(),
                                          *states.values()),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)
    return params, inputs, states


@pytest.mark.parametrize("name", list(CUSTOM))
@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
def test_custom_cells_pass_gradcheck_in_double_precision(name, mode):
    source, sizes = CUSTOM[name]
    T, B = 4, 2
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 0] = True
    gradcheck_cell(cellc.compile(source), sizes, T, B, mode, resets)


TWICE = "cellc computes first derivatives only; its gradient cannot be differentiated again"


def test_a_gradient_is_not_differentiated_again_and_says_so():
    # A gradient penalty or MAML differentiates a gradient. The kernels'
    # gradients have no graph of their own: differentiating them is an error
    # that says so. With create_graph and no second differentiation, the
    # gradients are the usual ones.
    cell = cellc.compile(LSTM)
    x = torch.randn(5, 2, 3, requires_grad=True)
    params = _lstm_params(3, 4)
    out, _ = cell(x, params)
    g, = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    want, = torch.autograd.grad(cell(x, params)[0].pow(2).sum(), x)
    torch.testing.assert_close(g, want)
    with pytest.raises(RuntimeError, match=TWICE):
        g.sum().backward()
    m = cellc.nn.GRU(3, 4)
    g, = torch.autograd.grad(m(x)[0].pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=TWICE):
        g.pow(2).sum().backward()
    # Params that want no gradient: the input's alone comes back, and it
    # says the same (torch 1.13 took its one tensor's rows for gradients).
    frozen = {n: t.detach() for n, t in params.items()}
    g, = torch.autograd.grad(cell(x, frozen)[0].sum(), x, create_graph=True)
    assert g.shape == x.shape
    torch.testing.assert_close(g, torch.autograd.grad(cell(x, frozen)[0].sum(), x)[0])
    with pytest.raises(RuntimeError, match=TWICE):
        g.sum().backward()


def gradient_penalty(run, x):
    """A WGAN-GP style loss: the output's sum, whose incoming gradients are
    constants, plus the squared norm of its gradient."""
    out = run(x)
    g, = torch.autograd.grad(out.sum(), x, create_graph=True)
    return out.sum() + (g ** 2).sum()


@pytest.mark.parametrize("path", ["cell", "nn", "package", "emulator"])
def test_a_gradient_penalty_fails_loudly(path, tmp_path):
    # The output's sum sends gradients that need none: torch's
    # once_differentiable then returns gradients without a node, and the
    # penalty's gradient through the cell was silently zero. Now every path
    # raises.
    torch.manual_seed(0)
    x = torch.randn(4, 2, 3, requires_grad=True)
    if path == "nn":
        run = lambda x: cellc.nn.LSTM(3, 4)(x)[0]
    else:
        params = {n: t.requires_grad_() for n, t in _lstm_params(3, 4).items()}
        if path == "cell":
            cell = cellc.compile(LSTM)
        elif path == "emulator":
            cell = cellc.compile(LSTM, target="cuda-emu")
        else:
            source = tmp_path / "lstm.cell"
            source.write_text(LSTM)
            subprocess.run([os.path.join(TOOLS, "cellc"), str(source), "-D", "H=4", "-D", "I=3",
                            "--emit=package", "--target=cpu", "-o", str(tmp_path / "pkg")],
                           check=True)
            cell = cellc.load_package(str(tmp_path / "pkg"))
        run = lambda x: cell(x, params)[0]
    loss = gradient_penalty(run, x)
    with pytest.raises(RuntimeError, match=TWICE):
        loss.backward()
    # Without the penalty, create_graph changes nothing.
    plain = run(x).sum()
    plain.backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_no_grad_keeps_nothing_and_needs_no_grad():
    cell = cellc.compile(LSTM)
    x, params = torch.randn(3, 2, 4), _lstm_params(4, 5)
    out, _ = cell(x, params)
    assert out.requires_grad and cell.saved_bytes > 0
    with torch.no_grad():
        out, final = cell(x, params)
    assert not out.requires_grad and out.shape == (3, 2, 5)
    assert cell.saved_bytes == 0


def test_names_and_shapes_are_reported():
    cell = cellc.compile(LSTM)
    assert cell.inputs == [("x", ["I"])]
    assert cell.states == [("h", ["H"]), ("c", ["H"])]
    assert ("W_ih", ["4*H", "I"]) in cell.params
    assert cell.outputs == ["h"]
    assert cellc.compile(CUSTOM["two outputs"][0]).outputs == ["h", "z"]
    assert cell.shape("W_ih", {"H": 5, "I": 3}) == [20, 3]
    with pytest.raises(ValueError, match="the size I is not bound"):
        cell.shape("W_ih", {"H": 5})
    assert "cell.save" in cell.emit("saves", {"H": 4, "I": 3})
    assert "none" in cell.emit("plan", {"H": 4, "I": 3})
    assert "func.func @lstm_bwd" in cell.emit("kernels", {"H": 4, "I": 3})
    assert isinstance(cellc.cache_dir(), str)


def test_bad_cells_are_errors_with_their_place():
    with pytest.raises(cellc.CellError, match=r"<cell>:3:6: error: unknown name 'q'") as bad:
        cellc.compile("cell t {\n state h: [H]\n h = q\n}")
    assert isinstance(bad.value, ValueError) and not isinstance(bad.value, cellc.SizeError)
    # Wrong only at the sizes given: a SizeError, when the kernels are built.
    with pytest.warns(UserWarning, match="local 'a' is never used"):
        cell = cellc.compile("cell t {\n input x: [H]\n state h: [H]\n"
                             " a, b = chunk(x, 2)\n h = tanh(h) + x\n}")
    with pytest.raises(cellc.SizeError, match=r"<cell>:4:9: error: cannot chunk a vector "
                                              r"of size 3 into 2 equal parts"):
        cell(torch.randn(2, 1, 3), {})
    out, _ = cell(torch.ones(2, 1, 4), {})
    assert out.shape == (2, 1, 4)
    with pytest.warns(UserWarning, match="param 'v' is never used"):
        cellc.compile("cell t { state h: [H]\n param v: [H]\n h = tanh(h) }")


def test_the_drop_ins_run_the_shipped_example_cells():
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    for name, text in [("lstm", cellc.nn.LSTM_CELL), ("gru", cellc.nn.GRU_CELL)]:
        with open(os.path.join(examples, name + ".cell")) as f:
            assert text == f.read()


def test_bad_tensors_are_exceptions_not_crashes():
    cell = cellc.compile(LSTM)
    x = torch.randn(3, 2, 4)
    params = _lstm_params(4, 5, requires_grad=False)
    with pytest.raises(ValueError, match=r"param 'W_hh' is declared \[4\*H, H\].*shape \[20, 6\]"):
        cell(x, {**params, "W_hh": torch.randn(20, 6)})
    # The params bind the sizes first: the input that disagrees is named,
    # with what it was held to and which param bound that.
    with pytest.raises(ValueError, match=r"input 'x' has width 4, but the cell expects I = 3 "
                                         r"\(I=3 from param 'W_ih' \[20, 3\]\)"):
        cell(x, {**params, "W_ih": torch.randn(20, 3)})
    with pytest.raises(ValueError, match=r"input 'x' has width 5, but the cell expects I = 4 "
                                         r"\(I=4 from param 'W_ih' \[20, 4\]\)"):
        cell(torch.randn(3, 2, 5), params)
    with pytest.raises(ValueError, match=r"state 'h' is declared \[H\] \(with H=5 from param "
                                         r"'W_ih' \[20, 4\]\) but the tensor for it has shape "
                                         r"\[7\]"):
        cell(x, params, {"h": torch.randn(2, 7)})
    with pytest.raises(TypeError, match="one dtype"):
        cell(x.double(), params)
    with pytest.raises(TypeError, match="float32 and float64"):
        cell(x.half(), {n: p.half() for n, p in params.items()})
    with pytest.raises(ValueError, match=r"input 'x' must be \[T, B, n\]"):
        cell(torch.randn(3, 4), params)
    with pytest.raises(ValueError, match="no tensor for param 'b_hh'"):
        cell(x, {n: p for n, p in params.items() if n != "b_hh"})
    with pytest.raises(ValueError, match="'W' is not a param"):
        cell(x, {**params, "W": torch.randn(2)})
    with pytest.raises(ValueError, match=r"state 'h' must be \[B, n\] with B=2"):
        cell(x, params, {"h": torch.randn(3, 5)})
    with pytest.raises(ValueError, match=r"resets must be a bool tensor of shape \[3, 2\]"):
        cell(x, params, resets=torch.zeros(2, 3, dtype=torch.bool))
    # One parse and one message, in the runtime, for every path.
    with pytest.raises(ValueError, match="recompute must be 'none', 'full' or 'chunk:K' with "
                                         "K > 0, not 'sometimes'"):
        cell(x, params, recompute="sometimes")
    with pytest.raises(ValueError, match="recompute must be 'none', 'full' or 'chunk:K' with "
                                         "K > 0, not 16"):
        cell(x, params, recompute=16)
    # Non-contiguous inputs are copied, not misread.
    xt = torch.randn(2, 3, 4).transpose(0, 1)
    out, _ = cell(xt, params)
    ref, _ = cell(xt.contiguous(), params)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_cuda_packages_are_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLC_CACHE_DIR", str(tmp_path))
    cell = cellc.compile(LSTM)
    path = cell.cuda_package({"H": 32, "I": 16}, arch="sm_80")
    assert path.startswith(str(tmp_path))
    meta = json.load(open(os.path.join(path, "kernels.json")))
    assert meta["arch"] == "sm_80" and meta["sizes"] == {"H": 32, "I": 16}
    assert meta["kernels"]["lstm_fwd"]["strategy"] == "batch-tiled"
    stamp = os.path.getmtime(os.path.join(path, "save.ptx"))
    assert cell.cuda_package({"H": 32, "I": 16}, arch="sm_80") == path
    assert os.path.getmtime(os.path.join(path, "save.ptx")) == stamp
    other = cell.cuda_package({"H": 32, "I": 16}, arch="sm_80", strategy="persistent",
                              storage="bf16")
    assert other != path
    assert json.load(open(os.path.join(other, "kernels.json")))["storage"] == "bf16"
    assert ".entry lstm_fwd" in cell.emit("ptx", {"H": 32, "I": 16})
    with pytest.raises(ValueError, match="unknown strategy 'ring'"):
        cell.cuda_package({"H": 32, "I": 16}, strategy="ring")
    with pytest.raises(ValueError, match="needs .* bytes of workgroup memory"):
        cell.cuda_package({"H": 4096, "I": 16}, strategy="batch-tiled")
    with pytest.raises(TypeError, match="unknown CUDA option 'warps'"):
        cellc.compile(LSTM, cuda={"warps": 4})
    assert cellc.compile(LSTM, cuda={"strategy": "persistent"}).cuda_options == {
        "strategy": "persistent"}
    # Nothing half-written is left behind.
    assert not [p for p in os.listdir(os.path.join(str(tmp_path), "cuda")) if ".tmp-" in p]


def test_cuda_tensors_run_on_the_gpu_like_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU here: CUDA tensors through cellc.compile were not run")
    cell = cellc.compile(LSTM)
    torch.manual_seed(0)
    x = torch.randn(5, 3, 4, requires_grad=True)
    params = {n: p.requires_grad_() for n, p in _lstm_params(4, 5).items()}
    out, final = cell(x, params)
    out.sum().backward()
    xg = x.detach().cuda().requires_grad_()
    pg = {n: p.detach().cuda().requires_grad_() for n, p in params.items()}
    out_g, final_g = cell(xg, pg, recompute="full")
    out_g.sum().backward()
    torch.testing.assert_close(out_g.cpu(), out.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xg.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
    for n in params:
        torch.testing.assert_close(pg[n].grad.cpu(), params[n].grad, rtol=1e-4, atol=1e-5)


def test_recurrent_module_trains():
    torch.manual_seed(0)
    model = cellc.nn.Recurrent(LSTM, I=3, H=8, num_layers=2, recompute="full")
    head = torch.nn.Linear(8, 1)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=0.05)
    x = torch.randn(10, 16, 3)
    y = x[:, :, :1].cumsum(0) * 0.1

    def closure():
        opt.zero_grad()
        loss = (head(model(x)[0]) - y).pow(2).mean()
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_a_cell_without_inputs_is_refused_clearly():
    cell = cellc.compile("cell decay { state h: [H]\n param a: [H]\n h = a * h }")
    with pytest.raises(ValueError, match="declares no input"):
        cell({}, {"a": torch.ones(3)})


UNUSED = """
cell rnn {
  input x: [I]
  state h: [H]
  param W: [H, I], U: [H, H], b: [H]
  h = tanh(W @ x + b + h)
}
"""


def unused_reference(x, W, b, h0):
    h, outs = h0, []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ W.t() + b + h)
        outs.append(h)
    return torch.stack(outs)


@pytest.mark.parametrize("target", [None, "cuda-emu", "package"])
def test_a_param_the_cell_never_reads_is_accepted_and_ignored(target, tmp_path):
    # It compiles with a warning; it is then callable with the param or
    # without it, in a sequence and a step, its gradient zero; a param the
    # cell reads is still required, by name.
    with pytest.warns(UserWarning, match="param 'U' is never used"):
        cell = cellc.compile(UNUSED, target=None if target == "package" else target)
    if target == "package":
        source = tmp_path / "rnn.cell"
        source.write_text(UNUSED)
        subprocess.run([os.path.join(TOOLS, "cellc"), str(source), "-D", "H=5", "-D", "I=4",
                        "--emit=package", "--target=cpu", "-o", str(tmp_path / "pkg")],
                       check=True, capture_output=True)
        cell = cellc.load_package(str(tmp_path / "pkg"))
    g = torch.Generator().manual_seed(3)
    W, U, b = (0.5 * torch.randn(*s, generator=g) for s in ((5, 4), (5, 5), (5,)))
    x, h0 = torch.randn(6, 3, 4, generator=g), 0.5 * torch.randn(3, 5, generator=g)
    leaves = [t.double().requires_grad_() for t in (x, W, b, h0)]
    want = unused_reference(*leaves)
    weight = torch.randn(want.shape, generator=g, dtype=torch.float64)
    (want * weight).sum().backward()
    for given in ({"W": W, "U": U, "b": b}, {"W": W, "b": b}):
        params = {n: t.clone().requires_grad_() for n, t in given.items()}
        xs, hs = x.clone().requires_grad_(), h0.clone().requires_grad_()
        out, _ = cell(xs, params, {"h": hs})
        (out.double() * weight).sum().backward()
        got = [out, xs.grad, params["W"].grad, params["b"].grad, hs.grad]
        for name, a, w in zip(["h", "dx", "dW", "db", "dh0"], got,
                              [want] + [t.grad for t in leaves]):
            torch.testing.assert_close(a.double(), w.detach(), rtol=1e-4, atol=1e-5, msg=name)
        if "U" in params:
            assert params["U"].grad is None or not params["U"].grad.any()
        if target != "package":
            step, _ = cell.step(x[0], {n: t.detach() for n, t in given.items()}, {"h": h0})
            torch.testing.assert_close(step.double(), want[0].detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="no tensor for param 'W'"):
        cell(x, {"U": U, "b": b})


@pytest.mark.parametrize("target", [None, "cuda-emu"])
def test_sizes_that_overflow_are_an_error_not_garbage(target):
    # A plan of 2^32 x 2^32 rows of an LSTM's values passes int64 bytes: it
    # was a floor of -8931681473871032320 bytes; it is an error naming the
    # sizes. Large sizes that fit still plan.
    cell = cellc.compile(LSTM, target=target)
    sizes = {"H": 16, "I": 5}
    with pytest.raises(ValueError, match=r"the sizes overflow: T = 4294967296 steps of "
                                         r"B = 4294967296 rows"):
        cell.memory_plan(sizes, 2 ** 32, 2 ** 32, "none")
    plan = cell.memory_plan(sizes, 2 ** 20, 2 ** 12, "none")
    assert all(v > 0 for v in plan.values())
    assert plan["outputs"] == 2 ** 20 * 2 ** 12 * 16 * 4
