"""The CUDA kernels, run on the CPU in the SIMT emulator (target="cuda-emu").

Every CUDA thread is a fiber; bar.sync, shfl.sync and mma.sync meet as on the
device; the emulator fails a launch on a shared-memory race, a global access
outside the launch's buffers, a deadlock or a livelock. So every test here
that passes also says: no race, no access out of bounds, no hang, in any of
the kernels it ran. The host path is the real one: cellc.compile,
CudaCell.launch and the C driver, with the emulator behind the launch.

Tolerances, each relative to the largest magnitude of the float64 reference:
- ieee: fp32 FMAs over T = 5 steps of products of depth <= 32: 1e-4.
- tf32: the tensor cores read 10 of fp32's 23 mantissa bits (relative error
  2^-11 per operand), over the same depths: 1e-2.
- bf16: sequences stored in bf16 (8 bits, 2^-9 per rounding: x, h, the
  gates and their gradients) and bf16 operands in the products: 6e-2.

The full matrix (every example cell in every strategy, precision and
storage) is `make test-emu`; this file runs the LSTM in every strategy and
precision, every example cell in three configs, and a cell nobody here wrote
in every strategy and precision.
"""

import ctypes
import json
import os
import shutil
import warnings

import pytest
import torch

import cellc
from cellc import _cellc, cuda

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
FULL = os.environ.get("CELLC_EMU_FULL") == "1"

TOLERANCE = {"ieee": 1e-4, "tf32": 1e-2, "bf16": 6e-2}

#: (strategy, CUDA options) of each strategy tested: batch-tiled with a
#: partial last tile (B = 5 over tiles of 4 rows), persistent with one CTA
#: per tile and with three that split the units and meet at grid barriers.
STRATEGIES = {
    "batch-tiled": {"strategy": "batch-tiled", "batch_tile": 4},
    "persistent-1": {"strategy": "persistent", "ctas": 1},
    "persistent-3": {"strategy": "persistent", "ctas": 3},
}

#: Sizes that bind every example's names, with the recurrent products'
#: depths multiples of 16: the tf32 and bf16 products run on the tensor cores
#: (TilePlan.cpp, onTensorCores), not on the FMAs they fall back to.
SIZES = {"I": 5, "H": 16, "NH": 2, "D": 16, "G": 2, "P": 16, "K": 8, "V": 16, "N": 16}

#: The minimal gated unit (Zhou et al., 2016): one gate, which both forgets
#: and resets. Nobody here wrote kernels for it.
MGU = """
cell mgu {
  input x: [I]
  state h: [H]
  param Wf: [H, I], Uf: [H, H], bf: [H], Wh: [H, I], Uh: [H, H], bh: [H]
  f = sigmoid(Wf @ x + Uf @ h + bf)
  n = tanh(Wh @ x + Uh @ (f * h) + bh)
  h = (1 - f) * h + f * n
}
"""


def problem(cell, T=5, B=5, seed=0):
    """float64 params, inputs and initial states for `cell` at SIZES, and
    weights for the outputs' and final states' gradients."""
    g = torch.Generator().manual_seed(seed)
    params = {n: 0.4 * torch.randn(*cell.shape(n, SIZES), generator=g, dtype=torch.float64)
              for n, _ in cell.params}
    if "gamma" in params and len(cell.states[0][1]) == 3:
        # RetNet's decays are in (0, 1) (the paper's 1 - 2^(-5-h)). A random
        # "decay" of -0.2 makes the state alternate in sign, and the decay's
        # gradient, a sum over every step and element of the state, cancels
        # to a twentieth of its terms: bf16's rounding of the data alone
        # moves it by 13%.
        params["gamma"] = 0.45 + 0.5 * torch.rand(*params["gamma"].shape, generator=g,
                                                  dtype=torch.float64)
    inputs = {n: torch.randn(T, B, cell.shape(n, SIZES)[0], generator=g, dtype=torch.float64)
              for n, _ in cell.inputs}
    states = {n: 0.5 * torch.rand(B, *cell.shape(n, SIZES), generator=g,
                                  dtype=torch.float64) for n, _ in cell.states}
    return params, inputs, states, g


