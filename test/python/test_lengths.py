"""Per-sample lengths (`cell(..., lengths=...)`): sample b runs steps
0 .. lengths[b] - 1, its outputs after them are zero, its final state is its
state after its own last step (the initial state for a length of 0), and
every gradient follows. Checked against torch.nn.LSTM looping each sample to
its own length in float64, and by gradcheck on custom cells."""

import os

import pytest
import torch

import cellc
from conftest import lstm_problem
from test_functional import CUSTOM, gradcheck_cell

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
with open(os.path.join(EXAMPLES, "lstm.cell")) as f:
    LSTM = f.read()
MODES = ["none", "full", "chunk:2", "chunk:3", "chunk:100"]


def _reference(ref, x, h0, c0, resets, lengths):
    """torch.nn.LSTM one step at a time, each sample to its own length, with
    the resets restoring (h0, c0)."""
    T, B, _ = x.shape
    outs, hs, cs = [], [], []
    for b in range(B):
        h, c = h0[None, b:b + 1], c0[None, b:b + 1]
        steps = []
        for t in range(lengths[b]):
            if resets[t, b]:
                h, c = h0[None, b:b + 1], c0[None, b:b + 1]
            o, (h, c) = ref(x[t:t + 1, b:b + 1], (h, c))
            steps.append(o[0, 0])
        pad = [x.new_zeros(h0.shape[1])] * (T - lengths[b])
        outs.append(torch.stack(steps + pad))
        hs.append(h[0, 0])
        cs.append(c[0, 0])
    return torch.stack(outs, 1), torch.stack(hs), torch.stack(cs)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("order", ["unsorted", "longest first"])
def test_lstm_with_lengths_matches_torch_per_sample(mode, batch_first, order):
    # Sorted longest first, the driver runs only the rows of samples that have
    # not ended (SequenceDriver::rowsRunning).
    torch.manual_seed(0)
    T, B, I, H = 7, 6, 3, 4
    lengths = [7, 1, 0, 4, 3, 7] if order == "unsorted" else [7, 7, 4, 3, 1, 0]
    ref, params, x, h0, c0 = lstm_problem(T, B, I, H)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[2, 0] = resets[5, 3] = resets[3, 4] = True  # the last is past sample 4's end
    g_out, g_h, g_c = (torch.randn(T, B, H, dtype=torch.float64),
                       torch.randn(B, H, dtype=torch.float64),
                       torch.randn(B, H, dtype=torch.float64))
    leaves = [x, h0, c0] + list(params.values())

    cell = cellc.compile(LSTM)
    xs = x.transpose(0, 1) if batch_first else x
    rs = resets.t() if batch_first else resets
    out, final = cell(xs, params, {"h": h0, "c": c0}, resets=rs, recompute=mode,
                      batch_first=batch_first, lengths=torch.tensor(lengths))
    out = out.transpose(0, 1) if batch_first else out
    loss = (out * g_out).sum() + (final["h"] * g_h).sum() + (final["c"] * g_c).sum()
    got = [out, final["h"], final["c"]] + list(torch.autograd.grad(loss, leaves))

    want_out, want_h, want_c = _reference(ref, x, h0, c0, resets, lengths)
    loss = (want_out * g_out).sum() + (want_h * g_h).sum() + (want_c * g_c).sum()
    want = [want_out, want_h, want_c] + list(torch.autograd.grad(loss, leaves))
    names = ["out", "h_T", "c_T", "dx", "dh0", "dc0", "dW_ih", "dW_hh", "db_ih", "db_hh"]
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # Past its length a sample's outputs are zero, and so is its input's gradient.
    for b, n in enumerate(lengths):
        assert not out[n:, b].any() and not got[3][n:, b].any()


@pytest.mark.parametrize("name", list(CUSTOM))
@pytest.mark.parametrize("mode", ["none", "full", "chunk:2"])
@pytest.mark.parametrize("order", ["unsorted", "longest first"])
def test_custom_cells_with_lengths_pass_gradcheck(name, mode, order):
    source, sizes = CUSTOM[name]
    cell = cellc.compile(source)
    T, B = 5, 4
    lengths = torch.tensor([5, 2, 0, 3] if order == "unsorted" else [5, 3, 2, 0])
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[1, 1] = resets[2, 0] = True
    params, inputs, states = gradcheck_cell(cell, sizes, T, B, mode, resets, lengths,
                                            seed=9)
    # A sample of length 0 ends where it starts.
    _, final = cell(next(iter(inputs.values())) if len(inputs) == 1 else inputs,
                    params, states, lengths=lengths)
    empty = lengths.tolist().index(0)
    for n, t in final.items():
        torch.testing.assert_close(t[empty], states[n][empty], atol=0, rtol=0)


def test_full_lengths_equal_no_lengths():
    torch.manual_seed(1)
    cell = cellc.compile(LSTM)
    T, B, I, H = 6, 3, 2, 5
    params = {"W_ih": torch.randn(4 * H, I), "W_hh": torch.randn(4 * H, H),
              "b_ih": torch.randn(4 * H), "b_hh": torch.randn(4 * H)}
    x = torch.randn(T, B, I)
    a, fa = cell(x, params)
    b, fb = cell(x, params, lengths=[T] * B)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(fa["c"], fb["c"], atol=0, rtol=0)


def test_bad_lengths_are_clear_errors():
    cell = cellc.compile(LSTM)
    T, B, I, H = 4, 3, 2, 5
    params = {"W_ih": torch.randn(4 * H, I), "W_hh": torch.randn(4 * H, H),
              "b_ih": torch.randn(4 * H), "b_hh": torch.randn(4 * H)}
    x = torch.randn(T, B, I)
    cases = [
        (torch.tensor([4, 5, 1]), ValueError, r"lengths must be in \[0, T = 4\], got 5"),
        (torch.tensor([4, -1, 1]), ValueError, r"got -1"),
        (torch.tensor([4, 2]), ValueError, "expected 3 lengths"),
        (torch.tensor([[4, 2, 1]]), ValueError, r"lengths must be \[B\]"),
        (torch.tensor([4.0, 2.0, 1.0]), TypeError, "int64 tensor, got torch.float32"),
        (torch.tensor([4, 2, 1], dtype=torch.int32), TypeError, "torch.int32"),
        (torch.empty(3, dtype=torch.int64, device="meta"), ValueError, "on the CPU"),
        ("4, 2, 1", TypeError, "an int64 tensor or a list of ints"),
    ]
    for lengths, error, message in cases:
        with pytest.raises(error, match=message):
            cell(x, params, lengths=lengths)
    # Nothing was lost: the cell still runs.
    out, _ = cell(x, params, lengths=[4, 0, 2])
    assert out.shape == (T, B, H)
