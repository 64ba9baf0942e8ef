"""Streaming: one step of a cell at a time, as an RL actor or a server calls it.
Under no_grad on the CPU a step runs the step kernels directly, checked once
per shape (a _StepPlan); from a stream's second step a short path, written
out for its tensors, compares each with the last call's and runs the bound
step. Part of cellc.Cell (a mixin), and the nn modules' steps."""

import builtins
import collections

import torch

from . import _cellc, _ops
from ._front import _DTYPES, _arguments, _autocast_cpu, _bind, _one_dtype

#: What a direct step needs, checked once per shape (Cell._step_plan): the
#: step's compiled cell, the names of the inputs and params, the outputs'
#: widths, each state's (name, width, shape), the states' names in order,
#: a one-item list holding the step bound to these shapes (a BoundStep,
#: made by the first step that gives every state; None until then), and one
#: holding Cell.step's short path once bound (_stream_step).
_StepPlan = collections.namedtuple(
    "_StepPlan",
    "compiled names_in names_par widths_out widths_st state_names bound stream out_dims")


def _stream_function(plan, signature, guard, fetch, result, tensors, new_shapes, env,
                     out_shape=None):
    """The short path of a stream's steps once `plan`'s step is bound: a
    function of `signature` that runs the step where `guard` holds and the
    tensors that `fetch` gives (the inputs, params and states in `plan`'s
    order) each have the type, shape, dtype and layout of those in
    `tensors`, no gradient is wanted and autocast is off, and returns
    `result` (over the outputs o0.., each of `out_shape(n)`, by default
    [B, n], and the new states n0.., shaped as `new_shapes`); None, running
    nothing, where any of that differs (the caller then takes the checked
    path, which says what is wrong).

    Its code is written out for these tensors, as namedtuple writes its
    class: straight-line checks cost half of the same in a loop, and at B = 1
    a microsecond of Python is 3% of a step."""
    first_state = len(plan.names_in) + len(plan.names_par)
    env = dict(env, T=(torch.Tensor, torch.nn.Parameter), D=tensors[0].dtype,
               grad_enabled=torch.is_grad_enabled, autocast=_autocast_cpu,
               bound=plan.bound, empty_like=torch.empty_like)
    ts = [f"t{i}" for i in range(len(tensors))]
    checks = []
    for i, t in enumerate(ts):
        env[f"S{i}"] = tensors[i].shape
        checks.append(f"type({t}) not in T or {t}.shape != S{i} or {t}.dtype is not D "
                      f"or not {t}.is_cpu or not {t}.is_contiguous()")
    B = tensors[0].shape[0]
    out_shape = out_shape or (lambda w: (B, w))
    # An output shaped as an input or a state (an nn module's one-step call:
    # [1, B, H] as h) is made as its empty_like, torch's cheapest.
    like = {}
    for j, t in enumerate(tensors):
        if j < len(plan.names_in) or j >= first_state:
            like.setdefault(tuple(t.shape), j)
    allocs = [f"o{i} = empty_like(t{like[tuple(out_shape(w))]})"
              if tuple(out_shape(w)) in like else f"o{i} = t0.new_empty({tuple(out_shape(w))})"
              for i, w in enumerate(plan.widths_out)]
    for i, shape in enumerate(new_shapes):
        old = tensors[first_state + i]
        # empty_like is torch's cheapest allocation.
        allocs.append(f"n{i} = empty_like({ts[first_state + i]})" if tuple(old.shape) == shape
                      else f"n{i} = t0.new_empty({tuple(shape)})")
    results = [f"o{i}" for i in range(len(plan.widths_out))] + [
        f"n{i}" for i in range(len(new_shapes))]
    params = ts[len(plan.names_in):first_state]
    nl = "\n        "
    source = f"""
def step({signature}):
    if not ({guard}):
        return None
    {", ".join(ts)}, = {", ".join(fetch)},
    if ({(" or" + nl).join(checks)}):
        return None
    if grad_enabled() and ({" or ".join(t + ".requires_grad" for t in ts)}):
        return None
    if autocast() or bound[0] is None:
        return None
    {"; ".join(allocs)}
    if not bound[0].run([{", ".join(t + ".data_ptr()" for t in ts + results)}],
                        [{", ".join(p + "._version" for p in params)}]):
        bound[0] = None  # another B stepped since, or other threads
        return None
    return {result}
"""
    exec(builtins.compile(source, f"<cellc stream of {plan.compiled.path}>", "exec"), env)
    step = env["step"]
    step.plan = plan
    return step


def _no_stream(plan):
    """The short path of steps that cannot take one: always the checked path."""
    step = lambda *args: None
    step.plan = plan
    return step