def run(cell, params, inputs, states, weights, dtype, recompute):
    """Outputs, final states and every gradient of the weighted sum of both,
    computed by `cell` with its tensors in `dtype`."""
    leaves = {k: {n: t.detach().to(dtype).requires_grad_() for n, t in group.items()}
              for k, group in (("p", params), ("x", inputs), ("s", states))}
    x = leaves["x"] if len(leaves["x"]) > 1 else next(iter(leaves["x"].values()))
    out, final = cell(x, leaves["p"], leaves["s"], recompute=recompute)
    outs = out if isinstance(out, dict) else {cell.outputs[0]: out}
    results = {**{"out " + n: t for n, t in outs.items()},
               **{"final " + n: t for n, t in final.items()}}
    loss = sum((t.double() * weights[n]).sum() for n, t in results.items())
    loss.backward()
    values = {n: t.detach().double() for n, t in results.items()}
    for k, group in leaves.items():
        for n, t in group.items():
            values[f"d{k} {n}"] = t.grad.double()
    return values


def weights_for(cell, params, inputs, states, g):
    """Random weights for each output and final state (their gradients)."""
    reference = run(cellc.compile(cell.source), params, inputs, states,
                    _Ones(), torch.float64, "none")
    return {n: torch.randn(*reference[n].shape, generator=g, dtype=torch.float64)
            for n in reference if n.startswith(("out ", "final "))}


class _Ones(dict):
    def __getitem__(self, name):
        return 1.0


def compare(source, options, precision, modes, seed=0, storage=None, batch=5):
    """The cell in the emulator against the CPU kernels in float64, in each
    recompute mode: forward, final states and every gradient. `storage` (bf16
    with bf16 products, else f32) is the dtype of the tensors."""
    storage = storage or ("bf16" if precision == "bf16" else "f32")
    tolerance = max(TOLERANCE[precision], TOLERANCE["bf16"] if storage == "bf16" else 0)
    cpu = cellc.compile(source)
    params, inputs, states, g = problem(cpu, B=batch, seed=seed)
    dtype = torch.bfloat16 if storage == "bf16" else torch.float32
    if dtype == torch.bfloat16:
        # The emulator is given the tensors rounded to bf16; the float64
        # reference runs on the same values, so that what is compared is the
        # kernels' arithmetic and storage, not the rounding of the data (a
        # RetNet decay's gradient moves 13% under that rounding alone).
        rounded = lambda ts: {n: t.to(dtype).double() for n, t in ts.items()}
        params, inputs, states = rounded(params), rounded(inputs), rounded(states)
    weights = weights_for(cpu, params, inputs, states, g)
    want = run(cpu, params, inputs, states, weights, torch.float64, "none")
    emu = cellc.compile(source, target="cuda-emu", cuda=dict(options, precision=precision))
    for mode in modes:
        got = run(emu, params, inputs, states, weights, dtype, mode)
        assert set(got) == set(want)
        for name, w in want.items():
            error = (got[name] - w).abs().max().item()
            scale = w.abs().max().item() + 1e-3
            assert error <= tolerance * scale, (
                f"{mode}, {name}: largest difference {error:.2e} from float64, "
                f"of a largest value {scale:.2e}")


