"""The chunkwise-parallel training form of a cell whose matrix states are
gated linear recurrences (`cellc --emit=chunkwise` says which are, and why
not): `cell(x, params, form="chunk")`.

The compiler's analysis (LinearRecurrence.cpp) cuts the step into a
prologue (what the gates, keys, values and queries are computed from,
gate-only states such as mLSTM's m included), the core (each linear state's
update and reads) and the rest. The prologue is a cell of its own that the
pipeline compiles (cell-chunk-part, `cellc --chunk-part=prologue`): its
kernels and derived backward run over all T * B rows (over T steps where it
steps a state), in the call's recompute mode; so does the rest of the step
after the core (`--chunk-part=epilogue`), over T steps, on the core's reads.
The core runs chunk by chunk:
within a chunk of L steps as matrix products, with chunk-local cumulative
log-gates, the state passed between chunks only; the delta rule goes through
the UT transform (a unit-triangular solve per chunk). Its templates run on
the CPU runtime's kernels (cellc._chunkcore); values of params alone,
expands, and the parts where the pipeline cannot build them run op by op in
torch, whose autograd chains the parts.
"""

import json
import math

import torch
import torch.nn.functional as F

from . import _cellc
from ._chunkcore import _kept
from ._front import _check_lengths

#: The chunk length where the call names none (jit::defaultChunkLength):
#: 64, or the power of two (at least 16) that holds a shorter sequence.
chunk_length = _cellc.default_chunk_length

#: Whether the prologue runs as compiled kernels (cell-chunk-part: the
#: pipeline's kernels and derived backward) rather than op by op in torch.
#: The tests compare the two.
COMPILED_PROLOGUE = True


def plan(front, sizes, dtype):
    """The cell's split at `sizes` (the compiler's JSON), cached on `front`."""
    key = (tuple(sorted(sizes.items())), dtype)
    cache = front.__dict__.setdefault("_chunkwise_plans", {})
    if key not in cache:
        text = _cellc.chunkwise(front.source, front.file_name, dict(sizes),
                                "f64" if dtype == torch.float64 else "f32")
        cache[key] = _prepare(json.loads(text))
    return cache[key]


def prologue(front, sizes, dtype, device=None):
    """The prologue of the cell's chunk form, compiled by the pipeline
    (`cellc --chunk-part=prologue`) at `sizes` and loaded: a front
    (cellc._front.Fixed) that cellc._ops.call runs, with its backward, in
    any recompute mode. Its outputs are named v<id> after the split's
    values; it has the cell's inputs, the params it reads, and the states
    stepped before the core (or one element that stays as it is, where
    there are none). On the CPU, the JIT's kernels; where the cell runs its CUDA
    kernels on `device` (a GPU, or the SIMT emulator), the CUDA package's.
    None where the pipeline cannot build it (the torch ops run)."""
    return _part(front, sizes, dtype, device, "prologue")


def epilogue(front, sizes, dtype, device=None):
    """The rest of the step after the core, compiled as the prologue is
    (`cellc --chunk-part=epilogue`): its inputs are the reads and the
    values before the core it reads, named v<id>; its states those after
    the core; its outputs the cell's. None where the step has nothing after
    the core or the pipeline cannot build it (the torch ops run)."""
    return _part(front, sizes, dtype, device, "epilogue")


def _part(front, sizes, dtype, device, part):
    cuda = device is not None and front._runs_cuda(device)
    key = (tuple(sorted(sizes.items())), dtype,
           (device.type, device.index, front.emulated) if cuda else None, part)
    cache = front.__dict__.setdefault("_chunk_parts", {})
    if key in cache:
        return cache[key]
    if cuda:
        try:
            pre = front._cuda_cell(sizes, torch.float32, device, part=part)._front()
        except ValueError:
            pre = None
        cache[key] = pre
        return pre
    from . import _ops
    from ._front import Fixed
    from .core import _jit
    try:
        compiled = _jit(front.source, front.file_name, dict(sizes),
                        "f64" if dtype == torch.float64 else "f32", front.threads, 0,
                        unit_slices=front.unit_slices, part=part)
    except ValueError:
        cache[key] = None
        return None
    dims = compiled.state_dims
    pre = Fixed(_ops.CpuRunner(compiled), f"the chunk form's {part}", compiled.inputs,
                compiled.params, [(n, list(dims.get(n, shape))) for n, shape in compiled.states],
                [n for n, _ in compiled.outputs], "cpu", dtype=dtype)
    pre._key = _ops.front_key(pre, {"package": compiled.path})
    # The prologue's outputs on the runtime's buffer cache
    # (cellc._ops._empty_outputs): they live as long as the call's backward.
    pre.lend_outputs = part == "prologue"
    cache[key] = pre
    return pre


