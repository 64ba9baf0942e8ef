"""The chunkwise-parallel training form of a cell whose matrix states are
gated linear recurrences (`cellc --emit=chunkwise` says which are, and why
not), as a reference in torch: `cell(x, params, form="chunk")`.

The compiler's analysis (LinearRecurrence.cpp) cuts the step into a
prologue (what the gates, keys, values and queries are computed from,
gate-only states such as mLSTM's m included), the core (each linear state's
update and reads) and the rest. Here the prologue and the rest run op by op
over all T * B rows at once (step by step where a gate-only state or a state
after the core needs it), and the core runs chunk by chunk: within a chunk of
L steps as matrix products, with chunk-local cumulative log-gates, the state
passed between chunks only. The delta rule goes through the UT transform (a
unit-triangular solve per chunk). torch's autograd gives the backward.

This is the oracle and the reference for the fused chunk kernels, which are
not built yet: it runs at eager torch's speed.
"""

import json
import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import _cellc
from ._front import _check_lengths

#: The chunk length where the call names none.
DEFAULT_CHUNK = 64


def plan(front, sizes, dtype):
    """The cell's split at `sizes` (the compiler's JSON), cached on `front`."""
    key = (tuple(sorted(sizes.items())), dtype)
    cache = front.__dict__.setdefault("_chunkwise_plans", {})
    if key not in cache:
        text = _cellc.chunkwise(front.source, front.file_name, dict(sizes),
                                "f64" if dtype == torch.float64 else "f32")
        cache[key] = json.loads(text)
    return cache[key]


def not_qualifying(front, p):
    """Why the cell has no chunk form: a ValueError's message."""
    why = "; ".join(f"{r['state']}: {r['reason']}" for r in p["reasons"])
    return (f"cell '{p['name']}' has no chunkwise form "
            f"({why or 'no matrix state is a gated linear recurrence'}); "
            f"use form='step' (cellc --emit=chunkwise shows where)")


# The ops, on rows [R, n] (params as they are, constants 0-d) ------------------

def _expand(x, shape, kept):
    if x.dim() == 0:
        return x
    lead = x.shape[:-1]
    view = list(lead) + [shape[d] if d in kept else 1 for d in range(len(shape))]
    return x.reshape(view).expand(*lead, *shape).reshape(*lead, math.prod(shape))


def _reduce(x, shape, kept, combine):
    lead = x.shape[:-1]
    x = x.reshape(*lead, *shape)
    dims = [len(lead) + d for d in range(len(shape)) if d not in kept]
    if combine == "sum":
        r = x.sum(dims)
    else:
        r = x.amax(dims) if combine == "max" else x.amin(dims)
    return r.reshape(*lead, math.prod(shape[d] for d in kept))


def _product(w, v, shape):
    if len(shape) == 3:
        G, M, N = shape
        return torch.einsum("gmn,...gn->...gm", w, v.reshape(*v.shape[:-1], G, N)).reshape(
            *v.shape[:-1], G * M)
    return v @ w.t()


_UNARY = {
    "neg": torch.neg, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
    "log": torch.log, "relu": torch.relu, "abs": torch.abs, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
    "log1p": torch.log1p, "silu": F.silu, "gelu": F.gelu, "elu": F.elu,
    "softplus": lambda x: torch.logaddexp(x, torch.zeros_like(x)),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow,
    "greater": lambda a, b: (a > b).to(torch.result_type(a, b)),
}


