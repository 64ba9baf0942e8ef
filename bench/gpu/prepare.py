"""Here, where the compiler is, before a GPU run: every example cell's CUDA
packages in each strategy and precision, with float64 references, and the
benchmark's packages. A GPU machine then needs only these, torch and the
runtime (bench/gpu/run.sh).

The references are cellc's CPU kernels in float64 on the same data; make
test checks those against independent float64
references written in torch (test_examples.py, test_matrix_cells.py, ...).
For LSTM and GRU the GPU run also compares with torch's own float64 LSTM and
GRU, and with cuDNN.

Usage: prepare.py OUT [--emulate]
  --emulate: the packages also hold the kernels for the SIMT emulator, at
  small sizes and for a slice of the cells, so that `make test` runs the GPU
  script end to end on the CPU.
"""

import importlib.util
import json
import os
import shutil
import sys

import torch

import cellc

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
#: test/gpu/check_cells.py, which holds each package to its reference.
_spec = importlib.util.spec_from_file_location(
    "check_cells", os.path.join(EXAMPLES, "..", "test", "gpu", "check_cells.py"))
CHECK = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CHECK)

#: Each check variant: its CUDA options, as `Cell.cuda_package` takes them.
VARIANTS = {
    "tiled": {"strategy": "batch-tiled"},
    "persistent": {"strategy": "persistent"},
    "tf32": {"strategy": "batch-tiled", "precision": "tf32"},
    "bf16": {"strategy": "batch-tiled", "precision": "bf16", "storage": "bf16"},
    "persistent-bf16": {"strategy": "persistent", "precision": "bf16", "storage": "bf16"},
}
#: Sizes that bind every example's names; the recurrent products' depths
#: are multiples of 16, so that tf32 and bf16 run on the tensor cores.
SIZES = {"I": 24, "H": 64, "NH": 2, "D": 32, "G": 2, "P": 32, "K": 16, "V": 32, "N": 16}
#: Steps and rows of the check: B = 19 leaves a partial batch tile of any
#: tile size (the references, float64, are what takes room: 1 MiB for a
#: matrix cell at B = 19).
SHAPE = (12, 19)
#: The emulator's, as test_emulator.py's.
EMU_SIZES = {"I": 5, "H": 16, "NH": 2, "D": 16, "G": 2, "P": 16, "K": 8, "V": 16, "N": 16}
EMU_SHAPE = (5, 5)
EMU_CELLS = ("lstm", "gru", "gated_deltanet")
EMU_VARIANTS = ("tiled", "tf32", "persistent-bf16")

#: The benchmark: (name, cell, sizes, B, T), with the variants each runs.
BENCH = [
    ("lstm-B16-T1024-H768", "lstm", {"I": 768, "H": 768}, 16, 1024),
    ("lstm-B4096-T32-H256", "lstm", {"I": 32, "H": 256}, 4096, 32),
    ("gated_deltanet-B8-T1024", "gated_deltanet",
     {"I": 512, "NH": 8, "K": 64, "V": 64}, 8, 1024),
]
BENCH_VARIANTS = {
    "tiled": {"strategy": "batch-tiled"},
    # An H100's 227 KiB of shared memory per CTA for the weight slices.
    "persistent": {"strategy": "persistent", "shared_limit": 232448},
    "persistent-bf16": {"strategy": "persistent", "shared_limit": 232448,
                        "precision": "bf16", "storage": "bf16"},
}
EMU_BENCH = [("lstm-B4-T4-H16", "lstm", {"I": 5, "H": 16}, 4, 4)]


def bench_options(variant, B):
    """The CUDA options of a benchmark's `variant` at batch `B`: a persistent
    variant takes the whole batch as one tile where it is small (up to 16
    rows), so that each step's rows are one grid's work, not tiles in turn."""
    options = dict(BENCH_VARIANTS[variant])
    if options["strategy"] == "persistent" and B <= 16:
        options["batch_tile"] = B
    return options


def source(name):
    return os.path.join(EXAMPLES, name + ".cell")


def package(cell, sizes, options, out, simt):
    """The package of `cell` at `sizes` copied to `out`; where it cannot be
    built, `out/not-built.txt` says why."""
    shutil.rmtree(out, ignore_errors=True)
    try:
        path = cell.cuda_package(sizes, arch="sm_90", simt=simt, **options)
    except Exception as e:  # noqa: BLE001 - the reason is the result
        os.makedirs(out)
        with open(os.path.join(out, "not-built.txt"), "w") as f:
            f.write(str(e).strip().splitlines()[0] + "\n")
        return False
    shutil.copytree(path, out)
    return True