def _padded(t, live):
    """`t` [T, B, n] with its rows after a sample's end (`live` [T, B]
    false) those of a live row: values a step really had, so that what runs
    there anyway and is masked after (a compiled part on all T * B rows)
    stays finite, and its gradient there zero, not NaN."""
    if live is None or not bool(live.any()) or bool(live.all()):
        return t
    src = int(live.reshape(-1).nonzero()[0, 0])
    return torch.where(live[..., None], t, t.reshape(-1, t.shape[-1])[src])


def _run_part(part, front, c, x, carried, init, finals):
    """Runs a compiled part of the chunk form (prologue() or epilogue()) over
    the call `c` on the inputs `x` (name: [T, B, n]), stepping the cell's
    states `carried` from `init` (their final values into `finals`), in the
    call's mode, resets and lengths; with no state, as one step over all
    T * B rows. Its outputs by name, [T, B, n] each."""
    from . import _ops
    T, B = c.inputs[0].shape[:2]
    state_names = [n for n, _ in front.states]
    names = {n for n, _ in part.params}
    params = {n: t for (n, _), t in zip(front.params, c.params) if n in names}
    if carried:
        states = {state_names[i]: init[i] for i in carried}
        outs, last = _ops.call(part, x, params, states, recompute=c.mode, resets=c.resets,
                               lengths=c.lengths)
        for i in carried:
            finals[i] = last[state_names[i]].reshape(B, -1)
    else:
        x = {n: t.reshape(1, T * B, -1) for n, t in x.items()}
        outs, _ = _ops.call(part, x, params, recompute=c.mode)
    if not isinstance(outs, dict):
        outs = {part.outputs[0]: outs}
    return {n: t.reshape(T, B, -1) for n, t in outs.items()}


def not_qualifying(front, p):
    """Why the cell has no chunk form: a ValueError's message."""
    why = "; ".join(f"{r['state']}: {r['reason']}" for r in p["reasons"])
    return (f"cell '{p['name']}' has no chunkwise form "
            f"({why or 'no matrix state is a gated linear recurrence'}); "
            f"use form='step' (cellc --emit=chunkwise shows where)")


#: form="auto" takes the chunk form for sequences of at least this many
#: chunks (bench/cpu/chunkwise.py: docs/benchmarks.md; jit::kAutoMinChunks,
#: which `cellc --emit=plan --form=auto` reads too).
AUTO_MIN_CHUNKS = _cellc.AUTO_MIN_CHUNKS


def choose(front, c, chunk=None):
    """form="auto": "chunk" where the chunk form is expected to be faster,
    else "step". The chunk form where gradients are wanted on the CPU, no
    resets are given and expected() says so; inference and step() keep the
    step kernels."""
    like = c.inputs[0]
    if (c.cuda or not torch.is_grad_enabled() or c.resets is not None
            or like.dtype not in (torch.float32, torch.float64)):
        return "step"
    if not chunk:
        # The length the call will take: a tuned one (cellc._chunktune).
        from . import _chunktune
        chunk = _chunktune.tuned(front, c.sizes, like.dtype, like.shape[1], like.shape[0],
                                 c.mode)
    return "chunk" if expected(front, c.sizes, like.dtype, like.shape[0], chunk) else "step"


def expected(front, sizes, dtype, T, chunk=None):
    """Whether the chunk form is expected to be faster for a training step
    of T steps on the CPU (as `cellc --emit=plan --form=auto` says,
    jit::chunkFormExpected): the cell has one, every linear state's core
    runs on the runtime's kernels (a template: scalar or row gates and
    reads after the update, or the delta rule with a scalar gate), and the
    sequence has at least AUTO_MIN_CHUNKS chunks."""
    if T < AUTO_MIN_CHUNKS * (chunk or chunk_length(T)):
        return False
    p = plan(front, sizes, dtype)
    return bool(p["linear"]) and all(p["templates"])


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


