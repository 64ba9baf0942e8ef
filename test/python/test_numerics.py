"""The transcendentals' error. Both backends lower tanh, exp, log (and with
them sigmoid and softplus) to MLIR's polynomial approximations, not to
libdevice or libm; their error is measured here in f32 on the CPU, against
float64 torch, over ranges that cover saturation. README and
docs/benchmarks.md quote these bounds."""

import math

import pytest
import torch

import cellc

ULP = 2.0 ** -23
T, B, H = 20, 25, 100

# (function, range, bound in units of the last place of f32, relative)
CASES = [("tanh", (-10, 10), 3), ("sigmoid", (-20, 20), 2), ("exp", (-20, 20), 1),
         ("log", (1e-3, 1e3), 1), ("softplus", (-20, 20), 2)]

REFERENCE = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "exp": torch.exp,
             "log": torch.log, "softplus": torch.nn.functional.softplus}


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
