"""On a GPU: cellc's CUDA kernels against cuDNN, an independent float64
reference and the CPU backend's results, then the benchmark table. Runs where only torch, the AOT packages
and libcellc_runtime.so are present (the lent GPU machine); cuda.py is imported
by path, and torchrl's Triton RNNs are timed when torchrl imports.

Usage: check_cells.py check PACKAGES_DIR      correctness, exit 1 on a failure
       check_cells.py bench PACKAGES_DIR      timings and peak memory (markdown)
"""

import importlib.util
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "cellc_cuda_module", os.path.join(here, "..", "..", "python", "cellc", "cuda.py"))
cuda = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuda)

DEV = torch.device("cuda")
# Relative tolerances (max |error| / max |reference|) per precision: fp32
# FMAs, tf32 (10-bit mantissa) and bf16 (7-bit) tensor-core matvecs.
TOL = {"ieee": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
# With x, h and the gates stored as bf16 (8-bit mantissa) too.
TOL_BF16_STORAGE = 5e-2
VARIANTS = ("tiled", "persistent", "tf32", "bf16", "persistent-bf16", "persistent-mma")


def load(pkg_dir):
    return cuda.CudaCell(cuda.Package(pkg_dir))


def torch_params(kind, I, H, seed=0):
    torch.manual_seed(seed)
    ref = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(I, H).to(DEV)
    params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0,
              "b_ih": ref.bias_ih_l0, "b_hh": ref.bias_hh_l0}
    return ref, params


def reference_step(kind, x, h, c, p):
    """One step in float64, written from the formulas: the independent reference."""
    g = x @ p["W_ih"].t() + p["b_ih"] + h @ p["W_hh"].t() + p["b_hh"]
    if kind == "lstm":
        i, f, gg, o = g.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        return torch.sigmoid(o) * torch.tanh(c), c
    gx = (x @ p["W_ih"].t() + p["b_ih"]).chunk(3, -1)
    gh = (h @ p["W_hh"].t() + p["b_hh"]).chunk(3, -1)
    r = torch.sigmoid(gx[0] + gh[0])
    z = torch.sigmoid(gx[1] + gh[1])
    n = torch.tanh(gx[2] + r * gh[2])
    return (1 - z) * n + z * h, None