def _run(op, args):
    """One op on its operands' values (params and constants are given, not
    run)."""
    name = op["op"]
    if name in _UNARY:
        return [_UNARY[name](args[0])]
    if name in _BINARY:
        return [_BINARY[name](*args)]
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
    def run(ops, env):
        for op in ops:
            env.update(zip(op["results"], _run(op, [env[o] for o in op["operands"]])))


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
    """The product of `factors`, broadcast as st.full gives them (a 0-d one
    where there are none): one factor is its own view, not a copy."""
    out = None
    for f in factors:
        t = st.full(env[f["vector"]], f["varies"], lead)
        out = t if out is None else out * t
    return torch.ones((), dtype=like.dtype, device=like.device) if out is None else out


def _along(st, f, position):
    """Whether factor `f` varies along the heads (0), the rows (1) or the
    columns (2) of the state's matrices."""
    return any(on and st.role[d] == position for d, on in enumerate(f["varies"]))


def _log_gates(st, lin, env, graph, lead, like, live=None, spread=True):
    """The row and column log-gates, [T, B, H, K] and [T, B, H, V] (None
    where no gate varies along the columns); `spread` False (a scalar gate,
    the delta rule's): the row's [T, B, H, 1], so that its gradient is not
    summed from a spread copy. After a sample's last step (`live` [T, B]
    false) a gate is 1 whatever the prologue left there (its compiled
    kernels write zeros; computed from padding, anything)."""
    row = col = None
    rowful = graph.p["rowful"]
    dead = lambda t, fill: (t if live is None else
                            torch.where(live[..., None], t, torch.full((), fill, dtype=t.dtype,
                                                                     device=t.device)))
    for f in lin["gates"]:
        v = f["vector"]
        op = graph.p["ops"][graph.op_of[v]] if v in graph.op_of else None
        if op is not None and op["op"] == "exp":
            log = env[op["operands"][0]]
            log = dead(log, 0.0) if op["operands"][0] in rowful else log
        else:
            g = env[v]
            g = dead(g, 1.0) if v in rowful else g
            if bool((g <= 0).any()):
                raise ValueError("form='chunk' needs positive gates: a gate of the state is "
                                 "zero or negative here; use form='step'")
            log = torch.log(g)
        log = st.full(log, f["varies"], lead)
        if _along(st, f, 2):
            col = log if col is None else col + log
        else:
            row = log if row is None else row + log
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    full = lambda t, shape: (zero if t is None else t).expand(*lead, *shape)
    row = full(row, (st.H, st.K if spread else 1, 1)).squeeze(-1)
    return row, None if col is None else full(col, (st.H, 1, st.V)).squeeze(-2)


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
        _Graph.run(ops, env)
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
                  mode="none", used=None, template=None, native=True, cuda_seed=None):
    """A linear state's reads (id: [T, B, n]) and its final value [B, K*V*H].
    After a sample's last step (`live` [T, B] false) its gates are 1 and
    its keys 0: the state stays as it is."""
    lead = (T, B)
    # The delta rule's gate is a step's scalar: its gradient, [T, B, H, 1],
    # not one spread over K and summed back (a [T, B, H*K] array more in
    # the backward).
    a, c = _log_gates(st, lin, env, graph, lead, like, live, spread="delta_key" not in lin)
    rows = any(_along(st, f, 1) for f in lin["gates"])
    columns = c is not None
    if c is None:
        c = a.new_zeros(()).expand(T, B, st.H, st.V)
    # Where, not a product: what the prologue left after a sample's end
    # need not be finite.
    alive = None if live is None else live[:, :, None, None]
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    keep = None if alive is None else (lambda t: torch.where(alive, t, zero))
    if keep is not None:
        a, c = keep(a), keep(c)
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
        k = vector(lin["delta_key"], kv).expand(T, B, st.H, st.K, 1).squeeze(-1)
        k = k if keep is None else keep(k)
        v = vector(lin["delta_target"], vv).expand(T, B, st.H, 1, st.V).squeeze(-2)
        beta = ones
        for i in lin["delta_scales"]:
            beta = beta * vector(i, sv)
        delta = bhtk(beta.expand(T, B, st.H, 1, 1).squeeze(-1))
    else:
        if len(lin["sources"]) != 1:
            raise NotImplementedError("form='chunk': a state with several outer-product "
                                      "terms is not built yet; use form='step'")
        src = lin["sources"][0]
        k = _factor_product(st, src["keys"], env, lead, like)
        k = k.expand(T, B, st.H, st.K, 1).squeeze(-1)
        v = _factor_product(st, src["values"] + src["scales"], env, lead, like)
        v = v.expand(T, B, st.H, 1, st.V).squeeze(-2)
        v = -v if src["negated"] else v
        k = k if keep is None else keep(k)
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
            # A view whose gradient is one too: select's backward fills a
            # [T, B, H, K, 1] of zeros and copies into it (4% of GLA's call).
            q = q.squeeze(at)
            qs.append((bhtk(q.expand(T, B, st.H, K)), r["after"]))
        return qs

    rb = None if resets is None else resets.t()
    outs, S = _kept(mode, template, bhtk(a), bhtk(c), bhtk(k), bhtk(v), S0,
                    queries(reads_k, st.K, -1), delta, chunk, rows, rb, native,
                    cuda_seed)
    if reads_v:
        if delta is not None:
            raise NotImplementedError("form='chunk': S q reads of a delta-rule state are not "
                                      "built yet; use form='step'")
        outs_v, _ = _kept(mode, None, bhtk(c), bhtk(a), bhtk(v), bhtk(k),
                          S0.transpose(-1, -2), queries(reads_v, st.V, -2), None, chunk,
                          columns, rb)
    else:
        outs_v = []
    for rs, os_, along in ((reads_k, outs, -2), (reads_v, outs_v, -1)):
        for r, o in zip(rs, os_):
            o = o.permute(2, 0, 1, 3)                      # [T, B, H, V or K]
            if r["scales"]:
                scale = _factor_product(st, r["scales"], env, lead, like)
                o = o * (scale.squeeze(along) if scale.dim() else scale)
            values[r["result"]] = o.reshape(T, B, -1)
    return values, S.reshape(B, -1)


