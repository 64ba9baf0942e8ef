"""torch 2.x: cellc as the torch operators cellc::sequence and
cellc::sequence_backward, inside torch.compile(fullgraph=True, dynamic=True)
and torch.export, and with checkpoint, functional_call, autocast and
state_dict. Gradients are compared with eager cellc, which the other tests
compare with torch. Skipped on torch < 2.4 (make test-torch2 runs them)."""

import io
import os
import subprocess
import sys

import pytest
import torch

import cellc
from cellc import _ops

pytestmark = pytest.mark.skipif(not _ops.AVAILABLE,
                                reason=f"torch {torch.__version__} has no custom_op")

# Three sequence lengths and two batch sizes: one graph for all of them.
SHAPES = [(T, B) for T in (5, 8, 13) for B in (3, 6)]

# A cell nobody here wrote kernels for: a minimal gated unit with a second
# output, its gate.
MGU = """
cell mgu {
  input x: [I]
  state h: [H]
  param W: [2*H, I], U: [H, H], Uf: [H, H], b: [2*H]
  wf, wh = chunk(W @ x + b, 2)
  f = sigmoid(wf + Uf @ h)
  hc = tanh(wh + U @ (f * h))
  h = (1 - f) * h + f * hc
  output h, f
}
"""


class _Counter:
    """A compile backend (aot_eager: AOTAutograd's forward and backward
    graphs, run eagerly) that counts the graphs Dynamo hands it."""

    def __init__(self, backend="aot_eager"):
        from torch._dynamo.testing import CompileCounterWithBackend
        self.inner = CompileCounterWithBackend(backend)

    @property
    def graphs(self):
        return self.inner.frame_count


def _compile_and_check(model, make_inputs, loss, backend="aot_eager", atol=0.0):
    """Compiles `model` with fullgraph=True and dynamic=True, runs it at every
    shape of SHAPES and checks outputs and gradients (of every parameter and
    float input) against eager. After the first call, a recompile is an
    error: the graph count must not move."""
    import torch._dynamo as dynamo
    dynamo.reset()
    dynamo.utils.counters.clear()
    counter = _Counter(backend)
    compiled = torch.compile(model, backend=counter.inner, fullgraph=True, dynamic=True)
    first = None
    try:
        for T, B in SHAPES:
            inputs = make_inputs(T, B)
            wrt = list(model.parameters()) + [t for t in inputs
                                              if t.is_floating_point() and t.requires_grad]
            got = compiled(*inputs)
            got_grads = torch.autograd.grad(loss(got), wrt)
            want = model(*inputs)
            want_grads = torch.autograd.grad(loss(want), wrt)
            torch.testing.assert_close(loss(got), loss(want), atol=atol, rtol=atol)
            for a, b in zip(got_grads, want_grads):
                torch.testing.assert_close(a, b, atol=max(atol, 1e-30), rtol=atol)
            if first is None:
                first = counter.graphs
                dynamo.config.error_on_recompile = True
    finally:
        dynamo.config.error_on_recompile = False
    assert first >= 1 and counter.graphs == first
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    return counter


def test_lstm_compiles_to_one_graph_for_every_T_and_B():
    torch.manual_seed(0)
    model = cellc.nn.LSTM(8, 16, num_layers=2)
    make = lambda T, B: (torch.randn(T, B, 8, requires_grad=True),)
    loss = lambda r: r[0].square().sum() + r[1][1].sum()
    _compile_and_check(model, make, loss)


def test_a_bidirectional_batch_first_gru_compiles():
    torch.manual_seed(10)
    model = cellc.nn.GRU(8, 12, bidirectional=True, batch_first=True)
    make = lambda T, B: (torch.randn(B, T, 8, requires_grad=True),
                         torch.randn(2, B, 12, requires_grad=True))
    loss = lambda r: r[0].square().sum() + r[1].sum()
    _compile_and_check(model, make, loss)


class _CustomCell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = cellc.compile(MGU)
        I, H = 6, 10
        g = torch.Generator().manual_seed(3)
        shapes = {"W": (2 * H, I), "U": (H, H), "Uf": (H, H), "b": (2 * H,)}
        self.params = torch.nn.ParameterDict({
            n: torch.nn.Parameter(0.4 * torch.randn(*s, generator=g)) for n, s in shapes.items()})

    def forward(self, x, h0, lengths):
        out, final = self.cell(x, dict(self.params.items()), {"h": h0}, lengths=lengths,
                               recompute="chunk:4")
        return out["h"], out["f"], final["h"]


