#!/usr/bin/env python3
"""The chunkwise form on one core, forward plus backward: GLA and gated
DeltaNet (B = 8, NH = 4, K = V = 64, I = 256, T = 1024 by default), cellc's
step kernels (`full`, `none`) against cellc's chunk form (form="chunk", its
torch reference) and PyTorch chunkwise implementations written from the
papers (GLA's chunk form with its secondary chunking; gated DeltaNet's WY/UT
form), each checked against the step kernels first. Times are medians of
interleaved rounds in one process; the peak memory of each (VmHWM over the
baseline, after a first call) in a fresh process. OpenBLAS's sgemm at
1024^3 is measured in the same run as the ceiling.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/chunkwise.py [--steps 1024] [--repeats 5]
"""

import argparse
import ctypes
import gc
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

import cellc

sys.path.insert(0, os.path.dirname(__file__))
import matrix_cells  # noqa: E402
from memory import _status  # noqa: E402
from shape import sgemm_ceiling, side_by_side  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
SIZES = dict(I=256, NH=4, K=64, V=64)


# The PyTorch chunkwise peers, from the papers: the projections over all
# steps, then chunk by chunk the intra-chunk products and the state passed on.

def _heads(t, T, B, NH):
    return t.view(T, B, NH, -1).permute(1, 2, 0, 3)          # [B, NH, T, d]


def gla_chunk(x, p, S, L=64, sub=16):
    """GLA (Yang et al. 2023, section 4): row gates in log space, chunk-local
    cumulative sums, sub-chunks with a reference row off the diagonal."""
    T, B, _ = x.shape
    NH, K = S.shape[1], S.shape[2]
    q = _heads(x @ p["W_q"].t(), T, B, NH)
    k = _heads(x @ p["W_k"].t(), T, B, NH) / math.sqrt(K)
    v = _heads(x @ p["W_v"].t(), T, B, NH)
    g = _heads(F.logsigmoid(x @ p["W_a"].t()) / 16, T, B, NH)
    outs = []
    for s in range(0, T, L):
        qc, kc, vc = q[:, :, s:s + L], k[:, :, s:s + L], v[:, :, s:s + L]
        A = g[:, :, s:s + L].cumsum(2)
        l = qc.shape[2]
        W = qc.new_zeros(B, NH, l, l)
        for i in range(0, l, sub):
            ref = A[:, :, i:i + 1]
            if i:
                W[:, :, i:i + sub, :i] = ((qc[:, :, i:i + sub] * (A[:, :, i:i + sub] - ref).exp())
                                          @ (kc[:, :, :i] * (ref - A[:, :, :i]).exp())
                                          .transpose(-1, -2))
            d = A[:, :, i:i + sub, None] - A[:, :, None, i:i + sub]
            m = torch.ones(d.shape[2], d.shape[3], dtype=torch.bool).tril()
            W[:, :, i:i + sub, i:i + sub] = torch.einsum(
                "bhik,bhjk,bhijk->bhij", qc[:, :, i:i + sub], kc[:, :, i:i + sub],
                d.masked_fill(~m[..., None], float("-inf")).exp())
        outs.append(W @ vc + (qc * A.exp()) @ S)
        AL = A[:, :, -1:]
        S = AL.transpose(-1, -2).exp() * S + (kc * (AL - A).exp()).transpose(-1, -2) @ vc
    return torch.cat(outs, 2).permute(2, 0, 1, 3).reshape(T, B, -1), S


def gated_deltanet_chunk(x, p, S, L=64):
    """Gated DeltaNet (Yang et al. 2024): the WY/UT form with a scalar gate;
    the state held as C = S^T, [K, V] per head."""
    T, B, _ = x.shape
    NH, K = S.shape[1], S.shape[2]
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    q = l2(_heads(x @ p["W_q"].t(), T, B, NH))
    k = l2(_heads(x @ p["W_k"].t(), T, B, NH))
    v = _heads(x @ p["W_v"].t(), T, B, NH)
    beta = torch.sigmoid(x @ p["w_b"].t()).permute(1, 2, 0)[..., None]
    g = (-torch.exp(p["A_log"]) * F.softplus(x @ p["w_a"].t() + p["dt_bias"])).permute(1, 2, 0)
    outs = []
    for s in range(0, T, L):
        qc, kc, vc, bc = q[:, :, s:s + L], k[:, :, s:s + L], v[:, :, s:s + L], beta[:, :, s:s + L]
        G = g[:, :, s:s + L].cumsum(2)
        l = qc.shape[2]
        decay = (G[..., :, None] - G[..., None, :])
        strict = torch.ones(l, l, dtype=torch.bool).tril(-1)
        A = (kc @ kc.transpose(-1, -2)) * decay.masked_fill(~strict, float("-inf")).exp() * bc
        u = torch.linalg.solve_triangular(torch.eye(l) + A,
                                          bc * (vc - (kc * G[..., None].exp()) @ S),
                                          upper=False, unitriangular=True)
        causal = torch.ones(l, l, dtype=torch.bool).tril()
        P = (qc @ kc.transpose(-1, -2)) * decay.masked_fill(~causal, float("-inf")).exp()
        outs.append(P @ u + (qc * G[..., None].exp()) @ S)
        GL = G[..., -1:]
        S = GL[..., None].exp() * S + (kc * (GL - G)[..., None].exp()).transpose(-1, -2) @ u
    return torch.cat(outs, 2).permute(2, 0, 1, 3).reshape(T, B, -1), S


