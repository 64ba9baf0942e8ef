"""The CUDA runtime without a GPU: a clear error and no crash, and AOT
packages that round-trip from `cellc --emit=package` to `cellc.cuda`."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import TOOLS
import cellc
from cellc import cuda

CELLC = os.path.join(TOOLS, "cellc")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def make_package(tmp_path, cell="lstm", *flags):
    out = tmp_path / cell
    subprocess.run([CELLC, os.path.join(EXAMPLES, cell + ".cell"), "-D", "H=32", "-D", "I=16",
                    "--emit=package", "-o", str(out), *flags], check=True)
    return out


def test_package_round_trip(tmp_path):
    pkg = cuda.Package(str(make_package(tmp_path, "lstm", "--arch=sm_80")))
    assert pkg.cell == "lstm"
    assert pkg.meta["arch"] == "sm_80" and pkg.meta["sizes"] == {"H": 32, "I": 16}
    assert set(pkg.kernels) == {"lstm_fwd", "lstm_bwd"}
    for variant in ("save", "replay"):
        assert ".target sm_80" in pkg.ptx[variant]
        assert ".entry lstm_fwd" in pkg.ptx[variant] and ".entry lstm_bwd" in pkg.ptx[variant]
    fwd = pkg.kernels["lstm_fwd"]
    assert 1 <= fwd["batch_tile"] <= 4 and fwd["threads"] == 256
    kinds = [a["kind"] for a in fwd["args"]]
    assert kinds[:3] == ["input", "projection", "resets"]
    # The batch range, then W_hh transposed: batch-tiled threads read its
    # rows along the lanes.
    assert kinds[-3:] == ["batch_begin", "batch_end", "param_transposed"]
    assert fwd["args"][-1]["name"] == "W_hh" and fwd["args"][-1]["shape"] == [32, 128]
    assert kinds.count("end_state") == 2
    proj = fwd["args"][1]
    assert proj["name"] == "W_ih" and proj["biases"] == ["b_ih", "b_hh"]
    assert proj["shape"] == [-1, -1, 128]
    # The variants differ only in the gate stores and loads.
    assert pkg.ptx["save"] != pkg.ptx["replay"]


def test_bad_packages_are_errors(tmp_path):
    with pytest.raises(ValueError, match="no package in .*: cannot read .*kernels.json"):
        cuda.Package(str(tmp_path))
    (tmp_path / "kernels.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="unknown package format 99"):
        cuda.Package(str(tmp_path))
    bad = subprocess.run([CELLC, os.path.join(EXAMPLES, "lstm.cell"), "-D", "H=8", "-D", "I=4",
                          "--emit=package"], capture_output=True, text=True)
    assert bad.returncode == 1 and "give it with -o DIR" in bad.stderr


@pytest.mark.skipif(cuda.available()[0], reason="a CUDA driver and GPU are present")
def test_no_driver_is_a_clear_error(tmp_path):
    ok, why = cuda.available()
    assert not ok and why.startswith("no CUDA driver/GPU")
    pkg = cuda.Package(str(make_package(tmp_path)))
    with pytest.raises(cuda.CudaUnavailable, match="no CUDA driver/GPU"):
        cuda.CudaCell(pkg)
    # Asking again gives the same answer: a failed load is not cached broken.
    assert cuda.available() == (ok, why)


def test_persistent_and_tensor_core_packages(tmp_path):
    pkg = cuda.Package(str(make_package(tmp_path, "gru", "--strategy=persistent")))
    assert pkg.meta["strategy"] == "persistent" and pkg.meta["precision"] == "ieee"
    assert pkg.meta["storage"] == "f32"
    for name in ("gru_fwd", "gru_bwd"):
        k = pkg.kernels[name]
        assert k["strategy"] == "persistent" and k["ctas"] >= 1
        assert k["workspace_bytes"] > 0
        assert 0 < k["dynamic_shared_bytes"] <= 49152
        kinds = [a["kind"] for a in k["args"]]
        assert kinds[-4:] == ["batch_begin", "batch_end", "workspace", "grid_barrier"]
        # The grid barrier's words, a count and a generation on their own
        # 128-byte lines per grid row.
        assert k["barrier_words"] == 64
    for variant in ("save", "replay"):
        assert "ld.acquire.gpu.u32" in pkg.ptx[variant]
        assert "atom.add.acq_rel.gpu.u32" in pkg.ptx[variant]
    mma = cuda.Package(str(make_package(tmp_path / "mma", "lstm", "--precision=bf16")))
    assert mma.meta["precision"] == "bf16"
    assert mma.kernels["lstm_fwd"]["strategy"] == "batch-tiled"
    assert "mma.sync.aligned.m16n8k16" in mma.ptx["save"]


def emulated(tmp_path, cell="lstm", *flags):
    """A package's kernels in the SIMT emulator: the C++ host side that a GPU
    runs, with the launches in the emulator and the GEMMs on the CPU."""
    return cuda.CudaCell(cuda.Package(str(make_package(tmp_path, cell, "--simt", *flags))),
                         emulate=True)


def lstm_params(I=16, H=32, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.LSTM(I, H)
    return ref, {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
                 "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}


@pytest.mark.parametrize("recompute,storage", [("none", "f32"), ("full", "f32"),
                                               ("chunk:3", "f32"), ("none", "bf16"),
                                               ("chunk:3", "bf16")])
def test_cuda_cell_host_side(tmp_path, recompute, storage):
    cell = emulated(tmp_path, "lstm", "--strategy=persistent", "--storage=" + storage)
    T, B = 7, 5
    dtype = torch.bfloat16 if storage == "bf16" else torch.float32
    _, params = lstm_params()
    x = (0.5 * torch.randn(T, B, 16)).to(dtype).requires_grad_()
    # A GPU's CudaCell insists on CUDA tensors, the emulator's on CPU ones
    # (the one checker, cellc._front).
    gpu = cellc._front.Fixed(None, "CudaCell", [], [], [], [], "cuda")
    with pytest.raises(ValueError, match="CudaCell runs CUDA tensors, but the tensors are on cpu"):
        gpu._placement(x.device)
    with pytest.raises(TypeError, match="float32 or bfloat16 tensors, not torch.float64"):
        cell({"x": x.double()}, params)
    out, final = cell({"x": x}, params, recompute=recompute)
    assert out["h"].shape == (T, B, 32) and final["c"].shape == (B, 32)
    assert out["h"].dtype == dtype and final["c"].dtype == torch.float32
    # Inputs are cast to the package's storage, as a Cell's `storage` option
    # casts them.
    other = torch.float32 if storage == "bf16" else torch.bfloat16
    assert cell({"x": x.detach().to(other)}, params)[0]["h"].dtype == dtype
    with pytest.raises(ValueError, match=r"resets must be a bool tensor of shape \[7, 5\]"):
        cell({"x": x}, params, resets=torch.zeros(5, 7, dtype=torch.bool))
    (out["h"].float().sum() + final["c"].sum()).backward()
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    grad = params["W_hh"].grad
    assert grad.shape == (128, 32) and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # What the calls held: the kept buffers, and each call's workspace.
    stats = cell.memory_stats()
    assert stats["kept_bytes"] == cell.saved_bytes > 0
    assert stats["forward_workspace_bytes"] > 0 and stats["backward_workspace_bytes"] > 0


def test_recompute_modes_are_checked(tmp_path):
    # The C++ runtime parses the mode (one parse function); a bad one is a
    # ValueError, before any kernel runs.
    cell = emulated(tmp_path)
    _, params = lstm_params()
    x = torch.randn(3, 2, 16)
    for bad in ("chunk:0", "chunk:x", "some", 7):
        with pytest.raises(ValueError, match="recompute must be 'none', 'full' or 'chunk:K' "
                                             "with K > 0, not"):
            cell({"x": x}, params, recompute=bad)
    for bad in ("chunk:0", "full "):
        with pytest.raises(ValueError, match="recompute must be"):
            cell.memory_plan(3, 2, bad)


def reference_lstm(ref, x, h0, c0, resets, lengths):
    """torch.nn.LSTM, one step at a time, with resets to the initial states;
    with lengths, a sample's state stops changing and its outputs are zero
    after its last step."""
    T, B = x.shape[:2]
    h, c, outs = h0[None], c0[None], []
    for t in range(T):
        alive = torch.tensor([lengths is None or t < n for n in (lengths or [T] * B)])
        alive = alive[None, :, None]
        m = resets[t][None, :, None] & alive
        h, c = torch.where(m, h0[None], h), torch.where(m, c0[None], c)
        o, (h2, c2) = ref(x[t:t + 1], (h, c))
        h, c = torch.where(alive, h2, h), torch.where(alive, c2, c)
        outs.append(torch.where(alive, o, torch.zeros_like(o)))
    return torch.cat(outs), h[0], c[0]


@pytest.mark.parametrize("recompute", ["none", "full", "chunk:3"])
@pytest.mark.parametrize("lengths", [None, [8, 3, 0, 6]])
def test_the_host_side_against_torch(tmp_path, recompute, lengths):
    # The C++ host side around real kernels (chunks, pieces, carried
    # gradients, resets, lengths, the GEMMs and column sums) against
    # torch.nn.LSTM in float64: forward, final states and every gradient.
    cell = emulated(tmp_path)
    T, B, I, H = 8, 4, 16, 32
    ref, params = lstm_params(I, H)
    x = torch.randn(T, B, I, requires_grad=True)
    h0 = (torch.randn(B, H) * 0.5).requires_grad_()
    c0 = (torch.randn(B, H) * 0.5).requires_grad_()
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[3, 1] = resets[5, 2] = resets[6, 1] = True
    g_out, g_h, g_c = torch.randn(T, B, H), torch.randn(B, H), torch.randn(B, H)

    out, final = cell({"x": x}, params, {"h": h0, "c": c0}, resets, recompute, lengths)
    if lengths is None and recompute != "chunk:3":
        # h's history is the output: kept once.
        assert cell.saved_bytes == (T * B * H * 4) * (1 if recompute == "full" else 6)
    ((out["h"] * g_out).sum() + (final["h"] * g_h).sum() + (final["c"] * g_c).sum()).backward()
    got = [out["h"].detach(), final["h"].detach(), final["c"].detach(), x.grad, h0.grad,
           c0.grad] + [p.grad for p in params.values()]

    ref64 = ref.double()
    leaves = [t.detach().double().requires_grad_() for t in (x, h0, c0)]
    want_out, hT, cT = reference_lstm(ref64, *leaves, resets, lengths)
    ((want_out * g_out.double()).sum() + (hT * g_h.double()).sum()
     + (cT * g_c.double()).sum()).backward()
    want = [want_out.detach(), hT.detach(), cT.detach()] + [t.grad for t in leaves]
    want += [p.grad for p in (ref64.weight_ih_l0, ref64.weight_hh_l0, ref64.bias_ih_l0,
                              ref64.bias_hh_l0)]
    for name, a, b in zip(["h", "h_T", "c_T", "dx", "dh0", "dc0", "dW_ih", "dW_hh", "db_ih",
                           "db_hh"], got, want):
        error = (a.double() - b).abs().max().item()
        assert error <= 1e-4 * (b.abs().max().item() + 1e-3), f"{recompute}, {name}: {error:.2e}"


def test_the_plan_keeps_pieces_within_what_full_keeps(tmp_path):
    # On the device, none projects the whole sequence at once; full keeps
    # c's history (h's is the output) and takes pieces whose projections
    # are no larger; chunk:K bounds its pieces by its chunks. The plan is the
    # runtime's dry run of the same calls.
    cell = emulated(tmp_path)
    T, B, H = 128, 64, 32
    none, full = cell.memory_plan(T, B, "none"), cell.memory_plan(T, B, "full")
    chunk = cell.memory_plan(T, B, "chunk:16")
    assert none["piece_steps"] == T and chunk["piece_steps"] == T
    # c is H wide, the gates' projection 4 H: a piece of T / 4 steps.
    assert full["piece_steps"] == T // 4
    assert full["kept"] == T * B * H * 4 and full["kept_outputs"] == T * B * H * 4
    # The GEMM library's workspace: cuBLAS's 32 MiB on sm_90
    # (CudaBackend::kHopperGemmWorkspaceBytes).
    gemm = 32 << 20
    projection = T * B * 4 * H * 4
    assert none["forward_peak"] - none["kept"] >= projection
    assert full["forward_peak"] - full["kept"] - gemm <= 1.1 * projection / 4
    assert chunk["kept"] == -(-T // 16) * B * 2 * H * 4
    assert chunk["backward_peak"] < full["backward_peak"] < none["backward_peak"]
    assert none["peak"] > full["peak"] > chunk["peak"] >= chunk["floor"]


@pytest.mark.parametrize("recompute", ["none", "full", "chunk:3"])
def test_the_plan_is_what_a_call_uses(tmp_path, recompute):
    # The workspace a call used is what the plan's dry run said, on the
    # emulator as on a GPU: the same host code places the same buffers.
    cell = emulated(tmp_path)
    T, B = 7, 5
    _, params = lstm_params()
    x = torch.randn(T, B, 16, requires_grad=True)
    out, _ = cell({"x": x}, params, recompute=recompute)
    out["h"].sum().backward()
    plan, stats = cell.memory_plan(T, B, recompute), cell.memory_stats()
    assert stats["kept_bytes"] == plan["kept"] == cell.saved_bytes
    assert stats["forward_workspace_bytes"] == plan["forward_peak"] - plan["kept"]
    assert stats["backward_workspace_bytes"] == plan["backward_peak"] - plan["kept"]


def test_a_call_too_large_for_its_workspace_runs_once_in_a_larger_one(tmp_path, monkeypatch):
    # The first call of a shape finds its workspace too small (nothing runs)
    # and runs in one of the size the dry run asked for; the next call of
    # that shape allocates that size at once.
    cell = emulated(tmp_path)
    _, params = lstm_params()
    calls = []
    forward = cell._lib.cellc_cuda_forward

    def counted(*args):
        calls.append(args[1]._obj.workspace_bytes)
        return forward(*args)

    monkeypatch.setattr(cell._lib, "cellc_cuda_forward", counted)
    x = torch.randn(4, 3, 16)
    with torch.no_grad():
        first, _ = cell({"x": x}, params)
        assert len(calls) == 2 and calls[0] == 0 and calls[1] > 0
        again, _ = cell({"x": x}, params)
    assert len(calls) == 3 and calls[2] == calls[1]
    assert torch.equal(first["h"], again["h"])


def test_no_python_runs_inside_a_call(tmp_path):
    # A forward and a backward are one C call each: a profiler sees no
    # Python function called between a call's entry and its return (no
    # callback into Python), and the count of Python calls does not grow
    # with the sequence.
    cell = emulated(tmp_path)
    _, params = lstm_params()
    lib = cell._lib
    inside = []
    wrapped = {}
    for name in ("cellc_cuda_forward", "cellc_cuda_backward"):
        fn = getattr(lib, name)

        def call(*args, fn=fn, name=name):
            inside.append(name)
            try:
                return fn(*args)
            finally:
                inside.pop()
        wrapped[name] = call

    def python_calls(T):
        x = torch.randn(T, 3, 16, requires_grad=True)
        seen, during = [0], []

        def profile(frame, event, arg):
            if event == "call":
                seen[0] += 1
                if inside:
                    during.append(frame.f_code.co_name)

        out, _ = cell({"x": x}, params, recompute="chunk:2")  # warm: workspaces sized
        out["h"].sum().backward()
        x.grad = None
        sys.setprofile(profile)
        try:
            out, _ = cell({"x": x}, params, recompute="chunk:2")
            out["h"].sum().backward()
        finally:
            sys.setprofile(None)
        assert not during, f"Python ran inside a C call: {during[:5]}"
        return seen[0]

    saved = {name: getattr(lib, name) for name in wrapped}
    try:
        for name, call in wrapped.items():
            setattr(lib, name, call)
        short, long = python_calls(4), python_calls(32)
    finally:
        for name, fn in saved.items():
            setattr(lib, name, fn)
    assert short == long, (short, long)


def test_a_second_backward_finds_what_forward_kept(tmp_path):
    # What forward kept (and the output it reads as h's history) lives with
    # the graph, not only until the first backward.
    cell = emulated(tmp_path)
    _, params = lstm_params()
    x = torch.randn(5, 3, 16, requires_grad=True)
    out, _ = cell({"x": x}, params, recompute="full")
    out["h"].sum().backward(retain_graph=True)
    first = x.grad.clone()
    out["h"].sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)


def test_a_new_compiler_build_rebuilds_the_packages(monkeypatch):
    # The package cache is keyed by the compiler's build, not its version
    # string alone: kernels fixed under the same version are rebuilt.
    from cellc import _targets
    cell = cellc.compile(os.path.join(EXAMPLES, "elman.cell"))
    sizes = {"I": 3, "H": 4}
    first = cell.cuda_package(sizes)
    assert cell.cuda_package(sizes) == first
    monkeypatch.setattr(_targets, "_compiler_build", lambda: "another build")
    assert cell.cuda_package(sizes) != first


NVCC = "/usr/local/cuda/bin/nvcc"
PTXAS = "/usr/local/cuda/bin/ptxas"


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc at /usr/local/cuda")
def test_the_runtimes_own_kernels_are_those_of_their_source(tmp_path):
    # HostKernels.ptx.inc is generated from HostKernels.cu and committed, so
    # that the runtime builds without nvcc: it must be what the source gives.
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = tmp_path / "HostKernels.ptx.inc"
    subprocess.run([os.path.join(root, "scripts", "gen-host-kernels.sh"), str(out)],
                   check=True, capture_output=True)
    committed = os.path.join(root, "runtime", "cuda", "HostKernels.ptx.inc")
    with open(committed) as f:
        assert out.read_text() == f.read(), "run scripts/gen-host-kernels.sh"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="no ptxas at /usr/local/cuda")
def test_the_runtimes_own_kernels_assemble_for_sm_90(tmp_path):
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "runtime", "cuda", "HostKernels.ptx.inc")) as f:
        text = f.read()
    ptx = text[text.index('R"cellc_ptx(') + len('R"cellc_ptx('):text.rindex(')cellc_ptx"')]
    # PTX ISA 8.0, which CUDA 12.0's drivers JIT; not nvcc's newest.
    assert "\n.version 8.0\n" in ptx and "\n.target sm_80\n" in ptx
    (tmp_path / "host.ptx").write_text(ptx)
    done = subprocess.run([PTXAS, "-arch=sm_90", "-v", str(tmp_path / "host.ptx"), "-o",
                           str(tmp_path / "host.cubin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kernels = ("convert", "accumulate", "fill_rows", "column_parts", "column_fold")
    for kernel in kernels:
        assert f"cellc_rt_{kernel}" in done.stderr
    spills = [line for line in done.stderr.splitlines() if "spill" in line]
    assert len(spills) >= len(kernels)
    assert all("0 bytes spill stores, 0 bytes spill loads" in line for line in spills), spills


@pytest.mark.parametrize("lengths", [False, True], ids=["no lengths", "lengths"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_a_calls_device_api_calls_do_not_grow_with_T(name, lengths):
    # Every call a GPU's driver and cuBLAS would get, counted by the
    # emulator's device: launches, GEMMs, copies, memsets and the runtime's
    # kernels, forward and backward. In none and full they are the same at
    # T and 2 T: full cuts a sequence into at most 8 pieces (a GRU, whose
    # states are all outputs, too), and lengths are masks, gathers and adds
    # on the device, one pass a view, not a call a step or a sample. chunk:K
    # runs a replay a chunk: more calls at 2 T.
    # A warp a CTA: the emulator runs fewer threads; the calls are the same.
    cell = cellc.compile(os.path.join(EXAMPLES, name + ".cell"), target="cuda-emu",
                         cuda={"cta_threads": 32})
    sizes = {"I": 8, "H": 16}
    # B = 128 rows: full's pieces at least 8 steps (1024 rows), at most 8 a
    # sequence, so 8 at both T = 64 and 128. (With lengths a GRU's states'
    # histories are kept, and its pieces are a third of T, as an LSTM's a
    # quarter.)
    B = 64 if lengths else 128
    device = cell._cuda_cell(sizes, torch.float32, torch.device("cpu"))

    def calls(T, mode):
        torch.manual_seed(T)
        ps = {n: (0.3 * torch.randn(*cell.shape(n, sizes))).requires_grad_()
              for n, _ in cell.params}
        x = torch.randn(T, B, 8, requires_grad=True)
        # Four lengths at any T (sorted: the forward's rows drop out too).
        given = ([T] * 16 + [T - 5] * 16 + [T // 2] * 16 + [3] * 16) if lengths else None
        device.device_calls(reset=True)
        out, _ = cell(x, ps, recompute=mode, lengths=given)
        out.sum().backward()
        return device.device_calls(reset=True)

    T = 64
    for mode in ("none", "full"):
        short, long = calls(T, mode), calls(2 * T, mode)
        assert short == long, f"{mode}: {short} at T = {T}, {long} at T = {2 * T}"
        assert short["launch"] >= 2 and short["gemm"] >= 2
        if lengths:
            assert short["mask_past_lengths"] >= 2 and short["gather_at_lengths"] >= 1
    if name == "gru" and not lengths:
        short, long = calls(T, f"chunk:{T // 2}"), calls(2 * T, f"chunk:{T // 2}")
        assert long["launch"] > short["launch"]
