"""The CUDA runtime without a GPU: a clear error and no crash, and AOT
packages that round-trip from `cellc --emit=package` to `cellc.cuda`."""

import json
import os
import subprocess

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
    assert kinds[-2:] == ["batch_begin", "batch_end"]
    proj = fwd["args"][1]
    assert proj["name"] == "W_ih" and proj["biases"] == ["b_ih", "b_hh"]
    assert proj["shape"] == [-1, -1, 128]
    # The variants differ only in the gate stores and loads.
    assert pkg.ptx["save"] != pkg.ptx["replay"]


def test_bad_packages_are_errors(tmp_path):
    with pytest.raises(ValueError, match="not a cellc package"):
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
    for variant in ("save", "replay"):
        assert "fence.acq_rel.gpu" in pkg.ptx[variant]
    mma = cuda.Package(str(make_package(tmp_path / "mma", "lstm", "--precision=bf16")))
    assert mma.meta["precision"] == "bf16"
    assert mma.kernels["lstm_fwd"]["strategy"] == "batch-tiled"
    assert "mma.sync.aligned.m16n8k16" in mma.ptx["save"]


class _Recorder(cuda.CudaCell):
    """A CudaCell whose launches are recorded instead of run: the host side
    (arguments, workspace, chunks, gradient GEMMs) without a GPU."""

    def __init__(self, package):
        self.package = package
        self.modules = {}
        self.launches = []

    def _check_tensors(self, tensors):
        pass  # CPU tensors stand in for CUDA ones

    def launch(self, kernel, variant, tensors, batch, stream=None):
        info = self.package.kernels[kernel]
        for arg, t in zip(info["args"], tensors):
            if arg["memref"]:
                assert t.dim() == len(arg["shape"]), (kernel, arg)
                assert all(s in (-1, d) for s, d in zip(arg["shape"], t.shape)), (kernel, arg)
                assert t.dtype == cuda._torch_dtype(arg), (kernel, arg, t.dtype)
        self.launches.append((kernel, variant, tensors, batch))
        if info.get("strategy") == "persistent":
            assert tensors[-1].dtype == torch.int32 and not tensors[-1].any()
        # What a kernel writes (the history's last step is the final state);
        # the backward only reads the history, which may be an output.
        writes = (("output", "state_history") if kernel.endswith("_fwd") else
                  ("input_grad", "projection_grad", "weight_rows", "weight_vectors",
                   "param_grad", "initial_state_grad", "start_state_grad"))
        for arg, t in zip(info["args"], tensors):
            if arg["memref"] and arg["kind"] in writes and t.numel():
                t.copy_(torch.rand_like(t))



@pytest.mark.parametrize("recompute,storage", [("none", "f32"), ("full", "f32"),
                                               ("chunk:3", "f32"), ("none", "bf16"),
                                               ("chunk:3", "bf16")])