def _run(op, args, params, like):
    name = op["op"]
    if name == "param":
        return [params[op["name"]]]
    if name == "constant":
        return [torch.tensor(op["value"], dtype=like.dtype, device=like.device)]
    if name in _UNARY:
        return [_UNARY[name](args[0])]
    if name in _BINARY:
        a, b = args
        if a.dim() == 0 and b.dim() == 0:
            return [_BINARY[name](a, b)]
        return [_BINARY[name](a, b)]
    if name == "select":
        return [torch.where(args[0] != 0, args[1], args[2])]
    if name == "expand":
        return [_expand(args[0], op["shape"], op["kept"])]
    if name == "reduce":
        return [_reduce(args[0], op["shape"], op["kept"], op["combine"])]
    if name in ("matvec", "projection"):
        out = _product(args[0], args[1], op["weight_shape"])
        for b in args[2:]:
            out = out + b
        return [out]
    if name == "vecmat":
        return [args[1] @ args[0]]
    if name == "sum":
        return [args[0].sum(-1, keepdim=True)]
    if name == "broadcast":
        return [args[0].expand(*args[0].shape[:-1], op["sizes"][0])]
    if name == "chunk":
        return list(torch.split(args[0], op["sizes"][0], -1))
    if name == "concat":
        return [torch.cat(args, -1)]
    raise NotImplementedError(f"form='chunk' cannot run cell.{name} yet")


class _Graph:
    """The step's ops by result id, and what each needs."""

    def __init__(self, p):
        self.p = p
        self.op_of = {}
        for i, op in enumerate(p["ops"]):
            for r in op["results"]:
                self.op_of[r] = i

    def needed(self, wanted, stop):
        """The ops, in order, that compute `wanted` from the ids in `stop`."""
        seen, todo = set(), [w for w in wanted if w not in stop]
        while todo:
            v = todo.pop()
            i = self.op_of.get(v)
            if i is None or i in seen:
                continue
            op = self.p["ops"][i]
            if op["phase"] == "linear":
                raise NotImplementedError("form='chunk': a value linear in a matrix state "
                                          "is needed outside its reads")
            seen.add(i)
            todo.extend(o for o in op["operands"] if o not in stop)
        return [self.p["ops"][i] for i in sorted(seen)]

    @staticmethod
    def run(ops, env, params, like):
        for op in ops:
            outs = _run(op, [env[o] for o in op["operands"]], params, like)
            env.update(zip(op["results"], outs))


def _rows(t):
    """[T, B, n] as [T * B, n]; params and constants as they are."""
    return t.reshape(-1, t.shape[-1]) if t.dim() == 3 else t


# The core ----------------------------------------------------------------------

class _State:
    """A linear state's dims: heads H, rows K, columns V."""

    def __init__(self, lin):
        dims = lin["dims"]
        if lin["heads"]:
            self.H, self.K = dims[0], dims[1]
            self.V = 1 if lin["one_column"] else dims[2]
            self.role = [0, 1] + ([] if lin["one_column"] else [2])
        else:
            self.H, (self.K, self.V) = 1, dims
            self.role = [1, 2]
        self.dims = dims

    def full(self, t, varies, lead):
        """A factor's values as [*lead, H, K, V], 1 along the dims it does not
        vary along (a param's or a constant's lead dims 1 too)."""
        if t.dim() == 0:
            return t
        size = [1, 1, 1]
        for d in range(len(self.dims)):
            if varies[d]:
                size[self.role[d]] = self.dims[d]
        tl = tuple(t.shape[:-1])
        return t.reshape(*([1] * (len(lead) - len(tl))), *tl, *size)


def _factor_product(st, factors, env, lead, like):
    out = torch.ones((), dtype=like.dtype, device=like.device)
    for f in factors:
        out = out * st.full(env[f["vector"]], f["varies"], lead)
    return out


def _along(st, f, position):
    """Whether factor `f` varies along the heads (0), the rows (1) or the
    columns (2) of the state's matrices."""
    return any(on and st.role[d] == position for d, on in enumerate(f["varies"]))


