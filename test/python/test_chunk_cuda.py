"""The chunk form's kernel templates as CUDA kernels (runtime/cuda/ChunkKernels.cu,
cellc._chunkcuda: the diagonal core and the delta rule's), run in the SIMT
emulator: against the torch templates in float64, in the chunk form of the
examples against their step kernels, and with a barrier taken out (the
emulator must say where the race is)."""

import os
import shutil
import subprocess

import pytest
import torch

import cellc
from cellc import _chunkcore, _chunkcuda, _chunkwise
from cellc.cuda import CudaError
from test_chunkwise import EXAMPLES, SIZES, arguments, rel, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")


def _inputs(B, H, T, K, V, reads, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = -0.6 * torch.rand(B, H, T, K if rows else 1, generator=g, dtype=torch.float64)
    a = a.expand(B, H, T, K).contiguous()
    k = torch.randn(B, H, T, K, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, V, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    qs = [torch.randn(B, H, T, K, generator=g, dtype=torch.float64) for _ in range(reads)]
    return [a, k, v, S0, *qs]


# (B, H, T, K, V, L, reads): T not a multiple of L; one chunk; V over two
# column tiles of the forward (64 a CTA); K != V; the last two tile the
# tensor cores (K and L multiples of 16, V of 8), the last over two column
# tiles of which the second is 8 wide.
SHAPES = [(2, 2, 37, 8, 12, 16, 2), (1, 2, 16, 4, 70, 16, 1), (1, 1, 9, 16, 6, 4, 1),
          (1, 2, 37, 16, 24, 16, 2), (1, 1, 80, 32, 72, 32, 1)]
TILED = SHAPES[3:]


@pytest.fixture(params=[True, False], ids=["tensor-cores", "fmas"])
def tensor_cores(request, monkeypatch):
    """The kernels' products on the tensor cores where the shape tiles, or
    on FMAs."""
    monkeypatch.setattr(_chunkcuda, "TENSOR_CORES", request.param)
    return request.param


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_cuda_core_matches_the_torch_template(shape, rows, tensor_cores):
    if not tensor_cores and shape not in TILED:
        pytest.skip("the same kernels either way")
    B, H, T, K, V, L, R = shape
    ins = [t.requires_grad_() for t in _inputs(B, H, T, K, V, R, rows)]
    want = _chunkcore._DiagonalCore.apply(ins[0], *ins[1:4], L, rows, *ins[4:])
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    # The first read's output takes no gradient: zeros, not garbage.
    grads[0] = None
    pairs = [(o, w) for o, w in zip(want, grads) if w is not None]
    dwant = torch.autograd.grad([o for o, _ in pairs], ins, [w for _, w in pairs])
    f32 = [t.detach().float().requires_grad_() for t in ins]
    got = _chunkcuda.DiagonalCore.apply(0, f32[0], *f32[1:4], L, *f32[4:])
    assert len(got) == len(want)
    for o, w in zip(got, want):
        assert o.dtype == torch.float32 and w.abs().max() > 0
        assert rel(o.double(), w) < 1e-5
    dgot = torch.autograd.grad([got[i] for i, w in enumerate(grads) if w is not None], f32,
                               [w.float() for w in grads if w is not None])
    for name, d, w in zip(["a", "k", "v", "S0"] + [f"q{r}" for r in range(R)], dgot, dwant):
        if name == "q0":
            assert w.abs().max() == 0 and d.abs().max() == 0
            continue
        assert w.abs().max() > 0, name
        assert rel(d.double(), w) < 1e-5, name


def _delta_inputs(B, H, T, K, V, reads, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = -0.6 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    k = torch.nn.functional.normalize(
        torch.randn(B, H, T, K, generator=g, dtype=torch.float64), dim=-1)
    w = torch.randn(B, H, T, V, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, 1, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    qs = [torch.randn(B, H, T, K, generator=g, dtype=torch.float64) for _ in range(reads)]
    return [a, k, w, beta, S0, *qs]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_cuda_delta_core_matches_the_torch_template(shape, tensor_cores):
    if not tensor_cores and shape not in TILED:
        pytest.skip("the same kernels either way")
    B, H, T, K, V, L, R = shape
    ins = [t.requires_grad_() for t in _delta_inputs(B, H, T, K, V, R)]
    want = _chunkcore._DeltaCore.apply(*ins[:5], L, *ins[5:])
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    grads[0] = None
    keep = [i for i, w in enumerate(grads) if w is not None]
    dwant = torch.autograd.grad([want[i] for i in keep], ins, [grads[i] for i in keep])
    f32 = [t.detach().float().requires_grad_() for t in ins]
    got = _chunkcuda.DeltaCore.apply(0, *f32[:5], L, *f32[5:])
    assert len(got) == len(want)
    for o, w in zip(got, want):
        assert o.dtype == torch.float32 and w.abs().max() > 0
        assert rel(o.double(), w) < 1e-5
    dgot = torch.autograd.grad([got[i] for i in keep], f32, [grads[i].float() for i in keep])
    names = ["a", "k", "w", "beta", "S0"] + [f"q{r}" for r in range(R)]
    for name, d, w in zip(names, dgot, dwant):
        assert d.shape == w.shape, name
        if name == "q0":
            assert w.abs().max() == 0 and d.abs().max() == 0
            continue
        assert w.abs().max() > 0, name
        assert rel(d.double(), w) < 1e-5, name


@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("name", ["gla", "retnet", "mlstm", "deltanet", "gated_deltanet"])
def test_the_chunk_form_trains_on_the_cuda_core_in_the_emulator(name, mode, monkeypatch):
    # target="cuda-emu" with lengths and no resets: the core runs on its
    # CUDA kernels in the emulator, the rest as before, in float32, against
    # the step kernels in float64.
    T, B = 23, 3
    cell = cellc.compile(os.path.join(EXAMPLES, name + ".cell"))
    x, params, states = arguments(cell, name, T, B, torch.float64, seed=4)
    options = dict(lengths=[T, 11, 18])
    want = run(cell, x, params, states, **options)
    emu = cellc.compile(os.path.join(EXAMPLES, name + ".cell"), target="cuda-emu")
    delta = "delta" in name
    core = _chunkcuda.DeltaCore if delta else _chunkcuda.DiagonalCore
    ran, real = [], core.apply

    def counted(*args):
        ran.append(args[6 if delta else 5])
        return real(*args)
    monkeypatch.setattr(core, "apply", counted)
    f32 = lambda t: t.detach().float().requires_grad_()
    got = run(emu, f32(x), {n: f32(t) for n, t in params.items()},
              {n: f32(t) for n, t in states.items()}, form="chunk", chunk=8, recompute=mode,
              **options)
    # mLSTM has two linear states (C and n): a core each.
    assert ran == [8] * (2 if name == "mlstm" else 1)
    assert rel(got[0].double(), want[0]) < 2e-5
    for n in want[1]:
        assert rel(got[1][n].double(), want[1][n]) < 2e-5, n
    for n in want[2]:
        assert want[2][n].abs().max() > 0, n
        assert rel(got[2][n].double(), want[2][n]) < 2e-5, n


def test_a_shape_the_kernels_do_not_hold_runs_the_torch_template(monkeypatch):
    # K = V = 256 at L = 64: the backward's shared memory (the state's
    # gradient alone is 256 KiB) is more than a GPU grants a CTA.
    kern = _chunkcuda.kernels(CPU)
    assert not _chunkcuda.usable(CPU, 64, 1, 256, 256, 64, 1, torch.float32)
    assert _chunkcuda.usable(CPU, 64, 1, 64, 64, 64, 1, torch.float32)
    assert not _chunkcuda.usable(CPU, 64, 1, 64, 64, 64, 1, torch.float64)
    assert kern.admits(_chunkcuda._shape(64, 1, 64, 64, 64, 1))
    # The delta rule's backward holds more: K = V = 128 fits at L = 32, not
    # at L = 64.
    assert _chunkcuda.usable(CPU, 64, 1, 128, 128, 32, 1, torch.float32, delta=True)
    assert not _chunkcuda.usable(CPU, 64, 1, 128, 128, 64, 1, torch.float32, delta=True)
    ran = []
    monkeypatch.setattr(_chunkcuda.DiagonalCore, "apply", lambda *a: ran.append(a))
    ins = [t.float() for t in _inputs(1, 1, 70, 256, 256, 1, True)]
    outs, S = _chunkcore._kept("none", "diagonal", ins[0], None, ins[1], ins[2], ins[3],
                               [(ins[4], True)], None, 64, True, None, native=False,
                               cuda_seed=0)
    want = _chunkcore._DiagonalCore.apply(ins[0], *ins[1:4], 64, True, ins[4])
    assert ran == []
    assert rel(outs[0], want[0]) == 0 and rel(S, want[1]) == 0


def test_the_kernels_fall_back_to_fmas_where_the_tensor_cores_do_not_fit(monkeypatch):
    # The delta rule at K = V = 96, L = 64: its tensor-core backward needs
    # 250,624 bytes of shared memory (more than the 232,448 a CTA may have),
    # its FMA one less: the call runs on FMAs, and still matches.
    kern = _chunkcuda.kernels(CPU)
    fit = kern.fitting(_chunkcuda._shape(70, 1, 96, 96, 64, 1), delta=True)
    assert fit is not None and fit.tensor_cores == 0
    assert kern.fitting(_chunkcuda._shape(70, 1, 96, 96, 64, 1), delta=False).tensor_cores == 1
    assert kern.fitting(_chunkcuda._shape(70, 1, 128, 128, 64, 1), delta=False) is None
    monkeypatch.setattr(_chunkcuda, "TENSOR_CORES", True)
    ins = [t.requires_grad_() for t in _delta_inputs(1, 1, 70, 96, 96, 1)]
    want = _chunkcore._DeltaCore.apply(*ins[:5], 64, ins[5])
    f32 = [t.detach().float().requires_grad_() for t in ins]
    got = _chunkcuda.DeltaCore.apply(0, *f32[:5], 64, f32[5])
    assert rel(got[0].double(), want[0]) < 1e-5 and rel(got[1].double(), want[1]) < 1e-5
    # A call at a shape neither fits says why, in the driver's words.
    big = [t.float() for t in _inputs(1, 1, 70, 128, 128, 1, True)]
    with pytest.raises(CudaError, match="shared memory"):
        _chunkcuda.DiagonalCore.apply(0, big[0], *big[1:4], 64, big[4])


def test_the_kernels_refuse_a_bad_shape_and_a_missing_object():
    kern = _chunkcuda.kernels(CPU)
    buf = cellc.cuda._error_buffer()
    shape = _chunkcuda._shape(0, 1, 4, 4, 4, 1)
    assert kern._lib.cellc_cuda_chunk_admit(kern._handle, shape, 0, buf, len(buf)) == 1
    assert "T, K, V, L and reads >= 1" in buf.value.decode()
    # A call at the shape: the same words, and nothing runs.
    with pytest.raises(CudaError, match=r"reads >= 1 \(BH=1, T=0\)"):
        kern.call("chunk_forward", shape, [torch.zeros(1)] * 9, torch.zeros(1))
    lib = _chunkcuda._lib()
    assert not lib.cellc_cuda_chunk_open(-1, b"/nonexistent/chunk.so", 0, buf, len(buf))
    assert "/nonexistent/chunk.so" in buf.value.decode()


# The N-th bar.sync of ChunkKernels.cu's IR (from 0, in the module's order:
# the diagonal forward's 0-6, on the tensor cores 7-15, its backward 16-24
# and 25-34, the delta rule's forward 35-43 and 44-54, backward 55-70 and
# 71-90), one a kernel.
BARRIERS = [(2, "diag_forward"), (9, "diag_forward_tc"), (18, "diag_backward"),
            (27, "diag_backward_tc"), (37, "delta_forward"), (46, "delta_forward_tc"),
            (59, "delta_backward"), (74, "delta_backward_tc")]


@pytest.mark.parametrize("barrier,kernel", BARRIERS)
def test_the_emulator_finds_a_missing_barrier_in_the_chunk_kernels(barrier, kernel, tmp_path,
                                                                   monkeypatch):
    # Without one bar.sync, threads race on shared memory: the emulator says
    # so and names the kernel. (The object has its own path: dlopen would
    # give back one already open.)
    path = str(tmp_path / f"planted{barrier}.so")
    cellc._cellc.chunk_kernels_simt(path, f"drop-barrier:{barrier}")
    monkeypatch.setattr(_chunkcuda, "_OBJECT", path)
    monkeypatch.setattr(_chunkcuda, "_OPEN", {})
    monkeypatch.setattr(_chunkcuda, "TENSOR_CORES", kernel.endswith("_tc"))
    # A shape the tensor cores tile: K = V = L = 16, two chunks and a half.
    if kernel.startswith("delta"):
        ins = [t.float().requires_grad_() for t in _delta_inputs(1, 2, 40, 16, 16, 1)]
        core = lambda: _chunkcuda.DeltaCore.apply(0, *ins[:5], 16, ins[5])
    else:
        ins = [t.float().requires_grad_() for t in _inputs(1, 2, 40, 16, 16, 1, True)]
        core = lambda: _chunkcuda.DiagonalCore.apply(0, ins[0], *ins[1:4], 16, ins[4])
    with pytest.raises(CudaError, match=f"shared-memory race in kernel cellc_chunk_{kernel},"):
        out = core()
        torch.autograd.grad(out, ins, [torch.ones_like(o) for o in out])


@pytest.mark.parametrize("delta", [False, True])
def test_the_tensor_core_forwards_read_the_fragments_the_isa_lays_out(delta, tmp_path,
                                                                     monkeypatch):
    # With each mma.sync's A registers 0 and 1 swapped (rows g and g + 8 of
    # the A fragment), the forwards on the tensor cores are wrong and those
    # on FMAs are not: the emulator runs the products on its mma.sync.
    path = str(tmp_path / f"swapped{int(delta)}.so")
    cellc._cellc.chunk_kernels_simt(path, "swap-mma-a")
    monkeypatch.setattr(_chunkcuda, "_OBJECT", path)
    monkeypatch.setattr(_chunkcuda, "_OPEN", {})
    B, H, T, K, V, L, R = TILED[0]
    errors = {}
    for tc in (True, False):
        monkeypatch.setattr(_chunkcuda, "TENSOR_CORES", tc)
        if delta:
            ins = _delta_inputs(B, H, T, K, V, R)
            want = _chunkcore._DeltaCore.apply(*ins[:5], L, *ins[5:])
            got = _chunkcuda.DeltaCore.apply(0, *[t.float() for t in ins[:5]], L,
                                             *[t.float() for t in ins[5:]])
        else:
            ins = _inputs(B, H, T, K, V, R, True)
            want = _chunkcore._DiagonalCore.apply(ins[0], *ins[1:4], L, True, *ins[4:])
            f32 = [t.float() for t in ins]
            got = _chunkcuda.DiagonalCore.apply(0, f32[0], *f32[1:4], L, *f32[4:])
        errors[tc] = rel(got[0].double(), want[0])
    assert errors[True] > 1e-2 and errors[False] < 1e-5, errors


@pytest.mark.skipif(shutil.which("clang-19") is None, reason="needs clang-19")
def test_the_kernels_ptx_and_ir_are_what_the_script_writes(tmp_path):
    (tmp_path / "ptx").mkdir()
    (tmp_path / "ll").mkdir()
    subprocess.run([os.path.join(ROOT, "scripts", "gen-chunk-kernels.sh"),
                    str(tmp_path / "ptx"), str(tmp_path / "ll")], check=True,
                   capture_output=True)
    for made, kept in [("ptx/ChunkKernels.ptx.inc", "runtime/cuda/ChunkKernels.ptx.inc"),
                       ("ll/ChunkKernels.ll.inc", "compiler/Pipelines/ChunkKernels.ll.inc")]:
        with open(os.path.join(ROOT, kept)) as f:
            assert (tmp_path / made).read_text() == f.read(), \
                "run scripts/gen-chunk-kernels.sh"


PTXAS = os.environ.get("PTXAS", "/usr/local/cuda/bin/ptxas")


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="needs ptxas (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernels_ptx_assembles_without_spills(arch, tmp_path):
    with open(os.path.join(ROOT, "runtime/cuda/ChunkKernels.ptx.inc")) as f:
        lines = f.read().splitlines()
    ptx = tmp_path / "chunk.ptx"
    ptx.write_text("\n".join(lines[2:-1]) + "\n")
    report = subprocess.run([PTXAS, f"-arch={arch}", "-v", str(ptx), "-o", os.devnull],
                            check=True, capture_output=True, text=True).stderr
    kernels = [f"cellc_chunk_{t}_{d}{tc}" for t in ("diag", "delta")
               for d in ("forward", "backward") for tc in ("", "_tc")]
    assert report.count("Compiling entry function") == len(kernels), report
    assert report.count("0 bytes spill stores") == len(kernels), report
    for kernel in kernels:
        assert f"'{kernel}'" in report, kernel
    # A CTA of 256 threads fits an SM's 64K registers.
    import re
    used = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    assert len(used) == len(kernels) and max(used) * 256 <= 65536, used


def test_the_gpu_runs_timing_table_runs(monkeypatch, capsys):
    # test/gpu/chunk_core.py's bench() runs only on a GPU, once a session:
    # here at a tiny shape in the emulator (torch's CUDA counters as no-ops),
    # so that a row that would fail there fails here first. Each row of
    # cellc's gives a time for forward + backward and for the forward alone.
    import importlib
    import sys
    monkeypatch.setattr(sys, "argv", ["chunk_core.py", "--emulate"])
    monkeypatch.syspath_prepend(os.path.join(ROOT, "test", "gpu"))
    for name in ("reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 0)
    # Imported afresh, and gone after (monkeypatch puts sys.modules' entry
    # back as it was).
    monkeypatch.setitem(sys.modules, "chunk_core", None)
    del sys.modules["chunk_core"]
    chunk_core = importlib.import_module("chunk_core")
    chunk_core.bench((1, 1, 40, 16, 16, 16))
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "cellc" in line]
    assert len(rows) == 6
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0, row