def _stream_step(plan, x, params, states, output_names):
    """Cell.step's short path (_stream_function) for steps whose x, params
    and states come as in this call: the same names, tensors alike; none
    (_no_stream) where they do not come as dicts of tensors."""
    named = isinstance(x, dict)
    if (type(params) is not dict or type(states) is not dict
            or named and type(x) is not dict):
        return _no_stream(plan)
    names_in, names_par, names_st = plan.names_in, plan.names_par, plan.state_names
    guard = [f"type(params) is dict and len(params) == {len(params)}",
             f"type(states) is dict and len(states) == {len(states)}"]
    if named:
        guard.append(f"type(x) is dict and len(x) == {len(x)}")
        fetch = [f"x.get({n!r})" for n in names_in]
    else:
        guard.append("type(x) is not dict")
        fetch = ["x"]
    fetch += [f"params.get({n!r})" for n in names_par]
    fetch += [f"states.get({n!r})" for n in names_st]
    tensors = [x[n] for n in names_in] if named else [x]
    tensors += [params.get(n) for n in names_par] + [states.get(n) for n in names_st]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return _no_stream(plan)
    B = tensors[0].shape[0]
    outs = (["o0"] if len(output_names) == 1 else
            ["{" + ", ".join(f"{n!r}: o{i}" for i, n in enumerate(output_names)) + "}"])
    news = "{" + ", ".join(f"{n!r}: n{i}" for i, n in enumerate(names_st)) + "}"
    return _stream_function(plan, "x, params, states", " and ".join(guard), fetch,
                            f"{outs[0]}, {news}", tensors,
                            [(B, *shape) for _, _, shape in plan.widths_st], {})


