"""Here, before a GPU run: the CPU backend's results for the GPU script to
compare with (bench/gpu/run.sh package). For LSTM and GRU at the check
shape, with resets, it saves the inputs, the output and final-state
gradients fed to backward, and what cellc's CPU kernels computed: outputs,
final states and every gradient. Usage: cpu_reference.py OUT_DIR"""

import os
import sys

import torch

import cellc

B, T, I, H = 37, 19, 24, 64
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")

for kind in ("lstm", "gru"):
    torch.manual_seed(3)
    cell = cellc.compile(open(os.path.join(EXAMPLES, kind + ".cell")).read())
    gates = 4 if kind == "lstm" else 3
    bound = H ** -0.5
    params = {"W_ih": torch.empty(gates * H, I).uniform_(-bound, bound),
              "W_hh": torch.empty(gates * H, H).uniform_(-bound, bound),
              "b_ih": torch.empty(gates * H).uniform_(-bound, bound),
              "b_hh": torch.empty(gates * H).uniform_(-bound, bound)}
    x = torch.randn(T, B, I)
    states = {"h": torch.randn(B, H) * 0.5}
    if kind == "lstm":
        states["c"] = torch.randn(B, H) * 0.5
    resets = torch.rand(T, B) < 0.15
    g_out = torch.randn(T, B, H)
    g_final = {n: torch.randn(B, H) for n in states}
    leaves = {"x": x.clone().requires_grad_()}
    leaves.update({n: p.clone().requires_grad_() for n, p in params.items()})
    leaves.update({n + "0": s.clone().requires_grad_() for n, s in states.items()})
    out, final = cell(leaves["x"], {n: leaves[n] for n in params},
                      {n: leaves[n + "0"] for n in states}, resets=resets)
    loss = (out * g_out).sum() + sum((final[n] * g_final[n]).sum() for n in states)
    loss.backward()
    torch.save({"x": x, "params": params, "states": states, "resets": resets,
                "g_out": g_out, "g_final": g_final, "out": out.detach(),
                "final": {n: t.detach() for n, t in final.items()},
                "grads": {n: t.grad for n, t in leaves.items()}},
               os.path.join(sys.argv[1], f"cpu-reference-{kind}.pt"))
    print(f"wrote cpu-reference-{kind}.pt")
