#!/usr/bin/env python3
"""Training memory on the CPU: the process's peak resident memory of one
forward plus backward, over its baseline, for torch.nn.LSTM/GRU and
cellc.nn.LSTM/GRU in each recompute mode, each in a fresh process.

A run builds the module and the input x ([T, B, I], requires_grad), runs a
first step of the same shape (the JIT compiles there, and torch, OpenBLAS
and the heap allocate what they keep), gives what that step freed back to
the system (malloc_trim, and cellc.empty_cache for the buffers cellc keeps
for a next call), resets the peak (5 to /proc/self/clear_refs), reads the baseline
(VmRSS), runs the forward, materializes a gradient for the outputs (as a
loss head's backward would) and runs the backward. The peak is VmHWM minus
the baseline. The floor is what any implementation holds at the end: the
outputs, their gradient, the input's gradient, the parameters' gradients,
and for cellc the states its mode keeps beyond the outputs (an LSTM's c in
none and full; an output that is a state is that state's history). cellc's
own prediction (cellc --emit=plan) stands beside the measure.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/memory.py
"""

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys

MiB = 1 << 20


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


SPLITS = {"auto": None, "units": True, "rows": False}


def one(kind, impl, mode, T, B, size, loop=0, threads=1, split="auto"):
    """Runs one measure in this process; prints a JSON line. With `loop`,
    then that many more steps as a training loop runs them, each forward
    while the last step's output is still held, and their peak. `threads`
    run torch and cellc; `split` is cellc's unit_slices (SPLITS)."""
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    I = H = size
    if impl == "torch":
        module = getattr(torch.nn, kind.upper())(I, H)
    else:
        import cellc
        module = getattr(cellc.nn, kind.upper())(I, H, recompute=mode)
        module.cell.threads = threads
        module.cell.unit_slices = SPLITS[split]  # read when the JIT compiles

    def step(steps):
        x = torch.randn(steps, B, I, requires_grad=True)
        out, _ = module(x)
        out.backward(torch.randn_like(out))
        return x

    # A first step of the same shape: the JIT, and what torch, OpenBLAS and
    # the heap allocate on first use. The second step is measured, as in
    # training.
    step(T)
    module.zero_grad(set_to_none=True)
    x = torch.randn(T, B, I, requires_grad=True)
    gc.collect()
    # What the first step freed goes back to the system, so that the baseline
    # is what is live: the heap's, and the buffers cellc keeps for a next
    # call (an older cellc, measured for comparison, has no cache).
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    if impl == "cellc" and hasattr(cellc, "empty_cache"):
        cellc.empty_cache()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    out, _ = module(x)
    after_forward = _status("VmRSS") - base
    grad = torch.randn_like(out)
    out.backward(grad)
    peak = _status("VmHWM") - base
    result = {"peak": peak, "held_after_forward": after_forward}
    if loop:
        for _ in range(loop):
            out, _ = module(x)
            out.backward(grad)
        result["loop_peak"] = _status("VmHWM") - base
        result["output_bytes"] = out.numel() * out.element_size()
        if impl == "cellc":
            held = _status("VmRSS")
            cellc.empty_cache()
            result["emptied"] = held - _status("VmRSS")
    # (An older cellc, measured for comparison, has no plan.)
    if impl == "cellc" and hasattr(module.cell, "memory_plan"):
        result["stats"] = module.cell.memory_stats()
        result["plan"] = module.cell.memory_plan({"I": I, "H": H}, T, B, mode)
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--modes", default="none,full,chunk:16")
    p.add_argument("--cells", default="lstm,gru")
    p.add_argument("--one", nargs=3, metavar=("CELL", "IMPL", "MODE"),
                   help=argparse.SUPPRESS)
    p.add_argument("--loop", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1,
                   help="threads for torch and cellc (run under taskset for as many cores)")
    p.add_argument("--unit-slices", choices=sorted(SPLITS), default="auto",
                   help="how cellc's threads share a tile: units, rows, or cellc's default")
    a = p.parse_args()
    if a.one:
        one(*a.one, a.steps, a.batch, a.size, a.loop, a.threads, a.unit_slices)
        return
    T, B, size = a.steps, a.batch, a.size
    print(f"T = {T}, B = {B}, I = H = {size}, float32, {a.threads} thread(s), cellc's threads "
          f"split {a.unit_slices}; peak resident memory over the baseline, MiB (each a fresh "
          f"process)")
    here = os.path.dirname(os.path.abspath(__file__))
    for kind in a.cells.split(","):
        runs = [("torch", "-")] + [("cellc", m) for m in a.modes.split(",")]
        measured = {}
        for impl, mode in runs:
            out = subprocess.run([sys.executable, os.path.join(here, "memory.py"),
                                  "--steps", str(T), "--batch", str(B), "--size",
                                  str(size), "--threads", str(a.threads), "--unit-slices",
                                  a.unit_slices, "--one", kind, impl, mode],
                                 check=True, capture_output=True, text=True)
            measured[(impl, mode)] = json.loads(out.stdout.strip().splitlines()[-1])
        torch_peak = measured[("torch", "-")]["peak"]
        print(f"\n{kind.upper()}: torch {torch_peak / MiB:.0f} MiB")
        print(f"  {'mode':<10} {'peak':>6} {'x torch':>9} {'predicted':>10} {'error':>7} "
              f"{'kept':>7} {'floor':>6} {'piece':>6}")
        for impl, mode in runs[1:]:
            r = measured[(impl, mode)]
            line = f"  {mode:<10} {r['peak'] / MiB:6.0f} {r['peak'] / torch_peak:7.3f}x"
            if "plan" in r:
                plan = r["plan"]
                error = (r["peak"] - plan["peak"]) / plan["peak"]
                line += (f" {plan['peak'] / MiB:10.0f} {100 * error:+6.1f}% "
                         f"{r['stats']['kept_bytes'] / MiB:7.1f} {plan['floor'] / MiB:6.0f} "
                         f"{plan['piece_steps']:6d}")
            print(line)


if __name__ == "__main__":
    main()