def test_a_custom_cell_compiles_with_lengths_and_states():
    torch.manual_seed(1)
    model = _CustomCell()

    def make(T, B):
        lengths = torch.randint(1, T + 1, (B,))
        return (torch.randn(T, B, 6, requires_grad=True),
                torch.randn(B, 10, requires_grad=True), lengths)

    loss = lambda r: (r[0] * r[1]).sum() + r[2].square().sum()
    _compile_and_check(model, make, loss)


class _Tagger(torch.nn.Module):
    """An embedding, a LayerNormLSTM, a linear head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 12)
        self.rnn = cellc.nn.LayerNormLSTM(12, 16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def test_a_model_with_a_layernorm_lstm_compiles():
    torch.manual_seed(2)
    model = _Tagger()
    make = lambda T, B: (torch.randint(0, 50, (T, B)),)
    _compile_and_check(model, make, lambda y: y.square().sum())


def test_inductor_compiles_the_lstm():
    # torch.compile's default backend, as users run it: the op stays an
    # opaque call; inductor fuses what is around it.
    torch.manual_seed(3)
    model = cellc.nn.LSTM(8, 16)
    make = lambda T, B: (torch.randn(T, B, 8, requires_grad=True),)
    loss = lambda r: r[0].square().sum()
    _compile_and_check(model, make, loss, backend="inductor", atol=1e-5)


def test_export_round_trips_the_model():
    torch.manual_seed(4)
    model = _Tagger()
    T, B = torch.export.Dim("T", min=2), torch.export.Dim("B", min=2)
    program = torch.export.export(model, (torch.randint(0, 50, (6, 3)),),
                                  dynamic_shapes=({0: T, 1: B},))
    assert "cellc.sequence" in str(program.graph)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    for T_, B_ in [(4, 2), (11, 5)]:
        tokens = torch.randint(0, 50, (T_, B_))
        want = model(tokens)
        torch.testing.assert_close(program.module()(tokens), want, atol=0, rtol=0)
        torch.testing.assert_close(loaded.module()(tokens), want, atol=0, rtol=0)


def test_an_exported_program_runs_in_a_process_that_never_compiled_the_cell(tmp_path):
    # The op names its cell by its source: a loaded program makes it again.
    torch.manual_seed(8)
    model = cellc.nn.LSTM(4, 6)
    program = torch.export.export(model, (torch.randn(5, 3, 4),),
                                  dynamic_shapes=({0: torch.export.Dim("T"),
                                                   1: torch.export.Dim("B")},))
    torch.export.save(program, str(tmp_path / "lstm.pt2"))
    x = torch.randn(9, 2, 4)
    torch.save({"x": x, "want": model(x)[0].detach()}, str(tmp_path / "io.pt"))
    script = (
        "import sys, torch, cellc\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"program = torch.export.load({str(tmp_path / 'lstm.pt2')!r})\n"
        "got = program.module()(io['x'])[0]\n"
        "assert torch.equal(got, io['want']), (got - io['want']).abs().max()\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(cellc.__file__)))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_fake_op_gives_the_real_shapes():
    # The fake implementation, as FakeTensorMode runs it while tracing, agrees
    # with the op on every result's shape, dtype and strides.
    from torch._subclasses.fake_tensor import FakeTensorMode
    model = _CustomCell()
    cell = model.cell
    args = lambda make: (
        cell._key, "chunk:4", [10, 6], True, [make(9, 3, 6)],
        [make(*model.params[n].shape) for n, _ in cell.params], [make(3, 10)], None, None)
    real = torch.ops.cellc.sequence(*args(torch.randn))
    with FakeTensorMode():
        fake = torch.ops.cellc.sequence(*args(torch.empty))
    assert len(real) == len(fake) == 2 + 1 + 1  # outputs h, f; final h; h per chunk
    for r, f in zip(real, fake):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())
    assert real[-1].shape == (3, 3, 10)  # ceil(9 / 4) chunks


def test_checkpoint_and_functional_call_give_eager_gradients():
    torch.manual_seed(5)
    model = cellc.nn.LSTM(6, 8)
    x = torch.randn(7, 4, 6, requires_grad=True)
    out, _ = model(x)
    want = torch.autograd.grad(out.square().sum(), [x, *model.parameters()])
    from torch.utils.checkpoint import checkpoint
    out = checkpoint(lambda t: model(t)[0], x, use_reentrant=False)
    got = torch.autograd.grad(out.square().sum(), [x, *model.parameters()])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # functional_call with other weights: those weights' gradients.
    other = {n: (p.detach() * 0.5).requires_grad_() for n, p in model.named_parameters()}
    out, _ = torch.func.functional_call(model, other, (x,))
    got = torch.autograd.grad(out.square().sum(), list(other.values()))
    reference = torch.nn.LSTM(6, 8)
    reference.load_state_dict({n: p.detach() for n, p in other.items()})
    ref_params = dict(reference.named_parameters())
    out, _ = reference(x)
    ref = torch.autograd.grad(out.square().sum(), [ref_params[n] for n in other])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_autocast_runs_float32_and_bf16_outside_it_is_refused():
    torch.manual_seed(7)
    model = cellc.nn.LSTM(6, 8)
    proj = torch.nn.Linear(6, 6)
    x = torch.randn(5, 2, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # A bf16 tensor from an autocast op runs in float32, as autocast's
        # float32 ops do; the gradient flows back through the cast.
        y = proj(x)
        assert y.dtype == torch.bfloat16
        out, _ = model(y)
        assert out.dtype == torch.float32
    want, _ = model(y.float())
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    grad, = torch.autograd.grad(out.sum(), x)
    assert grad.dtype == torch.float32 and grad.abs().sum() > 0
    # Outside autocast, bf16 is refused, naming the dtype.
    with pytest.raises(TypeError, match="bfloat16"):
        model(x.detach().bfloat16())


def test_state_dict_round_trips():
    torch.manual_seed(6)
    a, b = cellc.nn.LayerNormLSTM(5, 7), cellc.nn.LayerNormLSTM(5, 7)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer))
    x = torch.randn(6, 3, 5)
    torch.testing.assert_close(a(x)[0], b(x)[0], atol=0, rtol=0)


def test_bad_lengths_are_errors_inside_the_op():
    # The op reads the lengths' values (tracing does not): still a
    # ValueError, compiled or not.
    model = _CustomCell()
    x, h0 = torch.randn(5, 3, 6), torch.randn(3, 10)
    with pytest.raises(ValueError, match="lengths"):
        model(x, h0, torch.tensor([1, 6, 2]))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match="lengths"):
        compiled(x, h0, torch.tensor([1, 6, 2]))


@pytest.mark.parametrize("recompute", ["none", "full", "chunk:3"])
def test_the_cuda_path_compiles_through_the_same_op(recompute):
    # The CUDA host path (the C++ driver and CUDA backend, through cellc.cuda's
    # C interface) with the real kernels in the SIMT emulator on CPU tensors:
    # cellc::sequence runs it as it runs a GPU's. Compiled with fullgraph and
    # dynamic shapes, its outputs and gradients are those of the CPU kernels.
    torch.manual_seed(9)
    # Sizes unlike any T or B of SHAPES: dynamo gives equal sizes one symbol,
    # and binding I would then fix T.
    I, H = 7, 16
    gpu = cellc.compile(cellc.nn.LSTM_CELL, target="cuda-emu")
    cpu = cellc.compile(cellc.nn.LSTM_CELL)
    ref = torch.nn.LSTM(I, H)
    params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
              "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}

    class Model(torch.nn.Module):
        def __init__(self, cell):
            super().__init__()
            self.cell = cell

        def forward(self, x, h0, lengths):
            out, final = self.cell(x, params, {"h": h0}, recompute=recompute,
                                   lengths=lengths)
            return out, final["c"]

    import torch._dynamo as dynamo
    dynamo.reset()
    counter = _Counter()
    compiled = torch.compile(Model(gpu), backend=counter.inner, fullgraph=True,
                             dynamic=True)
    eager = Model(cpu)
    try:
        for i, (T, B) in enumerate(SHAPES[:4]):
            x = torch.randn(T, B, I, requires_grad=True)
            h0 = (0.5 * torch.randn(B, H)).requires_grad_()
            lengths = torch.randint(1, T + 1, (B,))
            wrt = [x, h0, *params.values()]
            results = []
            for model in (compiled, eager):
                out, c = model(x, h0, lengths)
                loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + c.sum()
                results.append([out, c, *torch.autograd.grad(loss, wrt)])
            for a, b in zip(*results):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
            if i == 0:
                first = counter.graphs
                dynamo.config.error_on_recompile = True
    finally:
        dynamo.config.error_on_recompile = False
    assert counter.graphs == first
    # The backward ran the CUDA kernels, through the op, in a workspace.
    assert gpu._last.memory_stats()["backward_workspace_bytes"] > 0