def _log_gates(st, lin, env, graph, lead, like):
    """The row and column log-gates, [T, B, H, K] and [T, B, H, V] (None
    where no gate varies along the columns)."""
    row = torch.zeros(*lead, st.H, st.K, 1, dtype=like.dtype, device=like.device)
    columns = any(_along(st, f, 2) for f in lin["gates"])
    col = (torch.zeros(*lead, st.H, 1, st.V, dtype=like.dtype, device=like.device)
           if columns else None)
    for f in lin["gates"]:
        v = f["vector"]
        op = graph.p["ops"][graph.op_of[v]] if v in graph.op_of else None
        if op is not None and op["op"] == "exp":
            log = env[op["operands"][0]]
        else:
            g = env[v]
            if bool((g <= 0).any()):
                raise ValueError("form='chunk' needs positive gates: a gate of the state is "
                                 "zero or negative here; use form='step'")
            log = torch.log(g)
        log = st.full(log, f["varies"], lead)
        if _along(st, f, 2):
            col = col + log
        else:
            row = row + log
    return row[..., 0], None if col is None else col[..., 0, :]


def _chunks(T, L):
    return [(s, min(T, s + L)) for s in range(0, T, L)]


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


def _core(st, a, c, k, v, S0, reads, delta, L, rows, resets=None, S_init=None):
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