def reference(kind, x, h0, c0, p, resets):
    h, c, outs = h0, c0, []
    for t in range(x.shape[0]):
        if resets is not None:
            m = resets[t][:, None]
            h = torch.where(m, h0, h)
            c = torch.where(m, c0, c) if c is not None else None
        h, c = reference_step(kind, x[t], h, c, p)
        outs.append(h)
    return torch.stack(outs), h, c


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check(pkg_root):
    failed = False
    B, T, I, H = 37, 19, 24, 64
    for kind in ("lstm", "gru"):
        for variant in VARIANTS:
            path = os.path.join(pkg_root, f"check-{kind}-{variant}")
            cell = load(path)
            precision = cell.package.meta.get("precision", "ieee")
            tol = TOL[precision]
            if cell.storage == torch.bfloat16:
                tol = TOL_BF16_STORAGE
            _, params = torch_params(kind, I, H)
            params = {n: t.detach().clone().requires_grad_() for n, t in params.items()}
            torch.manual_seed(1)
            x = torch.randn(T, B, I, device=DEV, requires_grad=True)
            h0 = (torch.randn(B, H, device=DEV) * 0.5).requires_grad_()
            c0 = (torch.randn(B, H, device=DEV) * 0.5).requires_grad_()
            states = {"h": h0, "c": c0} if kind == "lstm" else {"h": h0}
            for with_resets in (False, True):
                resets = None
                if with_resets:
                    resets = torch.rand(T, B, device=DEV) < 0.15
                # The float64 reference and its gradients.
                leaves64 = [t.detach().double().requires_grad_()
                            for t in [x, h0, c0] + list(params.values())]
                x64, h64, c64, *p64 = leaves64
                p64 = dict(zip(params, p64))
                out64, hT64, cT64 = reference(kind, x64, h64, c64 if kind == "lstm" else None,
                                              p64, resets)
                torch.manual_seed(2)
                g_out = torch.randn_like(out64)
                g_h = torch.randn_like(hT64)
                loss64 = (out64 * g_out).sum() + (hT64 * g_h).sum()
                if kind == "lstm":
                    g_c = torch.randn_like(cT64)
                    loss64 = loss64 + (cT64 * g_c).sum()
                loss64.backward()
                for mode in ("none", "full", "chunk:5"):
                    for t in [x, h0, c0] + list(params.values()):
                        t.grad = None
                    xs = x.to(cell.storage)  # the graph goes through the cast to x
                    out, final = cell({"x": xs}, params, states, resets, mode)
                    loss = (out["h"] * g_out.float()).sum() + (final["h"] * g_h.float()).sum()
                    if kind == "lstm":
                        loss = loss + (final["c"] * g_c.float()).sum()
                    loss.backward()
                    errs = {"h": rel(out["h"].double(), out64), "h_T": rel(final["h"].double(), hT64)}
                    if kind == "lstm":
                        errs["c_T"] = rel(final["c"].double(), cT64)
                    names = ["x", "h0"] + (["c0"] if kind == "lstm" else []) + list(params)
                    tensors = [x, h0] + ([c0] if kind == "lstm" else []) + list(params.values())
                    refs = [x64, h64] + ([c64] if kind == "lstm" else []) + list(p64.values())
                    for n, t, r in zip(names, tensors, refs):
                        errs["d" + n] = rel(t.grad.double(), r.grad) if t.grad is not None else 1.0
                    worst = max(errs, key=errs.get)
                    ok = errs[worst] <= tol
                    failed |= not ok
                    print(f"{kind} {variant:10} resets={int(with_resets)} {mode:8} "
                          f"worst {worst} {errs[worst]:.1e} (tol {tol:.0e}) "
                          f"{'ok' if ok else 'FAIL ' + str(errs)}", flush=True)
            # cuDNN too, forward, for the record.
            ref, rp = torch_params(kind, I, H)
            with torch.no_grad():
                want, _ = ref(x, (h0[None], c0[None]) if kind == "lstm" else h0[None])
                out, _ = cell({"x": x.detach().to(cell.storage)},
                              {n: t.detach() for n, t in rp.items()},
                              {n: t.detach() for n, t in states.items()})
            print(f"{kind} {variant:10} vs cuDNN forward: {rel(out['h'].float(), want):.1e}")
    return failed


def check_cpu_backend(pkg_root):
    """Against the CPU backend: the results cellc's CPU kernels gave here for
    the same data (bench/gpu/cpu_reference.py), for every variant and for
    recompute none and full."""
    failed = False
    for kind in ("lstm", "gru"):
        ref = torch.load(os.path.join(pkg_root, f"cpu-reference-{kind}.pt"))
        for variant in VARIANTS:
            cell = load(os.path.join(pkg_root, f"check-{kind}-{variant}"))
            tol = TOL[cell.package.meta.get("precision", "ieee")]
            if cell.storage == torch.bfloat16:
                tol = TOL_BF16_STORAGE
            for mode in ("none", "full"):
                leaves = {"x": ref["x"].to(DEV).requires_grad_()}
                leaves.update({n: p.to(DEV).requires_grad_() for n, p in ref["params"].items()})
                leaves.update({n + "0": s.to(DEV).requires_grad_()
                               for n, s in ref["states"].items()})
                out, final = cell({"x": leaves["x"].to(cell.storage)},
                                  {n: leaves[n] for n in ref["params"]},
                                  {n: leaves[n + "0"] for n in ref["states"]},
                                  ref["resets"].to(DEV), mode)
                loss = (out["h"].float() * ref["g_out"].to(DEV)).sum() + sum(
                    (final[n].float() * g.to(DEV)).sum() for n, g in ref["g_final"].items())
                loss.backward()
                errs = {"h": rel(out["h"].float().cpu(), ref["out"])}
                errs.update({n + "_T": rel(final[n].float().cpu(), t)
                             for n, t in ref["final"].items()})
                errs.update({"d" + n: rel(leaves[n].grad.float().cpu(), g)
                             for n, g in ref["grads"].items()})
                worst = max(errs, key=errs.get)
                ok = errs[worst] <= tol
                failed |= not ok
                print(f"{kind} {variant:15} vs CPU backend {mode:5} worst {worst} "
                      f"{errs[worst]:.1e} (tol {tol:.0e}) {'ok' if ok else 'FAIL ' + str(errs)}",
                      flush=True)
    return failed