@pytest.mark.parametrize("precision", ["ieee", "tf32", "bf16"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_lstm_matches_torch_in_every_strategy_and_precision(strategy, precision):
    # Against torch.nn.LSTM in float64, the forward and every gradient, in
    # each recompute mode.
    T, B, I, H = 5, 5, SIZES["I"], SIZES["H"]
    torch.manual_seed(1)
    ref = torch.nn.LSTM(I, H).double()
    names = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0, "b_ih": ref.bias_ih_l0,
             "b_hh": ref.bias_hh_l0}
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(T, B, H, dtype=torch.float64)
    out, _ = ref(x)
    (out * weight).sum().backward()
    cell = cellc.compile(os.path.join(EXAMPLES, "lstm.cell"), target="cuda-emu",
                         cuda=dict(STRATEGIES[strategy], precision=precision))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for mode in ["none", "full", "chunk:2"]:
        xs = x.detach().to(dtype).requires_grad_()
        ps = {n: t.detach().to(dtype).requires_grad_() for n, t in names.items()}
        got, _ = cell(xs, ps, recompute=mode)
        (got.double() * weight).sum().backward()
        tol = TOLERANCE[precision]
        pairs = [("out", got, out), ("dx", xs.grad, x.grad)]
        pairs += [("d" + n, ps[n].grad, t.grad) for n, t in names.items()]
        for what, a, b in pairs:
            error = (a.double() - b).abs().max().item()
            assert error <= tol * (b.abs().max().item() + 1e-3), f"{mode}, {what}: {error:.2e}"


EXAMPLE_CELLS = sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".cell"))


#: (strategy, precision of the products, storage of the sequences): a slice
#: here, every combination in the full matrix.
CASES = (["batch-tiled ieee f32", "persistent-3 tf32 f32", "batch-tiled bf16 bf16"]
         if not FULL else
         [f"{s} {p} {st}" for s in STRATEGIES for p in TOLERANCE for st in ("f32", "bf16")])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", EXAMPLE_CELLS)
def test_every_example_cell_matches_float64(name, case):
    strategy, precision, storage = case.split()
    with open(os.path.join(EXAMPLES, name + ".cell")) as f:
        source = f.read()
    compare(source, STRATEGIES[strategy], precision,
            ["none", "full", "chunk:2"] if FULL or precision == "ieee" else ["full"],
            storage=storage)


