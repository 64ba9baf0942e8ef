"""Modules: `Recurrent` for any cell, and drop-ins for torch.nn.LSTM and GRU
with the same constructor, forward signature and state_dict keys, plus
per-step episode resets."""

import math
import os

import torch
from torch.nn.utils.rnn import PackedSequence

from ._front import _compiling, one_step
from ._stream import _no_stream, _stream_function
from .core import compile as _compile


def _shipped(name):
    """A cell shipped with the package (cellc/cells/, copied from examples/)."""
    with open(os.path.join(os.path.dirname(__file__), "cells", name + ".cell")) as f:
        return f.read()


LSTM_CELL = _shipped("lstm")
GRU_CELL = _shipped("gru")
LSTMP_CELL = _shipped("lstmp")


def _reverse_steps(x, lengths):
    """`x` ([T, B, ...]) with each sample's steps reversed: its first
    lengths[b] (all T without lengths), the padding after them left in place.
    Its own inverse."""
    if lengths is None:
        return x.flip(0)
    T, B = x.shape[:2]
    t = torch.arange(T)[:, None]
    index = torch.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    index = index.to(x.device).view(T, B, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(0, index)


def _reverse_resets(resets, lengths):
    """Resets for the reverse direction: a segment that starts at step t ends
    at t - 1, which is where the reverse pass must restart: step len - t of
    the sample reversed."""
    if resets is None:
        return None
    T, B = resets.shape
    lengths = torch.full((B,), T) if lengths is None else lengths
    s = torch.arange(T)[:, None]
    src = (lengths[None, :] - s).clamp(0, T - 1).to(resets.device)
    valid = ((s >= 1) & (s < lengths[None, :])).to(resets.device)
    return resets.gather(0, src) & valid


def _unpack(packed):
    """A PackedSequence as a padded time-major batch ([T, B, n], zeros past
    each length) and its lengths, longest first: the order of its data, and
    the one in which the driver runs only the samples that have not ended.
    Also `to_sorted`, which puts per-sample tensors (dim 1) in that order, or
    back with `to_sorted(t, True)`."""
    sizes = packed.batch_sizes
    T, B = len(sizes), int(sizes[0])
    # Row r of the data is step t of sample b (sorted order): at t * B + b.
    starts = torch.cumsum(sizes, 0) - sizes
    steps = torch.repeat_interleave(torch.arange(T), sizes)
    rows = steps * B + torch.arange(len(steps)) - starts[steps]
    rows = rows.to(packed.data.device)
    data = packed.data
    padded = data.new_zeros(T * B, *data.shape[1:]).index_copy(0, rows, data)
    lengths = (sizes[None, :] > torch.arange(B)[:, None]).sum(1)
    order, back = packed.sorted_indices, packed.unsorted_indices

    def to_sorted(t, back_=False):
        index = back if back_ else order
        return t if index is None or t is None else t.index_select(1, index.to(t.device))

    return padded.view(T, B, *data.shape[1:]), lengths, to_sorted, rows


def _pack_like(out, rows, like):
    """Time-major `out` ([T, B, n], longest first) packed like `like`."""
    data = out.reshape(-1, *out.shape[2:]).index_select(0, rows)
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def _check_input(input, who, batched, unbatched):
    """Whether `input`, a tensor of `batched` or `unbatched` dimensions (each
    given as its count first, then words), is batched."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{who}: input must be a tensor, got {type(input).__name__}")
    dims = int(batched.split()[0])
    if input.dim() not in (dims - 1, dims):
        raise ValueError(f"{who}: expected input of {unbatched} or {batched} dimensions, "
                         f"got shape {list(input.shape)}")
    return input.dim() == dims


class _TorchStyleRNN(torch.nn.Module):
    """The common part of LSTM and GRU: torch's parameter layout and forward."""

    def __init__(self, source, gates, state_names, input_size, hidden_size,
                 num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None,
                 recompute="none", target=None, cuda=None):
        super().__init__()
        if proj_size < 0:
            raise ValueError(f"proj_size should be >= 0, got {proj_size}")
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size ({proj_size}) has to be smaller than "
                             f"hidden_size ({hidden_size})")
        # LSTMP: h is the projection of o * tanh(c) (examples/lstmp.cell).
        self.cell = _compile(LSTMP_CELL if proj_size else source, target, cuda=cuda)
        self.state_names = state_names
        self.proj_size = proj_size
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers, self.bias = num_layers, bias
        self.batch_first, self.dropout = batch_first, float(dropout)
        self.bidirectional = bidirectional
        self.recompute = recompute
        #: Bytes the last forward keeps for backward, over all layers.
        self.saved_bytes = 0
        directions = 2 if bidirectional else 1
        factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
        # What each layer outputs: h, or its projection.
        out_size = proj_size or hidden_size
        #: The shape of each state per layer and direction: h, then c.
        self._state_sizes = [out_size, hidden_size][:len(state_names)]
        self._names = []
        for layer in range(num_layers):
            for d in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                size_in = input_size if layer == 0 else out_size * directions
                # torch's order: weight_ih, weight_hh, bias_ih, bias_hh, weight_hr.
                shapes = {f"weight_ih{suffix}": (gates * hidden_size, size_in),
                          f"weight_hh{suffix}": (gates * hidden_size, out_size)}
                if bias:
                    shapes[f"bias_ih{suffix}"] = (gates * hidden_size,)
                    shapes[f"bias_hh{suffix}"] = (gates * hidden_size,)
                if proj_size:
                    shapes[f"weight_hr{suffix}"] = (proj_size, hidden_size)
                for n, shape in shapes.items():
                    self.register_parameter(n, torch.nn.Parameter(torch.empty(*shape,
                                                                              **factory)))
                self._names.append(list(shapes))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    # What torch.nn.LSTM and GRU have besides forward, for code written for them.

    @property
    def mode(self):
        """"LSTM" or "GRU", as torch's RNNBase.mode."""
        return type(self).__name__

    @property
    def all_weights(self):
        """The parameters of each layer and direction, in torch's order
        (weight_ih, weight_hh, bias_ih, bias_hh, weight_hr)."""
        return [[getattr(self, n) for n in names] for names in self._names]

    def flatten_parameters(self):
        """Nothing to do: torch packs cuDNN's weights into one buffer here,
        and cellc's kernels read the parameters where they are."""

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first:
            s += f", batch_first={self.batch_first}"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += f", bidirectional={self.bidirectional}"
        if self.recompute != "none":
            s += f", recompute={self.recompute!r}"
        return s

    def _torch_names(self, index):
        """The cell's params that are this module's parameters for layer and
        direction `index`, and their names here (no biases without bias)."""
        cell = ["W_ih", "W_hh"] + (["b_ih", "b_hh"] if self.bias else []) + (
            ["W_hr"] if self.proj_size else [])
        return dict(zip(cell, self._names[index]))

    def _params(self, index):
        # The registered parameters first (faster than getattr, which also
        # finds what weight_norm and parametrizations put in their place).
        own = self._parameters
        get = lambda n: own[n] if n in own else getattr(self, n)
        given = {n: get(t) for n, t in self._torch_names(index).items()}
        w_ih = given["W_ih"]
        params = {"W_ih": w_ih, "W_hh": given["W_hh"]}
        for n in ("b_ih", "b_hh"):  # zeros without bias
            params[n] = given[n] if self.bias else w_ih.new_zeros(w_ih.shape[0])
        if self.proj_size:
            params["W_hr"] = given["W_hr"]
        return params

    def _run(self, x, hx, resets, lengths):
        # x is [T, B, n]; hx is a tuple of [L * D, B, H] or None; lengths [B]
        # or None.
        directions = 2 if self.bidirectional else 1
        finals = [[] for _ in self.state_names]
        layer_input = x
        # Eager bookkeeping: a compiled graph neither reads nor guards on it.
        count = not _compiling()
        saved_bytes = 0
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                index = layer * directions + d
                states = None
                if hx is not None:
                    states = {n: h[index] for n, h in zip(self.state_names, hx)}
                # The reverse direction starts at each sample's own last step.
                seq = layer_input if d == 0 else _reverse_steps(layer_input, lengths)
                r = resets if d == 0 else _reverse_resets(resets, lengths)
                out, final = self.cell(seq, self._params(index), states, resets=r,
                                       recompute=self.recompute, lengths=lengths)
                if count:
                    saved_bytes += self.cell.saved_bytes
                outs.append(out if d == 0 else _reverse_steps(out, lengths))
                for k, n in enumerate(self.state_names):
                    finals[k].append(final[n])
            layer_input = outs[0] if directions == 1 else torch.cat(outs, dim=2)
            if layer + 1 < self.num_layers and self.training and self.dropout:
                layer_input = torch.nn.functional.dropout(layer_input, self.dropout, True)
        if count:
            self.saved_bytes = saved_bytes
        return layer_input, tuple(torch.stack(f) for f in finals)

    def _forward(self, input, hx, resets):
        if (not torch.is_grad_enabled() and resets is None and not self.bidirectional
                and isinstance(input, torch.Tensor) and not _compiling()):
            # A one-step call under no_grad (an RL actor's `lstm(x_t[None],
            # hx)`) is a step: the step kernels, their packed weights and
            # short path, and the sequence's results.
            if self.saved_bytes:
                self.saved_bytes = 0
            stream = self._stream_of_calls
            if stream is not None and hx is not None:
                done = stream(input, hx)
                if done is not None:
                    return done
            batched = input.dim() == 3
            step = one_step(input, self.batch_first, 3 if batched else 2)
            if step is not None:
                out, finals = self._step(step, hx)
                plan = self._stream.plan if self._stream is not None else None
                if (batched and hx is not None and plan is not None
                        and plan.bound[0] is not None and (self._stream_of_calls is None
                                                           or self._stream_of_calls.plan
                                                           is not plan)):
                    # The short path of the next such calls: no views in or out.
                    self._stream_of_calls = self._stream_of(plan, input, list(hx), call=True)
                return out.unsqueeze(1 if self.batch_first and batched else 0), finals
        name = type(self).__name__
        if isinstance(input, PackedSequence):
            # The kernels run each sample to its length; hx, the final states
            # and resets (if any: [T, B] over the padded batch) are in the
            # batch's original order, as in torch.
            x, lengths, to_sorted, rows = _unpack(input)
            if hx is not None:
                hx = tuple(to_sorted(self._check_state(h, i, x.shape[1], True))
                           for i, h in enumerate(hx))
            if resets is not None and (resets.dtype != torch.bool
                                       or tuple(resets.shape) != tuple(x.shape[:2])):
                raise ValueError(f"with a PackedSequence, resets must be a bool tensor "
                                 f"of shape {list(x.shape[:2])} (time-major)")
            out, finals = self._run(x, hx, to_sorted(resets), lengths)
            return (_pack_like(out, rows, input),
                    tuple(to_sorted(f, True) for f in finals))
        batched = _check_input(input, f"cellc.nn.{name}", "3", "2 (unbatched)")
        # Unbatched input is [T, n] whatever batch_first says, as in torch.
        if not batched:
            x = input.unsqueeze(1)
        else:
            x = input.transpose(0, 1) if self.batch_first else input
        if resets is not None:
            if resets.dtype != torch.bool:
                raise TypeError("resets must be a bool tensor")
            if resets.dim() != input.dim() - 1:
                raise ValueError(f"resets must have {input.dim() - 1} dimensions, got "
                                 f"shape {list(resets.shape)}")
            if not batched:
                resets = resets.unsqueeze(1)
            elif self.batch_first:
                resets = resets.transpose(0, 1)
        if hx is not None:
            hx = tuple(self._check_state(h, i, x.shape[1], batched)
                       for i, h in enumerate(hx))
        out, finals = self._run(x, hx, resets, None)
        if not batched:
            return out.squeeze(1), tuple(f.squeeze(1) for f in finals)
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, finals

    def _step(self, input, hx):
        """One step of every layer: `input` [B, n] (unbatched: [n]), `hx` a
        tuple of [L, B, n] (unbatched: [L, n]) or None. Returns the last
        layer's output and the new states, shaped as `hx`."""
        stream = self._stream
        if stream is not None and hx is not None:
            done = stream(input, hx)
            if done is not None:
                return done
        name = type(self).__name__
        if self.bidirectional:
            raise ValueError(f"cellc.nn.{name}.step: a bidirectional module has no step "
                             f"(its reverse direction starts at the sequence's end)")
        batched = _check_input(input, f"cellc.nn.{name}.step", "2 (batched: [B, n])",
                               "1 (unbatched)")
        x = input if batched else input.unsqueeze(0)
        if batched and self.num_layers == 1:
            direct = self._direct_step(x, hx)
            if direct is not None:
                return direct
        if hx is not None:
            hx = tuple(self._check_state(h, i, x.shape[0], batched)
                       for i, h in enumerate(hx))
        finals = [[] for _ in self.state_names]
        for layer in range(self.num_layers):
            states = None if hx is None else {n: h[layer]
                                              for n, h in zip(self.state_names, hx)}
            x, final = self.cell.step(x, self._params(layer), states)
            for k, n in enumerate(self.state_names):
                finals[k].append(final[n])
            if layer + 1 < self.num_layers and self.training and self.dropout:
                x = torch.nn.functional.dropout(x, self.dropout, True)
        # One layer: a view, not a copy.
        finals = tuple(f[0].unsqueeze(0) if len(f) == 1 else torch.stack(f) for f in finals)
        if not batched:
            return x[0], tuple(f[:, 0] for f in finals)
        return x, finals

    def _direct_step(self, x, hx):
        """One layer's step straight to its kernel, with the states read and
        written as [1, B, n] (no views, no copies); None where the cell's
        step would not call the kernel directly, or the states are not
        contiguous [1, B, n] tensors of the input's dtype and device (the
        general path then says what is wrong, or runs them)."""
        params = self._params(0)
        plan = self.cell._step_plan(x, params, None)
        if plan is None:
            return None
        if hx is not None:
            grad = torch.is_grad_enabled()
            B = x.shape[0]
            for h, n in zip(hx, self._state_sizes):
                if (not isinstance(h, torch.Tensor) or h.shape != (1, B, n)
                        or not h.is_contiguous() or h.dtype != x.dtype
                        or h.device != x.device or grad and h.requires_grad):
                    return None
        order = plan.state_names  # the cell's order
        same = order == self.state_names
        if hx is None:
            states = [None] * len(order)
        else:
            states = list(hx) if same else [dict(zip(self.state_names, hx))[n] for n in order]
        outs, news = self.cell._step_run(plan, [x], params, states, lead=(1,))
        if (hx is not None and plan.bound[0] is not None
                and (self._stream is None or self._stream.plan is not plan)):
            self._stream = self._stream_of(plan, x, states)
        if not same:
            new = dict(zip(order, news))
            news = [new[n] for n in self.state_names]
        return outs[0], tuple(news)

    # The last bound step's short path (_stream_of), and that of one-step
    # calls, or None; class attributes, so that a module pickled without
    # them steps too.
    _stream = None
    _stream_of_calls = None

    def _stream_of(self, plan, x, states, call=False):
        """The short path (cellc.core._stream_function) of the next steps of
        a one-layer module whose step `plan` has bound, from states in the
        cell's order given as these are: the module's own parameters (not
        ones that weight_norm or a parametrization makes), read each step.
        With `call`, of its one-step calls (forward): `x` is [1, B, n] (or
        [B, 1, n] batch-first), and so is the output."""
        own = self._parameters
        torch_names = self._torch_names(0)
        names = [torch_names.get(n) for n in plan.names_par]
        if (not self.bias or plan.state_names != self.state_names
                or any(n not in own for n in names)):
            return _no_stream(plan)
        k = len(states)
        fetch = ["input"] + [f"own.get({n!r})" for n in names] + [f"hx[{i}]" for i in range(k)]
        news = ", ".join(f"n{i}" for i in range(k))
        B = x.shape[0 if not call or self.batch_first else 1]
        lead = (1, B) if call and not self.batch_first else (B, 1) if call else None
        return _stream_function(
            plan, "input, hx", f"type(hx) in (tuple, list) and len(hx) == {k}", fetch,
            f"o0, ({news},)", [x, *[own[n] for n in names], *states],
            [(1, B, *shape) for _, _, shape in plan.widths_st], {"own": own},
            out_shape=(lambda w: (*lead, w)) if call else None)

    def __getstate__(self):
        # The stream's short path is this module's, bound to its kernels.
        return dict(self.__dict__, _stream=None, _stream_of_calls=None)

    def _check_state(self, h, i, batch, batched):
        """The i-th initial state, [L * D, B, n] (unbatched: [L * D, n])."""
        layers = self.num_layers * (2 if self.bidirectional else 1)
        want = (layers, batch, self._state_sizes[i]) if batched else \
            (layers, self._state_sizes[i])
        if not isinstance(h, torch.Tensor) or tuple(h.shape) != want:
            got = list(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(f"cellc.nn.{type(self).__name__}: expected initial state "
                             f"'{self.state_names[i]}' of shape {list(want)}, got {got}")
        return h if batched else h.unsqueeze(1)


class LSTM(_TorchStyleRNN):
    """torch.nn.LSTM on cellc kernels: the same arguments (proj_size runs
    examples/lstmp.cell), state_dict keys and forward; `recompute` ("none", "full", "chunk:K") trades memory for time,
    and `resets` ([T, B] bool, or [B, T] with batch_first) restarts episodes
    from the initial state inside the sequence. `target` and `cuda` are
    cellc.compile's: target="cuda-emu" runs the CUDA kernels on CPU tensors
    in the SIMT emulator."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None, recompute="none", target=None, cuda=None):
        super().__init__(LSTM_CELL, 4, ["h", "c"], input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, proj_size, device,
                         dtype, recompute, target, cuda)

    def forward(self, input, hx=None, resets=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ValueError("cellc.nn.LSTM: hx must be a tuple (h_0, c_0)")
        out, (h, c) = self._forward(input, hx, resets)
        return out, (h, c)

    def step(self, input, hx=None):
        """One time step, as a stream runs the module (an RL actor, a model
        served token by token): `input` [B, input_size] (or unbatched
        [input_size]), `hx` = (h, c) as for forward, or None (zeros).
        Returns `(output, (h, c))`, output [B, H] the last layer's h. Under
        no_grad it calls the kernels directly (cellc.Cell.step); where
        gradients are wanted they flow as through forward. Not for a
        bidirectional module."""
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ValueError("cellc.nn.LSTM.step: hx must be a tuple (h_0, c_0)")
        out, (h, c) = self._step(input, hx)
        return out, (h, c)


class GRU(_TorchStyleRNN):
    """torch.nn.GRU on cellc kernels; see LSTM for `recompute`, `resets`,
    `target` and `cuda`."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None,
                 dtype=None, recompute="none", target=None, cuda=None):
        super().__init__(GRU_CELL, 3, ["h"], input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype,
                         recompute, target, cuda)

    def forward(self, input, hx=None, resets=None):
        out, (h,) = self._forward(input, None if hx is None else (hx,), resets)
        return out, h

    def step(self, input, hx=None):
        """One time step: `input` [B, input_size] (or [input_size]), `hx` as
        for forward or None. Returns `(output, h)`; see LSTM.step."""
        out, (h,) = self._step(input, None if hx is None else (hx,))
        return out, h