def _time_major(t):
    """[B, H, T, X] (a view) as a contiguous [T, B, H, X] (free where it is
    one already, as the step's values are)."""
    return t.permute(2, 0, 1, 3).contiguous()


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
        outs = [v.new_empty(T, Bn, H, V) for _ in qs]
        starts, end = v.new_empty(Bn, H, NC, K, V), v.new_empty(Bn, H, K, V)
        threads = torch.get_num_threads()
        rt.chunk_forward(a.dtype == torch.float64, Bn * H, T, K, V, L, rows, a.data_ptr(),
                         k.data_ptr(), v.data_ptr(), S0.data_ptr(), [q.data_ptr() for q in qs],
                         [o.data_ptr() for o in outs], starts.data_ptr(), end.data_ptr(),
                         threads)
        ctx.save_for_backward(a, k, v, starts, end, *qs)
        ctx.L, ctx.rows, ctx.threads = L, rows, threads
        return (*[o.permute(1, 2, 0, 3) for o in outs], end)

    @staticmethod
    def backward(ctx, *grads):
        from . import _cellc_runtime as rt
        a, k, v, starts, end, *qs = ctx.saved_tensors
        douts = [None if g is None else _time_major(g) for g in grads[:-1]]
        dEnd = None if grads[-1] is None else grads[-1].contiguous()
        T, Bn, H, K = a.shape
        V = v.shape[-1]
        da, dk, dv = torch.empty_like(a), torch.empty_like(k), torch.empty_like(v)
        dS0 = end.new_empty(end.shape)
        dqs = [torch.empty_like(q) for q in qs]
        ptr = lambda t: 0 if t is None else t.data_ptr()
        rt.chunk_backward(a.dtype == torch.float64, Bn * H, T, K, V, ctx.L, ctx.rows,
                          a.data_ptr(), k.data_ptr(), v.data_ptr(), starts.data_ptr(),
                          end.data_ptr(), [q.data_ptr() for q in qs], [ptr(d) for d in douts],
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
        outs = [w.new_empty(T, Bn, H, V) for _ in qs]
        starts, end = w.new_empty(Bn, H, NC, K, V), w.new_empty(Bn, H, K, V)
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
        da, dk, dw, dbeta = (torch.empty_like(t) for t in (a, k, w, beta))
        dS0 = end.new_empty(end.shape)
        dqs = [torch.empty_like(q) for q in qs]
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


def _kept(mode, st, a, c, k, v, S0, reads, delta, L, rows, resets, columns):
    """_core under the call's recompute mode: `none` keeps what autograd
    keeps; `full` keeps the core's inputs and the state between chunks, and
    computes each chunk again in the backward; `chunk:K` keeps the state
    every K steps, and computes each span of K steps again."""
    T = a.shape[2]
    if (delta is not None and resets is None and all(after for _, after in reads)
            and not columns and not rows):
        native = (NATIVE and a.device.type == "cpu"
                  and a.dtype in (torch.float32, torch.float64))
        core = _NativeDeltaCore if native else _DeltaCore
        *outs, S = core.apply(a[..., 0], k, v, delta, S0, L, *[q for q, _ in reads])
        return list(outs), S
    if delta is None and resets is None and all(after for _, after in reads) and not columns:
        # The template's own adjoint: it keeps the state at each chunk's
        # start and the core's inputs, whatever the mode.
        native = (NATIVE and a.device.type == "cpu"
                  and a.dtype in (torch.float32, torch.float64))
        core = _NativeDiagonalCore if native else _DiagonalCore
        *outs, S = core.apply(a, k, v, S0, L, rows, *[q for q, _ in reads])
        return list(outs), S
    if mode == "none" or not torch.is_grad_enabled():
        return _core(st, a, c, k, v, S0, reads, delta, L, rows, resets)
    span = L if mode == "full" else int(mode.split(":")[1])
    afters = [after for _, after in reads]
    outs, S = [[] for _ in reads], S0
    for s in range(0, T, span):
        e = min(T, s + span)
        part = lambda t: None if t is None else t[:, :, s:e]

        def piece(a_, c_, k_, v_, S_, S0_, d_, *qs, s=s, e=e):
            o, last = _core(st, a_, c_, k_, v_, S_, list(zip(qs, afters)), d_, L, rows,
                            None if resets is None else resets[:, s:e], S0_)
            return (*o, last)

        done = checkpoint(piece, part(a), part(c), part(k), part(v), S, S0, part(delta),
                          *[part(q) for q, _ in reads], use_reentrant=False)
        for n in range(len(reads)):
            outs[n].append(done[n])
        S = done[-1]
    return [torch.cat(o, 2) for o in outs], S


# The call ----------------------------------------------------------------------

def _stepped(ops, hist, rowful, state_ids, yields, init, T, live=None, resets=None):
    """Runs `ops` step by step over `hist` (id: [T, B, n] where rowful, else
    as is), carrying the states `state_ids` (their next values `yields`)
    from `init`: back to `init` before a step that `resets` [T, B] marks,
    unchanged after a sample's last step (`live` [T, B]). Returns the
    histories of every result and of the states' values before each step,
    and the final states."""
    prev = list(init)
    out = {}
    for t in range(T):
        if resets is not None:
            prev = [torch.where(resets[t][:, None], i0, p) for i0, p in zip(init, prev)]
        env = {i: (v[t] if i in rowful else v) for i, v in hist.items()}
        env.update(zip(state_ids, prev))
        for i, v in zip(state_ids, prev):
            out.setdefault(i, []).append(v)
        _Graph.run(ops, env, {}, None)
        for op in ops:
            for r in op["results"]:
                if r in rowful:
                    out.setdefault(r, []).append(env[r])
                elif t == 0:
                    out[r] = env[r]
        new = [env[y] for y in yields]
        prev = (new if live is None else
                [torch.where(live[t][:, None], n, p) for n, p in zip(new, prev)])
    return {i: (torch.stack(v) if isinstance(v, list) else v) for i, v in out.items()}, prev


def _leaves(p, graph):
    ids = set()
    for lin in p["linear"]:
        for f in lin["gates"]:
            # An exp's log is its operand: the gate itself is not needed.
            op = graph.p["ops"][graph.op_of[f["vector"]]] if f["vector"] in graph.op_of else None
            ids.add(op["operands"][0] if op is not None and op["op"] == "exp" else f["vector"])
        for src in lin["sources"]:
            ids.update(f["vector"] for part in ("keys", "values", "scales") for f in src[part])
        for r in lin["reads"]:
            ids.update(f["vector"] for part in ("queries", "scales") for f in r[part])
        if "delta_key" in lin:
            ids.update([lin["delta_key"], lin["delta_target"], *lin["delta_scales"]])
    return ids


def _linear_state(st, lin, env, graph, T, B, S0, chunk, like, live=None, resets=None,
                  mode="none", used=None):
    """A linear state's reads (id: [T, B, n]) and its final value [B, K*V*H].
    After a sample's last step (`live` [T, B] false) its gates are 1 and
    its keys 0: the state stays as it is."""
    lead = (T, B)
    a, c = _log_gates(st, lin, env, graph, lead, like)
    rows = any(_along(st, f, 1) for f in lin["gates"])
    columns = c is not None
    if c is None:
        c = a.new_zeros(()).expand(T, B, st.H, st.V)
    keep = None if live is None else live[:, :, None, None].to(like.dtype)
    if keep is not None:
        a, c = a * keep, c * keep
    ones = torch.ones((), dtype=like.dtype, device=like.device)
    bhtk = lambda t: t.permute(1, 2, 0, 3)
    heads = lin["heads"]

    def vector(i, varies):
        return st.full(env[i], varies, lead)

    if "delta_key" in lin:
        if rows or columns:
            raise NotImplementedError("form='chunk': the delta rule with a row or column "
                                      "gate is not built yet; use form='step'")
        kv = [True, True, False] if heads else [True, False]
        vv = [True, False, True] if heads else [False, True]
        sv = [True, False, False] if heads else [False, False]
        k = vector(lin["delta_key"], kv).expand(T, B, st.H, st.K, 1)[..., 0]
        k = k if keep is None else k * keep
        v = vector(lin["delta_target"], vv).expand(T, B, st.H, 1, st.V)[..., 0, :]
        beta = ones
        for i in lin["delta_scales"]:
            beta = beta * vector(i, sv)
        delta = bhtk(beta.expand(T, B, st.H, 1, 1)[..., 0])
    else:
        if len(lin["sources"]) != 1:
            raise NotImplementedError("form='chunk': a state with several outer-product "
                                      "terms is not built yet; use form='step'")
        src = lin["sources"][0]
        k = _factor_product(st, src["keys"], env, lead, like).expand(T, B, st.H, st.K, 1)[..., 0]
        v = (_factor_product(st, src["values"], env, lead, like)
             * _factor_product(st, src["scales"], env, lead, like))
        v = v.expand(T, B, st.H, 1, st.V)[..., 0, :]
        v = -v if src["negated"] else v
        k = k if keep is None else k * keep
        delta = None
    S0 = S0.reshape(B, st.H, st.K, st.V)
    wanted = [r for r in lin["reads"] if used is None or r["result"] in used]
    reads_k = [r for r in wanted if r["contracts_k"]]
    reads_v = [r for r in wanted if not r["contracts_k"]]
    values = {}

    def queries(rs, K, at):
        qs = []
        for r in rs:
            # The queries vary along the contracted dim only: the other is 1.
            q = _factor_product(st, r["queries"], env, lead, like)
            q = q.reshape(1, 1, 1, 1, 1) if q.dim() == 0 else q
            q = q.select(at, 0)
            qs.append((bhtk(q.expand(T, B, st.H, K)), r["after"]))
        return qs

    rb = None if resets is None else resets.t()
    outs, S = _kept(mode, st, bhtk(a), bhtk(c), bhtk(k), bhtk(v), S0,
                    queries(reads_k, st.K, -1), delta, chunk, rows, rb, columns)
    if reads_v:
        if delta is not None:
            raise NotImplementedError("form='chunk': S q reads of a delta-rule state are not "
                                      "built yet; use form='step'")
        outs_v, _ = _kept(mode, st, bhtk(c), bhtk(a), bhtk(v), bhtk(k), S0.transpose(-1, -2),
                          queries(reads_v, st.V, -2), None, chunk, columns, rb, rows)
    else:
        outs_v = []
    for rs, os_, along in ((reads_k, outs, -2), (reads_v, outs_v, -1)):
        for r, o in zip(rs, os_):
            scale = _factor_product(st, r["scales"], env, lead, like)
            o = o.permute(2, 0, 1, 3)                      # [T, B, H, V or K]
            o = o * (scale.squeeze(along) if scale.dim() else scale)
            values[r["result"]] = o.reshape(T, B, -1)
    return values, S.reshape(B, -1)


def call(front, c, chunk=None):
    """The chunk form of a checked call `c` (cellc._front.Call): the outputs
    [T, B, n] in `front.outputs` order and the final states [B, n]."""
    like = c.inputs[0]
    T, B = like.shape[:2]
    live = resets = None
    if c.lengths is not None:
        _check_lengths(c.lengths, T, B)
        live = torch.arange(T)[:, None] < c.lengths[None, :]
        live = live.to(like.device)
    if c.resets is not None:
        resets = c.resets.to(torch.bool)
        # A reset after a sample's last step restarts nothing that is kept.
        resets = resets if live is None else resets & live
    p = plan(front, c.sizes, like.dtype)
    if not p["linear"]:
        raise ValueError(not_qualifying(front, p))
    chunk = chunk or (DEFAULT_CHUNK if T >= DEFAULT_CHUNK
                      else max(16, 1 << (T - 1).bit_length()))
    graph = _Graph(p)
    params = {n: t for (n, _), t in zip(front.params, c.params)}
    init = []
    for n, _ in front.states:
        t = c.states.get(n) if c.states is not None else None
        init.append(t if t is not None else like.new_zeros(B, math.prod(front.shape(n, c.sizes))))
    linear = {lin["state"] for lin in p["linear"]}
    post = set(p["post"])
    before = [i for i in range(len(init)) if i not in linear and i not in post]
    after = sorted(post)
    reads = {r["result"] for lin in p["linear"] for r in lin["reads"]}
    args = set(p["inputs"]) | set(p["states"])
    wanted = (_leaves(p, graph) | set(p["yield_outputs"])
              | {p["yield_states"][i] for i in before + after})
    ops = graph.needed(wanted, reads | args)
    # The reads something outside the core uses (not the delta rule's
    # read-back, which the core does itself).
    used = (wanted | {o for op in ops for o in op["operands"]}) & reads
    # What varies by row: the inputs, the states, and what is computed from them.
    rowful = set(args) | reads
    for op in p["ops"]:
        if any(o in rowful for o in op["operands"]):
            rowful.update(op["results"])
    params_env = {}
    for op in p["ops"]:
        if op["op"] == "param":
            params_env[op["results"][0]] = params[op["name"]]
        elif op["op"] == "constant":
            params_env[op["results"][0]] = torch.tensor(op["value"], dtype=like.dtype,
                                                        device=like.device)
    ops = [op for op in ops if op["op"] not in ("param", "constant")]
    pro = [op for op in ops if op["phase"] == "prologue"]
    rest = [op for op in ops if op["phase"] != "prologue"]
    env = dict(params_env)
    env.update(zip(p["inputs"], c.inputs))
    state_ids = p["states"]
    finals = list(init)

    def run(part, carried):
        if carried:
            hist, last = _stepped(part, env, rowful, [state_ids[i] for i in carried],
                                  [p["yield_states"][i] for i in carried],
                                  [init[i] for i in carried], T, live, resets)
            env.update(hist)
            for i, v in zip(carried, last):
                finals[i] = v
        else:
            flat = {i: (v.reshape(T * B, -1) if i in rowful else v) for i, v in env.items()}
            _Graph.run(part, flat, {}, None)
            for op in part:
                for r in op["results"]:
                    env[r] = flat[r].reshape(T, B, -1) if r in rowful else flat[r]

    run(pro, before)
    for lin in p["linear"]:
        st = _State(lin)
        values, finals[lin["state"]] = _linear_state(st, lin, env, graph, T, B,
                                                     init[lin["state"]], chunk, like, live,
                                                     resets, c.mode, used)
        env.update(values)
    run(rest, after)
    outs = [env[i] for i in p["yield_outputs"]]
    if live is not None:
        # After its last step a sample's outputs are zero.
        outs = [o * live[..., None].to(o.dtype) for o in outs]
    return outs, finals
