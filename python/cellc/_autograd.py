"""What runs a loaded CPU cell under autograd, shared by compiled cells
(cellc.compile) and loaded packages (cellc.load_package): the argument
checks that read no compiler, and the autograd function over the runtime's
forward and backward. Imports nothing that loads MLIR or LLVM."""

import torch

# One definition each, in the module that a GPU machine loads alone.
from .cuda import first_derivative
from .cuda import recompute_mode as _parse_mode  # noqa: F401
from .cuda import shaped_states as _shaped_states  # noqa: F401



def _flat_states(states, B):
    """The states given (a dict, or None) as the kernels' `[B, n]`: a matrix
    state `[B, NH, K, V]` is the vector of its elements in row-major order."""
    if states is None:
        return None
    return {n: t if t.dim() == 2 else t.reshape(B, -1) for n, t in states.items()}


#: The dtypes the CPU kernels run, by their names in the compiler.
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def _one_dtype(tensors):
    """The dtype all of `tensors` share (an error names two that differ)."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise TypeError(f"all tensors must have one dtype; got {dtype} and {t.dtype}")
    return dtype


def _check_lengths(lengths, T, B):
    """Per-sample lengths as a list of B ints in [0, T] ([] for none): from
    an int64 CPU tensor of shape [B], as torch's PackedSequence keeps them, or
    a list."""
    if lengths is None:
        return []
    lengths = _lengths_tensor(lengths, B).tolist()
    bad = [n for n in lengths if n < 0 or n > T]
    if bad:
        raise ValueError(f"lengths must be in [0, T = {T}], got {bad[0]}")
    return lengths


def _lengths_tensor(lengths, B):
    """Per-sample lengths as an int64 CPU tensor [B] (or None), its
    values unread: what the torch operators take."""
    if lengths is None:
        return None
    if isinstance(lengths, torch.Tensor):
        if lengths.dtype != torch.int64:
            raise TypeError(f"lengths must be an int64 tensor, got {lengths.dtype}")
        if lengths.device.type != "cpu":
            raise ValueError(f"lengths must be on the CPU (as PackedSequence keeps them), "
                             f"got {lengths.device}")
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be [B], got shape {list(lengths.shape)}")
    elif isinstance(lengths, (list, tuple)) and all(isinstance(n, int) for n in lengths):
        lengths = torch.tensor(list(lengths), dtype=torch.int64)
    else:
        raise TypeError("lengths must be an int64 tensor or a list of ints")
    if lengths.shape[0] != B:
        raise ValueError(f"expected {B} lengths, one a sample, got {lengths.shape[0]}")
    return lengths


def _arguments(x, params, states, names_in, names_par, names_st):
    """Checks a call's tensors against the cell's names: `x` is a tensor (one
    input) or a dict, `params` a dict, `states` None or a dict of some
    states. Returns the inputs in declaration order, the params with a
    tensor of no elements for each one not given, and the names of those:
    a param the cell declares and never reads may be left out (the runtime
    says which param is missing where the kernels read it)."""
    if not names_in:
        raise ValueError("this cell declares no input; the Python API needs one to "
                         "know T and B")
    if isinstance(x, dict):
        missing = [n for n in names_in if n not in x]
        if missing:
            raise ValueError(f"no tensor for input {missing[0]!r}")
        inputs = [x[n] for n in names_in]
    else:
        if len(names_in) != 1:
            raise ValueError(f"this cell has inputs {names_in}: pass a dict of tensors")
        inputs = [x]
    if not isinstance(params, dict):
        raise TypeError("params must be a dict from param names to tensors")
    extra = [n for n in params if n not in names_par]
    if extra:
        raise ValueError(f"{extra[0]!r} is not a param of this cell; it has {names_par}")
    if states is not None:
        if not isinstance(states, dict):
            raise TypeError("states must be None or a dict from state names to tensors")
        extra = [n for n in states if n not in names_st]
        if extra:
            raise ValueError(f"{extra[0]!r} is not a state of this cell; it has {names_st}")
    for t in list(inputs) + list(params.values()) + list((states or {}).values()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
    missing = [n for n in names_par if n not in params]
    if missing:
        params = dict(params)
        for n in missing:
            params[n] = inputs[0].new_empty(0)
    return inputs, params, missing


def _bind(cell, shapes, missing):
    """`cell.bind_sizes(shapes)`, where a size that only a missing param
    would bind says that the param is missing."""
    try:
        return cell.bind_sizes(shapes)
    except ValueError:
        if missing:
            raise ValueError(f"no tensor for param {missing[0]!r}") from None
        raise


def _check_resets(resets, T, B, batch_first, device=None):
    """Resets as a uint8 tensor [T, B] ([B, T] batch-first), or None; on
    `device`, the other tensors', where it is given."""
    if resets is None:
        return None
    want = (B, T) if batch_first else (T, B)
    if not isinstance(resets, torch.Tensor) or tuple(resets.shape) != want:
        raise ValueError(f"resets must be a bool tensor of shape {list(want)}")
    if device is not None and resets.device != device:
        raise ValueError(f"resets are on {resets.device}, but the other tensors are on "
                         f"{device}")
    return resets.to(torch.uint8).contiguous()


def _autocast_cpu_of_torch():
    """The function that says whether autocast is on for the CPU, as this
    torch asks it: chosen once, since a streaming step asks every call (a
    TypeError caught each time cost 0.4 us of a 31 us step)."""
    try:
        torch.is_autocast_enabled("cpu")
        return lambda: torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled


_autocast_cpu = _autocast_cpu_of_torch()


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and compiler.is_compiling()


