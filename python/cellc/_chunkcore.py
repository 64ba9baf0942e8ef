"""The chunk form's core (cellc._chunkwise): a linear state's reads and
final value from its leaves, chunk by chunk.

- `_core`, generic, in torch under torch's reverse mode: scalar, row and
  column gates, reads before and after the update on either side, the delta
  rule, resets (segments).
- The templates with their adjoints written out, in torch (`_DiagonalCore`:
  scalar and row gates, reads after the update; `_DeltaCore`: the delta rule
  with a scalar gate) and on the CPU runtime's kernels
  (`_NativeDiagonalCore`, `_NativeDeltaCore`, runtime/cpu/ChunkCore).
- `_kept` chooses among them and runs the generic core under the call's
  recompute mode.

Tensors are [B, H, T, K or V] (states [B, H, K, V]); a chunk's log-gates are
summed from its start, and every exponent taken is <= 0 where the gates are
<= 1.
"""

import torch
from torch.utils.checkpoint import checkpoint

from . import _chunkcuda


#: The sub-chunk of a row gate's pair weights: blocks below the diagonal
#: are products of rescaled q and k, diagonal blocks pair by pair.
SUB = 16


def _pairs(q, k, A_q, A_k, strict, rows):
    """W[i, j] = sum_k q_ik k_jk exp(A_q[i,k] - A_k[j,k]) over the causal
    pairs (j <= i, or j < i with `strict`), [B, H, l, l]. Every exponent
    taken is <= 0 where the gates are <= 1: a scalar gate's difference
    directly; a row gate's through a reference row per sub-chunk (GLA's
    secondary chunking), pair by pair on the diagonal blocks only."""
    l = q.shape[-2]
    mask = torch.ones(l, l, dtype=torch.bool, device=q.device).tril(-1 if strict else 0)
    if not rows:
        diff = A_q[..., :1] - A_k[..., 0].unsqueeze(-2)             # [..., l, l]
        return (q @ k.transpose(-1, -2)) * diff.masked_fill(~mask, float("-inf")).exp()
    W = q.new_zeros(*q.shape[:-1], l)
    for i0 in range(0, l, SUB):
        i1 = min(l, i0 + SUB)
        ref = A_q[..., i0:i0 + 1, :]
        if i0:
            qs = q[..., i0:i1, :] * (A_q[..., i0:i1, :] - ref).exp()
            ks = k[..., :i0, :] * (ref - A_k[..., :i0, :]).exp()
            W[..., i0:i1, :i0] = qs @ ks.transpose(-1, -2)
        diff = A_q[..., i0:i1, None, :] - A_k[..., None, i0:i1, :]   # [..., s, s, K]
        diff = diff.masked_fill(~mask[i0:i1, i0:i1, None], float("-inf"))
        W[..., i0:i1, i0:i1] = torch.einsum("...ik,...jk,...ijk->...ij", q[..., i0:i1, :],
                                            k[..., i0:i1, :], diff.exp())
    return W