def problem(cell, sizes, T, B, seed):
    """float64 params, inputs, states and resets for `cell`, and weights for
    the outputs' and final states' gradients (as test_emulator.py makes
    them)."""
    g = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    params = {n: 0.4 * randn(*cell.shape(n, sizes)) for n, _ in cell.params}
    if "gamma" in params and len(cell.states[0][1]) == 3:
        # RetNet's decays are in (0, 1).
        params["gamma"] = 0.45 + 0.5 * torch.rand(*params["gamma"].shape, generator=g,
                                                  dtype=torch.float64)
    inputs = {n: randn(T, B, cell.shape(n, sizes)[0]) for n, _ in cell.inputs}
    states = {n: 0.5 * torch.rand(B, *cell.shape(n, sizes), generator=g, dtype=torch.float64)
              for n, _ in cell.states}
    resets = torch.rand(T, B, generator=g) < 0.15
    with torch.no_grad():
        x = inputs if len(inputs) > 1 else next(iter(inputs.values()))
        out, final = cell(x, params, states, resets=resets)
    if not isinstance(out, dict):
        out = {cell.outputs[0]: out}
    out_w = {n: randn(*t.shape) for n, t in out.items()}
    final_w = {n: randn(*t.shape) for n, t in final.items()}
    return params, inputs, states, resets, out_w, final_w


def reference(cell, params, inputs, states, resets, out_w, final_w, mode):
    """cellc's CPU kernels in float64: outputs, final states and the
    gradients of the inputs, params and initial states of the loss
    sum(out * out_w) + sum(final * final_w)."""
    leaves = {("input", n): t.clone().requires_grad_() for n, t in inputs.items()}
    leaves.update({("param", n): t.clone().requires_grad_() for n, t in params.items()})
    leaves.update({("state", n): t.clone().requires_grad_() for n, t in states.items()})
    x = {n: leaves[("input", n)] for n in inputs}
    out, final = cell(x if len(x) > 1 else next(iter(x.values())),
                      {n: leaves[("param", n)] for n in params},
                      {n: leaves[("state", n)] for n in states}, resets=resets, recompute=mode)
    if not isinstance(out, dict):
        out = {cell.outputs[0]: out}
    loss = sum((out[n] * w).sum() for n, w in out_w.items())
    loss = loss + sum((final[n] * w).sum() for n, w in final_w.items())
    loss.backward()
    # Copies: a view saves the whole of what it views.
    return {"out": {n: t.detach().clone() for n, t in out.items()},
            "final": {n: t.detach().clone() for n, t in final.items()},
            "grads": {f"{kind}:{n}": t.grad.clone() for (kind, n), t in leaves.items()}}


def main(out, emulate):
    os.makedirs(out, exist_ok=True)
    cells = sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".cell"))
    sizes, (T, B) = (EMU_SIZES, EMU_SHAPE) if emulate else (SIZES, SHAPE)
    variants = {v: VARIANTS[v] for v in EMU_VARIANTS} if emulate else VARIANTS
    manifest = {"emulate": emulate, "T": T, "B": B, "checks": [], "bench": []}
    for name in EMU_CELLS if emulate else cells:
        cell = cellc.compile(source(name))
        bound = {k: v for k, v in sizes.items()
                 if k in cell.size_symbols}
        data = problem(cell, bound, T, B, seed=len(name))
        refs = {}
        for storage in ("f32", "bf16"):
            d = data
            if storage == "bf16":
                # The reference runs on the data rounded to bf16, so that
                # what is compared is the kernels' arithmetic and storage.
                rounded = lambda ts: {n: t.to(torch.bfloat16).double() for n, t in ts.items()}
                d = (rounded(data[0]), rounded(data[1]), rounded(data[2])) + data[3:]
            # One reference for every mode: the CPU's modes agree in float64
            # (test_functional.py), and the GPU's are each held to it.
            refs[storage] = {"data": d, "want": reference(cell, *d, "none")}
        # The tf32 packages' reference: on the f32 data as their tensor cores
        # read it (check_cells.reference_of rounds the data again there),
        # in float32, which their tolerance of 1e-2 leaves room for.
        d = tuple({n: CHECK.as_tf32(t) for n, t in ts.items()} for ts in data[:3]) + data[3:]
        want = reference(cell, *d, "none")
        refs["tf32"] = {"want": {part: {n: t.float() for n, t in ts.items()}
                                 for part, ts in want.items()}}
        torch.save(refs, os.path.join(out, f"reference-{name}.pt"))
        for variant, options in variants.items():
            path = os.path.join(out, f"check-{name}-{variant}")
            built = package(cell, bound, options, path, emulate)
            manifest["checks"].append({"cell": name, "variant": variant, "dir": path,
                                       "built": built, "sizes": bound})
            print(f"{name} {variant}: {'built' if built else 'not built'}", flush=True)
    for bench_name, name, bound, Bb, Tb in EMU_BENCH if emulate else BENCH:
        cell = cellc.compile(source(name))
        for variant in ["tiled"] if emulate else BENCH_VARIANTS:
            options = bench_options(variant, Bb)
            path = os.path.join(out, f"bench-{bench_name}-{variant}")
            built = package(cell, bound, options, path, emulate)
            manifest["bench"].append({"name": bench_name, "cell": name, "variant": variant,
                                      "dir": path, "built": built, "sizes": bound, "B": Bb,
                                      "T": Tb})
            print(f"bench {bench_name} {variant}: {'built' if built else 'not built'}",
                  flush=True)
    # Paths relative to OUT: the folder travels.
    for entry in manifest["checks"] + manifest["bench"]:
        entry["dir"] = os.path.basename(entry["dir"])
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    main(args[0], "--emulate" in sys.argv)