def keep_until_backward(kept):
    """A tensor for `ctx.save_for_backward` that holds `kept` (what the
    runtime keeps for the backward; `ctx.saved_tensors[-1].cellc_kept` in
    the backward). Autograd drops what was saved once the backward has run,
    unless the graph is retained, and `kept` goes with it. Held on `ctx`, it
    would live as long as the outputs: a training loop's next forward would
    then run while the last one's buffers are still held."""
    holder = torch.empty(0)
    holder.cellc_kept = kept
    return holder


class _CellFunction(torch.autograd.Function):
    """One call of a compiled cell: forward and backward in the CPU runtime."""

    @staticmethod
    def forward(ctx, compiled, mode, resets, lengths, training, counts, stats, *tensors):
        n_in, n_par, n_st, batch_first = counts
        inputs = tensors[:n_in]
        params = tensors[n_in:n_in + n_par]
        states = tensors[n_in + n_par:]
        x0 = inputs[0]
        T, B = (x0.shape[1], x0.shape[0]) if batch_first else (x0.shape[0], x0.shape[1])
        lead = (B, T) if batch_first else (T, B)
        outputs = [x0.new_empty(*lead, shape[0]) for _, shape in compiled.outputs]
        finals = [x0.new_empty(B, shape[0]) for _, shape in compiled.states]
        buf = lambda ts: [(t.data_ptr(), list(t.shape)) for t in ts]
        resets_ptr = resets.data_ptr() if resets is not None else 0
        # An output that is a state is that state's history for the backward:
        # saved here, so that autograd keeps it and catches an in-place change.
        saved = compiled.forward(buf(inputs), buf(params), buf(states), resets_ptr,
                                 T, B, batch_first, buf(outputs), buf(finals), mode,
                                 training, lengths, outputs_outlive_saved=True)
        ctx.compiled, ctx.counts = compiled, counts
        stats["saved_bytes"] = saved.nbytes if saved is not None else 0
        ctx.steps_batch = (T, B)
        ctx.resets, ctx.lengths = resets, lengths
        if training:
            ctx.save_for_backward(*tensors, *[outputs[i] for i in saved.outputs_read],
                                  keep_until_backward(saved))
        return (*outputs, *finals)

    @staticmethod
    @first_derivative
    def backward(ctx, *grads):
        # The kernels' gradients are not differentiated again (a gradient
        # penalty, MAML): differentiating them says so, where it would
        # otherwise be a silent zero.
        n_in, n_par, n_st, batch_first = ctx.counts
        # The saved outputs (read by the driver through what forward kept)
        # come after the tensors, and what forward kept last.
        tensors = ctx.saved_tensors[:n_in + n_par + n_st]
        saved = ctx.saved_tensors[-1].cellc_kept
        inputs = tensors[:n_in]
        params = tensors[n_in:n_in + n_par]
        states = tensors[n_in + n_par:]
        n_out = len(ctx.compiled.outputs)
        buf = lambda ts: [(t.data_ptr(), list(t.shape)) if t is not None else (0, [])
                          for t in ts]
        grad_out = [g.contiguous() if g is not None else None for g in grads[:n_out]]
        grad_fin = [g.contiguous() if g is not None else None for g in grads[n_out:]]
        # Only the gradients autograd wants (compiled, mode, resets, lengths,
        # training, counts and stats come first): an input's that nobody wants
        # costs neither its buffer nor its GEMM. Without initial states the
        # runtime starts from zeros, whose gradient nobody wants.
        wanted = ctx.needs_input_grad[7:]
        grad_like = lambda ts, first: [torch.empty_like(t) if wanted[first + i] else None
                                       for i, t in enumerate(ts)]
        d_in = grad_like(inputs, 0)
        d_par = grad_like(params, n_in)
        d_st = (grad_like(states, n_in + n_par) if states
                else [None] * len(ctx.compiled.states))
        T, B = ctx.steps_batch
        resets_ptr = ctx.resets.data_ptr() if ctx.resets is not None else 0
        ctx.compiled.backward(buf(inputs), buf(params), buf(states), resets_ptr, T, B,
                              batch_first, saved, buf(grad_out), buf(grad_fin),
                              buf(d_in), buf(d_par), buf(d_st), ctx.lengths)
        return (None, None, None, None, None, None, None, *d_in, *d_par,
                *(d_st if states else ()))


def _run(compiled, inputs, params, states, resets, mode, lengths, batch_first):
    """Runs a loaded CPU cell (the runtime's CompiledCell) on checked tensors
    under autograd: inputs and params in declaration order, states None or a
    dict (missing ones start at zero), resets uint8 or None, lengths a list.
    Returns the output (a dict when there are several), the final states and
    the bytes kept for the backward."""
    B = inputs[0].shape[0] if batch_first else inputs[0].shape[1]
    state_list = []
    if states is not None:
        for n, shape in compiled.states:
            t = states.get(n)
            state_list.append(t if t is not None else inputs[0].new_zeros(B, shape[0]))
    tensors = [t.contiguous() for t in list(inputs) + list(params) + state_list]
    training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    counts = (len(inputs), len(params), len(state_list), batch_first)
    stats = {}
    results = _CellFunction.apply(compiled, mode, resets, lengths, training, counts,
                                  stats, *tensors)
    n_out = len(compiled.outputs)
    outs, finals = results[:n_out], results[n_out:]
    out = outs[0] if n_out == 1 else {n: t for (n, _), t in zip(compiled.outputs, outs)}
    final = {n: t for (n, _), t in zip(compiled.states, finals)}
    return out, final, stats.get("saved_bytes", 0)