def _core(a, c, k, v, S0, reads, delta, L, rows, resets=None, S_init=None):
    """The state's reads and its final value. a, k: [B, H, T, K]; c, v:
    [B, H, T, V]; S0: [B, H, K, V]; each read a tuple (q [B, H, T, K],
    after); delta: None or beta [B, H, T, 1]; resets: None or [B, T] bool,
    the steps before which the state restarts from S_init (S0 where none is
    given).

    The steps are cut into chunks of L (the last padded with steps whose
    gate is 1 and whose key is 0). Every chunk's own products run at once;
    only the state passes from chunk to chunk, one step per chunk. A reset
    cuts its sample's chunk into segments: no pair crosses one, and the rows
    after it start from S_init, decayed from the reset on."""
    S_init = S0 if S_init is None else S_init
    Bn, H, T = a.shape[:3]
    NC = -(-T // L)
    P = NC * L - T

    def blocks(t):
        if P:
            t = torch.cat([t, t.new_zeros(*t.shape[:2], P, t.shape[3])], 2)
        return t.reshape(Bn, H, NC, L, t.shape[-1])

    ab, cb, kb, vb = blocks(a), blocks(c), blocks(k), blocks(v)
    A, C = ab.cumsum(3), cb.cumsum(3)
    columns = bool((c != 0).any())
    seg = None
    if resets is not None and bool(resets.any()):
        rr = torch.cat([resets, resets.new_zeros(Bn, P)], 1).reshape(Bn, NC, L)
        seg = rr.long().cumsum(2)                                       # [B, NC, L]
        same = (seg[..., :, None] == seg[..., None, :])[:, None].to(a.dtype)
        last = (torch.arange(L, device=a.device) * rr).cummax(2).values
        at = lambda X: X.gather(3, last[:, None, :, :, None].expand(Bn, H, NC, L, X.shape[-1]))
        # The log-gates summed up to the step before the row's last reset.
        BA, BC = at(A - ab), at(C - cb)
        fresh = (seg > 0)[:, None, :, :, None]                          # [B, 1, NC, L, 1]
        kb_end = kb * (seg == seg[..., -1:])[:, None, :, :, None]       # the last segment's
    else:
        kb_end = kb
    AL, CL = A[..., -1:, :], C[..., -1:, :]
    kend = kb_end * (AL - A).exp()
    vscale = (CL - C).exp()
    if delta is not None:
        # u_j = beta_j (w_j - e^{A_j} k_j S - sum_{m<j} e^{A_j - A_m} (k_j.k_m) u_m):
        # u = U0 - Wk @ S, a solve per chunk before the state pass.
        beta = blocks(delta)
        W = _pairs(kb, kb, A, A, True, rows) * beta
        if seg is not None:
            W = W * same
        eye = torch.eye(L, dtype=a.dtype, device=a.device)
        solve = lambda r: torch.linalg.solve_triangular(eye + W, r, upper=False,
                                                        unitriangular=True)
        U0 = solve(beta * vb)
        if seg is None:
            Wk = solve(beta * kb * A.exp())
        else:
            Wk = solve(beta * kb * A.exp() * ~fresh)
            U0 = U0 - solve(beta * kb * (A - BA).exp() * fresh) @ S_init[:, :, None]
    else:
        add = kend.transpose(-1, -2) @ (vb * vscale)                    # [B, H, NC, K, V]
    S, starts, us = S0, [], []
    for n in range(NC):
        starts.append(S)
        if delta is not None:
            u = U0[:, :, n] - Wk[:, :, n] @ S
            us.append(u)
            step_add = kend[:, :, n].transpose(-1, -2) @ u
        else:
            step_add = add[:, :, n]
        base = AL[:, :, n].transpose(-1, -2).exp() * S * CL[:, :, n].exp()
        if seg is not None:
            restart = ((AL[:, :, n] - BA[:, :, n, -1:]).transpose(-1, -2).exp() * S_init
                       * (CL[:, :, n] - BC[:, :, n, -1:]).exp())
            base = torch.where(fresh[:, :, n, -1:], restart, base)
        S = base + step_add
    Sc = torch.stack(starts, 2)                                         # [B, H, NC, K, V]
    values = torch.stack(us, 2) if delta is not None else vb
    outs = []
    for q, after in reads:
        qb = blocks(q)
        # Before the update: the gates up to the step before.
        Aq = A if after else A - ab
        Cq = C if after else C - cb
        W = _pairs(qb, kb, Aq, A, not after, rows)
        if seg is not None:
            W = W * same
        if columns:
            mask = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(0 if after else -1)
            diff = Cq.unsqueeze(-2) - C.unsqueeze(-3)                   # [..., L, L, V]
            diff = diff.masked_fill(~mask[..., None], float("-inf"))
            intra = torch.einsum("...ij,...jv,...ijv->...iv", W, values, diff.exp())
        else:
            intra = W @ values
        start = Cq.exp() * ((qb * Aq.exp()) @ Sc)
        if seg is not None:
            start = torch.where(fresh, (Cq - BC).exp()
                                * ((qb * (Aq - BA).exp()) @ S_init[:, :, None]), start)
        o = start + intra
        outs.append(o.reshape(Bn, H, NC * L, o.shape[-1])[:, :, :T])
    return outs, S


def _pair_grads(dW, q, k, A, rows):
    """The adjoint of W = _pairs(q, k, A, A, False, rows): dq and dk from dW
    (zero above the diagonal), [..., L, K] each, with the same exponents."""
    L = q.shape[-2]
    if not rows:
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        D = (A[..., :1] - A[..., 0].unsqueeze(-2)).masked_fill(~mask, float("-inf")).exp()
        G = dW * D
        return G @ k, G.transpose(-1, -2) @ q
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    mask = torch.ones(SUB, SUB, dtype=torch.bool, device=q.device).tril()
    for i0 in range(0, L, SUB):
        i1 = min(L, i0 + SUB)
        ref = A[..., i0:i0 + 1, :]
        if i0:
            up = (A[..., i0:i1, :] - ref).exp()                     # rows of the block
            down = (ref - A[..., :i0, :]).exp()                     # columns before it
            blockW = dW[..., i0:i1, :i0]
            dq[..., i0:i1, :] += up * (blockW @ (k[..., :i0, :] * down))
            dk[..., :i0, :] += down * (blockW.transpose(-1, -2) @ (q[..., i0:i1, :] * up))
        n = i1 - i0
        E = (A[..., i0:i1, None, :] - A[..., None, i0:i1, :])
        E = E.masked_fill(~mask[:n, :n, None], float("-inf")).exp()  # [..., s, s, K]
        d = dW[..., i0:i1, i0:i1]
        dq[..., i0:i1, :] += torch.einsum("...ij,...jk,...ijk->...ik", d, k[..., i0:i1, :], E)
        dk[..., i0:i1, :] += torch.einsum("...ij,...ik,...ijk->...jk", d, q[..., i0:i1, :], E)
    return dq, dk


class _DiagonalCore(torch.autograd.Function):
    """The core of a state with scalar and row gates, outer-product sources
    and reads q @ S after the update, with its adjoint written out (the
    design note's template): the forward keeps its inputs and the state at
    each chunk's start, and the backward runs the state's gradient back
    chunk by chunk, everything else for all chunks at once. The gates'
    gradient comes from one identity: a cumulative log-gate enters as
    e^{+A} on the read side and e^{-A} on the write side, so
    dA = q * dq - k * dk (plus the state's own term at a chunk's end), and
    the per-step gradient is its reverse cumulative sum in the chunk."""

    @staticmethod
    def forward(ctx, a, k, v, S0, L, rows, *qs):
        Bn, H, T, K = a.shape
        NC = -(-T // L)
        P = NC * L - T

        def blocks(t):
            if P:
                t = torch.cat([t, t.new_zeros(*t.shape[:2], P, t.shape[3])], 2)
            return t.reshape(Bn, H, NC, L, t.shape[-1])

        ab, kb, vb = blocks(a), blocks(k), blocks(v)
        A = ab.cumsum(3)
        AL = A[..., -1:, :]
        add = (kb * (AL - A).exp()).transpose(-1, -2) @ vb
        S, starts = S0, []
        for n in range(NC):
            starts.append(S)
            S = AL[:, :, n].transpose(-1, -2).exp() * S + add[:, :, n]
        Sc = torch.stack(starts, 2)
        outs = []
        for q in qs:
            qb = blocks(q)
            o = (qb * A.exp()) @ Sc + _pairs(qb, kb, A, A, False, rows) @ vb
            outs.append(o.reshape(Bn, H, NC * L, o.shape[-1])[:, :, :T])
        ctx.save_for_backward(a, k, v, Sc, S, *qs)
        ctx.L, ctx.rows = L, rows
        return (*outs, S)

    @staticmethod
    def backward(ctx, *grads):
        a, k, v, Sc, S_end, *qs = ctx.saved_tensors
        L, rows = ctx.L, ctx.rows
        douts, dS_end = grads[:-1], grads[-1]
        Bn, H, T, K = a.shape
        V = v.shape[-1]
        NC = -(-T // L)
        P = NC * L - T

        def blocks(t):
            if t is None:
                return torch.zeros(Bn, H, NC, L, V, dtype=a.dtype, device=a.device)
            if P:
                t = torch.cat([t, t.new_zeros(*t.shape[:2], P, t.shape[3])], 2)
            return t.reshape(Bn, H, NC, L, t.shape[-1])

        ab, kb, vb = blocks(a), blocks(k), blocks(v)
        A = ab.cumsum(3)
        AL = A[..., -1:, :]
        qbs = [blocks(q) for q in qs]
        dos = [blocks(d) for d in douts]
        eA = A.exp()
        # The state's gradient at each chunk's end, back from the last.
        back = sum((qb * eA).transpose(-1, -2) @ do for qb, do in zip(qbs, dos))
        G = torch.zeros_like(S_end) if dS_end is None else dS_end
        ends = [None] * NC
        for n in reversed(range(NC)):
            ends[n] = G
            G = AL[:, :, n].transpose(-1, -2).exp() * G + back[:, :, n]
        dS0 = G
        Ge = torch.stack(ends, 2)                                       # [B, H, NC, K, V]
        kend = kb * (AL - A).exp()
        dv = kend @ Ge
        dk = (AL - A).exp() * (vb @ Ge.transpose(-1, -2))
        dA = torch.zeros_like(A)
        mask = torch.ones(L, L, dtype=torch.bool, device=a.device).tril()
        dqs = []
        for qb, do in zip(qbs, dos):
            W = _pairs(qb, kb, A, A, False, rows)
            dv = dv + W.transpose(-1, -2) @ do
            dW = (do @ vb.transpose(-1, -2)).masked_fill(~mask, 0)
            dq_pairs, dk_pairs = _pair_grads(dW, qb, kb, A, rows)
            dq = eA * (do @ Sc.transpose(-1, -2)) + dq_pairs
            dk = dk + dk_pairs
            dA = dA + qb * dq
            dqs.append(dq.reshape(Bn, H, NC * L, K)[:, :, :T])
        dA = dA - kb * dk
        # The state at each chunk's end is scaled by e^{A_L} as a whole.
        S_next = torch.cat([Sc[:, :, 1:], S_end.unsqueeze(2)], 2)
        dA[..., -1, :] += (S_next * Ge).sum(-1)
        da = dA.flip(3).cumsum(3).flip(3)
        cut = lambda t: t.reshape(Bn, H, NC * L, t.shape[-1])[:, :, :T]
        return (cut(da), cut(dk), cut(dv), dS0, None, None, *dqs)


class _DeltaCore(torch.autograd.Function):
    """The delta rule's core with a scalar gate and reads q @ S after the
    update (DeltaNet, gated DeltaNet), with its adjoint written out. Per
    chunk, with M = I + strictly lower (beta_i (k_i . k_j) e^{A_i - A_j}):
    the new values U = M^-1 beta (w - e^A k S) = U0 - Wk S (two solves for
    all chunks at once), the state S' = e^{A_L} S + (k e^{A_L - A})^T U
    passed on, the reads (q k^T . e^{A_i - A_j}) U + e^A q S. The forward
    keeps its inputs and each chunk's start state; the backward computes
    U again from them, runs the state's gradient back chunk by chunk (a
    transposed solve each), and the rest for all chunks at once."""

    @staticmethod
    def _blocks(t, L):
        Bn, H, T = t.shape[:3]
        NC = -(-T // L)
        if NC * L > T:
            t = torch.cat([t, t.new_zeros(Bn, H, NC * L - T, *t.shape[3:])], 2)
        return t.reshape(Bn, H, NC, L, *t.shape[3:])

    @staticmethod
    def _setup(a, k, w, beta, L):
        blocks = lambda t: _DeltaCore._blocks(t, L)
        ab, kb, wb, bb = blocks(a), blocks(k), blocks(w), blocks(beta)
        A = ab.cumsum(3)                                                # [B, H, NC, L]
        diff = A[..., :, None] - A[..., None, :]
        strict = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1)
        causal = torch.ones(L, L, dtype=torch.bool, device=a.device).tril()
        Ds = diff.masked_fill(~strict, float("-inf")).exp()
        Dc = diff.masked_fill(~causal, float("-inf")).exp()
        KK = kb @ kb.transpose(-1, -2)
        Mlow = bb * KK * Ds
        eye = torch.eye(L, dtype=a.dtype, device=a.device)
        M = eye + Mlow
        eA = A.exp()[..., None]
        U0 = torch.linalg.solve_triangular(M, bb * wb, upper=False, unitriangular=True)
        Wk = torch.linalg.solve_triangular(M, bb * eA * kb, upper=False, unitriangular=True)
        return ab, kb, wb, bb, A, Ds, Dc, KK, Mlow, M, eA, U0, Wk

    @staticmethod
    def forward(ctx, a, k, w, beta, S0, L, *qs):
        T = a.shape[2]
        ab, kb, wb, bb, A, Ds, Dc, KK, Mlow, M, eA, U0, Wk = _DeltaCore._setup(a, k, w, beta, L)
        NC = A.shape[2]
        AL = A[..., -1:]
        kend = kb * (AL - A).exp()[..., None]
        S, starts = S0, []
        for n in range(NC):
            starts.append(S)
            u = U0[:, :, n] - Wk[:, :, n] @ S
            S = AL[:, :, n, :, None].exp() * S + kend[:, :, n].transpose(-1, -2) @ u
        Sc = torch.stack(starts, 2)
        U = U0 - Wk @ Sc
        outs = []
        for q in qs:
            qb = _DeltaCore._blocks(q, L)
            o = ((qb @ kb.transpose(-1, -2)) * Dc) @ U + eA * (qb @ Sc)
            outs.append(o.reshape(*o.shape[:2], -1, o.shape[-1])[:, :, :T])
        ctx.save_for_backward(a, k, w, beta, Sc, S, *qs)
        ctx.L = L
        return (*outs, S)

    @staticmethod
    def backward(ctx, *grads):
        a, k, w, beta, Sc, S_end, *qs = ctx.saved_tensors
        L, T = ctx.L, a.shape[2]
        blocks = lambda t: _DeltaCore._blocks(t, L)
        ab, kb, wb, bb, A, Ds, Dc, KK, Mlow, M, eA, U0, Wk = _DeltaCore._setup(a, k, w, beta, L)
        NC = A.shape[2]
        AL = A[..., -1:]
        decay = (AL - A).exp()[..., None]
        kend = kb * decay
        U = U0 - Wk @ Sc
        qbs = [blocks(q) for q in qs]
        dos = [None if g is None else blocks(g) for g in grads[:-1]]
        Ps = [(qb @ kb.transpose(-1, -2)) * Dc for qb in qbs]
        pairs_back = sum((P.transpose(-1, -2) @ do for P, do in zip(Ps, dos) if do is not None),
                         torch.zeros_like(U))
        reads_back = sum(((qb * eA).transpose(-1, -2) @ do for qb, do in zip(qbs, dos)
                          if do is not None), torch.zeros_like(Sc))
        bek = bb * eA * kb                                              # [B, H, NC, L, K]
        G = torch.zeros_like(S_end) if grads[-1] is None else grads[-1]
        ends, dRs = [None] * NC, [None] * NC
        for n in reversed(range(NC)):
            ends[n] = G
            dU = pairs_back[:, :, n] + kend[:, :, n] @ G
            dR = torch.linalg.solve_triangular(M[:, :, n].transpose(-1, -2), dU, upper=True,
                                               unitriangular=True)
            dRs[n] = dR
            G = (AL[:, :, n, :, None].exp() * G + reads_back[:, :, n]
                 - bek[:, :, n].transpose(-1, -2) @ dR)
        dS0 = G
        Ge, dR = torch.stack(ends, 2), torch.stack(dRs, 2)
        kS = kb @ Sc                                                    # [..., L, V]
        # R = beta (w - e^A k S)
        dw = bb * dR
        dbeta = (dR * (wb - eA * kS)).sum(-1, keepdim=True)
        dk = -(bb * eA * dR) @ Sc.transpose(-1, -2)
        dA = -(bb * eA * dR * kS).sum(-1)[..., None]
        # M = I + beta_i (k_i . k_j) e^{A_i - A_j} below the diagonal, U = M^-1 R
        dM = -(dR @ U.transpose(-1, -2)) * Ds.ne(0)
        dbeta = dbeta + (dM * KK * Ds).sum(-1, keepdim=True)
        dKK = dM * bb * Ds
        dk = dk + (dKK + dKK.transpose(-1, -2)) @ kb
        E = dM * Mlow
        dA = dA + E.sum(-1)[..., None] - E.sum(-2)[..., None]
        # The state passed on: e^{A_L} S + (k e^{A_L - A})^T U
        dk = dk + decay * (U @ Ge.transpose(-1, -2))
        Ek = (kend * (U @ Ge.transpose(-1, -2))).sum(-1)               # [..., L]
        dAL = Ek.sum(-1) + (AL[..., 0].exp()[..., None, None] * Sc * Ge).sum((-1, -2))
        dA = dA - Ek[..., None]
        dA[..., -1, 0] += dAL
        dqs = []
        for qb, do, P in zip(qbs, dos, Ps):
            if do is None:
                dqs.append(torch.zeros_like(qb).reshape(*qb.shape[:2], -1, qb.shape[-1])[:, :, :T])
                continue
            dP = (do @ U.transpose(-1, -2)) * Dc
            dq = dP @ kb + eA * (do @ Sc.transpose(-1, -2))
            dk = dk + dP.transpose(-1, -2) @ qb
            E = dP * (qb @ kb.transpose(-1, -2))
            dA = dA + E.sum(-1)[..., None] - E.sum(-2)[..., None]
            dA = dA + eA * (do * (qb @ Sc)).sum(-1, keepdim=True)
            dqs.append(dq.reshape(*dq.shape[:2], -1, dq.shape[-1])[:, :, :T])
        da = dA[..., 0].flip(-1).cumsum(-1).flip(-1)
        cut = lambda t: t.reshape(*t.shape[:2], -1, *t.shape[4:])[:, :, :T]
        return (cut(da), cut(dk), cut(dw), cut(dbeta), dS0, None, *dqs)


def _empty(shape, like):
    """An uninitialised tensor of `shape` like `like`: for the CPU, pages of
    the runtime's buffer cache, which go back to it when torch frees the
    tensor, so that the next call runs on pages it had instead of faulting
    in fresh zeros (about a tenth of GLA's chunk form at B = 8, T = 1024);
    else torch's."""
    from ._ops import _ELEMENT_OF
    if like.device.type == "cpu" and like.dtype in _ELEMENT_OF:
        from torch.utils.dlpack import from_dlpack
        from . import _cellc_runtime as rt
        return from_dlpack(rt.CompiledCell.buffer(list(shape), _ELEMENT_OF[like.dtype]))
    return like.new_empty(shape)


def _time_major(t):
    """[B, H, T, X] (a view) as a contiguous [T, B, H, X] (free where it is
    one already, as the step's values are; else copied onto the buffer
    cache's pages, as a sum's expanded gradient is)."""
    t = t.permute(2, 0, 1, 3)
    return t if t.is_contiguous() else _empty(t.shape, t).copy_(t)


class _NativeDiagonalCore(torch.autograd.Function):
    """_DiagonalCore on the CPU runtime's kernels (runtime/cpu/ChunkCore):
    per (sample, head) on its threads, the chunk-sized products on the host
    GEMM, on the time-major arrays the step's values are. Same arguments,
    results and adjoint."""

    @staticmethod
    def forward(ctx, a, k, v, S0, L, rows, *qs):
        from . import _cellc_runtime as rt
        Bn, H, T, K = a.shape
        V = v.shape[-1]
        a, k, v = _time_major(a), _time_major(k), _time_major(v)
        qs = [_time_major(q) for q in qs]
        S0 = S0.contiguous()
        NC = -(-T // L)
        outs = [_empty((T, Bn, H, V), v) for _ in qs]
        starts, end = _empty((Bn, H, NC, K, V), v), _empty((Bn, H, K, V), v)
        pairs = _empty((Bn * H, NC, len(qs), L, L), v)
        threads = torch.get_num_threads()
        rt.chunk_forward(a.dtype == torch.float64, Bn * H, T, K, V, L, rows, a.data_ptr(),
                         k.data_ptr(), v.data_ptr(), S0.data_ptr(), [q.data_ptr() for q in qs],
                         [o.data_ptr() for o in outs], starts.data_ptr(), end.data_ptr(),
                         pairs.data_ptr(), threads)
        ctx.save_for_backward(a, k, v, starts, end, pairs, *qs)
        ctx.L, ctx.rows, ctx.threads = L, rows, threads
        return (*[o.permute(1, 2, 0, 3) for o in outs], end)

    @staticmethod
    def backward(ctx, *grads):
        from . import _cellc_runtime as rt
        a, k, v, starts, end, pairs, *qs = ctx.saved_tensors
        douts = [None if g is None else _time_major(g) for g in grads[:-1]]
        dEnd = None if grads[-1] is None else grads[-1].contiguous()
        T, Bn, H, K = a.shape
        V = v.shape[-1]
        da, dk, dv = (_empty(t.shape, t) for t in (a, k, v))
        dS0 = _empty(end.shape, end)
        dqs = [_empty(q.shape, q) for q in qs]
        ptr = lambda t: 0 if t is None else t.data_ptr()
        rt.chunk_backward(a.dtype == torch.float64, Bn * H, T, K, V, ctx.L, ctx.rows,
                          a.data_ptr(), k.data_ptr(), v.data_ptr(), starts.data_ptr(),
                          end.data_ptr(), pairs.data_ptr(), [q.data_ptr() for q in qs], [ptr(d) for d in douts],
                          ptr(dEnd), da.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                          dS0.data_ptr(), [d.data_ptr() for d in dqs], ctx.threads)
        bhtk = lambda t: t.permute(1, 2, 0, 3)
        return (bhtk(da), bhtk(dk), bhtk(dv), dS0, None, None, *[bhtk(d) for d in dqs])


class _NativeDeltaCore(torch.autograd.Function):
    """_DeltaCore on the CPU runtime's kernels (runtime/cpu/ChunkCore), on
    time-major arrays. Same arguments, results and adjoint."""

    @staticmethod
    def forward(ctx, a, k, w, beta, S0, L, *qs):
        from . import _cellc_runtime as rt
        Bn, H, T, K = k.shape
        V = w.shape[-1]
        a = a.permute(2, 0, 1).contiguous()
        beta = beta[..., 0].permute(2, 0, 1).contiguous()
        k, w = _time_major(k), _time_major(w)
        qs = [_time_major(q) for q in qs]
        S0 = S0.contiguous()
        NC = -(-T // L)
        outs = [_empty((T, Bn, H, V), w) for _ in qs]
        starts, end = _empty((Bn, H, NC, K, V), w), _empty((Bn, H, K, V), w)
        threads = torch.get_num_threads()
        rt.delta_forward(k.dtype == torch.float64, Bn * H, T, K, V, L, a.data_ptr(),
                         k.data_ptr(), w.data_ptr(), beta.data_ptr(), S0.data_ptr(),
                         [q.data_ptr() for q in qs], [o.data_ptr() for o in outs],
                         starts.data_ptr(), end.data_ptr(), threads)
        ctx.save_for_backward(a, k, w, beta, starts, end, *qs)
        ctx.L, ctx.threads = L, threads
        return (*[o.permute(1, 2, 0, 3) for o in outs], end)

    @staticmethod
    def backward(ctx, *grads):
        from . import _cellc_runtime as rt
        a, k, w, beta, starts, end, *qs = ctx.saved_tensors
        douts = [None if g is None else _time_major(g) for g in grads[:-1]]
        dEnd = None if grads[-1] is None else grads[-1].contiguous()
        T, Bn, H, K = k.shape
        V = w.shape[-1]
        da, dk, dw, dbeta = (_empty(t.shape, t) for t in (a, k, w, beta))
        dS0 = _empty(end.shape, end)
        dqs = [_empty(q.shape, q) for q in qs]
        ptr = lambda t: 0 if t is None else t.data_ptr()
        rt.delta_backward(k.dtype == torch.float64, Bn * H, T, K, V, ctx.L, a.data_ptr(),
                          k.data_ptr(), w.data_ptr(), beta.data_ptr(), starts.data_ptr(),
                          end.data_ptr(), [q.data_ptr() for q in qs], [ptr(d) for d in douts],
                          ptr(dEnd), da.data_ptr(), dk.data_ptr(), dw.data_ptr(),
                          dbeta.data_ptr(), dS0.data_ptr(), [d.data_ptr() for d in dqs],
                          ctx.threads)
        bhtk = lambda t: t.permute(1, 2, 0, 3)
        return (da.permute(1, 2, 0), bhtk(dk), bhtk(dw), dbeta.permute(1, 2, 0)[..., None],
                dS0, None, *[bhtk(d) for d in dqs])


#: Whether the diagonal template runs on the CPU runtime's kernels (True)
#: or in torch (False: the reference they are tested against).
NATIVE = True


def _kept(mode, template, a, c, k, v, S0, reads, delta, L, rows, resets, native=True,
          cuda_seed=None):
    """The core: on a kernel template where the state fits one (`template`,
    the compiler's chunkTemplateOf) and no resets are given, which keeps the
    state at each chunk's start and the core's inputs whatever the mode;
    else the generic `_core` under the call's recompute mode: `none` keeps
    what autograd keeps; `full` keeps the core's inputs and the state
    between chunks, and computes each chunk again in the backward;
    `chunk:K` keeps the state every K steps, and computes each span of K
    steps again. `native` False: the templates in torch. `cuda_seed` (the
    CUDA target's calls): the templates on the CUDA kernels (cellc._chunkcuda:
    a GPU's, or for CPU tensors the SIMT emulator's with that shuffle seed)
    where they hold the shape, else in torch."""
    T = a.shape[2]
    if (template is not None and resets is None and cuda_seed is not None
            and _chunkcuda.usable(a.device, T, k.shape[0] * k.shape[1], k.shape[3],
                                  v.shape[3], L, len(reads), a.dtype, cuda_seed,
                                  delta=template == "delta")):
        qs = [q for q, _ in reads]
        if template == "delta":
            *outs, S = _chunkcuda.DeltaCore.apply(cuda_seed, a.squeeze(-1), k, v, delta, S0, L,
                                                  *qs)
        else:
            *outs, S = _chunkcuda.DiagonalCore.apply(cuda_seed, a, k, v, S0, L, *qs)
        return list(outs), S
    if template is not None and resets is None:
        native = (native and NATIVE and a.device.type == "cpu"
                  and a.dtype in (torch.float32, torch.float64))
        qs = [q for q, _ in reads]
        if template == "delta":
            core = _NativeDeltaCore if native else _DeltaCore
            *outs, S = core.apply(a.squeeze(-1), k, v, delta, S0, L, *qs)
        else:
            core = _NativeDiagonalCore if native else _DiagonalCore
            *outs, S = core.apply(a, k, v, S0, L, rows, *qs)
        return list(outs), S
    if mode == "none" or not torch.is_grad_enabled():
        return _core(a, c, k, v, S0, reads, delta, L, rows, resets)
    span = L if mode == "full" else int(mode.split(":")[1])
    afters = [after for _, after in reads]
    outs, S = [[] for _ in reads], S0
    for s in range(0, T, span):
        e = min(T, s + span)
        part = lambda t: None if t is None else t[:, :, s:e]

        def piece(a_, c_, k_, v_, S_, S0_, d_, *qs, s=s, e=e):
            o, last = _core(a_, c_, k_, v_, S_, list(zip(qs, afters)), d_, L, rows,
                            None if resets is None else resets[:, s:e], S0_)
            return (*o, last)

        done = checkpoint(piece, part(a), part(c), part(k), part(v), S, S0, part(delta),
                          *[part(q) for q, _ in reads], use_reentrant=False)
        for n in range(len(reads)):
            outs[n].append(done[n])
        S = done[-1]
    return [torch.cat(o, 2) for o in outs], S