def _output_width(cell, sizes):
    """The width of the first output of `cell` at `sizes`: a state's size
    (all its dims), or else what the compiled cell says."""
    states = dict(cell.states)
    if cell.outputs[0] in states:
        return math.prod(cell.shape(cell.outputs[0], sizes))
    return cell.jit(sizes, torch.float32).outputs[0][1][0]


class Recurrent(torch.nn.Module):
    """Any cell as a module: `Recurrent(cell, I=..., H=..., num_layers=1)`
    creates the cell's params with uniform(-1/sqrt(H), 1/sqrt(H)) and runs the
    layers in sequence (layer k > 0 takes the previous layer's first output)."""

    def __init__(self, cell, num_layers=1, batch_first=False, dropout=0.0,
                 recompute="none", dtype=None, target=None, cuda=None, form="step",
                 chunk=None, **sizes):
        super().__init__()
        self.cell = _compile(cell, target, cuda=cuda) if isinstance(cell, str) else cell
        self.sizes = dict(sizes)
        self.num_layers, self.batch_first = num_layers, batch_first
        self.dropout, self.recompute = float(dropout), recompute
        # The training form (cellc.Cell's form="step" | "chunk" | "auto").
        self.form, self.chunk = form, chunk
        self.layer_sizes = []
        hidden = sizes.get("H", next(iter(sizes.values())) if sizes else 1)
        bound = 1.0 / math.sqrt(hidden)
        dtype = dtype or torch.get_default_dtype()
        self.layers = torch.nn.ModuleList()
        # Layers after the first read the previous layer's first output: the
        # input's size symbol is bound to its width.
        out_size = _output_width(self.cell, sizes) if num_layers > 1 else None
        first_input = self.cell.inputs[0][1][0] if self.cell.inputs else None
        for layer in range(num_layers):
            params = torch.nn.ParameterDict()
            layer_sizes = dict(sizes)
            if layer and first_input and first_input.isidentifier():
                layer_sizes[first_input] = out_size
            for name, _ in self.cell.params:
                dims = self.cell.shape(name, layer_sizes)
                params[name] = torch.nn.Parameter(
                    torch.empty(*dims, dtype=dtype).uniform_(-bound, bound))
            self.layers.append(params)
            # The sizes a call binds from them: those the params' shapes hold
            # only as products (GLA's NH*K) too.
            self.layer_sizes.append({n: v for n, v in layer_sizes.items()
                                     if n in self.cell.size_symbols})

    def forward(self, x, states=None, resets=None, lengths=None):
        """x: [T, B, n] ([B, T, n] with batch_first) or a PackedSequence;
        `lengths` ([B] int64 on the CPU) runs each sample to its own length.
        Returns the last layer's first output (packed like x when x is) and
        each layer's final states."""
        packed = x if isinstance(x, PackedSequence) else None
        if packed is not None:
            if lengths is not None:
                raise ValueError("a PackedSequence carries its own lengths; do not pass "
                                 "lengths too")
            x, lengths, to_sorted, rows = _unpack(packed)
            resets = to_sorted(resets)
            if states is not None:
                states = [{n: to_sorted(t[None])[0] for n, t in layer.items()}
                          for layer in states]
        elif self.batch_first:
            x = x.transpose(0, 1)
            if resets is not None:
                resets = resets.transpose(0, 1)
        finals = []
        for k, params in enumerate(self.layers):
            out, final = self.cell(x, dict(params.items()),
                                   None if states is None else states[k],
                                   resets=resets, recompute=self.recompute,
                                   lengths=lengths, sizes=self.layer_sizes[k],
                                   form=self.form, chunk=self.chunk)
            finals.append(final)
            x = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
            if k + 1 < self.num_layers and self.training and self.dropout:
                x = torch.nn.functional.dropout(x, self.dropout, True)
        if packed is not None:
            finals = [{n: to_sorted(t[None], True)[0] for n, t in f.items()} for f in finals]
            return _pack_like(x, rows, packed), finals
        if self.batch_first:
            x = x.transpose(0, 1)
        return x, finals

    def step(self, x, states=None):
        """One time step of every layer: `x` [B, n], `states` None or a list
        (one a layer) of dicts of [B, n]. Returns the last layer's first
        output and each layer's new states, as forward does for a
        sequence; see cellc.Cell.step."""
        if states is not None and (not isinstance(states, (list, tuple))
                                   or len(states) != self.num_layers):
            raise ValueError(f"cellc.nn.Recurrent.step: states must be a list of "
                             f"{self.num_layers} dicts (one a layer), or None")
        finals = []
        for k, params in enumerate(self.layers):
            out, final = self.cell.step(x, dict(params.items()),
                                        None if states is None else states[k])
            finals.append(final)
            x = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
            if k + 1 < self.num_layers and self.training and self.dropout:
                x = torch.nn.functional.dropout(x, self.dropout, True)
        return x, finals


