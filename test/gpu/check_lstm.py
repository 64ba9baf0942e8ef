"""On a GPU: cellc's CUDA LSTM forward against torch.nn.LSTM (cuDNN), then a
forward timing table. Usage: check_lstm.py PACKAGE_DIR B T I H

Runs where only torch, the package and libcellc_cuda.so are present (the lent
GPU machine); cuda.py is imported by path.
"""

import importlib.util
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "cellc_cuda", os.path.join(here, "..", "..", "python", "cellc", "cuda.py"))
cuda = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuda)

pkg_dir, B, T, I, H = sys.argv[1], *map(int, sys.argv[2:6])
ok, why = cuda.available()
if not ok:
    sys.exit(f"check_lstm: {why}")
torch.manual_seed(0)
dev = torch.device("cuda")
ref = torch.nn.LSTM(I, H).to(dev)
params = {"W_ih": ref.weight_ih_l0.detach(), "W_hh": ref.weight_hh_l0.detach(),
          "b_ih": ref.bias_ih_l0.detach(), "b_hh": ref.bias_hh_l0.detach()}
x = torch.randn(T, B, I, device=dev)
h0 = torch.randn(B, H, device=dev) * 0.5
c0 = torch.randn(B, H, device=dev) * 0.5

cell = cuda.CudaCell(cuda.Package(pkg_dir))
print(f"registers: fwd {cell.registers('lstm_fwd')}, bwd {cell.registers('lstm_bwd')}")
failed = False
for save in (True, False):
    out, hist, _ = cell.forward({"x": x}, params, {"h": h0, "c": c0}, save_gates=save)
    with torch.no_grad():
        want, (hn, cn) = ref(x, (h0[None], c0[None]))
    err = (out["h"] - want).abs().max().item()
    errc = (hist["c"][-1] - cn[0]).abs().max().item()
    status = "ok" if err < 1e-4 and errc < 1e-4 else "FAIL"
    failed |= status == "FAIL"
    print(f"forward save_gates={int(save)}: max |h - cuDNN| {err:.2e}, "
          f"max |c_T - cuDNN| {errc:.2e} {status}")

# Resets: rows restart from the initial state at their reset step.
resets = torch.zeros(T, B, dtype=torch.bool, device=dev)
resets[T // 2, ::3] = True
out, _, _ = cell.forward({"x": x}, params, {"h": h0, "c": c0}, resets=resets)
with torch.no_grad():
    a, (h1, c1) = ref(x[: T // 2], (h0[None], c0[None]))
    keep = ~resets[T // 2][None, :, None]
    h1 = torch.where(keep, h1, h0[None]); c1 = torch.where(keep, c1, c0[None])
    b, _ = ref(x[T // 2:], (h1, c1))
err = (out["h"] - torch.cat([a, b])).abs().max().item()
failed |= err >= 1e-4
print(f"forward with resets: max |h - cuDNN| {err:.2e} {'ok' if err < 1e-4 else 'FAIL'}")


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


with torch.no_grad():
    t_cudnn = median_ms(lambda: ref(x, (h0[None], c0[None])))
t_save = median_ms(lambda: cell.forward({"x": x}, params, {"h": h0, "c": c0}, save_gates=True))
t_none = median_ms(lambda: cell.forward({"x": x}, params, {"h": h0, "c": c0}, save_gates=False))
print(f"| LSTM fwd B={B} T={T} I={I} H={H} fp32 | cuDNN {t_cudnn:.3f} ms | "
      f"cellc save {t_save:.3f} ms | cellc no-save {t_none:.3f} ms |")
sys.exit(1 if failed else 0)
