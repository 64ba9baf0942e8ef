"""The chunkwise form (form="chunk", cellc._chunkwise) against its oracle, the
step kernels: every linear-recurrence example, forward, final states and
every gradient (inputs, params, initial states), at T not a multiple of the
chunk, in float64 and float32, with resets and lengths; and what it refuses,
with a message."""

import os

import pytest
import torch

import cellc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
LINEAR = ["gla", "retnet", "mlstm", "deltanet", "gated_deltanet"]
SIZES = dict(I=6, NH=2, K=4, V=5)


def load(name):
    return cellc.compile(os.path.join(EXAMPLES, name + ".cell"))


def arguments(cell, name, T, B, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for n, _ in cell.params:
        t = 0.5 * torch.randn(*cell.shape(n, SIZES), generator=g, dtype=dtype)
        if name == "retnet" and n == "gamma":
            t = 0.6 + 0.35 * torch.rand(*t.shape, generator=g, dtype=dtype)
        params[n] = t.requires_grad_()
    x = torch.randn(T, B, SIZES["I"], generator=g, dtype=dtype, requires_grad=True)
    states = {}
    for n, _ in cell.states:
        t = 0.3 * torch.randn(B, *cell.shape(n, SIZES), generator=g, dtype=dtype)
        states[n] = t.requires_grad_()
    return x, params, states


def run(cell, x, params, states, **form):
    out, final = cell(x, params, states, sizes=SIZES, **form)
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    loss = (out * weights).sum() + sum((f * torch.cos(f)).sum() for f in final.values())
    leaves = [x, *params.values(), *states.values()]
    names = ["x", *params, *(f"{n}0" for n in states)]
    return out, final, dict(zip(names, torch.autograd.grad(loss, leaves)))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("T,chunk", [(37, 8), (20, 16), (5, None)])
@pytest.mark.parametrize("name", LINEAR)
def test_the_chunk_form_matches_the_step_kernels(name, T, chunk):
    cell = load(name)
    x, params, states = arguments(cell, name, T, 3, torch.float64)
    out, final, grads = run(cell, x, params, states)
    c_out, c_final, c_grads = run(cell, x, params, states, form="chunk", chunk=chunk)
    assert c_out.shape == out.shape
    assert rel(c_out, out) < 1e-10
    for n in final:
        assert c_final[n].shape == final[n].shape
        assert rel(c_final[n], final[n]) < 1e-10, n
    for n in grads:
        assert grads[n].abs().max() > 0, n
        assert rel(c_grads[n], grads[n]) < 1e-10, n


@pytest.mark.parametrize("T,chunk", [(37, 8), (20, 16), (5, None)])
@pytest.mark.parametrize("name", LINEAR)
def test_in_float32_the_chunk_form_is_as_accurate_as_the_step_kernels(name, T, chunk):
    # Both in float32 against the float64 step on the same data: the chunk
    # form reassociates the sums, so each is held to the float64 result, the
    # chunk form within 2e-5 or twice the step kernels' own error. The
    # largest, 1.3e-5: mLSTM's m0 at T = 5, whose gradient (0.2, against 140
    # for w_i) is what is left of large terms that cancel in the gate's
    # cumulative q * dq - k * dk (the kernels sum it in double; in float32
    # it reached 2.2e-5).
    cell = load(name)
    x, params, states = arguments(cell, name, T, 3, torch.float64)
    ref_out, ref_final, ref_grads = run(cell, x, params, states)
    f32 = lambda t: t.detach().float().requires_grad_()
    x32, p32, s32 = f32(x), {n: f32(t) for n, t in params.items()}, \
        {n: f32(t) for n, t in states.items()}
    step = run(cell, x32, p32, s32)
    chunk_ = run(cell, x32, p32, s32, form="chunk", chunk=chunk)
    pairs = [(step[0], chunk_[0], ref_out)]
    pairs += [(step[1][n], chunk_[1][n], ref_final[n]) for n in ref_final]
    pairs += [(step[2][n], chunk_[2][n], ref_grads[n]) for n in ref_grads]
    for s_, c_, ref in pairs:
        err_step, err_chunk = rel(s_.double(), ref), rel(c_.double(), ref)
        assert err_step < 1e-3
        assert err_chunk < max(2e-5, 2 * err_step), (err_chunk, err_step)


def test_a_chunk_of_one_step_is_the_recurrence():
    cell = load("gated_deltanet")
    x, params, states = arguments(cell, "gated_deltanet", 9, 2, torch.float64)
    out, final, grads = run(cell, x, params, states)
    c_out, _, c_grads = run(cell, x, params, states, form="chunk", chunk=1)
    assert rel(c_out, out) < 1e-12
    assert all(rel(c_grads[n], grads[n]) < 1e-10 for n in grads)


def test_batch_first_and_no_initial_states():
    cell = load("gla")
    x, params, _ = arguments(cell, "gla", 11, 2, torch.float64)
    xb = x.detach().transpose(0, 1)
    out, final = cell(xb, params, batch_first=True, sizes=SIZES)
    c_out, c_final = cell(xb, params, batch_first=True, sizes=SIZES, form="chunk", chunk=4)
    assert rel(c_out, out) < 1e-12 and rel(c_final["S"], final["S"]) < 1e-12


def test_a_cell_with_no_chunk_form_says_why():
    cell = load("mamba_s6")
    sizes = dict(D=4, N=3)
    params = {n: torch.randn(*cell.shape(n, sizes)) for n, _ in cell.params}
    with pytest.raises(ValueError, match=r"no chunkwise form \(h: the gate .* varies along "
                                         r"both dims.*form='step'"):
        cell(torch.randn(5, 2, 4), params, sizes=sizes, form="chunk")
    lstm = load("lstm")
    params = {n: torch.randn(*lstm.shape(n, dict(I=3, H=4))) for n, _ in lstm.params}
    with pytest.raises(ValueError, match="no matrix state is a gated linear recurrence"):
        lstm(torch.randn(5, 2, 3), params, form="chunk")
    # The delta rule beside another outer product: refused (the delta
    # template ran without the other term before, a wrong result).
    both = cellc.compile("""
cell delta_and_outer {
  input x: [I]
  state C: [NH, K, V]
  param W_q: [NH*K, I], W_k: [NH*K, I], W_v: [NH*V, I], W_j: [NH*K, I], W_u: [NH*V, I]
  param w_b: [NH, I]
  k = heads(W_k @ x, NH)
  u = heads(W_v @ x, NH) - k @ C
  C = C + outer(k, sigmoid(w_b @ x) * u) + outer(heads(W_j @ x, NH), heads(W_u @ x, NH))
  y = heads(W_q @ x, NH) @ C
  output y
}
""")
    params = {n: 0.3 * torch.randn(*both.shape(n, SIZES)) for n, _ in both.params}
    with pytest.raises(ValueError, match="the delta rule with another outer product has no "
                                         "chunk form yet"):
        both(torch.randn(5, 2, SIZES["I"]), params, sizes=SIZES, form="chunk")
    out, _ = both(torch.randn(5, 2, SIZES["I"]), params, sizes=SIZES)   # the step form runs it
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", LINEAR)
def test_resets_and_lengths_match_the_step_kernels(name):
    # Resets at random steps (two at chunk starts, one at a chunk's last
    # step, one after a sample's end), lengths that end inside a chunk, at
    # a chunk's end and at 0: the state restarts from the initial state,
    # outputs are zero after a sample's end, the final state is its last.
    T, B = 37, 4
    cell = load(name)
    x, params, states = arguments(cell, name, T, B, torch.float64, seed=5)
    g = torch.Generator().manual_seed(6)
    resets = torch.rand(T, B, generator=g) < 0.1
    resets[8, 0] = resets[16, 1] = resets[15, 2] = resets[30, 3] = True
    lengths = torch.tensor([T, 23, 16, 0])
    step = run(cell, x, params, states, resets=resets, lengths=lengths)
    chunk = run(cell, x, params, states, resets=resets, lengths=lengths, form="chunk", chunk=8)
    (out, final, grads), (c_out, c_final, c_grads) = step, chunk
    assert out[23:, 1].abs().max() == 0 and c_out[23:, 1].abs().max() == 0
    assert rel(c_out, out) < 1e-10
    for n in final:
        assert rel(c_final[n], final[n]) < 1e-10, n
    for n in grads:
        assert grads[n].abs().max() > 0 and rel(c_grads[n], grads[n]) < 1e-10, n


@pytest.mark.parametrize("mode", ["none", "full", "chunk:16", "chunk:5"])
@pytest.mark.parametrize("name", ["mlstm", "gated_deltanet"])
def test_every_recompute_mode_gives_the_same_gradients(name, mode):
    # full computes the core again in the backward from what it read;
    # chunk:K keeps the state every K steps and computes each span again.
    T, B = 37, 3
    cell = load(name)
    x, params, states = arguments(cell, name, T, B, torch.float64, seed=7)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[11, 0] = resets[20, 2] = True
    out, final, grads = run(cell, x, params, states, resets=resets, lengths=[T, 30, 12])
    c_out, c_final, c_grads = run(cell, x, params, states, resets=resets, lengths=[T, 30, 12],
                                  form="chunk", chunk=8, recompute=mode)
    assert rel(c_out, out) < 1e-10
    assert all(rel(c_final[n], final[n]) < 1e-10 for n in final)
    for n in grads:
        assert rel(c_grads[n], grads[n]) < 1e-10, n


def test_what_the_chunk_form_does_not_take_yet_is_refused():
    cell = load("gla")
    x, params, _ = arguments(cell, "gla", 6, 2, torch.float32)
    with pytest.raises(ValueError, match="chunk:K"):
        cell(x, params, sizes=SIZES, form="chunk", recompute="chunk:0")
    with pytest.raises(ValueError, match="form must be one of 'step', 'chunk', 'auto'"):
        cell(x, params, sizes=SIZES, form="chunks")
    with pytest.raises(ValueError, match="chunk must be a positive number of steps"):
        cell(x, params, sizes=SIZES, form="chunk", chunk=0)


def test_a_gate_that_is_not_positive_is_refused():
    # RetNet's gamma is a param: its log exists only where it is positive.
    cell = load("retnet")
    x, params, _ = arguments(cell, "retnet", 6, 2, torch.float64)
    with torch.no_grad():
        params["gamma"][0] = -0.5
    with pytest.raises(ValueError, match="needs positive gates"):
        cell(x, params, sizes=SIZES, form="chunk")
    out, _ = cell(x, params, sizes=SIZES)      # the step form takes it
    assert torch.isfinite(out).all()


def test_auto_takes_the_chunk_form_where_it_is_expected_to_be_faster():
    # form="auto" (cellc._chunkwise.choose): the chunk form when training on
    # the CPU over at least AUTO_MIN_CHUNKS chunks with every core on a
    # kernel template; the step kernels for inference, short sequences,
    # resets, and cells without a chunk form.
    from cellc import _chunkwise
    from cellc._front import check
    cell = load("gla")
    x, params, _ = arguments(cell, "gla", 20, 2, torch.float64)
    called = lambda **o: check(cell, x, params, sizes=SIZES, **o)
    assert _chunkwise.choose(cell, called(), 4) == "chunk"
    assert _chunkwise.choose(cell, called(), 8) == "step"          # 3 chunks
    assert _chunkwise.choose(cell, called(resets=torch.zeros(20, 2, dtype=torch.bool)),
                             4) == "step"
    with torch.no_grad():
        assert _chunkwise.choose(cell, called(), 4) == "step"
    delta = load("gated_deltanet")
    dx, dparams, _ = arguments(delta, "gated_deltanet", 20, 2, torch.float64)
    assert _chunkwise.choose(delta, check(delta, dx, dparams, sizes=SIZES), 4) == "chunk"
    lstm = load("lstm")
    lp = {n: torch.randn(*lstm.shape(n, dict(I=3, H=4))) for n, _ in lstm.params}
    assert _chunkwise.choose(lstm, check(lstm, torch.randn(300, 2, 3), lp), None) == "step"
    # And what it chose is what runs: the chunk form's results exactly.
    auto, _ = cell(x, params, sizes=SIZES, form="auto", chunk=4)
    chunk, _ = cell(x, params, sizes=SIZES, form="chunk", chunk=4)
    assert torch.equal(auto, chunk)


#: Sizes with K != V, so that the plan's arrays differ by their widths.
PLAN_SIZES = dict(I=12, NH=2, K=8, V=4)


def _saved_bytes(run, caller):
    """The bytes of every tensor autograd saves while `run` runs (torch's
    saved-tensor hooks, each storage once), but those of `caller`'s tensors
    (after `run`, its results too) and 0-d ones."""
    seen = {}

    def pack(t):
        if t.dim() > 0:
            st = t.storage()
            seen.setdefault(st.data_ptr(), st.size() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        results = run()
    mine = {t.storage().data_ptr() for t in caller(results)}
    return sum(b for ptr, b in seen.items() if ptr not in mine)


def _plan_against_kept(cell, sizes, mode, dtype, chunk, positive=()):
    """memory_plan(form="chunk") (jit::planChunkForm) of `cell` and what
    its chunk form's forward keeps for its backward (_saved_bytes) at
    T = 37 (no multiple of the chunk), B = 3; and the call's results.
    `positive`: params that are gates read as they are."""
    T, B = 37, 3
    g = torch.Generator().manual_seed(3)
    params = {n: (0.3 * torch.randn(*cell.shape(n, sizes), generator=g, dtype=dtype))
              for n, _ in cell.params}
    for n in positive:
        params[n] = 0.6 + 0.3 * torch.rand(*params[n].shape, generator=g, dtype=dtype)
    params = {n: t.requires_grad_() for n, t in params.items()}
    x = torch.randn(T, B, sizes["I"], generator=g, dtype=dtype, requires_grad=True)
    states = {n: (0.1 * torch.randn(B, *cell.shape(n, sizes), generator=g,
                                    dtype=dtype)).requires_grad_() for n, _ in cell.states}
    results = []
    kept = _saved_bytes(
        lambda: results.append(cell(x, params, states, sizes=sizes, form="chunk",
                                    chunk=chunk, recompute=mode)) or results[0],
        lambda r: [x, *params.values(), *states.values(), r[0], *r[1].values()])
    plan = cell.memory_plan(sizes, T, B, recompute=mode, dtype=dtype, form="chunk",
                            chunk=chunk)
    return plan, kept, results[0]


@pytest.mark.parametrize("dtype,chunk", [(torch.float32, 16), (torch.float64, None)])
@pytest.mark.parametrize("mode", ["none", "full", "chunk:16"])
@pytest.mark.parametrize("name", LINEAR)
def test_the_memory_plan_counts_what_the_chunk_form_keeps(name, mode, dtype, chunk):
    # Byte for byte: the compiled parts' driver buffers, the arrays between
    # them, the cores' copies and chunk buffers.
    cell = load(name)
    plan, kept, (out, final) = _plan_against_kept(
        cell, PLAN_SIZES, mode, dtype, chunk, ["gamma"] if name == "retnet" else [])
    assert plan["chunk"] == (chunk or 64)
    assert plan["kept"] == kept
    assert plan["outputs"] == out.numel() * out.element_size()
    assert plan["final_states"] == sum(f.numel() * f.element_size() for f in final.values())


#: Cells whose glue around the core makes other arrays: a negated source (a
#: view, a product, no value factor), a key product, a read scaled by one
#: factor and by two, the rest reading a cell input.
PLAN_CELLS = {
    "negated": "S = alpha * S - outer(k, v)\n  o = q @ S",
    "negated_product": "S = alpha * S - outer(k, v * v)\n  o = q @ S",
    "key_product": "S = alpha * S + outer(k * q, v)\n  o = q @ S",
    "scaled_read": "S = alpha * S + outer(k, v)\n  o = q @ (g * S)",
    "twice_scaled_read": "S = alpha * S + outer(k, v)\n  o = q @ (g * (h * S))",
    "rest_reads_input": "S = alpha * S + outer(k, v)\n  o = sum(sum(q @ S)) * x",
}
PLAN_CELL = """
cell planned {{
  input x: [I]
  state S: [NH, K, V]
  param W_q: [NH*K, I], W_k: [NH*K, I], W_v: [NH*V, I], W_a: [NH*K, I]
  param w_g: [NH, I], w_h: [NH, I]
  q = heads(W_q @ x, NH)
  k = heads(W_k @ x, NH)
  v = heads(W_v @ x, NH)
  g = sigmoid(w_g @ x)
  h = sigmoid(w_h @ x)
  alpha = exp(logsigmoid(heads(W_a @ x, NH)) / 16)
  {step}
  output o
}}
"""
ONE_COLUMN_NEGATED = """
cell one_column {
  input x: [I]
  state n: [NH, K]
  param W_q: [NH*K, I], W_k: [NH*K, I], w_f: [NH, I]
  q = heads(W_q @ x, NH)
  n = sigmoid(w_f @ x) * n - heads(W_k @ x, NH)
  o = sum(n * q)
  output o
}
"""


@pytest.mark.filterwarnings("ignore:.*is never used")
@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("name", [*PLAN_CELLS, "one_column_negated"])
def test_the_memory_plan_counts_the_glue_of_other_cells(name, mode):
    source = (ONE_COLUMN_NEGATED if name == "one_column_negated"
              else PLAN_CELL.format(step=PLAN_CELLS[name]))
    cell = cellc.compile(source)
    sizes = dict(I=8, NH=2, K=8, V=4) if name != "one_column_negated" else dict(I=8, NH=2, K=8)
    plan, kept, _ = _plan_against_kept(cell, sizes, mode, torch.float64, 16)
    assert plan["kept"] == kept


def test_the_chunk_forms_memory_plan_refuses_what_it_does_not_plan():
    gla = load("gla")
    with pytest.raises(ValueError, match="form must be one of"):
        gla.memory_plan(SIZES, 64, 2, form="chunks")
    with pytest.raises(ValueError, match="chunk must be a positive number of steps"):
        gla.memory_plan(SIZES, 64, 2, form="chunk", chunk=0)
    with pytest.raises(ValueError, match="chunk:K"):
        gla.memory_plan(SIZES, 64, 2, recompute="chunk:0", form="chunk")
    with pytest.raises(ValueError, match="T >= 1"):
        gla.memory_plan(SIZES, 0, 2, form="chunk")
    with pytest.raises(TypeError, match="float32 and float64"):
        gla.memory_plan(SIZES, 64, 2, form="chunk", dtype=torch.bfloat16)
    lstm = load("lstm")
    with pytest.raises(ValueError, match="has no chunkwise form"):
        lstm.memory_plan(dict(I=3, H=4), 64, 2, form="chunk")
    # A column gate runs the generic core in torch: not planned, and said so.
    both = cellc.compile(GATED_BOTH_SIDES)
    with pytest.raises(ValueError, match="generic core"):
        both.memory_plan(SIZES, 64, 2, form="chunk")
    # auto: the form a call with form="auto" takes.
    assert "chunk" not in gla.memory_plan(SIZES, 64, 2, form="auto")
    assert gla.memory_plan(SIZES, 256, 2, form="auto") == gla.memory_plan(
        SIZES, 256, 2, form="chunk")
    assert "chunk" not in lstm.memory_plan(dict(I=3, H=4), 512, 2, form="auto")


#: Row and column gates together (GateLoop's diag(a) S diag(b)), a read of
#: the state before its update, and both reads of it after: q @ S and S q.
GATED_BOTH_SIDES = """
cell both_sides {
  input x: [I]
  state S: [NH, K, V]
  param W_q: [NH*V, I], W_k: [NH*K, I], W_v: [NH*V, I], W_b: [NH*V, I], W_a: [NH*K, I]
  param W_r: [NH*K, I]
  a = exp(logsigmoid(heads(W_a @ x, NH)) / 4)
  b = exp(logsigmoid(heads(W_b @ x, NH)) / 4)
  early = heads(W_r @ x, NH) @ S
  S = a * S * cols(b) + outer(heads(W_k @ x, NH), heads(W_v @ x, NH))
  o = S @ heads(W_q @ x, NH)
  r = heads(W_r @ x, NH) @ S
  output o, r, early
}
"""


@pytest.mark.parametrize("resets", [False, True], ids=["", "resets"])
@pytest.mark.parametrize("chunk", [19, 64])
def test_row_and_column_gates_and_reads_on_both_sides(chunk, resets):
    # Chunks of 19 cut the sub-chunks of 16 (the row gate's secondary
    # chunking) across a chunk; 64 holds all 37 steps in one. With resets,
    # lengths too.
    cell = cellc.compile(GATED_BOTH_SIDES)
    text = cell.emit("chunkwise", sizes=SIZES)
    assert "gate: row" in text and "gate: column" in text and "before the update" in text
    with pytest.raises(ValueError, match="unknown stage 'chunkwize'; expected mlir, split, "
                                         "chunkwise"):
        cell.emit("chunkwize", sizes=SIZES)
    g = torch.Generator().manual_seed(3)
    params = {n: (0.5 * torch.randn(*cell.shape(n, SIZES), generator=g,
                                    dtype=torch.float64)).requires_grad_()
              for n, _ in cell.params}
    x = torch.randn(37, 3, SIZES["I"], generator=g, dtype=torch.float64, requires_grad=True)
    S0 = (0.3 * torch.randn(3, 2, 4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    leaves = [x, S0, *params.values()]
    restarts = (torch.rand(37, 3, generator=g) < 0.15) if resets else None
    results = []
    for form in ("step", "chunk"):
        outs, final = cell(x, params, {"S": S0}, sizes=SIZES, form=form, chunk=chunk,
                           resets=restarts, lengths=[37, 30, 19] if resets else None)
        loss = sum((o * torch.cos(o)).sum() for o in outs.values()) + final["S"].sum()
        results.append((outs, final, torch.autograd.grad(loss, leaves)))
    (outs, final, grads), (c_outs, c_final, c_grads) = results
    for n in outs:
        assert c_outs[n].shape == outs[n].shape and rel(c_outs[n], outs[n]) < 1e-10, n
    assert rel(c_final["S"], final["S"]) < 1e-10
    for a, b in zip(c_grads, grads):
        assert b.abs().max() > 0 and rel(a, b) < 1e-10


def test_the_recurrent_module_trains_in_the_chunk_form():
    # cellc.nn.Recurrent binds the sizes it was built with (GLA's params
    # hold NH, K and V only as products) and takes form= and chunk=; two
    # layers, the second reading the first's output.
    torch.manual_seed(0)
    step = cellc.nn.Recurrent(os.path.join(EXAMPLES, "gla.cell"), num_layers=2,
                              dtype=torch.float64, **SIZES)
    chunk = cellc.nn.Recurrent(os.path.join(EXAMPLES, "gla.cell"), num_layers=2,
                               dtype=torch.float64, form="chunk", chunk=8, **SIZES)
    chunk.load_state_dict(step.state_dict())
    x = torch.randn(21, 3, SIZES["I"], dtype=torch.float64)
    grads = []
    for m in (step, chunk):
        out, finals = m(x, lengths=torch.tensor([21, 9, 14]))
        assert out.shape == (21, 3, SIZES["NH"] * SIZES["V"])
        assert finals[1]["S"].shape == (3, SIZES["NH"], SIZES["K"], SIZES["V"])
        (out * torch.cos(out)).sum().backward()
        grads.append((out.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (out, g), (c_out, c_g) = grads
    assert rel(c_out, out) < 1e-10
    for n in g:
        assert g[n].abs().max() > 0 and rel(c_g[n], g[n]) < 1e-10, n


@pytest.mark.parametrize("name,core", [("gla", "Diagonal"), ("retnet", "Diagonal"),
                                       ("mlstm", "Diagonal"), ("deltanet", "Delta"),
                                       ("gated_deltanet", "Delta")])
def test_the_examples_cores_run_on_the_kernels(name, core):
    # Each example fits a template, so its core runs on runtime/cpu/ChunkCore
    # (the tests above would pass on the generic core too).
    cell = load(name)
    x, params, _ = arguments(cell, name, 20, 2, torch.float64)
    out, _ = cell(x, params, sizes=SIZES, form="chunk", chunk=8)
    seen, todo = set(), [out.grad_fn]
    while todo:
        g = todo.pop()
        if g is not None and g not in seen:
            seen.add(g)
            todo += [n for n, _ in g.next_functions]
    assert {type(g).__name__ for g in seen if "Core" in type(g).__name__} == \
        {f"_Native{core}CoreBackward"}


def _count_prologues(monkeypatch, epilogues=None):
    """The devices of the compiled prologues the chunk form runs from now on
    (and, into `epilogues`, of its compiled epilogues: the parts whose
    outputs are the cell's, not values v<id>)."""
    from cellc import _chunkwise
    ran, real = [], _chunkwise._run_part

    def counted(part, *args):
        prologue = all(n.startswith("v") and n[1:].isdigit() for n in part.outputs)
        into = ran if prologue else epilogues
        if into is not None:
            into.append(part.devices)
        return real(part, *args)
    monkeypatch.setattr(_chunkwise, "_run_part", counted)
    return ran


@pytest.mark.parametrize("name", LINEAR)
def test_the_compiled_prologue_is_the_torch_ops(name, monkeypatch):
    # The prologue and the rest of the step run as the pipeline's kernels
    # (cell-chunk-part) with their derived backward; op by op in torch they
    # give the same values and gradients, with lengths and resets, in full
    # (which replays them).
    from cellc import _chunkwise
    T, B = 29, 3
    cell = load(name)
    x, params, states = arguments(cell, name, T, B, torch.float64, seed=9)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[9, 1] = True
    options = dict(form="chunk", chunk=8, recompute="full", resets=resets,
                   lengths=[T, 17, 4])
    assert _chunkwise.prologue(cell, SIZES, torch.float64) is not None
    # Only mLSTM has ops after the core (its normalisation): compiled too.
    rests = []
    ran = _count_prologues(monkeypatch, rests)
    compiled = run(cell, x, params, states, **options)
    assert ran == ["cpu"] and rests == (["cpu"] if name == "mlstm" else [])
    monkeypatch.setattr(_chunkwise, "COMPILED_PROLOGUE", False)
    ops = run(cell, x, params, states, **options)
    assert ran == ["cpu"]
    assert rel(compiled[0], ops[0]) < 1e-12
    for n in ops[1]:
        assert rel(compiled[1][n], ops[1][n]) < 1e-12, n
    for n in ops[2]:
        assert ops[2][n].abs().max() > 0 and rel(compiled[2][n], ops[2][n]) < 1e-12, n


@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("name", LINEAR)
def test_the_chunk_form_trains_on_the_emulated_cuda_kernels(name, mode, monkeypatch):
    # target="cuda-emu": the prologue's CUDA kernels run in the SIMT emulator
    # and the core in torch (its templates, as on a GPU, not the CPU's
    # kernels), in float32, against the step kernels in float64, with
    # resets and lengths.
    from cellc import _chunkwise
    T, B = 21, 3
    cell = load(name)
    x, params, states = arguments(cell, name, T, B, torch.float64, seed=4)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[13, 0] = True
    options = dict(resets=resets, lengths=[T, 11, 18])
    want = run(cell, x, params, states, **options)
    emu = cellc.compile(os.path.join(EXAMPLES, name + ".cell"), target="cuda-emu")
    assert _chunkwise.prologue(emu, SIZES, torch.float32, torch.device("cpu")).devices == \
        "emulator"
    f32 = lambda t: t.detach().float().requires_grad_()
    rests = []
    ran = _count_prologues(monkeypatch, rests)
    got = run(emu, f32(x), {n: f32(t) for n, t in params.items()},
              {n: f32(t) for n, t in states.items()}, form="chunk", chunk=8, recompute=mode,
              **options)
    assert ran == ["emulator"] and rests == (["emulator"] if name == "mlstm" else [])
    assert got[0].dtype == torch.float32
    assert rel(got[0].double(), want[0]) < 2e-5
    for n in want[1]:
        assert rel(got[1][n].double(), want[1][n]) < 2e-5, n
    for n in want[2]:
        assert rel(got[2][n].double(), want[2][n]) < 2e-5, n


# A gate read as it is (not an exp), in a cell whose input is named as the
# compiled prologue's own placeholder state would be, with and without a
# state stepped before the core.
SIGMOID_GATES = {
    False: """cell sg {
  input unused: [I]
  state S: [NH, K, V]
  param W_q: [NH*K, I], W_k: [NH*K, I], W_v: [NH*V, I], W_a: [NH*K, I]
  q = heads(W_q @ unused, NH)
  k = heads(W_k @ unused, NH)
  v = heads(W_v @ unused, NH)
  a = sigmoid(heads(W_a @ unused, NH))
  S = a * S + outer(k, v)
  o = q @ S
  output o
}
""",
    True: """cell sg {
  input unused: [I]
  state S: [NH, K, V], c: [NH]
  param W_q: [NH*K, I], W_k: [NH*K, I], W_v: [NH*V, I], w_a: [NH, I], w_c: [NH, I]
  q = heads(W_q @ unused, NH)
  k = heads(W_k @ unused, NH)
  v = heads(W_v @ unused, NH)
  c_new = max(c, w_c @ unused)
  a = sigmoid(w_a @ unused + c_new)
  S = a * S + outer(k, v)
  c = c_new
  o = q @ S
  output o
}
"""}


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("stepped", [False, True])
def test_a_gate_read_as_it_is_takes_lengths(stepped, compiled, monkeypatch):
    # Past a sample's length the prologue leaves zeros (its kernels) or
    # values of padding (torch): the gate there is 1 whatever it is, not a
    # zero gate refused nor a log of zero.
    from cellc import _chunkwise
    cell = cellc.compile(SIGMOID_GATES[stepped])
    monkeypatch.setattr(_chunkwise, "COMPILED_PROLOGUE", compiled)
    ran = _count_prologues(monkeypatch)
    T, B = 19, 3
    x, params, states = arguments(cell, "sg", T, B, torch.float64, seed=11)
    options = dict(lengths=[T, 9, 2])
    want = run(cell, x, params, states, **options)
    got = run(cell, x, params, states, form="chunk", chunk=8, **options)
    assert ran == (["cpu"] if compiled else [])
    assert rel(got[0], want[0]) < 1e-10
    for n in want[1]:
        assert rel(got[1][n], want[1][n]) < 1e-10, n
    for n in want[2]:
        assert want[2][n].abs().max() > 0 and rel(got[2][n], want[2][n]) < 1e-10, n
