"""bf16 storage is a storage choice, not another model (cuda={"storage":
"bf16"}), in the SIMT emulator.

The state carried from step to step is f32 in every recompute mode and with
or without grad: a launch leaves its states in f32 (the kernels' end_state
arguments) and the next launch starts from them, not from the history,
which is kept in bf16. Only the sequences in memory (inputs, outputs, the
history and gates kept for the backward) are bf16. So a forward's outputs
and final states are bitwise the same whichever mode runs it, and whether or
not it keeps anything.
"""

import os

import pytest
import torch

import cellc

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
CELLS = sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".cell"))
SIZES = {"I": 5, "H": 16, "NH": 2, "D": 16, "G": 2, "P": 16, "K": 8, "V": 16, "N": 16}


def forwards(cell, inputs, params, states, lengths=None):
    """The outputs and final states of `cell`'s forward without grad, and with
    grad in each recompute mode (chunks of 2 and 3 steps: the state crosses
    launches)."""
    runs = {}
    with torch.no_grad():
        runs["no grad"] = cell(inputs, params, states, lengths=lengths)
    for mode in ("none", "full", "chunk:2", "chunk:3"):
        leaves = {n: t.clone().requires_grad_() for n, t in params.items()}
        runs[mode] = cell(inputs, leaves, states, recompute=mode, lengths=lengths)
    flat = {}
    for run, (out, final) in runs.items():
        out = out if isinstance(out, dict) else {"out": out}
        flat[run] = {**{"out " + n: t.detach() for n, t in out.items()},
                     **{"final " + n: t.detach() for n, t in final.items()}}
    return flat


def problem(cell, T, B, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    params = {n: 0.4 * torch.randn(*cell.shape(n, SIZES), generator=g)
              for n, _ in cell.params}
    if "gamma" in params and len(cell.states[0][1]) == 3:
        params["gamma"] = 0.45 + 0.5 * torch.rand(*params["gamma"].shape, generator=g)
    inputs = {n: torch.randn(T, B, cell.shape(n, SIZES)[0], generator=g).to(dtype)
              for n, _ in cell.inputs}
    states = {n: 0.5 * torch.rand(B, *cell.shape(n, SIZES), generator=g)
              for n, _ in cell.states}
    return (inputs if len(inputs) > 1 else next(iter(inputs.values()))), params, states


@pytest.mark.parametrize("storage", ["f32", "bf16"])
@pytest.mark.parametrize("name", CELLS)
def test_the_forward_is_bitwise_the_same_in_every_mode_with_or_without_grad(name, storage):
    source = os.path.join(EXAMPLES, name + ".cell")
    cell = cellc.compile(source, target="cuda-emu", cuda={"storage": storage})
    dtype = torch.bfloat16 if storage == "bf16" else torch.float32
    inputs, params, states = problem(cell, 7, 3, dtype, seed=len(name))
    runs = forwards(cell, inputs, params, states)
    want = runs.pop("no grad")
    for mode, got in runs.items():
        for what, t in want.items():
            assert torch.equal(got[what], t), (
                f"{mode}: {what} differs from the forward without grad by "
                f"{(got[what].double() - t.double()).abs().max().item():.2e}")


def test_rows_that_end_early_carry_their_states_in_f32_too():
    # Sorted lengths: the rows that run drop out in groups of 16, so each
    # chunk runs in pieces, each starting from where the last left its
    # states (in f32).
    cell = cellc.compile(os.path.join(EXAMPLES, "gru.cell"), target="cuda-emu",
                         cuda={"storage": "bf16"})
    inputs, params, states = problem(cell, 9, 40, torch.bfloat16, seed=4)
    lengths = sorted([9] * 10 + [6] * 14 + [3] * 10 + [1] * 6, reverse=True)
    runs = forwards(cell, inputs, params, states, lengths=lengths)
    want = runs.pop("no grad")
    for mode, got in runs.items():
        for what, t in want.items():
            assert torch.equal(got[what], t), f"{mode}: {what}"


#: A state that creeps up by less than half a bf16 step at 1.0 (2^-8) each
#: step: rounded to bf16 between launches, it would never move.
CREEP = """
cell creep {
  input x: [I]
  state h: [H]
  param W: [H, I]
  h = h + 0.0001 + 0 * (W @ x)
}
"""


@pytest.mark.parametrize("mode", ["no grad", "none", "full", "chunk:10"])
def test_a_creeping_state_is_not_rounded_away(mode):
    cell = cellc.compile(CREEP, target="cuda-emu", cuda={"storage": "bf16"})
    T, B, I, H = 100, 2, 4, 8
    x = torch.randn(T, B, I).to(torch.bfloat16)
    W = torch.randn(H, I, requires_grad=mode != "no grad")
    h0 = {"h": torch.ones(B, H)}
    if mode == "no grad":
        with torch.no_grad():
            out, final = cell(x, {"W": W}, h0)
    else:
        out, final = cell(x, {"W": W}, h0, recompute=mode)
    exact = 1.0 + T * 0.0001
    # The final state is f32, within f32's rounding of 100 additions; the
    # last output is that, rounded to bf16 (2^-7 apart near 1).
    assert abs(final["h"].float() - exact).max().item() < 1e-5
    assert abs(out[-1].float() - exact).max().item() <= 2 ** -8
    assert out[-1].float().min().item() > 1.0
