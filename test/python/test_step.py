"""Streaming steps: cellc.Cell.step and the nn modules' step, against the
sequence call step by step and against torch's cells, in float64; their
gradients; and their errors for bad tensors."""

import os

import pytest
import torch

import cellc
from conftest import lstm_problem

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LSTM = cellc.nn.LSTM_CELL


def example(name):
    return cellc.compile(os.path.join(ROOT, "examples", name + ".cell"))


def random_params(cell, sizes, dtype=torch.float64):
    return {n: 0.3 * torch.randn(*cell.shape(n, sizes), dtype=dtype) for n, _ in cell.params}


# The cells: a plain one, one with reductions (layer norm), one with
# block-diagonal weights and a reduction, one with two outputs of which
# neither is a state (lstmp's h is a projection).
CASES = [("lstm", {"I": 5, "H": 7}), ("layernorm_lstm", {"I": 5, "H": 7}),
         ("block_gru", None), ("lstmp", {"I": 5, "H": 7, "P": 3})]


def sizes_for(cell, sizes):
    if sizes is not None:
        return sizes
    return {s: 4 for s in cell.size_symbols}


@pytest.mark.parametrize("name,sizes", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("threads", [1, 3])
def test_steps_are_the_sequence_step_by_step(name, sizes, threads):
    torch.manual_seed(0)
    cell = cellc.compile(os.path.join(ROOT, "examples", name + ".cell"), threads=threads)
    sizes = sizes_for(cell, sizes)
    params = random_params(cell, sizes)
    T, B = 4, 5
    x = {n: torch.randn(T, B, cell.shape(n, sizes)[0], dtype=torch.float64)
         for n, _ in cell.inputs}
    states = {n: torch.randn(B, cell.shape(n, sizes)[0], dtype=torch.float64)
              for n, _ in cell.states}
    with torch.no_grad():
        out, final = cell(x, params, states)
        st = states
        for t in range(T):
            o, st = cell.step({n: v[t] for n, v in x.items()}, params, st)
            if isinstance(out, dict):
                for n in out:
                    torch.testing.assert_close(o[n], out[n][t], rtol=1e-12, atol=1e-12)
            else:
                torch.testing.assert_close(o, out[t], rtol=1e-12, atol=1e-12)
    for n in final:
        torch.testing.assert_close(st[n], final[n], rtol=1e-12, atol=1e-12)
    # The states stepped from are left as they were.
    assert all(st[n] is not states[n] for n in states)


@pytest.mark.parametrize("T", [3, 4])
def test_one_rows_steps_on_one_thread_turn_their_order_and_keep_their_results(T):
    # B = 1 on one thread runs the per-row kernels, whose matvecs read the
    # weights from the last row at every other step and call (a snake).
    # Each output is one row's dot product either way: the steps are the
    # sequence's in float64, and a step taken again, in the other order, is
    # the same bit for bit.
    torch.manual_seed(0)
    cell = cellc.compile(os.path.join(ROOT, "examples", "lstm.cell"), threads=1)
    sizes = {"I": 5, "H": 7}
    params = random_params(cell, sizes)
    x = torch.randn(T, 1, 5, dtype=torch.float64)
    states = {n: torch.randn(1, 7, dtype=torch.float64) for n, _ in cell.states}
    with torch.no_grad():
        out, final = cell(x, params, states)
        st = states
        for t in range(T):
            o, nxt = cell.step(x[t], params, st)
            again, nxt_again = cell.step(x[t], params, st)
            assert torch.equal(o, again)
            assert all(torch.equal(nxt[n], nxt_again[n]) for n in nxt)
            torch.testing.assert_close(o, out[t], rtol=1e-12, atol=1e-12)
            st = nxt
    for n in final:
        torch.testing.assert_close(st[n], final[n], rtol=1e-12, atol=1e-12)
    ref = torch.nn.LSTM(5, 7).double()
    with torch.no_grad():
        for n, m in (("W_ih", "weight_ih_l0"), ("W_hh", "weight_hh_l0"),
                     ("b_ih", "bias_ih_l0"), ("b_hh", "bias_hh_l0")):
            getattr(ref, m).copy_(params[n])
        want, _ = ref(x, (states["h"][None], states["c"][None]))
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_a_step_is_torchs_lstm_cell_and_missing_states_are_zeros():
    torch.manual_seed(1)
    cell = cellc.compile(LSTM)
    ref = torch.nn.LSTMCell(6, 8).double()
    params = {"W_ih": ref.weight_ih, "W_hh": ref.weight_hh, "b_ih": ref.bias_ih,
              "b_hh": ref.bias_hh}
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        h, c = ref(x)
        out, st = cell.step(x, params)
        torch.testing.assert_close(out, h, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(st["c"], c, rtol=1e-12, atol=1e-12)
        # Only c given: h starts at zero.
        c0 = torch.randn(3, 8, dtype=torch.float64)
        h, c = ref(x, (torch.zeros(3, 8, dtype=torch.float64), c0))
        out, st = cell.step(x, params, {"c": c0})
        torch.testing.assert_close(st["c"], c, rtol=1e-12, atol=1e-12)


def test_batch_sizes_change_between_steps_and_params_changed_in_place_count():
    torch.manual_seed(2)
    cell = cellc.compile(LSTM)
    ref = torch.nn.LSTMCell(4, 6)
    params = {"W_ih": ref.weight_ih, "W_hh": ref.weight_hh, "b_ih": ref.bias_ih,
              "b_hh": ref.bias_hh}
    with torch.no_grad():
        for B in (3, 17, 1, 3):
            x, h, c = torch.randn(B, 4), torch.randn(B, 6), torch.randn(B, 6)
            out, st = cell.step(x, params, {"h": h, "c": c})
            rh, rc = ref(x, (h, c))
            torch.testing.assert_close(out, rh, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(st["c"], rc, rtol=1e-5, atol=1e-6)
            # An optimizer's step (in place): the next step reads the new values.
            for p in params.values():
                p.mul_(0.9).add_(0.01)


def lstm_step_is_torchs(cell, B, p):
    """One float64 step of `cell` (an LSTM, I = 5, H = 7) at batch B with
    params `p`, against torch.lstm_cell to 1e-12; returns its x, h and c."""
    x, h, c = (torch.randn(B, n, dtype=torch.float64) for n in (5, 7, 7))
    with torch.no_grad():
        out, st = cell.step(x, p, {"h": h, "c": c})
        rh, rc = torch.lstm_cell(x, (h, c), p["W_ih"], p["W_hh"], p["b_ih"], p["b_hh"])
    torch.testing.assert_close(out, rh, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st["c"], rc, rtol=1e-12, atol=1e-12)
    return x, h, c


@pytest.mark.parametrize("threads", [1, 2])
def test_the_weights_a_step_packed_follow_every_write_to_the_params(threads):
    """A step keeps the weights it packed for the next step while the params
    are the same tensors with the same contents. Each kind of write must be
    seen: torch's in-place ops, a write through `.data` (which torch's
    version counter misses), new tensors, and a batch that changes the
    workspace. B = 16 runs the batched kernels, which pack; B = 1 the per-row
    ones, which read the params as they are, in between."""
    torch.manual_seed(3)
    cell = cellc.compile(LSTM, threads=threads)
    ref = torch.nn.LSTMCell(5, 7).double()
    params = {"W_ih": ref.weight_ih.detach(), "W_hh": ref.weight_hh.detach(),
              "b_ih": ref.bias_ih.detach(), "b_hh": ref.bias_hh.detach()}

    def check(B, p):
        lstm_step_is_torchs(cell, B, p)

    check(16, params)
    check(16, params)  # the packed weights again
    with torch.no_grad():
        params["W_hh"].mul_(-0.5)  # in place: a new version
    check(16, params)
    # Through .data, as soft target updates write: the version stays.
    params["W_ih"].data.copy_(torch.randn(28, 5, dtype=torch.float64))
    params["W_hh"].data.mul_(0.7).add_(0.01)
    check(16, params)
    check(1, params)
    params["W_hh"].data.mul_(-1.5)
    check(1, params)
    check(16, params)
    # Other tensors with other values.
    check(16, {n: 0.5 * torch.randn_like(t) for n, t in params.items()})
    check(16, params)
    # Other batches (other tile counts, so other workspaces, which may start
    # where the last one did), then back; with the same params each time.
    check(40, params)
    check(16, params)
    check(40, params)
    with torch.no_grad():
        params["W_ih"].add_(0.25)
    check(16, params)


def test_a_step_runs_bound_and_binds_again_for_other_threads_and_batches():
    """From the second step of the same shapes, a step runs bound: the
    kernel's arguments laid out once, only the tensors' data written. Other
    threads, or another batch stepped in between, make it bind again; every
    step stays torch's LSTM cell."""
    torch.manual_seed(4)
    cell = cellc.compile(LSTM, threads=1)
    ref = torch.nn.LSTMCell(5, 7).double()
    p = {"W_ih": ref.weight_ih.detach(), "W_hh": ref.weight_hh.detach(),
         "b_ih": ref.bias_ih.detach(), "b_hh": ref.bias_hh.detach()}

    def check(B):
        x, h, c = lstm_step_is_torchs(cell, B, p)
        return cell._step_plan(x, p, {"h": h, "c": c})

    plan = check(16)
    bound = plan.bound[0]
    assert bound is not None
    assert check(16).bound[0] is bound  # ran bound
    plan.compiled.threads = 2
    assert check(16).bound[0] is not bound  # bound again, for two threads
    bound = plan.bound[0]
    check(16)
    # Another batch on the same kernels remakes the step's buffers.
    x, h, c, o, h2, c2 = (torch.randn(3, n, dtype=torch.float64) for n in (5, 7, 7, 7, 7, 7))
    buf = lambda *ts: [(t.data_ptr(), list(t.shape)) for t in ts]
    plan.compiled.step(buf(x), buf(*[p[n] for n in plan.names_par]), buf(h, c), buf(o),
                       buf(h2, c2))
    assert check(16).bound[0] is not bound
    check(16)
    # A bound step checks what it can: the new states apart from the old.
    x, h, c = (torch.randn(16, n, dtype=torch.float64) for n in (5, 7, 7))
    outs = [torch.empty(16, 7, dtype=torch.float64) for _ in range(3)]
    data = [t.data_ptr() for t in (x, *[p[n] for n in plan.names_par], h, c)]
    with pytest.raises(ValueError, match="new state 'h' must not be the state it steps from"):
        plan.bound[0].run(data + [outs[0].data_ptr(), h.data_ptr(), outs[2].data_ptr()],
                          [0, 0, 0, 0])
    with pytest.raises(ValueError, match="takes 10 tensors, not 9"):
        plan.bound[0].run(data + [outs[0].data_ptr(), outs[1].data_ptr()], [0, 0, 0, 0])


def test_two_threads_stepping_one_binding_each_get_their_own_steps():
    """Two threads that step one Cell at the same shapes share its bound
    step. Each must run its own tensors: the bound step's argument array is
    each thread's (a shared one, filled by one thread while the other's call
    had let go of the GIL, ran the other's tensors and left this one's
    outputs unwritten, with no error). A race: with the array shared, this
    failed in one of three runs here, not in every one."""
    import sys
    import threading
    torch.manual_seed(6)
    cell = cellc.compile(LSTM, threads=1)
    ref = torch.nn.LSTMCell(5, 7).double()
    p = {"W_ih": ref.weight_ih.detach(), "W_hh": ref.weight_hh.detach(),
         "b_ih": ref.bias_ih.detach(), "b_hh": ref.bias_hh.detach()}
    inputs = [[(torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 7, dtype=torch.float64),
                torch.randn(4, 7, dtype=torch.float64)) for _ in range(300)] for _ in range(2)]
    worst, errors = [0.0, 0.0], []

    def stream(k):
        try:
            with torch.no_grad():
                for x, h, c in inputs[k]:
                    out, news = cell.step(x, p, {"h": h, "c": c})
                    want_h, want_c = ref(x, (h, c))
                    worst[k] = max(worst[k], (news["h"] - want_h).abs().max().item(),
                                   (news["c"] - want_c).abs().max().item())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert max(worst) < 1e-12, worst


def test_gradients_flow_through_a_step():
    torch.manual_seed(3)
    cell = cellc.compile(LSTM)
    ref, params, x, h0, c0 = lstm_problem(1, 4, 5, 6)
    cell_ref = torch.nn.LSTMCell(5, 6).double()
    for a, b in ((cell_ref.weight_ih, ref.weight_ih_l0), (cell_ref.weight_hh, ref.weight_hh_l0),
                 (cell_ref.bias_ih, ref.bias_ih_l0), (cell_ref.bias_hh, ref.bias_hh_l0)):
        a.data.copy_(b.data)
    out, st = cell.step(x[0], params, {"h": h0, "c": c0})
    (out.sum() + 2 * st["c"].sum()).backward()
    got = [t.grad.clone() for t in (x, h0, c0, *params.values())]
    for t in (x, h0, c0):
        t.grad = None
    h, c = cell_ref(x[0], (h0, c0))
    (h.sum() + 2 * c.sum()).backward()
    want = [x.grad, h0.grad, c0.grad, cell_ref.weight_ih.grad, cell_ref.weight_hh.grad,
            cell_ref.bias_ih.grad, cell_ref.bias_hh.grad]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("proj_size", [0, 3])
def test_lstm_step_is_its_forward_step_by_step(proj_size):
    torch.manual_seed(4)
    m = cellc.nn.LSTM(5, 7, num_layers=2, proj_size=proj_size).double()
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    hx = (torch.randn(2, 3, proj_size or 7, dtype=torch.float64),
          torch.randn(2, 3, 7, dtype=torch.float64))
    with torch.no_grad():
        out, (h, c) = m(x, hx)
        state = hx
        for t in range(4):
            o, state = m.step(x[t], state)
            torch.testing.assert_close(o, out[t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state[0], h, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state[1], c, rtol=1e-12, atol=1e-12)
        # Unbatched: [n] and [L, n].
        o, (h1, c1) = m.step(x[0, 0], (hx[0][:, 0], hx[1][:, 0]))
        torch.testing.assert_close(o, out[0, 0], rtol=1e-12, atol=1e-12)
        assert h1.shape == (2, proj_size or 7) and c1.shape == (2, 7)


@pytest.mark.parametrize("proj_size", [0, 3])
def test_a_one_layer_modules_step_is_its_forward_with_any_states(proj_size):
    """One layer's step runs the kernel straight on the [1, B, n] states:
    contiguous ones, none, transposed ones (the general path) and states of
    another dtype (an error, as there) must all give forward's answers."""
    torch.manual_seed(7)
    m = cellc.nn.LSTM(5, 7, proj_size=proj_size).double()
    x = torch.randn(3, 16, 5, dtype=torch.float64)
    H = proj_size or 7
    hx = (torch.randn(1, 16, H, dtype=torch.float64), torch.randn(1, 16, 7, dtype=torch.float64))
    with torch.no_grad():
        out, (h, c) = m(x, hx)
        out0, (h0, c0) = m(x, None)
        state = hx
        for t in range(3):
            o, new = m.step(x[t], state)
            assert new[0].shape == (1, 16, H) and new[1].shape == (1, 16, 7)
            assert all(n is not s for n, s in zip(new, state))
            torch.testing.assert_close(o, out[t], rtol=1e-12, atol=1e-12)
            state = new
        torch.testing.assert_close(state[0], h, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state[1], c, rtol=1e-12, atol=1e-12)
        # The states it started from are as they were.
        torch.testing.assert_close(hx[0], hx[0].clone())
        o, (h1, c1) = m.step(x[0], None)
        torch.testing.assert_close(o, out0[0], rtol=1e-12, atol=1e-12)
        # Not contiguous: [1, B, n] views of [1, n, B] tensors.
        odd = tuple(s.transpose(1, 2).contiguous().transpose(1, 2) for s in hx)
        assert not odd[0].is_contiguous()
        o, (h2, c2) = m.step(x[0], odd)
        torch.testing.assert_close(o, out[0], rtol=1e-12, atol=1e-12)
        with pytest.raises(TypeError, match="one dtype"):
            m.step(x[0], (hx[0].float(), hx[1]))
    # States that want gradients, with the weights frozen: the gradient
    # reaches them as through forward.
    for p in m.parameters():
        p.requires_grad_(False)
    h0, c0 = (s.clone().requires_grad_() for s in hx)
    o, _ = m.step(x[0], (h0, c0))
    o.sum().backward()
    h1, c1 = (s.clone().requires_grad_() for s in hx)
    out, _ = m(x[:1], (h1, c1))
    out[0].sum().backward()
    torch.testing.assert_close(h0.grad, h1.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c0.grad, c1.grad, rtol=1e-12, atol=1e-12)


def test_a_modules_stream_follows_its_parameters():
    """A one-layer module's steps take a short path once bound, reading its
    parameters at each step: values loaded in place, a parameter replaced,
    another dtype and weight_norm's computed weight are all seen."""
    torch.manual_seed(8)
    m = cellc.nn.LSTM(5, 7).double()
    ref = torch.nn.LSTM(5, 7).double()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(16, 5, dtype=torch.float64)
    hx = (torch.randn(1, 16, 7, dtype=torch.float64), torch.randn(1, 16, 7, dtype=torch.float64))

    def step_is_torchs(module, x, hx):
        o, new = m.step(x, hx)
        ro, want = module(x[None], hx)
        # float64 to 1e-12; float32 to assert_close's own tolerances.
        tol = {"rtol": 1e-12, "atol": 1e-12} if x.dtype == torch.float64 else {}
        torch.testing.assert_close(o, ro[0], **tol)
        for got, w in zip(new, want):
            torch.testing.assert_close(got, w, **tol)
        return new

    with torch.no_grad():
        for _ in range(3):
            hx = step_is_torchs(ref, x, hx)
        stream = m._stream
        assert stream is not None
        m._direct_step = lambda *a: pytest.fail("a bound stream's step took the checked path")
        hx = step_is_torchs(ref, x, hx)
        del m._direct_step
        # Values loaded in place (as load_state_dict and optimizers write).
        other = torch.nn.LSTM(5, 7).double()
        m.load_state_dict(other.state_dict())
        hx = step_is_torchs(other, x, hx)
        # A parameter replaced by another tensor.
        m.weight_hh_l0 = torch.nn.Parameter(torch.randn(28, 7, dtype=torch.float64))
        other.weight_hh_l0.copy_(m.weight_hh_l0)
        hx = step_is_torchs(other, x, hx)
    # Another dtype: the checked path, then a stream of its own.
    m, other = m.float(), other.float()
    x, hx = x.float(), tuple(h.float() for h in hx)
    with torch.no_grad():
        for _ in range(3):
            hx = step_is_torchs(other, x, hx)
        assert m._stream is not stream
    # weight_norm computes weight_ih_l0 from two parameters of its own.
    m = torch.nn.utils.weight_norm(m, "weight_ih_l0")
    other = torch.nn.utils.weight_norm(other, "weight_ih_l0")
    other.load_state_dict(m.state_dict())
    with torch.no_grad():
        m.weight_ih_l0_g.mul_(0.5)
        other.weight_ih_l0_g.mul_(0.5)
        m(x[None], hx)  # weight_norm's hook computes the weight on a forward
        for _ in range(3):
            hx = step_is_torchs(other, x, hx)


def test_gru_and_recurrent_steps_are_their_forwards_step_by_step():
    torch.manual_seed(5)
    g = cellc.nn.GRU(5, 7, num_layers=2).double()
    r = cellc.nn.Recurrent(os.path.join(ROOT, "examples", "elman.cell"), num_layers=2,
                           dtype=torch.float64, **{s: 6 for s in
                                                   example("elman").size_symbols})
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    xr = torch.randn(3, 2, 6, dtype=torch.float64)
    with torch.no_grad():
        out, h = g(x)
        rout, rfinal = r(xr)
        hx, states = None, None
        for t in range(3):
            o, hx = g.step(x[t], hx)
            ro, states = r.step(xr[t], states)
            torch.testing.assert_close(o, out[t], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(ro, rout[t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(hx, h, rtol=1e-12, atol=1e-12)
        for got, want in zip(states, rfinal):
            for n in want:
                torch.testing.assert_close(got[n], want[n], rtol=1e-12, atol=1e-12)


def test_module_steps_train():
    # Under autograd the modules' steps are one-step sequences: the gradient
    # of a two-step unroll matches forward's.
    torch.manual_seed(6)
    m = cellc.nn.LSTM(3, 4).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    out, _ = m(x)
    out.pow(2).sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    hx, total = None, 0
    for t in range(2):
        o, hx = m.step(x[t], hx)
        total = total + o.pow(2).sum()
    total.backward()
    for p, w in zip(m.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-10, atol=1e-12)


def test_a_streams_short_path_leaves_whatever_differs_to_the_checked_one():
    """From its second step, a stream takes a short path that checks each
    tensor against the last call's. Whatever differs (a shape, a dtype, a
    layout, a name, a tensor that wants gradients) takes the checked path:
    the same errors, and results that are still torch's."""
    torch.manual_seed(5)
    cell = cellc.compile(LSTM)
    p = {"W_ih": torch.randn(16, 3), "W_hh": torch.randn(16, 4), "b_ih": torch.randn(16),
         "b_hh": torch.randn(16)}
    x = torch.randn(2, 3)
    st = {"h": torch.randn(2, 4), "c": torch.randn(2, 4)}

    def step_is_torchs(x, p, st):
        out, new = cell.step(x, p, st)
        h, c = (st.get(n, torch.zeros(x.shape[0], 4, dtype=x.dtype)) for n in ("h", "c"))
        rh, rc = torch.lstm_cell(x, (h, c), p["W_ih"], p["W_hh"], p["b_ih"], p["b_hh"])
        torch.testing.assert_close(out, rh)
        torch.testing.assert_close(new["h"], rh)
        torch.testing.assert_close(new["c"], rc)
        return out, new

    with torch.no_grad():
        for _ in range(3):
            _, st = step_is_torchs(x, p, st)
        stream = cell._streams[0]
        # The stream's steps do not go through the checked path.
        checked = cell._step_plan
        calls = []
        cell._step_plan = lambda *a: calls.append(a) or checked(*a)
        for _ in range(2):
            _, st = step_is_torchs(x, p, st)
        assert not calls and cell._streams[0] is stream
        del cell._step_plan
        errors = [
            ((torch.randn(3, 3), p, st), ValueError,
             r"state 'h' must be \[B, n\] with B=3, got \[2, 4\]"),
            ((x, dict(p, W_hh=torch.randn(16, 5)), st), ValueError,
             r"param 'W_hh' is declared \[4\*H, H\]"),
            ((x, {n: t for n, t in p.items() if n != "b_hh"}, st), ValueError,
             "no tensor for param 'b_hh'"),
            ((x, dict(p, bias=torch.randn(16)), st), ValueError,
             "'bias' is not a param of this cell"),
            ((x.double(), p, st), TypeError, "all tensors must have one dtype"),
            ((x, p, dict(st, z=torch.randn(2, 4))), ValueError,
             "'z' is not a state of this cell"),
            (([1, 2], p, st), TypeError, "expected tensors, got list"),
            ((x, list(p.values()), st), TypeError, "params must be a dict"),
            ((x, p, {"h": st["h"], "c": torch.randn(2, 5)}), ValueError,
             r"state 'c' is declared \[H\]"),
        ]
        for args, error, message in errors:
            with pytest.raises(error, match=message):
                cell.step(*args)
            _, st = step_is_torchs(x, p, st)  # and the stream goes on
        # Other layouts and names run, through the checked path.
        step_is_torchs(torch.randn(3, 2).t(), p, st)
        step_is_torchs(x, p, {"h": st["h"]})
        step_is_torchs(x, p, {"h": st["h"], "c": st["c"].t().contiguous().t()})
        xd, pd, sd = x.double(), {n: t.double() for n, t in p.items()}, \
            {n: t.double() for n, t in st.items()}
        for _ in range(3):
            _, sd = step_is_torchs(xd, pd, sd)
        assert cell._streams[:2] == [cell._streams[0], stream]  # the float64 stream's, first
        _, st = step_is_torchs(x, p, st)
    # Where gradients are wanted, they flow, though the shapes are a bound
    # stream's.
    _, st = step_is_torchs(x, p, st)
    w = p["W_hh"].clone().requires_grad_()
    out, new = cell.step(x, dict(p, W_hh=w), st)
    (out.sum() + new["c"].sum()).backward()
    w_ref = p["W_hh"].clone().requires_grad_()
    rh, rc = torch.lstm_cell(x, (st["h"], st["c"]), p["W_ih"], w_ref, p["b_ih"], p["b_hh"])
    (rh.sum() + rc.sum()).backward()
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_steps_that_alternate_between_sizes_each_keep_their_short_path():
    # Two layers of other sizes stepping in turn (as a module's layers do)
    # each take their own short path, with no checked step once bound.
    torch.manual_seed(9)
    cell = cellc.compile(LSTM)
    layers = [({"W_ih": torch.randn(16, I), "W_hh": torch.randn(16, 4),
                "b_ih": torch.randn(16), "b_hh": torch.randn(16)}, I) for I in (3, 4)]
    st = [{"h": torch.randn(2, 4), "c": torch.randn(2, 4)} for _ in layers]
    checked = cell._step_plan
    calls = []
    with torch.no_grad():
        for step in range(5):
            if step == 2:
                cell._step_plan = lambda *a: calls.append(a) or checked(*a)
            for k, (p, I) in enumerate(layers):
                x = torch.randn(2, I)
                h, c = st[k]["h"], st[k]["c"]
                out, st[k] = cell.step(x, p, st[k])
                rh, rc = torch.lstm_cell(x, (h, c), p["W_ih"], p["W_hh"], p["b_ih"], p["b_hh"])
                torch.testing.assert_close(out, rh)
                torch.testing.assert_close(st[k]["c"], rc)
    assert not calls and len(cell._streams) == 2
    del cell._step_plan


def test_bad_tensors_are_errors_that_say_what_is_wrong():
    cell = cellc.compile(LSTM)
    p = {"W_ih": torch.randn(16, 3), "W_hh": torch.randn(16, 4), "b_ih": torch.randn(16),
         "b_hh": torch.randn(16)}
    x = torch.randn(2, 3)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"a step's input 'x' must be \[B, n\], got shape \[3\]"):
            cell.step(torch.randn(3), p)
        with pytest.raises(ValueError, match=r"input 'x' must be \[B, n\], got shape \[2, 2, 3\]"):
            cell.step(torch.randn(2, 2, 3), p)
        with pytest.raises(ValueError, match=r"state 'h' must be \[B, n\] with B=2, got \[3, 4\]"):
            cell.step(x, p, {"h": torch.randn(3, 4)})
        with pytest.raises(ValueError, match=r"param 'W_hh' is declared \[4\*H, H\]"):
            cell.step(x, dict(p, W_hh=torch.randn(16, 5)))
        with pytest.raises(ValueError, match="no tensor for param 'b_hh'"):
            cell.step(x, {n: t for n, t in p.items() if n != "b_hh"})
        with pytest.raises(ValueError, match="'bias' is not a param of this cell"):
            cell.step(x, dict(p, bias=torch.randn(16)))
        with pytest.raises(TypeError, match="all tensors must have one dtype"):
            cell.step(x.double(), p)
        with pytest.raises(TypeError, match="float32 and float64"):
            cell.step(x.int(), {n: t.int() for n, t in p.items()})
        with pytest.raises(TypeError, match="expected tensors, got list"):
            cell.step([1, 2], p)
        with pytest.raises(TypeError, match="params must be a dict"):
            cell.step(x, [p["W_ih"]])
        with pytest.raises(ValueError, match="'z' is not a state of this cell"):
            cell.step(x, p, {"z": torch.randn(2, 4)})
        # After the errors, the same cell steps, from a transposed (not
        # contiguous) input too.
        out, _ = cell.step(torch.randn(3, 2).t(), p)
        assert out.shape == (2, 4) and torch.isfinite(out).all()
    m = cellc.nn.LSTM(3, 4, bidirectional=True)
    with pytest.raises(ValueError, match="a bidirectional module has no step"):
        m.step(x)
    m = cellc.nn.LSTM(3, 4, num_layers=2)
    with pytest.raises(ValueError, match=r"expected initial state 'h' of shape \[2, 2, 4\]"):
        m.step(x, (torch.randn(1, 2, 4), torch.randn(2, 2, 4)))
    with pytest.raises(ValueError, match=r"expected input of 1 \(unbatched\) or 2 \(batched: \[B, n\]\) dimensions"):
        m.step(torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match="hx must be a tuple"):
        m.step(x, torch.randn(2, 2, 4))


def test_a_one_step_call_under_no_grad_is_a_step():
    # An RL actor calls its module one step at a time, `lstm(x_t[None], hx)`,
    # as torchrl's modules do: under no_grad that call takes the step
    # kernels (a step plan is made, and from the second call the module's
    # short path), and gives torch's results. With gradients wanted it stays
    # a one-step sequence, with a graph.
    torch.manual_seed(8)
    ref = torch.nn.LSTM(5, 7).double()
    for batch_first in (False, True):
        m = cellc.nn.LSTM(5, 7, batch_first=batch_first).double()
        m.load_state_dict(ref.state_dict())
        hx = (torch.randn(1, 3, 7, dtype=torch.float64), torch.randn(1, 3, 7, dtype=torch.float64))
        for t in range(3):
            x = torch.randn(1, 3, 5, dtype=torch.float64)
            with torch.no_grad():
                want, (h, c) = ref(x, hx)
                out, (h1, c1) = m(x.transpose(0, 1) if batch_first else x, hx)
            if batch_first:
                out = out.transpose(0, 1)
            assert out.shape == (1, 3, 7) and out.grad_fn is None
            torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(h1, h, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(c1, c, rtol=1e-12, atol=1e-12)
            hx = (h1, c1)
        # From the second call, the module's short path of one-step calls.
        assert m.cell._step_plans and m._stream_of_calls is not None
        # Unbatched: [1, n] and [L, n].
        with torch.no_grad():
            want, (h, c) = ref(x[:, 0], (hx[0][:, 0], hx[1][:, 0]))
            out, (h1, c1) = m(x[:, 0], (hx[0][:, 0], hx[1][:, 0]))
        assert out.shape == (1, 7) and h1.shape == (1, 7)
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c1, c, rtol=1e-12, atol=1e-12)
    # Gradients wanted: the sequence, whose gradients are torch's.
    plans = len(m.cell._step_plans)
    x = torch.randn(3, 1, 5, dtype=torch.float64, requires_grad=True)
    out, _ = m(x, hx)
    assert out.grad_fn is not None and len(m.cell._step_plans) == plans
    out.sum().backward()
    xr = x.detach().transpose(0, 1).requires_grad_()
    want, _ = ref(xr, hx)
    want.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad.transpose(0, 1), rtol=1e-12, atol=1e-12)


def test_a_cells_one_step_call_under_no_grad_is_a_step():
    torch.manual_seed(9)
    cell = cellc.compile(LSTM)
    ref = torch.nn.LSTMCell(6, 8).double()
    params = {"W_ih": ref.weight_ih, "W_hh": ref.weight_hh, "b_ih": ref.bias_ih,
              "b_hh": ref.bias_hh}
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    h0, c0 = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    with torch.no_grad():
        h, c = ref(x[0], (h0, c0))
        out, st = cell(x, params, {"h": h0, "c": c0})
        assert cell._step_plans  # it took the step
        torch.testing.assert_close(out, h[None], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(st["c"], c, rtol=1e-12, atol=1e-12)
        out, st = cell(x.transpose(0, 1), params, {"h": h0, "c": c0}, batch_first=True)
        torch.testing.assert_close(out, h[:, None], rtol=1e-12, atol=1e-12)
        # A mode the runtime does not take is still an error, not ignored.
        with pytest.raises(ValueError, match="recompute must be 'none', 'full' or "
                                             "'chunk:K' with K > 0, not 'chunk:0'"):
            cell(x, params, recompute="chunk:0")