class Steps:
    def step(self, x, params, states=None):
        """One step, as a stream runs the cell (an RL actor, a model served
        token by token): `x` is `[B, n]` (a dict for several inputs),
        `params` as for a call, `states` a dict of `[B, n]` (those missing
        start at zero). Returns `(output, new_states)`: the output `[B, n]`
        (a dict when there are several) and every state after the step.
        Under no_grad on the CPU it calls the kernel directly, with what it
        checked and allocated kept per shape; where gradients are wanted, or
        on CUDA, it is the call of a one-step sequence, and gradients flow
        as through any call."""
        for stream in self._streams:
            done = stream(x, params, states)
            if done is not None:
                if stream.plan.out_dims is not None:
                    return self._shaped_step(stream.plan, *done)
                return done
        plan = self._step_plan(x, params, states)
        if plan is None:
            return self._step_as_sequence(x, params, states)
        inputs = [x[n] for n in plan.names_in] if isinstance(x, dict) else [x]
        st = ([None] * len(plan.state_names) if states is None
              else [states.get(n) for n in plan.state_names])
        outs, news = self._step_run(plan, inputs, params, st)
        if plan.bound[0] is not None:
            # Made once a plan, and the last few kept: steps that alternate
            # between plans (the layers of a module, each its own sizes) each
            # find theirs. A stream that does not fit returns at its first
            # check that differs.
            if plan.stream[0] is None:
                plan.stream[0] = _stream_step(plan, x, params, states, self.outputs)
            self._streams = [plan.stream[0], *[s for s in self._streams
                                               if s is not plan.stream[0]][:3]]
        out = outs[0] if len(outs) == 1 else dict(zip(self.outputs, outs))
        if plan.out_dims is not None:
            return self._shaped_step(plan, out, dict(zip(plan.state_names, news)))
        return out, dict(zip(plan.state_names, news))

    def _shaped_step(self, plan, out, news):
        """A step's outputs in their declared dims (`output S` of a matrix
        state: [B, NH, K, V]), as a call's are."""
        if _ops.flat_matrix_outputs:
            return out, news
        shape = lambda o, d: o.reshape(o.shape[0], *d) if d else o
        if isinstance(out, dict):
            return {n: shape(o, d) for (n, o), d in zip(out.items(), plan.out_dims)}, news
        return shape(out, plan.out_dims[0]), news

    def _step_run(self, plan, inputs, params, states, lead=()):
        """Runs a step that `plan` (_step_plan) checked: `states` a list in
        the cell's order of contiguous tensors of B * n elements (or None:
        zeros). Returns the outputs and new states as lists; the new states
        have the leading dims `lead` (the nn modules' [1, B, n])."""
        compiled, widths_st = plan.compiled, plan.widths_st
        x0 = inputs[0]
        B = x0.shape[0]
        # A param the cell never reads may be left out (_arguments).
        par = [params[n] if n in params else x0.new_empty(0) for n in plan.names_par]
        outs = [x0.new_empty(B, w) for w in plan.widths_out]
        news = [x0.new_empty(*lead, B, *shape) for _, _, shape in widths_st]
        versions = [p._version for p in par]
        given = all([t is not None for t in states])
        bound = plan.bound[0]
        if bound is not None and given:
            # The step bound to these shapes: only the tensors' data.
            if bound.run([t.data_ptr() for t in (*inputs, *par, *states, *outs, *news)],
                         versions):
                return outs, news
            plan.bound[0] = None  # another B stepped since, or other threads
        buf = lambda ts: [(t.data_ptr(), list(t.shape)) for t in ts]
        # A state is passed as the kernel's [B, n] (a matrix state [B, NH, K, V]
        # as [B, NH*K*V]).
        flat = [(t.data_ptr(), [B, w]) if t is not None else None
                for t, (_, w, _) in zip(states, widths_st)]
        for i, (_, w, _) in enumerate(widths_st):
            if flat[i] is None:
                z = x0.new_zeros(B, w)
                flat[i] = (z.data_ptr(), [B, w])
                states[i] = z  # alive through the call
        # The versions say whether the weights the last step packed still hold.
        args = (buf(inputs), buf(par), flat, buf(outs),
                [(t.data_ptr(), [B, w]) for t, (_, w, _) in zip(news, widths_st)], versions)
        if given:  # bind the step for the next ones
            plan.bound[0] = compiled.bind_step(*args)
        else:
            compiled.step(*args)
        return outs, news

    def _step_plan(self, x, params, states):
        """What a direct step needs (a _StepPlan), cached per the tensors'
        shapes, dtypes and layouts; None where the step must run as a
        sequence (gradients, CUDA, the emulator, autocast)."""
        try:
            if isinstance(x, dict):
                tensors, names = [*x.values(), *params.values()], (tuple(x), tuple(params))
            else:
                tensors, names = [x, *params.values()], (None, tuple(params))
            if states is not None:
                tensors += states.values()
                names += (tuple(states),)
            key = (names, *[(t.shape, t.dtype, t.device, t.is_contiguous()) for t in tensors])
            grad = torch.is_grad_enabled() and any([t.requires_grad for t in tensors])
        except (AttributeError, TypeError):
            return None  # not tensors, not dicts: the sequence call says what is wrong
        if grad or self.emulated or _autocast_cpu():
            return None
        plan = self._step_plans.get(key, False)
        if plan is False:
            plan = self._make_step_plan(x, params, states)
            if len(self._step_plans) > 64:
                self._step_plans.clear()
            self._step_plans[key] = plan
        return plan

    def _make_step_plan(self, x, params, states):
        """Checks a step's tensors once for their key (errors as a call
        reports them) and binds its sizes."""
        names_in = [n for n, _ in self.inputs]
        names_par = [n for n, _ in self.params]
        inputs, params, missing = _arguments(x, params, states, names_in, names_par,
                                             [n for n, _ in self.states])
        tensors = list(inputs) + [params[n] for n in names_par] + list(
            (states or {}).values())
        if any(not t.is_contiguous() for t in tensors) or inputs[0].device.type != "cpu":
            return None
        dtype = _one_dtype(tensors)
        if dtype not in _DTYPES:
            return None  # the sequence call says which dtypes run
        if self.target == _cellc.Target.cuda.name:
            return None
        for name, t in zip(names_in, inputs):
            if t.dim() != 2:
                raise ValueError(f"a step's input '{name}' must be [B, n], got shape "
                                 f"{list(t.shape)}")
        B = inputs[0].shape[0]
        for name, t in zip(names_in, inputs):
            if t.shape[0] != B:
                raise ValueError(f"input '{name}' has B = {t.shape[0]}, but "
                                 f"'{names_in[0]}' has B = {B}")
        if B == 0:
            return None  # the sequence call takes an empty batch
        shapes = {n: (t.shape[1],) for n, t in zip(names_in, inputs)}
        shapes.update({n: tuple(params[n].shape) for n in names_par if n not in missing})
        shapes.update(self._state_shapes(states, B))
        sizes = _bind(self, shapes, missing)
        compiled = self.jit(sizes, dtype, batch=B, seq_len=1, step=True)
        widths_out = [shape[0] for _, shape in compiled.outputs]
        widths_st = [(n, shape[0], tuple(self.shape(n, sizes)))
                     for n, shape in compiled.states]
        dims = self.output_dims(sizes)
        return _StepPlan(compiled, names_in, names_par, widths_out, widths_st,
                         [n for n, _, _ in widths_st], [None], [None],
                         dims if any(dims) else None)

    def _step_as_sequence(self, x, params, states):
        """A step as the call of a one-step sequence (autograd, CUDA)."""
        named = x if isinstance(x, dict) else {n: x for n, _ in self.inputs[:1]}
        for n, t in named.items():
            if isinstance(t, torch.Tensor) and t.dim() != 2:
                raise ValueError(f"a step's input '{n}' must be [B, n], got shape "
                                 f"{list(t.shape)}")
        if isinstance(x, dict):
            seq = {n: t.unsqueeze(0) if isinstance(t, torch.Tensor) else t
                   for n, t in x.items()}
        else:
            seq = x.unsqueeze(0) if isinstance(x, torch.Tensor) else x
        out, final = _ops.call(self, seq, params, states)
        # The call's outputs are in their declared dims already.
        if isinstance(out, dict):
            return {n: o[0] for n, o in out.items()}, final
        return out[0], final