LAYERNORM_LSTM_CELL = _shipped("layernorm_lstm")


class LayerNormLSTM(torch.nn.Module):
    """Haste's LayerNormLSTM (haste_pytorch.LayerNormLSTM), on cellc's
    kernels: the same constructor, parameter names and shapes (`kernel`
    [I, 4H], `recurrent_kernel` [H, 4H], `bias` [4H], `gamma` [2, 4H],
    `gamma_h` and `beta_h` [H]), initialization, gate order (i, g, f, o) and
    DropConnect `dropout` on the recurrent kernel; zoneout is not offered.
    The step is examples/layernorm_lstm.cell. `forward(input, state=None,
    lengths=None, resets=None)` returns `output` [T, B, H] and `(h_n, c_n)`,
    each [1, B, H]; `state` is such a pair. `recompute`, `target` and `cuda`
    as for cellc cells."""

    def __init__(self, input_size, hidden_size, batch_first=False, forget_bias=1.0,
                 dropout=0.0, recompute="none", dtype=None, target=None, cuda=None):
        super().__init__()
        if not 0.0 <= dropout <= 1.0:
            raise ValueError("LayerNormLSTM: dropout must be in [0.0, 1.0]")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.batch_first, self.forget_bias = batch_first, forget_bias
        self.dropout, self.recompute = float(dropout), recompute
        self.cell = _compile(LAYERNORM_LSTM_CELL, target, cuda=cuda)
        H, dtype = hidden_size, dtype or torch.get_default_dtype()
        empty = lambda *shape: torch.nn.Parameter(torch.empty(*shape, dtype=dtype))
        self.kernel = empty(input_size, 4 * H)
        self.recurrent_kernel = empty(H, 4 * H)
        self.bias = empty(4 * H)
        self.gamma = empty(2, 4 * H)
        self.gamma_h = empty(H)
        self.beta_h = empty(H)
        self.reset_parameters()

    def reset_parameters(self):
        H = self.hidden_size
        with torch.no_grad():
            for i in range(4):
                torch.nn.init.xavier_uniform_(self.kernel[:, i * H:(i + 1) * H])
                torch.nn.init.orthogonal_(self.recurrent_kernel[:, i * H:(i + 1) * H])
            torch.nn.init.zeros_(self.bias)
            torch.nn.init.constant_(self.bias[2 * H:3 * H], self.forget_bias)
            torch.nn.init.ones_(self.gamma)
            torch.nn.init.ones_(self.gamma_h)
            torch.nn.init.zeros_(self.beta_h)

    def forward(self, input, state=None, lengths=None, resets=None):
        x = input.transpose(0, 1) if self.batch_first else input
        if resets is not None and self.batch_first:
            resets = resets.transpose(0, 1)
        B, H = x.shape[1], self.hidden_size
        states = None
        if state is not None:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise ValueError("LayerNormLSTM: state must be a pair (h_0, c_0)")
            for name, s in zip("hc", state):
                if s.shape != (1, B, H):
                    raise ValueError(f"LayerNormLSTM: {name}_0 must be [1, {B}, {H}], "
                                     f"got {list(s.shape)}")
            states = {"h": state[0][0], "c": state[1][0]}
        recurrent = self.recurrent_kernel
        if self.training and self.dropout:
            recurrent = torch.nn.functional.dropout(recurrent, self.dropout, True)
        params = {"W": self.kernel.t().contiguous(), "R": recurrent.t().contiguous(),
                  "b": self.bias, "gamma_x": self.gamma[0], "gamma_r": self.gamma[1],
                  "gamma_h": self.gamma_h, "beta_h": self.beta_h}
        out, final = self.cell(x, params, states, resets=resets, recompute=self.recompute,
                               lengths=lengths)
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, (final["h"][None], final["c"][None])