def _prepare(p):
    """What every call of the plan `p` reads, worked out once: its graph;
    the states stepped before the core and after it; the reads, and those
    something outside the core uses (not the delta rule's read-back, which
    the core does itself); the block arguments; the ops that run outside
    the core, in order, params and constants aside; the values that vary by
    row; each linear state's kernel template (the compiler's choice,
    chunkTemplateOf: "diagonal", "delta" or None for the generic core)."""
    graph = p["graph"] = _Graph(p)
    n = len(p["states"])
    linear = {lin["state"] for lin in p["linear"]}
    post = set(p["post"])
    before = [i for i in range(n) if i not in linear and i not in post]
    after = sorted(post)
    reads = {r["result"] for lin in p["linear"] for r in lin["reads"]}
    args = set(p["inputs"]) | set(p["states"])
    # What the core and the rest read (the compiled prologue steps the
    # states before the core), and with those states' next values.
    read = _leaves(p, graph) | set(p["yield_outputs"]) | {p["yield_states"][i] for i in after}
    wanted = read | {p["yield_states"][i] for i in before}
    ops = graph.needed(wanted, reads | args)
    # The reads something outside the core uses (readUsedOutsideCore).
    used = {r["result"] for lin in p["linear"] for r in lin["reads"] if r["used"]}
    # What varies by row: the inputs, the states, and what is computed from them.
    rowful = set(args) | reads
    for op in p["ops"]:
        if any(o in rowful for o in op["operands"]):
            rowful.update(op["results"])
    p.update(before=before, after=after, reads=reads, args=args, used=used, rowful=rowful,
             read_outside=read,
             run=[op for op in ops if op["op"] not in ("param", "constant")],
             templates=[lin["template"] for lin in p["linear"]])
    return p


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
    # The CUDA target's calls run the diagonal core on the CUDA kernels.
    cuda_seed = getattr(front, "shuffle_seed", 0) if c.cuda else None
    if not p["linear"]:
        raise ValueError(not_qualifying(front, p))
    if not chunk and not c.cuda:
        # A length cellc.autotune(form="chunk") found for this shape.
        from . import _chunktune
        chunk = _chunktune.tuned(front, c.sizes, like.dtype, B, T, c.mode)
    chunk = chunk or chunk_length(T)
    graph = p["graph"]
    params = {n: t for (n, _), t in zip(front.params, c.params)}
    init = []
    for n, _ in front.states:
        t = c.states.get(n) if c.states is not None else None
        init.append(t if t is not None else like.new_zeros(B, math.prod(front.shape(n, c.sizes))))
    before, after, used, rowful = p["before"], p["after"], p["used"], p["rowful"]
    params_env = {}
    for op in p["ops"]:
        if op["op"] == "param":
            params_env[op["results"][0]] = params[op["name"]]
        elif op["op"] == "constant":
            params_env[op["results"][0]] = torch.tensor(op["value"], dtype=like.dtype,
                                                        device=like.device)
    env = dict(params_env)
    env.update(zip(p["inputs"], c.inputs))
    state_ids = p["states"]
    finals = list(init)
    pre = prologue(front, c.sizes, like.dtype, like.device) if COMPILED_PROLOGUE else None
    ops = p["run"]
    if pre is not None:
        # Past a sample's end, inputs of padding: a stateless prologue runs
        # there too (its rows are masked after).
        x = {n: _padded(t, live) for (n, _), t in zip(front.inputs, c.inputs)}
        outs = _run_part(pre, front, c, x, before, init, finals)
        env.update((int(n[1:]), t) for n, t in outs.items())
        # What the compiled prologue does not give: values of params and
        # constants alone, and the expands of its outputs (views).
        ops = graph.needed(p["read_outside"], set(env) | p["reads"] | p["args"])
        ops = [op for op in ops if op["op"] not in ("param", "constant")]
        before = []  # stepped in the prologue's kernels
    pro = [op for op in ops if op["phase"] == "prologue"]
    rest = [op for op in ops if op["phase"] != "prologue"]

    def run(part, carried):
        if carried:
            hist, last = _stepped(part, env, rowful, [state_ids[i] for i in carried],
                                  [p["yield_states"][i] for i in carried],
                                  [init[i] for i in carried], T, live, resets)
            env.update(hist)
            for i, v in zip(carried, last):
                finals[i] = v
        elif part:
            # Over the rows of live steps only: past a sample's length the
            # prologue's outputs are zeros (its compiled kernels') or come
            # from padding, which the ops need not take (a division by them),
            # and the step form runs nothing there.
            rows = (None if live is None or bool(live.all())
                    else live.reshape(-1).nonzero()[:, 0])
            read = {o for op in part for o in op["operands"]}
            flat = {}
            for i, v in env.items():
                if i in rowful and i in read:
                    v = v.reshape(T * B, -1)
                    v = v if rows is None else v.index_select(0, rows)
                flat[i] = v
            _Graph.run(part, flat)
            for op in part:
                for r in op["results"]:
                    v = flat[r]
                    if r in rowful and rows is not None:
                        v = v.new_zeros(T * B, v.shape[-1]).index_copy(0, rows, v)
                    env[r] = v.reshape(T, B, -1) if r in rowful else v

    run(pro, before)
    for lin, template in zip(p["linear"], p["templates"]):
        values, finals[lin["state"]] = _linear_state(_State(lin), lin, env, graph, T, B,
                                                     init[lin["state"]], chunk, like, live,
                                                     resets, c.mode, used, template,
                                                     native=not c.cuda,
                                                     cuda_seed=cuda_seed)
        env.update(values)
    post = (epilogue(front, c.sizes, like.dtype, like.device)
            if COMPILED_PROLOGUE and rest else None)
    if post is not None:
        # Past a sample's end the reads and the prologue's values may be
        # zeros: the rest runs on a live row's values there (a division by
        # them).
        x = {n: _padded(env[int(n[1:])].reshape(T, B, -1), live) for n, _ in post.inputs}
        outs = _run_part(post, front, c, x, after, init, finals)
        outs = [outs[n] for n in front.outputs]
    else:
        run(rest, after)
        outs = [env[i] for i in p["yield_outputs"]]
    if live is not None:
        # After its last step a sample's outputs are zero.
        outs = [o * live[..., None].to(o.dtype) for o in outs]
    return outs, finals
