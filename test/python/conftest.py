"""pytest setup: the cellc package from the build tree (or, with
CELLC_INSTALLED=1, the one pip installed, as make test-torch2 runs it), and
kernels cached inside the build tree."""

import os
import sys

BUILD = os.environ.get("CELLC_BUILD_DIR",
                       os.path.join(os.path.dirname(__file__), "..", "..", "build"))
if os.environ.get("CELLC_INSTALLED") == "1":
    # The tools pip installed beside the interpreter.
    TOOLS = os.path.dirname(sys.executable)
else:
    sys.path.insert(0, os.path.join(os.path.abspath(BUILD), "python"))
    TOOLS = os.path.join(os.path.abspath(BUILD), "bin")
os.environ.setdefault("CELLC_CACHE_DIR", os.path.join(os.path.abspath(BUILD), "test",
                                                      "kernel-cache"))


def lstm_problem(T, B, I, H):
    """A float64 torch.nn.LSTM with its weights named as examples/lstm.cell
    names them, and random inputs and initial states that want gradients."""
    import torch
    ref = torch.nn.LSTM(I, H).double()
    params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
              "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}
    x, h0, c0 = (torch.randn(*shape, dtype=torch.float64, requires_grad=True)
                 for shape in ((T, B, I), (B, H), (B, H)))
    return ref, params, x, h0, c0


def assert_sequence_matches(out, final, want_out, want_final, leaves, names, tol=1e-12):
    """A cell's outputs and final state against a reference's, and the
    gradients of one random linear loss on both with respect to `leaves`
    (named `names`): the reference's to `tol`, the gradients' to 100 tol."""
    import torch
    torch.testing.assert_close(out, want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(final, want_final, rtol=tol, atol=tol)
    g_out, g_final = torch.randn_like(want_out), torch.randn_like(want_final)
    got = torch.autograd.grad((out * g_out).sum() + (final * g_final).sum(), leaves)
    want = torch.autograd.grad((want_out * g_out).sum() + (want_final * g_final).sum(), leaves)
    for n, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=100 * tol, atol=100 * tol, msg=f"d{n}")
