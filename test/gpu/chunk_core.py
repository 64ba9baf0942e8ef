"""The GPU check of the chunk form's kernel templates (runtime/cuda/ChunkKernels.cu,
cellc._chunkcuda): the diagonal core with scalar and row gates and the delta
rule's, their CUDA kernels against the torch templates in float64, forward
and every gradient; then forward + backward timed beside the torch
templates in float32 and fla's chunk_gla and chunk_gated_delta_rule where
fla is installed.

It runs where there are only torch and libcellc_runtime.so ($CELLC_CUDA_LIB):
python/cellc's cuda.py, _chunkcuda.py and _chunkcore.py are loaded from the
tree as a package without its __init__ (no extension). With --emulate the
check runs in the SIMT emulator at a small shape, and the timing is left out.

Usage: chunk_core.py [--emulate | --small]   exit 1 on a failure
"""

import os
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EMULATE = "--emulate" in sys.argv
#: The emulator's small shape on a GPU too, with no timing (for
#: compute-sanitizer, which runs each access through its checks).
SMALL = EMULATE or "--small" in sys.argv
if not EMULATE:
    package = types.ModuleType("cellc")
    package.__path__ = [os.path.join(HERE, "..", "..", "python", "cellc")]
    sys.modules["cellc"] = package
# In the emulator, cellc as installed or built (its compiler writes the
# kernels' emulated object).
from cellc import _chunkcore, _chunkcuda  # noqa: E402

DEV = torch.device("cpu" if EMULATE else "cuda")


def inputs(B, H, T, K, V, rows, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = -0.3 * torch.rand(B, H, T, K if rows else 1, generator=g, dtype=torch.float64)
    a = a.expand(B, H, T, K)
    k = torch.randn(B, H, T, K, generator=g, dtype=torch.float64) / K ** 0.5
    v = torch.randn(B, H, T, V, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    q = torch.randn(B, H, T, K, generator=g, dtype=torch.float64) / K ** 0.5
    return [t.to(DEV, dtype).contiguous().requires_grad_() for t in (a, k, v, S0, q)]


def rel(a, b):
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check():
    shape = (1, 2, 37, 16, 24, 16) if SMALL else (2, 4, 1000, 64, 64, 64)
    B, H, T, K, V, L = shape
    failed = 0
    for rows in (True, False):
        ref = inputs(*shape[:5], rows, torch.float64)
        got = inputs(*shape[:5], rows, torch.float32)
        want = _chunkcore._DiagonalCore.apply(ref[0], *ref[1:4], L, rows, ref[4])
        outs = _chunkcuda.DiagonalCore.apply(0, got[0], *got[1:4], L, got[4])
        g = [torch.randn(o.shape, dtype=torch.float64, device=DEV) for o in want]
        dwant = torch.autograd.grad(want, ref, g)
        dgot = torch.autograd.grad(outs, got, [x.float() for x in g])
        errs = {"out": rel(outs[0], want[0]), "end": rel(outs[1], want[1])}
        errs.update({f"d{n}": rel(d, w) for n, d, w in zip(["a", "k", "v", "S0", "q"],
                                                             dgot, dwant)})
        worst = max(errs.values())
        ok = worst < 1e-4
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} chunk core B={B} H={H} T={T} K={K} V={V} L={L} "
              f"{'row' if rows else 'scalar'} gates: worst rel {worst:.2e} "
              + " ".join(f"{n}={e:.1e}" for n, e in errs.items()), flush=True)
    return failed


def delta_inputs(B, H, T, K, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = -0.3 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    k = torch.nn.functional.normalize(
        torch.randn(B, H, T, K, generator=g, dtype=torch.float64), dim=-1)
    w = torch.randn(B, H, T, V, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, 1, generator=g, dtype=torch.float64)
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    q = torch.randn(B, H, T, K, generator=g, dtype=torch.float64) / K ** 0.5
    return [t.to(DEV, dtype).contiguous().requires_grad_() for t in (a, k, w, beta, S0, q)]


def check_delta():
    shape = (1, 2, 37, 16, 24, 16) if SMALL else (2, 4, 1000, 64, 64, 64)
    B, H, T, K, V, L = shape
    ref = delta_inputs(*shape[:5], torch.float64)
    got = delta_inputs(*shape[:5], torch.float32)
    want = _chunkcore._DeltaCore.apply(*ref[:5], L, ref[5])
    outs = _chunkcuda.DeltaCore.apply(0, *got[:5], L, got[5])
    g = [torch.randn(o.shape, dtype=torch.float64, device=DEV) for o in want]
    dwant = torch.autograd.grad(want, ref, g)
    dgot = torch.autograd.grad(outs, got, [x.float() for x in g])
    errs = {"out": rel(outs[0], want[0]), "end": rel(outs[1], want[1])}
    errs.update({f"d{n}": rel(d, w) for n, d, w in zip(["a", "k", "w", "beta", "S0", "q"],
                                                         dgot, dwant)})
    worst = max(errs.values())
    ok = worst < 1e-4
    print(f"{'ok  ' if ok else 'FAIL'} delta core B={B} H={H} T={T} K={K} V={V} L={L}: "
          f"worst rel {worst:.2e} " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()),
          flush=True)
    return int(not ok)


def timed(fn, repeats=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def fla_refusal_lifted():
    """fla 0.6 refuses its gated chunk backward on Hopper with Triton 3.4 to
    3.7.0 (its issue 640: wrong dq, dk and dg there); the GPU machines have
    Triton 3.6, and neither a newer Triton nor tilelang fits in what travels.
    For its time alone, lift the refusal, and say so in the row's name."""
    global _LIFTED
    try:
        import fla.ops.common.chunk_o as chunk_o
    except Exception:  # noqa: BLE001 - no fla, or another layout
        return ""
    if (getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False)
            and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True)):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        _LIFTED = True
    # Every row after the lifting says so, not only the first.
    return " (time only: refusal for Triton < 3.7.1 on Hopper lifted, fla #640)" if _LIFTED else ""


