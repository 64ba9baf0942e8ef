"""Checks an installed cellc from outside the source tree (test-install.sh, and
test-wheel.sh for the wheel).

Run with the virtual environment's python; argv[1] is that environment.
"""

import os
import subprocess
import sys

import torch

venv = os.path.realpath(sys.argv[1])
import cellc  # noqa: E402

where = os.path.realpath(cellc.__file__)
assert where.startswith(venv), f"imported cellc from {where}, not from {venv}"
print(f"import cellc {cellc.__version__} from {os.path.dirname(where)}")

# An LSTM training step, with every gradient against torch.nn.LSTM.
torch.manual_seed(0)
ref = torch.nn.LSTM(8, 16).double()
lstm = cellc.nn.LSTM(8, 16).double()
lstm.load_state_dict(ref.state_dict())
x = torch.randn(5, 3, 8, dtype=torch.float64)
out, (h, c) = lstm(x)
ref_out, (ref_h, ref_c) = ref(x)
loss = out.pow(2).sum() + h.sum() + c.sum()
ref_loss = ref_out.pow(2).sum() + ref_h.sum() + ref_c.sum()
loss.backward()
ref_loss.backward()
assert torch.allclose(out, ref_out, atol=1e-10), "LSTM outputs differ from torch"
for (name, p), (_, q) in zip(lstm.named_parameters(), ref.named_parameters()):
    assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {name}"
    assert torch.allclose(p.grad, q.grad, atol=1e-9), f"gradient of {name} differs"
torch.optim.SGD(lstm.parameters(), lr=1e-3).step()
out, (h, c) = lstm(x)
after = out.pow(2).sum() + h.sum() + c.sum()
assert after.item() < loss.item(), f"an SGD step did not lower the loss: {loss} -> {after}"
print(f"LSTM training step: gradients match torch.nn.LSTM; "
      f"loss {loss.item():.4f} -> {after.item():.4f}")

# A cell from a string, forward and gradients against the same cell in torch.
source = """
cell elman {
  input x: [I]
  state h: [H]
  param W: [H, I], U: [H, H], b: [H]
  h = tanh(W @ x + U @ h + b)
}
"""
cell = cellc.compile(source)
T, B, I, H = 4, 2, 3, 5
xs = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
params = {"W": torch.randn(H, I, dtype=torch.float64, requires_grad=True),
          "U": torch.randn(H, H, dtype=torch.float64, requires_grad=True),
          "b": torch.randn(H, dtype=torch.float64, requires_grad=True)}
out, final = cell(xs, params)
hs, h = [], torch.zeros(B, H, dtype=torch.float64)
for t in range(T):
    h = torch.tanh(xs[t] @ params["W"].t() + h @ params["U"].t() + params["b"])
    hs.append(h)
expected = torch.stack(hs)
assert torch.allclose(out, expected, atol=1e-12), "Elman outputs differ"
grads = torch.autograd.grad(out.sum(), [xs, *params.values()])
ref_grads = torch.autograd.grad(expected.sum(), [xs, *params.values()])
for g, r in zip(grads, ref_grads):
    assert torch.allclose(g, r, atol=1e-10), "Elman gradients differ"
print("a cell from a string: outputs and gradients match a torch loop")

# cellc.autotune runs the packaged cellc-tune; the JIT then reads its entry.
result = cellc.autotune(cell, {"I": I, "H": H}, batch=B, seq_len=T, budget=2, progress=False)
assert result["stored"] and result["winner"] >= 0, result["table"]
assert cell.jit({"I": I, "H": H}, torch.float32, batch=B).config_source == "tuned"
print(f"cellc.autotune: {len(result['candidates'])} candidates, winner "
      f"{result['winner_config']}")

# The CUDA runtime library ships in the package: without a GPU the error is
# about the driver, not a missing library.
from cellc import cuda  # noqa: E402

ok, why = cuda.available()
assert ok or "libcellc_runtime.so not found" not in why, why
print(f"cellc.cuda: available={ok} ({why or 'a GPU is there'})")


# The tools, on the PATH and through python3 -m cellc.
def run(args):
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, f"{args} failed ({done.returncode}): {done.stderr}"
    return done.stdout


for tool in ("cellc", "cellc-opt", "cellc-tune"):
    text = run([tool, "--version"])
    assert f"{tool} (cellc) {cellc.__version__}" in text, text
    path = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
    assert os.path.realpath(path).startswith(venv), f"{tool} is {path}, not the venv's"
    print(f"{tool} --version: {text.splitlines()[0]}")
text = run([sys.executable, "-m", "cellc", "cellc", "--version"])
assert f"cellc (cellc) {cellc.__version__}" in text, text
with open("elman.cell", "w") as f:
    f.write(source)
summary = run(["cellc", "elman.cell", "-D", "H=5", "-D", "I=3", "--emit=summary"])
assert "elman" in summary, summary
bad = subprocess.run(["cellc", "elman.cell", "-D", "H=5", "--emit=mlir"],
                     capture_output=True, text=True)
assert bad.returncode != 0 and "I" in bad.stderr, bad.stderr
print("cellc elman.cell --emit=summary: ok; a missing size fails with: "
      + bad.stderr.strip().splitlines()[0])

# A CPU package from the installed cellc, trained by the installed runtime in
# a fresh process that loads no MLIR or LLVM.
run(["cellc", "elman.cell", "-D", "H=5", "-D", "I=3", "--dtype=f64", "--emit=package",
     "--target=cpu", "-o", "elman.pkg"])
train = """
import torch, cellc
pkg = cellc.load_package("elman.pkg")
params = {n: torch.randn(*s, dtype=torch.float64, requires_grad=True) for n, s in pkg.params}
xs = torch.randn(4, 2, 3, dtype=torch.float64)
out, _ = pkg(xs, params)
out.sum().backward()
h, hs = torch.zeros(2, 5, dtype=torch.float64), []
for t in range(4):
    h = torch.tanh(xs[t] @ params["W"].t() + h @ params["U"].t() + params["b"])
    hs.append(h)
assert torch.allclose(out, torch.stack(hs), atol=1e-12), "package outputs differ"
maps = open("/proc/self/maps").read()
assert "libMLIR" not in maps and "libLLVM" not in maps, "the runtime loaded LLVM"
assert "libcellc_compiler" not in maps, "the runtime loaded the compiler"
print("cellc.load_package: an Elman package trained without MLIR or LLVM")
"""
print(run([sys.executable, "-c", train]).strip())
