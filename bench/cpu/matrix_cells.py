#!/usr/bin/env python3
"""Matrix-state cells on one core, forward plus backward: gated DeltaNet
and mLSTM (B = 16, T = 256, NH = 4, K = V = 64, I = 256) against a PyTorch
loop of the same step, and Mamba's S6 step (D = 256, N = 16) against
selective_scan_ref's sequential form; side by side in one process,
interleaved rounds, medians. Then the bytes each recompute mode keeps for
the backward (gated DeltaNet at T = 256). OpenBLAS's sgemm at 1024^3 is
measured in the same run as the ceiling.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=build/python \\
    taskset -c 0 python3 bench/cpu/matrix_cells.py
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

import cellc

sys.path.insert(0, os.path.dirname(__file__))
from shape import sgemm_ceiling, side_by_side  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


# The PyTorch loops: the same step as the cell, written as a torch user
# would write it (batched over samples and heads, no Python loop inside a
# step).

def gated_deltanet_loop(x, p, s, NH, K, V):
    B = x.shape[1]
    C, outs = s["C"], []
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    for xt in x:
        q = l2((xt @ p["W_q"].t()).view(B, NH, K))
        k = l2((xt @ p["W_k"].t()).view(B, NH, K))
        v = (xt @ p["W_v"].t()).view(B, NH, V)
        beta = torch.sigmoid(xt @ p["w_b"].t())
        alpha = torch.exp(-torch.exp(p["A_log"]) * F.softplus(xt @ p["w_a"].t() + p["dt_bias"]))
        C = alpha[..., None, None] * C
        u = v - torch.einsum("bhk,bhkv->bhv", k, C)
        C = C + k[..., :, None] * (beta[..., None] * u)[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q, C).flatten(1))
    return torch.stack(outs), C


def mlstm_loop(x, p, s, NH, K, V):
    B = x.shape[1]
    C, n, m, outs = s["C"], s["n"], s["m"], []
    for xt in x:
        q = (xt @ p["W_q"].t()).view(B, NH, K)
        k = (xt @ p["W_k"].t()).view(B, NH, K) / math.sqrt(K)
        v = (xt @ p["W_v"].t()).view(B, NH, V)
        log_f = F.logsigmoid(xt @ p["w_f"].t() + p["b_f"])
        log_i = xt @ p["w_i"].t() + p["b_i"]
        m_new = torch.maximum(log_f + m, log_i)
        f, i = torch.exp(log_f + m - m_new), torch.exp(log_i - m_new)
        C = f[..., None, None] * C + i[..., None, None] * k[..., :, None] * v[..., None, :]
        n = f[..., None] * n + i[..., None] * k
        num = torch.einsum("bhk,bhkv->bhv", q, C)
        den = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m_new))
        outs.append(torch.sigmoid(xt @ p["W_o"].t()) * (num / den[..., None]).flatten(1))
        m = m_new
    return torch.stack(outs), C


def mamba_s6_ref(x, p, s, D, N):
    # selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py): the
    # whole sequence's deltaA and deltaB_u first, then the loop over time.
    u = x  # [T, B, D]
    delta = F.softplus(u @ p["W_dt"].t() + p["dt_bias"])
    A = -torch.exp(p["A_log"].view(D, N))
    Bt, Ct = u @ p["W_B"].t(), u @ p["W_C"].t()
    deltaA = torch.exp(torch.einsum("tbd,dn->tbdn", delta, A))
    deltaB_u = torch.einsum("tbd,tbn,tbd->tbdn", delta, Bt, u)
    h, ys = s["h"], []
    for i in range(u.shape[0]):
        h = deltaA[i] * h + deltaB_u[i]
        ys.append(torch.einsum("bdn,bn->bd", h, Ct[i]))
    return torch.stack(ys) + u * p["skip"], h


def mamba_s6_loop(x, p, s, D, N):
    # The same step in a loop, each step's deltaA and deltaB_u computed in
    # it: no [T, B, D, N] tensors, whose per-step slices cost
    # selective_scan_ref's backward a full-size gradient each.
    A = -torch.exp(p["A_log"].view(D, N))
    h, ys = s["h"], []
    for u in x:
        delta = F.softplus(u @ p["W_dt"].t() + p["dt_bias"])
        Bt, Ct = u @ p["W_B"].t(), u @ p["W_C"].t()
        h = torch.exp(delta[..., None] * A) * h + (delta * u)[..., None] * Bt[:, None, :]
        ys.append((h * Ct[:, None, :]).sum(-1) + u * p["skip"])
    return torch.stack(ys), h


CASES = {
    "gated_deltanet": (gated_deltanet_loop, dict(I=256, NH=4, K=64, V=64)),
    "mlstm": (mlstm_loop, dict(I=256, NH=4, K=64, V=64)),
    "mamba_s6": (mamba_s6_ref, dict(D=256, N=16)),
}
#: A second torch baseline where the first is not a loop of steps.
STEP_LOOPS = {"mamba_s6": mamba_s6_loop}


def problem(cell, sizes, B, T):
    torch.manual_seed(0)
    p = {}
    for n, _ in cell.params:
        shape = cell.shape(n, sizes)
        scale = 1 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.5
        p[n] = (scale * torch.randn(*shape)).requires_grad_()
    s = {n: (0.1 * torch.randn(B, *cell.shape(n, sizes))).requires_grad_()
         for n, _ in cell.states}
    x = torch.randn(T, B, cell.shape(cell.inputs[0][0], sizes)[0], requires_grad=True)
    return x, p, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cells", nargs="+", default=list(CASES), choices=list(CASES))
    a = ap.parse_args()
    torch.set_num_threads(1)
    B, T = a.batch, a.steps
    print(f"torch {torch.__version__}, f32, B = {B}, T = {T}, cores "
          f"{sorted(os.sched_getaffinity(0))}, OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}; fwd+bwd, medians of {a.repeats} "
          f"interleaved rounds")
    print(sgemm_ceiling(a.repeats))
    for name in a.cells:
        loop, sizes = CASES[name]
        with open(os.path.join(EXAMPLES, name + ".cell")) as f:
            cell = cellc.compile(f.read(), threads=1)
        x, p, s = problem(cell, sizes, B, T)
        leaves = [x, *p.values(), *s.values()]
        loop_sizes = {k: v for k, v in sizes.items() if k != "I"}

        def run_torch(loop=loop):
            out, last = loop(x, p, s, **loop_sizes)
            torch.autograd.grad(out.sum() + last.sum(), leaves)

        def run_cellc(mode):
            def run():
                out, final = cell(x, p, s, recompute=mode)
                last = final[next(iter(final))]
                torch.autograd.grad(out.sum() + last.sum(), leaves)
            return run

        runs = {"torch loop": run_torch}
        if name in STEP_LOOPS:
            runs["torch steps"] = lambda: run_torch(STEP_LOOPS[name])
        runs.update({"cellc none": run_cellc("none"), "cellc full": run_cellc("full"),
                     "cellc chunk:16": run_cellc("chunk:16")})
        for f in runs.values():  # the JIT, and torch's first calls
            f()
        med = side_by_side(runs, a.repeats)
        shape = ", ".join(f"{k} = {v}" for k, v in sizes.items())
        print(f"\n{name} ({shape}):")
        for n, t in med.items():
            print(f"  {n:14s} {t * 1e3:9.1f} ms   {med['torch loop'] / t:6.2f}x the torch loop")
        kept = {}
        for mode in ("none", "full", "chunk:16"):
            cell(x, p, s, recompute=mode)
            kept[mode] = cell.saved_bytes
        print("  kept for the backward: " + ", ".join(
            f"{m} {k / 2**20:.1f} MiB ({100 * k / kept['none']:.1f}% of none)"
            for m, k in kept.items()))


if __name__ == "__main__":
    main()