_LIFTED = False


def _grad(outputs, inputs):
    """The gradients of `outputs`, where gradients are wanted (bench's
    forward-only timing runs its functions under no_grad)."""
    if torch.is_grad_enabled():
        torch.autograd.grad(outputs, inputs)


def bench(shape=(16, 8, 4096, 64, 64, 64)):
    B, H, T, K, V, L = shape
    a, k, v, S0, q = inputs(B, H, T, K, V, True, torch.float32)
    print(f"\n| core, B={B} H={H} T={T} K=V={K} L={L}, f32 | fwd+bwd ms (median of 5) "
          "| fwd ms | peak MiB |\n|---|---|---|---|", flush=True)

    def ours():
        out, end = _chunkcuda.DiagonalCore.apply(0, a, k, v, S0, L, q)
        _grad((out.sum(), end.sum()), (a, k, v, S0, q))

    def template():
        out, end = _chunkcore._DiagonalCore.apply(a, k, v, S0, L, True, q)
        _grad((out.sum(), end.sum()), (a, k, v, S0, q))

    def fmas(fn):
        def run():
            _chunkcuda.TENSOR_CORES = False
            try:
                fn()
            finally:
                _chunkcuda.TENSOR_CORES = True
        return run

    runs = [("GLA core: cellc CUDA kernels", ours),
            ("GLA core: cellc CUDA kernels on FMAs", fmas(ours)),
            ("GLA core: cellc torch template", template)]
    try:
        from fla.ops.gla import chunk_gla
        qf, kf, vf, gf = (t.detach().transpose(1, 2).contiguous().requires_grad_()
                          for t in (q, k, v, a))

        # Bound now: the delta rule's fla run below takes these names again.
        def fla(qf=qf, kf=kf, vf=vf, gf=gf):
            try:
                o, s = chunk_gla(qf, kf, vf, gf, scale=1.0, initial_state=S0,
                                 output_final_state=True)
            except AssertionError as e:
                raise AssertionError(f"{e} q {tuple(qf.shape)} k {tuple(kf.shape)} "
                                     f"v {tuple(vf.shape)} g {tuple(gf.shape)}") from e
            _grad((o.sum(), s.sum()), (qf, kf, vf, gf))
        runs.append(("GLA core: fla chunk_gla" + fla_refusal_lifted(), fla))
    except Exception as e:  # fla absent, or another version's API
        print(f"(fla: {type(e).__name__}: {e})", flush=True)
    a1 = a[..., 0].detach().contiguous().requires_grad_()
    kn = torch.nn.functional.normalize(k.detach(), dim=-1).requires_grad_()
    beta = torch.rand(B, H, T, 1, device=DEV).requires_grad_()

    def delta_ours():
        out, end = _chunkcuda.DeltaCore.apply(0, a1, kn, v, beta, S0, L, q)
        _grad((out.sum(), end.sum()), (a1, kn, v, beta, S0, q))

    def delta_template():
        out, end = _chunkcore._DeltaCore.apply(a1, kn, v, beta, S0, L, q)
        _grad((out.sum(), end.sum()), (a1, kn, v, beta, S0, q))

    runs += [("gated DeltaNet core: cellc CUDA kernels", delta_ours),
             ("gated DeltaNet core: cellc CUDA kernels on FMAs", fmas(delta_ours)),
             ("gated DeltaNet core: cellc torch template", delta_template)]
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        qf, kf, vf = (t.detach().transpose(1, 2).contiguous().requires_grad_()
                      for t in (q, kn, v))
        gf = a1.detach().transpose(1, 2).contiguous().requires_grad_()
        bf = beta.detach()[..., 0].transpose(1, 2).contiguous().requires_grad_()

        def delta_fla(qf=qf, kf=kf, vf=vf, gf=gf, bf=bf):
            o, s = chunk_gated_delta_rule(qf, kf, vf, gf, bf, scale=1.0, initial_state=S0,
                                          output_final_state=True)
            _grad((o.sum(), s.sum()), (qf, kf, vf, gf, bf))
        runs.append(("gated DeltaNet core: fla chunk_gated_delta_rule" + fla_refusal_lifted(),
                     delta_fla))
    except Exception as e:
        print(f"(fla gated delta rule: {type(e).__name__}: {e})", flush=True)
    for name, fn in runs:
        try:
            torch.cuda.reset_peak_memory_stats()
            ms = timed(fn)
            peak = torch.cuda.max_memory_allocated() / 2 ** 20
            # The forward alone (the backward's share is the difference):
            # where the time goes, for the next change to the kernels.
            with torch.no_grad():
                fwd = timed(fn)
            print(f"| {name} | {ms:.2f} | {fwd:.2f} | {peak:.0f} |", flush=True)
        except Exception as e:
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:200]} | | |", flush=True)


def both(fn):
    """`fn` with the kernels' products on the tensor cores, then on FMAs."""
    failed = 0
    for tc in (True, False):
        _chunkcuda.TENSOR_CORES = tc
        print(f"-- products on {'the tensor cores' if tc else 'FMAs'}", flush=True)
        failed += fn()
    _chunkcuda.TENSOR_CORES = True
    return failed


if __name__ == "__main__":
    failures = both(check) + both(check_delta)
    if not EMULATE and "--small" not in sys.argv:
        # One GPU run a session: time the kernels even where a check failed,
        # and say so beside the table.
        if failures:
            print(f"(timed although {failures} checks failed above)", flush=True)
        bench()
    sys.exit(1 if failures else 0)
