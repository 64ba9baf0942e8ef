"""What an H100 or H200 would launch, checked in the SIMT emulator's device
model (runtime/emu/DeviceModel.h: 132 SMs, 227 KiB of shared memory a CTA,
2048 threads and 64K registers an SM, registers from ptxas where it is).

The emulator runs any grid; a GPU does not. A persistent CTA takes about
220 KB of shared memory, so an SM holds one, and a cooperative grid larger
than the GPU holds is refused. Each shape here is one the benchmark runs or
one Python's default strategy builds, launched as a call launches it
(`CudaCell.launch_plan`: the grid, checked, not run), forward and backward,
in both variants.
"""

import importlib.util
import os
import warnings

import pytest

import cellc
from cellc import cuda

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLES = os.path.join(ROOT, "examples")
H100_SMS = 132


def prepare():
    """bench/gpu/prepare.py: the benchmark's shapes and variants, as the GPU
    run builds them."""
    spec = importlib.util.spec_from_file_location(
        "prepare", os.path.join(ROOT, "bench", "gpu", "prepare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launches(cell, batch):
    """Every kernel's launch over `batch` rows in both variants: the plans,
    each admitted by the device model (an error otherwise)."""
    plans = {}
    for kernel in cell.package.kernels:
        for variant in ("save", "replay"):
            plans[kernel, variant] = cell.launch_plan(kernel, batch, variant)
    return plans


def assert_resident(plans):
    for (kernel, variant), plan in plans.items():
        x, y = plan["grid"]
        assert x >= 1 and 1 <= y <= 65535, (kernel, variant, plan)
        if plan["cooperative"]:
            assert x * y <= plan["resident_per_sm"] * H100_SMS, (kernel, variant, plan)


BENCH = prepare()


@pytest.mark.parametrize("variant", sorted(BENCH.BENCH_VARIANTS))
@pytest.mark.parametrize("bench", [b for b in BENCH.BENCH if b[1] == "lstm"],
                         ids=lambda b: b[0])
def test_the_benchmarks_lstm_launches_on_an_h100(bench, variant):
    name, cell_name, sizes, B, T = bench
    cell = cellc.compile(os.path.join(EXAMPLES, cell_name + ".cell"))
    path = cell.cuda_package(sizes, arch="sm_90", simt=True, **BENCH.bench_options(variant, B))
    emulated = cuda.CudaCell(path, emulate=True)
    plans = launches(emulated, B)
    assert_resident(plans)
    if BENCH.BENCH_VARIANTS[variant]["strategy"] == "persistent":
        # Whole-batch tiles at B = 16: each step's rows split over one grid
        # of CTAs; at B = 4096 the grid's rows of CTAs loop over the tiles.
        grid_y = {p["grid"][1] for p in plans.values()}
        assert grid_y == {1} if B == 16 else max(grid_y) > 1, plans


@pytest.mark.parametrize("cell_name,H,B", [("lstm", 1024, 1), ("lstm", 1024, 256),
                                          ("lstm", 2048, 1), ("lstm", 2048, 256),
                                          ("layernorm_lstm", 256, 256)])
def test_the_default_strategy_launches_on_an_h100(cell_name, H, B):
    # No strategy named: what Python builds for an H100 (the emulator's
    # device), which must launch at any batch, forward and backward.
    cell = cellc.compile(os.path.join(EXAMPLES, cell_name + ".cell"), target="cuda-emu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        emulated = cell._cuda_cell({"H": H, "I": H}, torch.float32, torch.device("cpu"))
    plans = launches(emulated, B)
    assert_resident(plans)
    kernels = emulated.package.kernels
    for kernel in kernels.values():
        assert kernel.get("ctas", 0) <= H100_SMS
    # Where the CTAs cannot keep every weight on chip, a warning says what
    # is read from global memory instead.
    spilled = any(k.get("global_weights") for k in kernels.values())
    said = [w for w in caught if "global memory" in str(w.message)]
    assert bool(said) == spilled, [str(w.message) for w in caught]
    if H == 2048:
        assert spilled


def test_a_cooperative_grid_larger_than_the_gpu_is_refused_as_the_driver_refuses_it():
    # 140 CTAs a tile, each with most of an SM's shared memory: one tile is
    # more than an H100 keeps resident.
    cell = cellc.compile(os.path.join(EXAMPLES, "lstm.cell"))
    path = cell.cuda_package({"H": 768, "I": 768}, arch="sm_90", simt=True,
                             strategy="persistent", ctas=140, shared_limit=232448)
    emulated = cuda.CudaCell(path, emulate=True)
    with pytest.raises(cuda.CudaError, match=r"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.*"
                       r"a grid of 140 CTAs .*keeps 132 resident \(1 per SM x 132 SMs\)"):
        emulated.launch_plan("lstm_fwd", 1)
    # A call is refused the same way, before anything runs.
    import torch
    x = torch.randn(2, 1, 768)
    params = {n: torch.randn(*cell.shape(n, {"H": 768, "I": 768})) * 0.01
              for n, _ in cell.params}
    with pytest.raises(cuda.CudaError, match="CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"):
        emulated({"x": x}, params)


def test_shared_memory_past_what_a_cta_may_opt_in_to_is_refused():
    # 240 KB of dynamic shared memory a CTA: past an H100's 227 KiB.
    cell = cellc.compile(os.path.join(EXAMPLES, "lstm.cell"))
    path = cell.cuda_package({"H": 768, "I": 768}, arch="sm_90", simt=True,
                             strategy="persistent", shared_limit=240000)
    emulated = cuda.CudaCell(path, emulate=True)
    with pytest.raises(cuda.CudaError, match=r"bytes of shared memory, past the 232448 a CTA "
                       r"may opt in to.*CUDA_ERROR_INVALID_VALUE"):
        emulated.launch_plan("lstm_fwd", 16)
