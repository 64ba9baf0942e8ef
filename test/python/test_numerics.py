"""The transcendentals' error. Both backends lower tanh, exp, log (and with
them sigmoid, softplus and logsigmoid) to MLIR's polynomial approximations, not to
libdevice or libm; their error is measured here in f32 on the CPU, against
float64 torch, over ranges that cover saturation. docs/language.md quotes
these bounds."""

import math

import pytest
import torch

import cellc

ULP = 2.0 ** -23
T, B, H = 20, 25, 100

# (function, range, bound in units of the last place of f32, relative)
CASES = [("tanh", (-10, 10), 3), ("sigmoid", (-20, 20), 2), ("exp", (-20, 20), 1),
         ("log", (1e-3, 1e3), 1), ("softplus", (-20, 20), 2), ("logsigmoid", (-20, 20), 2)]

REFERENCE = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "exp": torch.exp,
             "log": torch.log, "softplus": torch.nn.functional.softplus,
             "logsigmoid": torch.nn.functional.logsigmoid}


@pytest.mark.parametrize("fn,bounds,ulps", CASES)
def test_approximation_error(fn, bounds, ulps):
    cell = cellc.compile(f"cell t {{\n  input x: [H]\n  state h: [H]\n  h = {fn}(x)\n"
                         f"  output h\n}}\n")
    lo, hi = bounds
    n = T * B * H
    if fn == "log":
        x = torch.exp(torch.linspace(math.log(lo), math.log(hi), n, dtype=torch.float64))
    else:
        x = torch.linspace(lo, hi, n, dtype=torch.float64)
    x = x.float().reshape(T, B, H)
    with torch.no_grad():
        out, _ = cell(x, {})
    ref = REFERENCE[fn](x.double())
    rel = ((out.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
    assert rel <= ulps * ULP, f"{fn}: max relative error {rel:.2e} = {rel / ULP:.1f} ulp"
    # Not exact either: the bound is not vacuous.
    assert rel > 0


def test_logsigmoid_and_its_gradient_stay_finite_where_sigmoid_underflows():
    # log(sigmoid(x)) would be log(0) = -inf below about -88 in f32.
    cell = cellc.compile("cell t {\n  input x: [H]\n  state h: [H]\n  h = logsigmoid(x)\n"
                         "  output h\n}\n")
    x = torch.linspace(-1000, 1000, T * B * H, dtype=torch.float64).reshape(T, B, H)
    xf = x.float().requires_grad_()
    out, _ = cell(xf, {})
    xd = xf.detach().double().requires_grad_()
    ref = torch.nn.functional.logsigmoid(xd)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=4 * ULP, atol=1e-30)
    g = torch.randn_like(ref)
    (got,) = torch.autograd.grad((out * g.float()).sum(), xf)
    (want,) = torch.autograd.grad((ref * g).sum(), xd)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