@pytest.mark.parametrize("precision", ["ieee", "tf32", "bf16"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_cell_nobody_wrote_matches_float64(strategy, precision):
    compare(MGU, STRATEGIES[strategy], precision, ["none", "full", "chunk:2"], seed=3)


@pytest.mark.parametrize("name", ["lstm", "mgu"])
def test_a_grid_smaller_than_the_batch_with_weights_in_global_memory(name, monkeypatch):
    # A GPU of 2 SMs, and a persistent tile capped at 2 CTAs whose shared
    # memory holds only their partial products: every recurrent product
    # reads its weights from global memory. B = 17 in tiles of 2 is 9 tiles,
    # more than the grid holds at once (an SM holds at most 8 CTAs of 256
    # threads): its rows of CTAs run the tiles in turn.
    monkeypatch.setenv("CELLC_EMU_SMS", "2")
    source = MGU
    if name == "lstm":
        with open(os.path.join(EXAMPLES, "lstm.cell")) as f:
            source = f.read()
    # The shared memory: each thread's partial products of a 2-row tile.
    options = {"strategy": "persistent", "max_ctas": 2, "shared_limit": 256 * 2 * 4,
               "batch_tile": 2}
    emu = cellc.compile(source, target="cuda-emu", cuda=options)
    path = emu.cuda_package(SIZES, simt=True, **options)
    cell = cuda.CudaCell(path, emulate=True)
    for kernel, info in cell.package.kernels.items():
        assert info["ctas"] == 2 and info["global_weights"] >= 1
        plan = cell.launch_plan(kernel, 17)
        assert plan["cooperative"] and plan["grid"][0] == 2
        assert plan["grid"][1] == plan["resident_per_sm"] < 9
    compare(source, options, "ieee", ["none", "full", "chunk:2"], seed=5, batch=17)


#: A diagonal RNN with an RMS norm: no weight to cache, and a reduction.
DIAG_RMS = """
cell diag_rms {
  input x: [I]
  state h: [H]
  param W: [H, I], u: [H], g: [H]
  y = g * h / sqrt(mean(h * h) + 0.000001)
  h = tanh(W @ x + u * y)
}
"""


def test_a_step_without_weights_runs_in_one_ctas_shared_memory():
    # The persistent strategy on a step with no recurrent weight: one CTA
    # owns its rows, its buffers and the reduction's partials in dynamic
    # shared memory, with no workspace and no barrier across CTAs.
    cell = cellc.compile(DIAG_RMS)
    path = cell.cuda_package({"I": SIZES["I"], "H": SIZES["H"]}, strategy="persistent")
    with open(os.path.join(path, "kernels.json")) as f:
        kernels = json.load(f)["kernels"]
    for kernel in ("diag_rms_fwd", "diag_rms_bwd"):
        assert (kernels[kernel]["heads"], kernels[kernel]["ctas"]) == (1, 1)
        assert kernels[kernel]["workspace_bytes"] == 0
    compare(DIAG_RMS, {"strategy": "persistent"}, "ieee", ["none", "full", "chunk:2"], seed=5)


def test_heads_split_a_backward_whose_input_gradient_is_zero():
    # Gated DeltaNet's x reaches the step only through projections: the
    # backward step's d x is a zero of I = 5 elements, which 2 heads do not
    # split. It is not written (the driver zeroes it), so both kernels run a
    # head a CTA, and the projections' GEMMs give d x.
    with open(os.path.join(EXAMPLES, "gated_deltanet.cell")) as f:
        source = f.read()
    sizes = {n: SIZES[n] for n in ("I", "NH", "K", "V")}
    path = cellc.compile(source).cuda_package(sizes, strategy="persistent")
    with open(os.path.join(path, "kernels.json")) as f:
        kernels = json.load(f)["kernels"]
    for kernel in ("gated_deltanet_fwd", "gated_deltanet_bwd"):
        assert kernels[kernel]["heads"] == SIZES["NH"], kernel
        assert kernels[kernel]["workspace_bytes"] == 0
    compare(source, {"strategy": "persistent"}, "ieee", ["none", "full", "chunk:2"], seed=7)


@pytest.mark.parametrize("strategy", ["batch-tiled", "persistent"])
def test_a_reduction_of_many_terms_splits_over_a_warp(strategy, monkeypatch):
    # Gated DeltaNet's decay gradient sums K * V = 256 terms a head. A warp
    # takes each element, its lanes every 32nd term, combined by shuffles
    # (TiledBuilder::forEachItemElement); before, one thread summed all the
    # terms at every step while its CTA waited (on an H200 the backward took
    # ten times the forward). The reductions inside a term stay each lane's:
    # split over the warp too, they deadlocked.
    monkeypatch.setitem(SIZES, "K", 16)
    with open(os.path.join(EXAMPLES, "gated_deltanet.cell")) as f:
        source = f.read()
    sizes = {n: SIZES[n] for n in ("I", "NH", "K", "V")}
    path = cellc.compile(source).cuda_package(sizes, strategy=strategy)
    ptx = cuda.Package(path).ptx["replay"]
    backward = ptx[ptx.index(".entry gated_deltanet_bwd"):]
    assert "shfl.sync.bfly" in backward
    compare(source, {"strategy": strategy}, "ieee", ["none", "full", "chunk:2"], seed=11)
    compare(source, {"strategy": strategy}, "bf16", ["full"], seed=12)


# The checks, each shown to catch a planted bug ---------------------------------


def lstm_package(tmp_path, mutation="", strategy="batch-tiled", precision="ieee", ctas=0):
    with open(os.path.join(EXAMPLES, "lstm.cell")) as f:
        source = f.read()
    path = str(tmp_path / f"pkg-{mutation or 'none'}-{strategy}-{precision}")
    _cellc.package(source, "lstm.cell", {"I": SIZES["I"], "H": SIZES["H"]}, path, "sm_90",
                   strategy=strategy, precision=precision, storage="f32", batch_tile=4,
                   ctas=ctas, shared_limit=49152, simt=True, simt_mutation=mutation)
    return cuda.Package(path)


def edited_package(package, tmp_path, edit):
    """A copy of `package` whose kernels.json `edit` (a function of the parsed
    JSON) changed: the runtime reads the file, not a copy in Python."""
    copy = tmp_path / ("edited-" + os.path.basename(package.directory))
    shutil.copytree(package.directory, copy)
    path = copy / "kernels.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    return cuda.Package(str(copy))


def lstm_call(package, seed=0, **kwargs):
    """Runs the package's LSTM forward and backward; returns the output and
    the gradients."""
    H, I = SIZES["H"], SIZES["I"]
    g = torch.Generator().manual_seed(seed)
    ps = {n: (0.3 * torch.randn(*s, generator=g)).requires_grad_()
          for n, s in (("W_ih", (4 * H, I)), ("W_hh", (4 * H, H)), ("b_ih", (4 * H,)),
                       ("b_hh", (4 * H,)))}
    x = torch.randn(5, 5, I, generator=g).requires_grad_()
    cell = cuda.CudaCell(package, emulate=True, **kwargs)
    out, _ = cell({"x": x}, ps)
    out["h"].sum().backward()
    return [out["h"].detach(), x.grad] + [p.grad for p in ps.values()]


def test_what_a_call_writes_starts_as_nan_as_a_caching_allocator_may_give_it(tmp_path):
    # The emulator's buffers come from the CPU allocator (zero pages, or the
    # last call's same data); a GPU's caching allocator hands back dirty
    # blocks. So the workspace, outputs, final states and gradients a call
    # writes start as NaN bytes in the emulator, and every numeric test here
    # reads only what the kernels and the driver wrote.
    cell = cuda.CudaCell(lstm_package(tmp_path), emulate=True)
    real = cell._lib
    H, I = SIZES["H"], SIZES["I"]
    outputs, finals = [torch.zeros(5, 5, H)], [torch.zeros(5, H), torch.zeros(5, H)]
    seen = []

    def forward(handle, call, buf, size):
        # As the call starts: what it was given.
        c = call._obj
        workspace = bytes((ctypes.c_ubyte * c.workspace_bytes).from_address(c.workspace)
                          if c.workspace_bytes else b"")
        seen.append((workspace, [t.clone() for t in outputs + finals]))
        return real.cellc_cuda_forward(handle, call, buf, size)

    class Spy:
        def __getattr__(self, name):
            return forward if name == "cellc_cuda_forward" else getattr(real, name)

    cell._lib = Spy()
    ps = [0.3 * torch.randn(*s) for s in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]
    x = torch.randn(5, 5, I)
    cell.forward_kept("none", [x], ps, [], None, [], outputs, finals, None)
    workspace, given = seen[-1]
    assert workspace and set(workspace) == {0xFF}
    assert all(torch.isnan(t).all() for t in given)
    assert all(torch.isfinite(t).all() for t in outputs + finals)


def test_a_missing_barrier_is_a_race(tmp_path):
    # The forward kernel's second bar.sync orders the step's writes of h to
    # shared memory before the products read them: without it, the thread
    # that writes a unit's h races with the threads that read it.
    with pytest.raises(cuda.CudaError) as error:
        lstm_call(lstm_package(tmp_path, "drop-barrier:1"))
    message = str(error.value)
    assert "cuda-emu: shared-memory race in kernel lstm_fwd, CTA (0, 0)" in message
    assert "of __wg_lstm_fwd_0" in message and "which thread" in message
    # The backward's, likewise (the forward has five: its fifth, after the
    # time loop, orders the last step before the end states are read).
    with pytest.raises(cuda.CudaError, match="shared-memory race in kernel lstm_bwd"):
        lstm_call(lstm_package(tmp_path, "drop-barrier:6"))
    # The same kernels with every barrier run clean.
    lstm_call(lstm_package(tmp_path))


def test_swapped_mma_fragments_fail_the_comparison(tmp_path):
    # mma.sync reading A's registers 0 and 1 swapped (rows g and g + 8) runs,
    # and its results are far outside tf32's tolerance; the right one's are
    # inside it.
    right = lstm_call(lstm_package(tmp_path, precision="tf32"))
    swapped = lstm_call(lstm_package(tmp_path, "swap-mma-a", precision="tf32"))
    exact = lstm_call(lstm_package(tmp_path))
    scale = exact[0].abs().max().item()
    assert (right[0] - exact[0]).abs().max().item() < TOLERANCE["tf32"] * scale
    assert (swapped[0] - exact[0]).abs().max().item() > 10 * TOLERANCE["tf32"] * scale


def test_a_shuffled_schedule_through_compile():
    path = os.path.join(EXAMPLES, "gru.cell")
    cpu = cellc.compile(path)
    x = torch.randn(4, 3, SIZES["I"])
    params = {n: 0.3 * torch.randn(*cpu.shape(n, SIZES)) for n, _ in cpu.params}
    outs = [cellc.compile(path, target="cuda-emu", cuda={"shuffle_seed": seed})(x, params)[0]
            for seed in (0, 9)]
    assert torch.equal(*outs)
    with pytest.raises(TypeError, match="'shuffle_seed' is the SIMT emulator's"):
        cellc.compile(path, cuda={"shuffle_seed": 1})


def test_shuffled_schedules_compute_the_same(tmp_path):
    # Threads run in another order between sync points: the same bits, and
    # no race, for the persistent kernels with their grid barriers too.
    for package in (lstm_package(tmp_path),
                    lstm_package(tmp_path, strategy="persistent", ctas=3)):
        first = lstm_call(package)
        for seed in (1, 2):
            again = lstm_call(package, shuffle_seed=seed)
            assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_a_grid_barrier_without_a_cooperative_launch_is_a_livelock(tmp_path):
    # Launched one CTA at a time (as a non-cooperative grid may be), the
    # persistent kernel's first grid barrier waits for CTAs that never run:
    # an error that says so, not a hang.
    def cooperative_off(meta):
        for info in meta["kernels"].values():
            del info["ctas"]
    package = edited_package(lstm_package(tmp_path, strategy="persistent", ctas=3), tmp_path,
                             cooperative_off)
    with pytest.raises(cuda.CudaError, match="livelock in kernel lstm_fwd.*cooperative"):
        lstm_call(package)


def test_an_access_outside_the_buffers_is_an_error(tmp_path):
    # A launch whose workspace is one row short: the kernel's stores past it
    # fail the bounds check, named with the kernel, CTA and thread.
    package = lstm_package(tmp_path)
    cell = cuda.CudaCell(package, emulate=True)
    info = package.kernels["lstm_fwd"]
    T, B = 2, 4
    tensors = []
    for arg in info["args"]:
        if not arg["memref"]:
            tensors.append(0 if arg["kind"] == "batch_begin" else B)
            continue
        shape = [{-1: None}.get(d, d) for d in arg["shape"]]
        dims = [d if d is not None else (T if i == 0 and len(shape) == 3 else B)
                for i, d in enumerate(shape)]
        if arg["kind"] == "output":
            dims[0] -= 1  # one step short
        tensors.append(torch.zeros(*dims, dtype=torch.uint8 if arg.get("element") == "i8"
                                   else torch.float32))
    with pytest.raises(cuda.CudaError, match=r"global store of 4 bytes at 0x[0-9a-f]+, "
                                             r"\d+ bytes into an argument's buffer of \d+, "
                                             r"in kernel lstm_fwd, CTA \(0, 0\), thread \d+"):
        cell.launch("lstm_fwd", "save", tensors, B)


def test_tensor_cores_that_cannot_run_are_a_warning():
    # At H = 12 the recurrent product's depth is not a multiple of 8: tf32
    # asks for tensor cores that the kernels cannot use, and the user is told.
    path = os.path.join(EXAMPLES, "lstm.cell")
    x = torch.randn(3, 2, 4)
    cpu = cellc.compile(path)
    params = {n: torch.randn(*cpu.shape(n, {"I": 4, "H": 12})) for n, _ in cpu.params}
    with pytest.warns(UserWarning, match="precision='tf32', but no product runs on the "
                                         "tensor cores"):
        cellc.compile(path, target="cuda-emu", cuda={"precision": "tf32"})(x, params)
    params16 = {n: torch.randn(*cpu.shape(n, {"I": 4, "H": 16})) for n, _ in cpu.params}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cellc.compile(path, target="cuda-emu", cuda={"precision": "tf32"})(x, params16)


def test_bad_tensors_are_errors(tmp_path):
    cell = cellc.compile(os.path.join(EXAMPLES, "lstm.cell"), target="cuda-emu")
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        cell(torch.zeros(2, 3, 4, dtype=torch.float64),
             {n: torch.zeros(*cell.shape(n, {"I": 4, "H": 5}), dtype=torch.float64)
              for n, _ in cell.params})
    # Resets on another device than the sequence would hand the kernels a
    # pointer they cannot read: an error, through the cell and the package.
    params = {n: torch.zeros(*cell.shape(n, {"I": 4, "H": 5})) for n, _ in cell.params}
    elsewhere = torch.zeros(2, 3, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="resets are on meta, but the other tensors are on cpu"):
        cell(torch.zeros(2, 3, 4), params, resets=elsewhere)
    package = cuda.CudaCell(lstm_package(tmp_path), emulate=True)
    H, I = SIZES["H"], SIZES["I"]
    with pytest.raises(ValueError, match="resets are on meta, but the other tensors are on cpu"):
        package({"x": torch.zeros(2, 3, I)},
                {n: torch.zeros(*s) for n, s in (("W_ih", (4 * H, I)), ("W_hh", (4 * H, H)),
                                                 ("b_ih", (4 * H,)), ("b_hh", (4 * H,)))},
                resets=elsewhere)
    with pytest.raises(ValueError, match="package has no kernels for the SIMT emulator"):
        package = edited_package(lstm_package(tmp_path), tmp_path,
                                 lambda meta: meta.pop("simt"))
        cuda.CudaCell(package, emulate=True)


# The host path around the kernels ----------------------------------------------


def test_resets_lengths_and_a_transposed_param(tmp_path):
    # Rows that restart mid-sequence, samples of different lengths and a
    # param that is a transposed view: the driver's host code around the
    # launches, against the CPU kernels in float64.
    path = os.path.join(EXAMPLES, "lstm.cell")
    cpu, emu = cellc.compile(path), cellc.compile(path, target="cuda-emu",
                                                   cuda={"strategy": "persistent", "ctas": 2})
    T, B, I, H = 6, 5, SIZES["I"], SIZES["H"]
    g = torch.Generator().manual_seed(4)
    W_hh_t = 0.3 * torch.randn(H, 4 * H, generator=g, dtype=torch.float64)
    params = {"W_ih": 0.3 * torch.randn(4 * H, I, generator=g, dtype=torch.float64),
              "b_ih": 0.1 * torch.randn(4 * H, generator=g, dtype=torch.float64),
              "b_hh": 0.1 * torch.randn(4 * H, generator=g, dtype=torch.float64)}
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64)
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[3, 1] = resets[2, 4] = True
    lengths = torch.tensor([6, 2, 5, 1, 4])
    weight = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    grads = []
    for cell, dtype in ((cpu, torch.float64), (emu, torch.float32)):
        leaf = W_hh_t.detach().to(dtype).requires_grad_()
        ps = {n: t.detach().to(dtype).requires_grad_() for n, t in params.items()}
        xs = x.detach().to(dtype).requires_grad_()
        out, _ = cell(xs, dict(ps, W_hh=leaf.t()), resets=resets, lengths=lengths,
                      recompute="chunk:2")
        (out.double() * weight).sum().backward()
        grads.append([out.detach().double(), xs.grad.double(), leaf.grad.double()]
                     + [p.grad.double() for p in ps.values()])
    for want, got in zip(*grads):
        assert (got - want).abs().max() <= TOLERANCE["ieee"] * (want.abs().max() + 1e-3)


@pytest.mark.parametrize("module", ["LSTM", "GRU", "LayerNormLSTM"])
def test_the_nn_drop_ins_run_in_the_emulator(module):
    # torch.nn-style modules with target="cuda-emu": the same parameters,
    # outputs and gradients as the module over the CPU kernels.
    results = []
    for target in (None, "cuda-emu"):
        torch.manual_seed(6)
        make = getattr(cellc.nn, module)
        extra = {"num_layers": 2} if module != "LayerNormLSTM" else {}
        rnn = make(SIZES["I"], SIZES["H"], recompute="chunk:2", target=target, **extra)
        x = torch.randn(5, 3, SIZES["I"])
        out, _ = rnn(x)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append([out.detach()] + [p.grad for p in rnn.parameters()])
    for want, got in zip(*results):
        assert (got - want).abs().max() <= 1e-4 * (want.abs().max() + 1e-3)


def test_the_nn_modules_run_an_emulated_cell():
    # cellc.nn.Recurrent over a cell compiled for the emulator trains as the
    # same module over the CPU kernels does.
    path = os.path.join(EXAMPLES, "gru.cell")
    results = []
    for target in (None, "cuda-emu"):
        torch.manual_seed(5)
        model = cellc.nn.Recurrent(cellc.compile(path, target=target), I=SIZES["I"],
                                   H=SIZES["H"], recompute="full")
        x = torch.randn(5, 3, SIZES["I"])
        out, _ = model(x)
        out.pow(2).sum().backward()
        results.append([out.detach()] + [p.grad for p in model.parameters()])
    for want, got in zip(*results):
        assert (got - want).abs().max() <= 1e-4 * (want.abs().max() + 1e-3)


def test_storage_is_a_cuda_option():
    # cuda={"storage": "bf16"} stores x, h and the gates as bf16 whatever the
    # inputs' dtype (they are cast to it, the outputs come in it), as
    # `cellc --storage=bf16` does; "f32" stores float32 from bf16 inputs. A
    # word the command line refuses is refused when the cell is compiled.
    T, B, I, H = 5, 3, SIZES["I"], SIZES["H"]
    torch.manual_seed(2)
    ref = torch.nn.LSTM(I, H).double()
    names = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0, "b_ih": ref.bias_ih_l0,
             "b_hh": ref.bias_hh_l0}
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    want, _ = ref(x)
    weight = torch.randn(T, B, H, dtype=torch.float64)
    (want * weight).sum().backward()
    path = os.path.join(EXAMPLES, "lstm.cell")
    sizes = {"I": I, "H": H}
    for storage, given, dtype in (("bf16", torch.float32, torch.bfloat16),
                                  ("f32", torch.bfloat16, torch.float32)):
        cell = cellc.compile(path, target="cuda-emu", cuda={"storage": storage})
        xs = x.detach().to(given).requires_grad_()
        ps = {n: t.detach().float().requires_grad_() for n, t in names.items()}
        out, final = cell(xs, ps, recompute="full")
        assert out.dtype == dtype and final["c"].dtype == torch.float32
        (out.double() * weight).sum().backward()
        assert xs.grad.dtype == given
        tol = TOLERANCE["bf16"]
        for what, a, b in [("out", out, want), ("dx", xs.grad, x.grad),
                           ("dW_hh", ps["W_hh"].grad, names["W_hh"].grad)]:
            error = (a.double() - b).abs().max().item()
            assert error <= tol * (b.abs().max().item() + 1e-3), f"{storage} {what}: {error:.2e}"
        # What full keeps is c's history, in the storage's element size.
        kept = cell.memory_plan(sizes, T, B, "full")["kept"]
        assert kept == T * B * H * (2 if storage == "bf16" else 4)
    with pytest.raises(ValueError, match="unknown storage 'fp8'; expected 'f32' or 'bf16'"):
        cellc.compile(path, target="cuda-emu", cuda={"storage": "fp8"})
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        cellc.compile(path, cuda={"precision": "fp8"})