def test_cuda_cell_host_side(tmp_path, recompute, storage):
    pkg = cuda.Package(str(make_package(tmp_path, "lstm", "--strategy=persistent",
                                        "--storage=" + storage)))
    cell = _Recorder(pkg)
    T, B = 7, 5
    dtype = torch.bfloat16 if storage == "bf16" else torch.float32
    x = torch.randn(T, B, 16).to(dtype).requires_grad_()
    params = {"W_ih": torch.randn(128, 16, requires_grad=True),
              "W_hh": torch.randn(128, 32, requires_grad=True),
              "b_ih": torch.randn(128, requires_grad=True),
              "b_hh": torch.randn(128, requires_grad=True)}
    # The real CudaCell insists on CUDA tensors; the recorder takes CPU ones.
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda.CudaCell._check_tensors(cell, [x])
    with pytest.raises(TypeError, match="float32"):
        cuda.CudaCell._check_tensors(cell, [x.double()])
    out, final = cell({"x": x}, params, recompute=recompute)
    assert out["h"].shape == (T, B, 32) and final["c"].shape == (B, 32)
    assert out["h"].dtype == dtype
    if storage == "f32":
        with pytest.raises(TypeError, match="stores its sequences as torch.float32"):
            cell({"x": x.detach().bfloat16()}, params)
    with pytest.raises(ValueError, match=r"resets must be a bool tensor of shape \[7, 5\]"):
        cell({"x": x}, params, resets=torch.zeros(5, 7, dtype=torch.bool))
    fwd = [l for l in cell.launches if l[0] == "lstm_fwd"]
    chunks = 3 if recompute == "chunk:3" else 1
    assert len(fwd) == chunks
    assert [l[1] for l in fwd] == ["save" if recompute == "none" else "replay"] * chunks
    info = pkg.kernels["lstm_fwd"]
    ws, words = fwd[0][2][-2], fwd[0][2][-1]
    tiles = -(-B // info["batch_tile"])
    assert ws.numel() * 4 == tiles * info["workspace_bytes"]
    assert words.dtype == torch.int32 and words.numel() == 2 * tiles and not words.any()
    (out["h"].sum() + final["c"].sum()).backward()
    bwd = [l for l in cell.launches if l[0] == "lstm_bwd"]
    assert len(bwd) == chunks
    # chunk:K replays each chunk's forward, saving its gates, before its backward.
    assert len([l for l in cell.launches if l[0] == "lstm_fwd"]) == chunks * (
        2 if recompute == "chunk:3" else 1)
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    assert params["W_hh"].grad.shape == (128, 32)
    assert torch.isfinite(params["W_hh"].grad).all() and params["W_hh"].grad.abs().sum() > 0


def test_recompute_modes_are_checked(tmp_path):
    # The driver parses the mode (one parse function, in C++); a bad one is a
    # ValueError before any kernel runs.
    cell = _Recorder(cuda.Package(str(make_package(tmp_path, "lstm"))))
    x = torch.randn(3, 2, 16)
    params = {"W_ih": torch.randn(128, 16), "W_hh": torch.randn(128, 32),
              "b_ih": torch.randn(128), "b_hh": torch.randn(128)}
    for bad in ("chunk:0", "chunk:x", "some", None):
        with pytest.raises(ValueError, match="recompute must be"):
            cell({"x": x}, params, recompute=bad)
    assert not cell.launches


class _TorchKernels(_Recorder):
    """Stand-in LSTM kernels in torch that keep the kernels' contract: the
    forward writes outputs and state history from the projections and the
    start states; the backward writes the gate gradients (as projection
    gradients and weight rows), the previous states (weight vectors) and the
    initial- and start-state gradients. What CudaCell does around them (GEMMs,
    chunks, carried gradients, resets) is then checked against torch."""

    def launch(self, kernel, variant, tensors, batch, stream=None):
        super().launch(kernel, variant, tensors, batch, stream)
        args = {}
        for arg, t in zip(self.package.kernels[kernel]["args"], tensors):
            args.setdefault(arg["kind"], {})[arg["name"]] = t
        p = {n: t.detach() for n, t in args["param"].items()}
        x = args["input"]["x"]
        proj = x @ p["W_ih"].t() + p["b_ih"] + p["b_hh"]
        resets = args["resets"]["resets"].bool()
        init, start = args["initial_state"], args["start_state"]
        with torch.enable_grad():
            proj = proj.detach().requires_grad_()
            s0 = {n: t.detach().clone().requires_grad_() for n, t in start.items()}
            i0 = {n: t.detach().clone().requires_grad_() for n, t in init.items()}
            h, c = s0["h"], s0["c"]
            outs, cs, gates, prev = [], [], [], []
            for t in range(x.shape[0]):
                m = resets[t][:, None]
                h = torch.where(m, i0["h"], h)
                c = torch.where(m, i0["c"], c)
                prev.append(h)
                g = proj[t] + h @ p["W_hh"].t()
                g.retain_grad()
                gates.append(g)
                i, f, gg, o = g.chunk(4, -1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
                cs.append(c)
            if kernel.endswith("_fwd"):
                args["output"]["h"].copy_(torch.stack(outs))
                args["state_history"]["h"].copy_(torch.stack(outs))
                args["state_history"]["c"].copy_(torch.stack(cs))
                return
            loss = (torch.stack(outs) * args["output_grad"]["h"]).sum()
            loss = loss + (h * args["final_state_grad"]["h"]).sum()
            loss = loss + (c * args["final_state_grad"]["c"]).sum()
            loss.backward()
        dg = torch.stack([g.grad for g in gates])
        args["projection_grad"]["W_ih"].copy_(dg)
        args["weight_rows"]["W_hh"].copy_(dg)
        args["weight_vectors"]["W_hh"].copy_(torch.stack(prev).detach())
        args["input_grad"]["x"].zero_()
        for n in ("h", "c"):
            args["initial_state_grad"][n].copy_(i0[n].grad)
            args["start_state_grad"][n].copy_(s0[n].grad)


@pytest.mark.parametrize("recompute", ["none", "full", "chunk:3"])
@pytest.mark.parametrize("lengths,T,B", [(None, 8, 4), ([8, 3, 0, 6], 8, 4),
                                         (None, 40, 64)])
def test_cuda_cell_gradients_with_stand_in_kernels(tmp_path, recompute, lengths, T, B):
    # B = 64: the driver runs pieces of 16 steps, three over T = 40.
    cell = _TorchKernels(cuda.Package(str(make_package(tmp_path, "lstm"))))
    torch.manual_seed(0)
    I, H = 16, 32
    ref = torch.nn.LSTM(I, H)
    params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
              "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}
    x = torch.randn(T, B, I, requires_grad=True)
    h0 = (torch.randn(B, H) * 0.5).requires_grad_()
    c0 = (torch.randn(B, H) * 0.5).requires_grad_()
    resets = torch.zeros(T, B, dtype=torch.bool)
    resets[3, 1] = resets[5, 2] = resets[6, 1] = True
    g_out, g_h, g_c = torch.randn(T, B, H), torch.randn(B, H), torch.randn(B, H)

    out, final = cell({"x": x}, params, {"h": h0, "c": c0}, resets, recompute, lengths)
    if lengths is None and recompute != "chunk:3":
        # h's history is the output: kept once, and safe from in-place changes.
        assert cell.saved_bytes == (T * B * H * 4) * (1 if recompute == "full" else 6)
    ((out["h"] * g_out).sum() + (final["h"] * g_h).sum() + (final["c"] * g_c).sum()).backward()
    got = [out["h"].detach(), final["h"].detach(), final["c"].detach(), x.grad, h0.grad,
           c0.grad] + [p.grad for p in params.values()]

    # torch.nn.LSTM, run in segments between resets; with lengths, a sample's
    # state stops changing and its outputs are zero after its last step.
    leaves = [x, h0, c0] + list(params.values())
    for t in leaves:
        t.grad = None
    h, c, outs = h0[None], c0[None], []
    for t in range(T):
        alive = torch.tensor([lengths is None or t < n for n in (lengths or [T] * B)])
        alive = alive[None, :, None]
        m = resets[t][None, :, None] & alive
        h, c = torch.where(m, h0[None], h), torch.where(m, c0[None], c)
        o, (h2, c2) = ref(x[t:t + 1], (h, c))
        h, c = torch.where(alive, h2, h), torch.where(alive, c2, c)
        outs.append(torch.where(alive, o, torch.zeros_like(o)))
    want_out = torch.cat(outs)
    ((want_out * g_out).sum() + (h[0] * g_h).sum() + (c[0] * g_c).sum()).backward()
    want = [want_out.detach(), h[0].detach(), c[0].detach()] + [t.grad for t in leaves]
    for name, a, b in zip(["h", "h_T", "c_T", "dx", "dh0", "dc0", "dW_ih", "dW_hh", "db_ih",
                           "db_hh"], got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_the_cuda_backend_allocates_pieces_not_sequences(tmp_path, monkeypatch):
    # Through torch's allocator (so torch.cuda.max_memory_allocated counts
    # them on a GPU): in full, the one buffer of a whole sequence is c's
    # history; h's is the output; projections and gradients come a piece
    # (16 steps of 64 rows) at a time.
    sizes = []
    allocate = cuda._TorchBackend._allocate

    def recording(self, elements, element, zero, out):
        sizes.append(elements)
        return allocate(self, elements, element, zero, out)

    monkeypatch.setattr(cuda._TorchBackend, "_allocate", recording)
    cell = _TorchKernels(cuda.Package(str(make_package(tmp_path, "lstm"))))
    T, B, I, H = 128, 64, 16, 32
    x = torch.randn(T, B, I, requires_grad=True)
    params = {"W_ih": torch.randn(128, I, requires_grad=True),
              "W_hh": torch.randn(128, H, requires_grad=True),
              "b_ih": torch.randn(128, requires_grad=True),
              "b_hh": torch.randn(128, requires_grad=True)}
    out, _ = cell({"x": x}, params, recompute="full")
    out["h"].backward(torch.randn_like(out["h"]))
    assert sizes and [n for n in sizes if n >= T * B * H] == [T * B * H]
    assert max(n for n in sizes if n != T * B * H) <= 16 * B * 4 * H
    stats = cell.memory_stats()
    assert stats["kept_bytes"] == T * B * H * 4
    assert stats["backward_peak_bytes"] >= stats["kept_bytes"]


def test_a_second_backward_finds_what_forward_kept(tmp_path):
    # The Saved (and the output it reads as h's history) lives with the graph,
    # not only until the first backward.
    cell = _TorchKernels(cuda.Package(str(make_package(tmp_path, "lstm"))))
    torch.manual_seed(4)
    x = torch.randn(5, 3, 16, requires_grad=True)
    params = {"W_ih": torch.randn(128, 16) * 0.1, "W_hh": torch.randn(128, 32) * 0.1,
              "b_ih": torch.zeros(128), "b_hh": torch.zeros(128)}
    out, _ = cell({"x": x}, params, recompute="full")
    out["h"].sum().backward(retain_graph=True)
    first = x.grad.clone()
    out["h"].sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)


def test_a_new_compiler_build_rebuilds_the_packages(monkeypatch):
    # The package cache is keyed by the compiler's build, not its version
    # string alone: kernels fixed under the same version are rebuilt.
    from cellc import core
    cell = cellc.compile(os.path.join(EXAMPLES, "elman.cell"))
    sizes = {"I": 3, "H": 4}
    first = cell.cuda_package(sizes)
    assert cell.cuda_package(sizes) == first
    monkeypatch.setattr(core, "_compiler_build", lambda: "another build")
    assert cell.cuda_package(sizes) != first
