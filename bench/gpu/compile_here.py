"""On the GPU machine, with the compiler from the wheel (bench/gpu/run.sh
installs it there): cells compiled there, at sizes no prepared package has,
run on the GPU (or, with --emulate, in the SIMT emulator) and held to the
same cells on the CPU in float64, forward and every gradient. What the wheel
brings a GPU run: any cell at any size, with nothing built beforehand.

Usage: compile_here.py [--emulate]   exit 1 on a failure
"""

import os
import sys
import time

import torch

import cellc

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
#: A cell written here, as a user would, and two examples; sizes that are
#: no multiple of a tile (prepare.py's are I = 24, H = 64).
ELMAN = """
cell elman {
  input x: [I]
  state h: [H]
  param W: [H, I], U: [H, H], b: [H]
  h = tanh(W @ x + U @ h + b)
}
"""
CASES = [("elman", ELMAN, {"I": 20, "H": 40}),
         ("lstm", os.path.join(EXAMPLES, "lstm.cell"), {"I": 40, "H": 48}),
         ("gru", os.path.join(EXAMPLES, "gru.cell"), {"I": 36, "H": 56})]
T, B = 7, 5
#: f32 FMAs against float64: the check's ieee tolerance.
TOLERANCE = 1e-4


def relative(got, want):
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check(name, source, sizes, target, device):
    start = time.time()
    cpu, gpu = cellc.compile(source), cellc.compile(source, target=target)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, sizes["I"], generator=g, dtype=torch.float64)
    params = {n: 0.3 * torch.randn(*cpu.shape(n, sizes), generator=g, dtype=torch.float64)
              for n, _ in cpu.params}
    weight = torch.randn(T, B, sizes["H"], generator=g, dtype=torch.float64)
    results = []
    for cell, dtype, where in ((cpu, torch.float64, "cpu"), (gpu, torch.float32, device)):
        xs = x.detach().to(where, dtype).clone().requires_grad_()
        ps = {n: p.detach().to(where, dtype).clone().requires_grad_() for n, p in params.items()}
        out, _ = cell(xs, ps)
        (out.double() * weight.to(where)).sum().backward()
        results.append([out.detach().cpu(), xs.grad.cpu()] + [ps[n].grad.cpu() for n in params])
    worst = max(relative(got, want) for got, want in zip(results[1], results[0]))
    ok = worst <= TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} compiled here: {name} "
          f"{' '.join(f'{k}={v}' for k, v in sizes.items())} T={T} B={B} on {target}: "
          f"worst relative error {worst:.1e} (forward and {len(results[0]) - 1} gradients), "
          f"{time.time() - start:.1f} s", flush=True)
    return ok


def main():
    emulate = "--emulate" in sys.argv
    target, device = ("cuda-emu", "cpu") if emulate else ("cuda", "cuda")
    print(f"cellc {cellc.__version__} from {os.path.dirname(cellc.__file__)}", flush=True)
    failed = [name for name, source, sizes in CASES
              if not check(name, source, sizes, target, device)]
    print(f"{len(CASES) - len(failed)} of {len(CASES)} cells compiled here passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