PEERS = {"gla": gla_chunk, "gated_deltanet": gated_deltanet_chunk}


def problem(cell, B, T):
    """The inputs, params and initial states matrix_cells.py times its cells on."""
    return matrix_cells.problem(cell, SIZES, B, T)


def runners(name, cell, x, p, s):
    leaves = [x, *p.values(), *s.values()]
    state = next(iter(s))

    def run(fn):
        def go():
            out, last = fn()
            torch.autograd.grad(out.sum() + last.sum(), leaves)
        return go

    def cellc_run(**options):
        def fn():
            out, final = cell(x, p, s, **options)
            return out, final[state]
        return fn

    return {
        "cellc full": run(cellc_run(recompute="full")),
        "cellc none": run(cellc_run(recompute="none")),
        "cellc chunk": run(cellc_run(form="chunk")),
        "cellc chunk full": run(cellc_run(form="chunk", recompute="full")),
        "torch chunkwise": run(lambda: PEERS[name](x, p, s[state])),
    }


def check(name, cell, x, p, s):
    """The peer and the chunk form against the step kernels, before timing."""
    with torch.no_grad():
        out, final = cell(x, p, s)
        state = next(iter(s))
        for label, (o, f) in {"torch chunkwise": PEERS[name](x, p, s[state]),
                              "cellc chunk": (lambda r: (r[0], r[1][state]))(
                                  cell(x, p, s, form="chunk"))}.items():
            err = ((o.reshape(out.shape) - out).abs().max() / out.abs().max()).item()
            err_s = ((f - final[state]).abs().max() / final[state].abs().max()).item()
            assert err < 1e-3 and err_s < 1e-3, (label, err, err_s)


def peak(name, label, B, T):
    """One run's peak in this process, printed as JSON: after a first call,
    what it freed given back, VmHWM over VmRSS across a second call."""
    torch.set_num_threads(1)
    with open(os.path.join(EXAMPLES, name + ".cell")) as f:
        cell = cellc.compile(f.read(), threads=1)
    x, p, s = problem(cell, B, T)
    go = runners(name, cell, x, p, s)[label]
    go()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    if hasattr(cellc, "empty_cache"):
        cellc.empty_cache()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    go()
    print(json.dumps({"peak": _status("VmHWM") - base}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs="+", default=[1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cells", nargs="+", default=list(PEERS), choices=list(PEERS))
    ap.add_argument("--peak", nargs=2, metavar=("CELL", "RUN"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.peak:
        return peak(*a.peak, a.batch, a.steps[0])
    shape = ", ".join(f"{k} = {v}" for k, v in SIZES.items())
    print(f"torch {torch.__version__}, f32, B = {a.batch}, {shape}, cores "
          f"{sorted(os.sched_getaffinity(0))}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}; fwd+bwd, medians of {a.repeats} "
          f"interleaved rounds; peaks in fresh processes")
    print(sgemm_ceiling(a.repeats))
    for name in a.cells:
        with open(os.path.join(EXAMPLES, name + ".cell")) as f:
            cell = cellc.compile(f.read(), threads=1)
        for T in a.steps:
            x, p, s = problem(cell, a.batch, T)
            check(name, cell, x, p, s)
            runs = runners(name, cell, x, p, s)
            for f in runs.values():
                f()
            med = side_by_side(runs, a.repeats)
            print(f"\n{name}, T = {T}:")
            # What memory_plan predicts for each of cellc's runs (the peak
            # over the inputs and params, as measured).
            plans = {"cellc full": ("step", "full"), "cellc none": ("step", "none"),
                     "cellc chunk": ("chunk", "none"), "cellc chunk full": ("chunk", "full")}
            for label, t in med.items():
                planned = ""
                if label in plans:
                    form, mode = plans[label]
                    bytes_ = cell.memory_plan(SIZES, T, a.batch, recompute=mode,
                                              form=form)["peak"]
                    planned = f"  plan {bytes_ / 2**20:8.1f} MiB"
                out = subprocess.run([sys.executable, __file__, "--peak", name, label,
                                      "--batch", str(a.batch), "--steps", str(T)],
                                     capture_output=True, text=True, check=True)
                mib = json.loads(out.stdout.splitlines()[-1])["peak"] / 2**20
                print(f"  {label:16s} {t * 1e3:9.1f} ms  {med['cellc full'] / t:5.2f}x full"
                      f"  {med['torch chunkwise'] / t:5.2f}x torch chunkwise"
                      f"  peak {mib:8.1f} MiB{planned}")


if __name__ == "__main__":
    main()
