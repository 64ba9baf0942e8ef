"""cellc.nn.LSTM and GRU against torch.nn.LSTM and GRU with the same weights:
outputs, final states and every gradient."""

import pytest
import torch

import cellc


def _compare(ref, mine, x, hx, atol=2e-5):
    mine.load_state_dict(ref.state_dict())
    xr = x.clone().requires_grad_()
    xm = x.clone().requires_grad_()
    hr = None if hx is None else tuple(h.clone().requires_grad_() for h in hx)
    hm = None if hx is None else tuple(h.clone().requires_grad_() for h in hx)
    if isinstance(ref, torch.nn.GRU):
        out_r, fin_r = ref(xr, None if hr is None else hr[0])
        out_m, fin_m = mine(xm, None if hm is None else hm[0])
        fin_r, fin_m = (fin_r,), (fin_m,)
    else:
        out_r, fin_r = ref(xr, hr)
        out_m, fin_m = mine(xm, hm)
    torch.testing.assert_close(out_m, out_r, atol=atol, rtol=1e-5)
    for a, b in zip(fin_m, fin_r):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)
    # A loss on everything, with random weights.
    g = torch.Generator().manual_seed(3)
    w_out = torch.randn(out_r.shape, generator=g)
    w_fin = [torch.randn(f.shape, generator=g) for f in fin_r]
    loss_r = (out_r * w_out).sum() + sum((f * w).sum() for f, w in zip(fin_r, w_fin))
    loss_m = (out_m * w_out).sum() + sum((f * w).sum() for f, w in zip(fin_m, w_fin))
    wrt_r = [xr] + list(ref.parameters()) + (list(hr) if hr else [])
    wrt_m = [xm] + list(mine.parameters()) + (list(hm) if hm else [])
    for gm, gr in zip(torch.autograd.grad(loss_m, wrt_m), torch.autograd.grad(loss_r, wrt_r)):
        torch.testing.assert_close(gm, gr, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_matches_torch(num_layers, batch_first, with_state, bidirectional):
    torch.manual_seed(0)
    T, B, I, H = 6, 4, 5, 7
    ref = torch.nn.LSTM(I, H, num_layers=num_layers, batch_first=batch_first,
                        bidirectional=bidirectional)
    mine = cellc.nn.LSTM(I, H, num_layers=num_layers, batch_first=batch_first,
                         bidirectional=bidirectional)
    x = torch.randn(B, T, I) if batch_first else torch.randn(T, B, I)
    D = 2 if bidirectional else 1
    hx = (torch.randn(num_layers * D, B, H), torch.randn(num_layers * D, B, H)) \
        if with_state else None
    _compare(ref, mine, x, hx)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gru_matches_torch(num_layers, bidirectional):
    torch.manual_seed(1)
    T, B, I, H = 5, 3, 4, 6
    ref = torch.nn.GRU(I, H, num_layers=num_layers, bidirectional=bidirectional)
    mine = cellc.nn.GRU(I, H, num_layers=num_layers, bidirectional=bidirectional)
    D = 2 if bidirectional else 1
    _compare(ref, mine, torch.randn(T, B, I), (torch.randn(num_layers * D, B, H),))


def test_a_trained_state_dict_loads_and_agrees():
    torch.manual_seed(2)
    ref = torch.nn.LSTM(3, 8)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        out, _ = ref(torch.randn(4, 2, 3))
        out.pow(2).mean().backward()
        opt.step()
    mine = cellc.nn.LSTM(3, 8)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(7, 5, 3)
    torch.testing.assert_close(mine(x)[0], ref(x)[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", [cellc.nn.LSTM, cellc.nn.GRU])
def test_resets_split_episodes_in_both_directions(cls):
    torch.manual_seed(4)
    rnn = cls(3, 5, num_layers=2, bidirectional=True)
    x = torch.randn(8, 2, 3)
    resets = torch.zeros(8, 2, dtype=torch.bool)
    resets[5] = True
    whole, _ = rnn(x, resets=resets)
    first, _ = rnn(x[:5])
    second, _ = rnn(x[5:])
    torch.testing.assert_close(whole, torch.cat([first, second]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_with_proj_size_matches_torch(num_layers, bidirectional, with_state):
    torch.manual_seed(5)
    T, B, I, H, P = 5, 3, 4, 6, 3
    ref = torch.nn.LSTM(I, H, num_layers=num_layers, bidirectional=bidirectional,
                        proj_size=P)
    mine = cellc.nn.LSTM(I, H, num_layers=num_layers, bidirectional=bidirectional,
                         proj_size=P)
    assert list(mine.state_dict()) == list(ref.state_dict())
    D = 2 if bidirectional else 1
    hx = (torch.randn(num_layers * D, B, P), torch.randn(num_layers * D, B, H)) \
        if with_state else None
    _compare(ref, mine, torch.randn(T, B, I), hx)


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
@pytest.mark.parametrize("with_state", [False, True])
def test_unbatched_input_matches_torch(cls, with_state):
    torch.manual_seed(6)
    T, I, H = 5, 3, 4
    ref = getattr(torch.nn, cls)(I, H, num_layers=2, batch_first=True)
    mine = getattr(cellc.nn, cls)(I, H, num_layers=2, batch_first=True)
    n_states = 2 if cls == "LSTM" else 1
    hx = tuple(torch.randn(2, H) for _ in range(n_states)) if with_state else None
    _compare(ref, mine, torch.randn(T, I), hx)


@pytest.mark.parametrize("cls,kwargs", [
    ("LSTM", {}), ("LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 2}),
    ("GRU", {"num_layers": 3, "bias": False, "batch_first": True, "dropout": 0.25})])
def test_what_code_written_for_torchs_modules_uses_is_there(cls, kwargs):
    # Code that swaps torch.nn.LSTM for cellc's calls flatten_parameters()
    # (DataParallel users do, before each forward), walks all_weights to
    # initialise, and prints the model.
    ref = getattr(torch.nn, cls)(3, 5, **kwargs)
    mine = getattr(cellc.nn, cls)(3, 5, **kwargs)
    mine.load_state_dict(ref.state_dict())
    assert repr(mine) == repr(ref)
    assert repr(getattr(cellc.nn, cls)(3, 5, recompute="full")) == \
        f"{cls}(3, 5, recompute='full')"
    assert mine.mode == ref.mode
    assert [[p.shape for p in w] for w in mine.all_weights] == \
        [[p.shape for p in w] for w in ref.all_weights]
    for w, rw in zip(mine.all_weights, ref.all_weights):
        for p, rp in zip(w, rw):
            assert isinstance(p, torch.nn.Parameter) and torch.equal(p, rp)
    mine.flatten_parameters()
    mine.eval(), ref.eval()  # no dropout: the same outputs
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(mine(x)[0], ref(x)[0])


def test_dropout_between_layers_runs_in_training_only():
    torch.manual_seed(7)
    mine = cellc.nn.LSTM(3, 5, num_layers=2, dropout=0.5)
    ref = torch.nn.LSTM(3, 5, num_layers=2, dropout=0.5)
    ref.load_state_dict(mine.state_dict())
    x = torch.randn(4, 2, 3)
    mine.eval(), ref.eval()
    torch.testing.assert_close(mine(x)[0], ref(x)[0], atol=2e-5, rtol=1e-5)
    mine.train()
    a, b = mine(x)[0], mine(x)[0]
    assert not torch.equal(a, b), "dropout between the layers draws a new mask each call"


@pytest.mark.parametrize("cls,kwargs", [
    ("LSTM", {}), ("LSTM", {"batch_first": True}),
    ("LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 2}),
    ("GRU", {"num_layers": 2})])
@pytest.mark.parametrize("with_state", [False, True])
def test_an_empty_batch_matches_torch(cls, kwargs, with_state):
    """B = 0 (a rank's share of a filtered batch, an RL step with no live
    environment): torch returns empty outputs and states and zero gradients
    for the weights, and so must the drop-in. It raised before."""
    torch.manual_seed(9)
    T, I, H = 4, 3, 5
    ref = getattr(torch.nn, cls)(I, H, **kwargs)
    mine = getattr(cellc.nn, cls)(I, H, **kwargs)
    x = torch.randn(0, T, I) if kwargs.get("batch_first") else torch.randn(T, 0, I)
    D = 2 if kwargs.get("bidirectional") else 1
    L = kwargs.get("num_layers", 1) * D
    hx = None
    if with_state:
        hx = (torch.randn(L, 0, kwargs.get("proj_size") or H),) + (
            (torch.randn(L, 0, H),) if cls == "LSTM" else ())
    _compare(ref, mine, x, hx)
    params = [p for p in mine.parameters()]
    loss = mine(x.requires_grad_())[0].sum()
    grads = torch.autograd.grad(loss, [x] + params)
    assert grads[0].shape == x.shape
    for g, p in zip(grads[1:], params):
        assert g.shape == p.shape and not g.any()


def test_a_cell_takes_an_empty_batch_with_resets_lengths_and_steps():
    """A Cell over B = 0 rows: empty outputs and final states, with resets
    and lengths, both layouts, in every recompute mode, and as a step (under
    no_grad and with gradients). T = 0 stays an error, as in torch."""
    torch.manual_seed(10)
    cell = cellc.compile(cellc.nn.LSTM_CELL)
    T, I, H = 3, 4, 6
    p = {"W_ih": torch.randn(4 * H, I, requires_grad=True),
         "W_hh": torch.randn(4 * H, H, requires_grad=True),
         "b_ih": torch.randn(4 * H, requires_grad=True),
         "b_hh": torch.randn(4 * H, requires_grad=True)}
    states = {"h": torch.randn(0, H, requires_grad=True), "c": torch.randn(0, H)}
    for recompute in ("none", "full", "chunk:2"):
        for batch_first in (False, True):
            x = torch.randn(0, T, I) if batch_first else torch.randn(T, 0, I)
            resets = torch.zeros(x.shape[:2], dtype=torch.bool)
            out, final = cell(x, p, states, resets=resets, lengths=torch.zeros(0, dtype=torch.long),
                              recompute=recompute, batch_first=batch_first)
            assert out.shape == (*x.shape[:2], H)
            assert final["h"].shape == final["c"].shape == (0, H)
            grads = torch.autograd.grad(out.sum() + final["c"].sum(),
                                        [states["h"], *p.values()])
            assert grads[0].shape == (0, H)
            assert all(g.shape == t.shape and not g.any() for g, t in zip(grads[1:], p.values()))
    with torch.no_grad():
        out, new = cell.step(torch.randn(0, I), p, {"h": torch.randn(0, H)})
    assert out.shape == new["h"].shape == new["c"].shape == (0, H)
    out, new = cell.step(torch.randn(0, I), p, states)
    assert out.shape == (0, H) and out.requires_grad
    with pytest.raises(ValueError, match=r"the sequence needs T >= 1 steps; input 'x' has "
                                         r"shape \[0, 2, 4\]"):
        cell(torch.randn(0, 2, I), p)
    with pytest.raises(ValueError, match=r"T >= 1 steps; input 'x' has shape \[2, 0, 4\]"):
        cell(torch.randn(2, 0, I), p, batch_first=True)


def test_what_torch_accepts_and_cellc_does_not_is_refused():
    lstm = cellc.nn.LSTM(3, 4)
    x = torch.randn(5, 2, 3)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="with a PackedSequence, resets must be"):
        lstm(packed, resets=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="initial state 'h' of shape \\[1, 2, 4\\]"):
        lstm(packed, (torch.randn(1, 3, 4), torch.randn(1, 3, 4)))
    with pytest.raises(ValueError, match="proj_size"):
        cellc.nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="proj_size"):
        cellc.nn.LSTM(3, 4, proj_size=-1)
    with pytest.raises(ValueError, match="2 \\(unbatched\\) or 3 dimensions"):
        lstm(torch.randn(5, 2, 3, 1))
    with pytest.raises(ValueError, match="initial state 'h' of shape \\[1, 2, 4\\]"):
        lstm(x, (torch.randn(1, 3, 4), torch.randn(1, 3, 4)))
    with pytest.raises(ValueError, match="initial state 'c' of shape \\[1, 2, 4\\]"):
        lstm(x, (torch.randn(1, 2, 4), torch.randn(2, 2, 4)))
    with pytest.raises(ValueError, match="hx must be a tuple"):
        lstm(x, torch.randn(1, 2, 4))


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
@pytest.mark.parametrize("used", ["new", "trained", "stepped"])
def test_modules_round_trip(how, used, tmp_path):
    # A module is copied at any time: a target network is a deepcopy of one
    # that has trained (and compiled, and bound its steps).
    import copy
    torch.manual_seed(8)
    mine = cellc.nn.LSTM(3, 5, num_layers=2, proj_size=2)
    if used == "trained":
        mine(torch.randn(4, 2, 3))[0].sum().backward()
        mine.zero_grad()
    elif used == "stepped":
        with torch.no_grad():
            hx = None
            for _ in range(3):
                _, hx = mine.step(torch.randn(2, 3), hx)
    if how == "deepcopy":
        other = copy.deepcopy(mine)
    else:
        torch.save(mine, tmp_path / "m.pt")
        other = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.randn(4, 2, 3)
    out, _ = mine(x)
    out2, _ = other(x)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)
    out2.sum().backward()
    out.sum().backward()
    for (n, p), q in zip(mine.named_parameters(), other.parameters()):
        assert q.grad is not None, n
        torch.testing.assert_close(q.grad, p.grad, atol=0, rtol=0)
        assert q.data_ptr() != p.data_ptr(), "the copy has its own parameters"


@pytest.mark.parametrize("cls,extra", [("LSTM", {}), ("LSTM", {"proj_size": 2}),
                                       ("GRU", {})])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_packed_sequences_match_torch(cls, extra, enforce_sorted, bidirectional,
                                      with_state):
    torch.manual_seed(9)
    T, B, I, H, L = 6, 4, 3, 5, 2
    lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([3, 6, 1, 4])
    ref = getattr(torch.nn, cls)(I, H, num_layers=L, bidirectional=bidirectional, **extra)
    mine = getattr(cellc.nn, cls)(I, H, num_layers=L, bidirectional=bidirectional, **extra)
    mine.load_state_dict(ref.state_dict())
    D = 2 if bidirectional else 1
    sizes = [extra.get("proj_size", H), H][:2 if cls == "LSTM" else 1]
    x = torch.randn(T, B, I)
    hx = [torch.randn(L * D, B, n) for n in sizes] if with_state else None
    g = torch.Generator().manual_seed(3)

    def run(module):
        xs = x.clone().requires_grad_()
        hs = [h.clone().requires_grad_() for h in hx] if hx else []
        packed = torch.nn.utils.rnn.pack_padded_sequence(xs, lengths,
                                                         enforce_sorted=enforce_sorted)
        state = None if not hs else (tuple(hs) if cls == "LSTM" else hs[0])
        out, fin = module(packed, state)
        fin = fin if isinstance(fin, tuple) else (fin,)
        loss = (out.data * torch.randn(out.data.shape, generator=g.manual_seed(5))).sum()
        loss = loss + sum((f * torch.randn(f.shape, generator=g)).sum() for f in fin)
        grads = torch.autograd.grad(loss, [xs] + hs + list(module.parameters()))
        return out, fin, grads

    out_r, fin_r, grads_r = run(ref)
    out_m, fin_m, grads_m = run(mine)
    assert isinstance(out_m, torch.nn.utils.rnn.PackedSequence)
    assert torch.equal(out_m.batch_sizes, out_r.batch_sizes)
    for a, b in [(out_m.sorted_indices, out_r.sorted_indices),
                 (out_m.unsorted_indices, out_r.unsorted_indices)]:
        assert (a is None and b is None) or torch.equal(a, b)
    torch.testing.assert_close(out_m.data, out_r.data, atol=2e-5, rtol=1e-5)
    for a, b in zip(fin_m, fin_r):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    for a, b in zip(grads_m, grads_r):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_recurrent_takes_packed_sequences_and_lengths():
    torch.manual_seed(10)
    model = cellc.nn.Recurrent(cellc.nn.GRU_CELL, I=3, H=4, num_layers=2)
    x = torch.randn(5, 3, 3)
    lengths = torch.tensor([2, 5, 3])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    out_p, fin_p = model(packed)
    out_l, fin_l = model(x, lengths=lengths)
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(out_p)
    torch.testing.assert_close(padded, out_l, atol=0, rtol=0)
    # Each sample alone, to its own length.
    for b in range(3):
        out_b, fin_b = model(x[:lengths[b], b:b + 1])
        torch.testing.assert_close(out_l[:lengths[b], b], out_b[:, 0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fin_l[1]["h"][b], fin_b[1]["h"][0], atol=1e-6, rtol=1e-6)
    assert not out_l[2:, 0].any()
    with pytest.raises(ValueError, match="carries its own lengths"):
        model(packed, lengths=lengths)