def median_ms(fn, reps=15):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def peak_mib(fn):
    """Peak allocated memory of `fn` above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench(pkg_root):
    try:
        from torchrl.modules.tensordict_module._rnn_triton import lstm_triton
    except Exception as e:  # noqa: BLE001 - report and go on
        lstm_triton = None
        print(f"torchrl's Triton LSTM not available: {type(e).__name__}: {e}")
    print("| shape | impl | fwd ms | fwd+bwd ms | peak MiB |")
    print("|---|---|---|---|---|")
    for B, T, I, H in ((4096, 32, 32, 256), (64, 256, 512, 512), (16, 1024, 768, 768)):
        shape = f"B={B} T={T} I={I} H={H}"
        ref, params = torch_params("lstm", I, H)
        x = torch.randn(T, B, I, device=DEV, requires_grad=True)
        h0 = torch.zeros(B, H, device=DEV)
        c0 = torch.zeros(B, H, device=DEV)

        def row(name, fwd, train):
            try:
                with torch.no_grad():
                    f = median_ms(fwd)
                t = median_ms(train)
                m = peak_mib(train)
                print(f"| {shape} | {name} | {f:.3f} | {t:.3f} | {m:.0f} |", flush=True)
            except Exception as e:  # noqa: BLE001 - a miss is a row too
                print(f"| {shape} | {name} | error: {type(e).__name__}: {str(e)[:120]} | | |",
                      flush=True)

        def cudnn_train():
            out, _ = ref(x, (h0[None], c0[None]))
            out.sum().backward()
        row("cuDNN fp32", lambda: ref(x, (h0[None], c0[None])), cudnn_train)
        ref16 = (torch.nn.LSTM(I, H).to(DEV).to(torch.bfloat16))
        x16 = x.detach().to(torch.bfloat16).requires_grad_()
        h16, c16 = h0.to(torch.bfloat16), c0.to(torch.bfloat16)

        def cudnn16_train():
            out, _ = ref16(x16, (h16[None], c16[None]))
            out.sum().backward()
        row("cuDNN bf16", lambda: ref16(x16, (h16[None], c16[None])), cudnn16_train)
        for variant in VARIANTS:
            path = os.path.join(pkg_root, f"lstm-I{I}-H{H}-{variant}")
            why = os.path.join(path, "not-built.txt")
            if os.path.exists(why):
                print(f"| {shape} | cellc {variant} | not built: {open(why).read().strip()} | | |")
                continue
            try:
                cell = load(path)
            except Exception as e:  # noqa: BLE001
                print(f"| {shape} | cellc {variant} | error: {e} | | |")
                continue
            xv = x16 if cell.storage == torch.bfloat16 else x
            for mode in ("none", "full"):
                def train(cell=cell, mode=mode, xv=xv):
                    out, _ = cell({"x": xv}, params, {"h": h0, "c": c0}, None, mode)
                    out["h"].float().sum().backward()
                row(f"cellc {variant} {mode}",
                    lambda cell=cell, xv=xv: cell({"x": xv}, params, {"h": h0, "c": c0},
                                                  None, "full"),
                    train)
        if lstm_triton is not None:
            xb = x.detach().transpose(0, 1).contiguous().requires_grad_()
            hb = torch.zeros(B, T, H, device=DEV)
            is_init = torch.zeros(B, T, dtype=torch.bool, device=DEV)
            args = (params["W_ih"], params["W_hh"], params["b_ih"], params["b_hh"], is_init)
            for compute in (torch.float32, torch.bfloat16):
                for recompute in (False, True):
                    def tr(recompute=recompute, compute=compute):
                        out = lstm_triton(xb, hb, hb, *args, compute, recompute=recompute)[0]
                        out.sum().backward()
                    row(f"torchrl triton {str(compute)[6:]} recompute={recompute}",
                        lambda compute=compute: lstm_triton(xb, hb, hb, *args, compute,
                                                            recompute=True), tr)


if __name__ == "__main__":
    what, root = sys.argv[1], sys.argv[2]
    ok, why = cuda.available()
    if not ok:
        sys.exit(f"check_cells: {why}")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    if what == "check":
        failed = check(root)
        failed |= check_cpu_backend(root)
        sys.exit(1 if failed else 0)
    bench(root)
