"""The chunk form's cores on their own (cellc._chunkcore): the torch
templates' written-out adjoints against torch's reverse mode through the
generic core, and the CPU runtime's kernels (runtime/cpu/ChunkCore) against
the templates, in float64 and float32, forward and every gradient."""

import pytest
import torch

from test_chunkwise import rel


@pytest.mark.parametrize("rows", [False, True], ids=["scalar gate", "row gate"])
def test_the_templates_adjoint_is_the_reverse_mode_of_the_core(rows):
    # The written-out backward (_DiagonalCore) against torch's reverse mode
    # through the generic core, on random tensors: two reads, T = 45 in
    # chunks of 32 (sub-chunks of 16 cut across), gates down to e^-3 a step.
    from cellc import _chunkcore as cw
    g = torch.Generator().manual_seed(11)
    B, H, T, K, V, L = 2, 3, 45, 5, 4, 32
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    # A scalar gate is one value a head, expanded along K (its gradient the
    # sum over K).
    gate = (-3 * torch.rand(B, H, T, K if rows else 1, generator=g,
                            dtype=torch.float64)).requires_grad_()
    a = gate.expand(B, H, T, K)
    k, v, S0 = r(B, H, T, K).requires_grad_(), r(B, H, T, V).requires_grad_(), \
        r(B, H, K, V).requires_grad_()
    qs = [r(B, H, T, K).requires_grad_() for _ in range(2)]
    c = torch.zeros(B, H, T, V, dtype=torch.float64)
    weights = [r(B, H, T, V) for _ in qs] + [r(B, H, K, V)]
    leaves = [gate, k, v, S0, *qs]

    def grads(results):
        loss = sum((w * t).sum() for w, t in zip(weights, results))
        return [t.detach() for t in results], torch.autograd.grad(loss, leaves)

    outs, S = cw._core(a, c, k, v, S0, [(q, True) for q in qs], None, L, rows)
    want, want_grads = grads([*outs, S])
    got, got_grads = grads(cw._DiagonalCore.apply(a, k, v, S0, L, rows, *qs))
    for x, y in zip(got + list(got_grads), want + list(want_grads)):
        assert rel(x, y) < 1e-12


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("rows", [False, True], ids=["scalar gate", "row gate"])
@pytest.mark.parametrize("strength", [0.1, 2.0, 3.0, 20.0, -0.1],
                         ids=["gentle", "near", "mixed", "steep", "rising"])
def test_the_native_core_is_the_torch_template(rows, dtype, strength, threads, monkeypatch):
    # runtime/cpu/ChunkCore against _DiagonalCore in torch: outputs, end
    # state and every gradient; T = 45 in chunks of 32 (a partial chunk,
    # sub-chunks of 16 cut across), two reads, one without a gradient, the
    # six heads on one thread or over four. The log-gates fall by up to
    # `strength` a step (rise, where it is negative): gentle, near (up to
    # 38.7) and rising ones keep every chunk's |cumulative log-gate| within
    # 40, where a row gate's pairs factor through the chunk's start
    # (Chunk::tame); steep ones take the sub-chunks in every chunk; mixed,
    # some of each.
    from cellc import _chunkcore as cw
    monkeypatch.setattr(cw.torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(12)
    B, H, T, K, V, L = 2, 3, 45, 5, 4, 32
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    gate = (-strength * torch.rand(B, H, T, K if rows else 1, generator=g,
                                   dtype=torch.float64)).to(dtype).requires_grad_()
    # The largest |cumulative log-gate| of each chunk, as Chunk::tame reads it.
    A = torch.cat([gate.detach().double()[:, :, t:t + L].cumsum(2).abs().amax((2, 3))[None]
                   for t in range(0, T, L)])
    tame = A <= 40
    assert {0.1: tame.all(), 2.0: tame.all() and A.max() > 30, -0.1: tame.all(),
            3.0: tame.any() and not tame.all(), 20.0: not tame.any()}[strength]
    a = gate.expand(B, H, T, K)
    k, v, S0 = r(B, H, T, K).requires_grad_(), r(B, H, T, V).requires_grad_(), \
        r(B, H, K, V).requires_grad_()
    qs = [r(B, H, T, K).requires_grad_() for _ in range(2)]
    weights = [r(B, H, T, V), None, r(B, H, K, V)]
    leaves = [gate, k, v, S0, *qs]

    def grads(core):
        results = core.apply(a, k, v, S0, L, rows, *qs)
        loss = sum((w * t).sum() for w, t in zip(weights, results) if w is not None)
        return [t.detach() for t in results], torch.autograd.grad(loss, leaves)

    (want, want_grads), (got, got_grads) = grads(cw._DiagonalCore), \
        grads(cw._NativeDiagonalCore)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for x, y in zip(got + list(got_grads), want + list(want_grads)):
        assert rel(x, y) < tol


@pytest.mark.parametrize("delta", [False, True], ids=["diagonal", "delta rule"])
def test_the_native_cores_take_states_wider_than_a_product_block(delta):
    # K = 70 and V = 80 (the CPU core's products run 64 columns a block and
    # six rows a call), chunks of 16 and a partial one: f32 against the
    # float64 torch templates, forward and every gradient.
    from cellc import _chunkcore as cw
    g = torch.Generator().manual_seed(14)
    B, H, T, K, V, L = 1, 2, 37, 70, 80, 16
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    gate = (-0.3 * torch.rand(B, H, T, 1 if delta else K, generator=g,
                              dtype=torch.float64)).requires_grad_()
    k = (r(B, H, T, K) / K ** 0.5).requires_grad_()
    v, S0, q = r(B, H, T, V).requires_grad_(), r(B, H, K, V).requires_grad_(), \
        r(B, H, T, K).requires_grad_()
    beta = torch.rand(B, H, T, 1, generator=g, dtype=torch.float64).requires_grad_()
    leaves = [gate, k, v, S0, q] + ([beta] if delta else [])
    weights = [r(B, H, T, V), r(B, H, K, V)]

    def grads(core, dtype):
        ins = [t.to(dtype) for t in leaves]
        if delta:
            results = core.apply(ins[0].squeeze(-1), ins[1], ins[2], ins[5], ins[3], L, ins[4])
        else:
            results = core.apply(ins[0], *ins[1:4], L, True, ins[4])
        loss = sum((w.to(dtype) * t).sum() for w, t in zip(weights, results))
        return [t.double() for t in (*results, *torch.autograd.grad(loss, leaves))]

    want = grads(cw._DeltaCore if delta else cw._DiagonalCore, torch.float64)
    got = grads(cw._NativeDeltaCore if delta else cw._NativeDiagonalCore, torch.float32)
    for x, y in zip(got, want):
        assert y.abs().max() > 0 and rel(x, y) < 2e-5


def test_the_delta_rules_adjoint_is_the_reverse_mode_of_the_core():
    # _DeltaCore's written-out backward (the transposed solves, the
    # gradients through M = I + beta k k^T e^{A_i - A_j}) against torch's
    # reverse mode through the generic core: T = 45 in chunks of 32.
    from cellc import _chunkcore as cw
    g = torch.Generator().manual_seed(13)
    B, H, T, K, V, L = 2, 3, 45, 5, 4, 32
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    gate = (-torch.rand(B, H, T, generator=g, dtype=torch.float64)).requires_grad_()
    k = torch.nn.functional.normalize(r(B, H, T, K), dim=-1).requires_grad_()
    w, S0 = r(B, H, T, V).requires_grad_(), r(B, H, K, V).requires_grad_()
    beta = torch.rand(B, H, T, 1, generator=g, dtype=torch.float64).requires_grad_()
    qs = [r(B, H, T, K).requires_grad_() for _ in range(2)]
    weights = [r(B, H, T, V) for _ in qs] + [r(B, H, K, V)]
    leaves = [gate, k, w, beta, S0, *qs]

    def grads(results):
        loss = sum((x * t).sum() for x, t in zip(weights, results))
        return [t.detach() for t in results], torch.autograd.grad(loss, leaves)

    a = gate[..., None].expand(B, H, T, K)
    c = torch.zeros(B, H, T, V, dtype=torch.float64)
    outs, S = cw._core(a, c, k, w, S0, [(q, True) for q in qs], beta, L, False)
    want, want_grads = grads([*outs, S])
    got, got_grads = grads(cw._DeltaCore.apply(gate, k, w, beta, S0, L, *qs))
    for x, y in zip(got + list(got_grads), want + list(want_grads)):
        assert rel(x, y) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_the_native_delta_core_is_the_torch_template(dtype):
    # runtime/cpu/ChunkCore's delta rule against _DeltaCore in torch: T = 45
    # in chunks of 32, two reads, one without a gradient.
    from cellc import _chunkcore as cw
    g = torch.Generator().manual_seed(14)
    B, H, T, K, V, L = 2, 3, 45, 5, 4, 32
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    leaves = [(-torch.rand(B, H, T, generator=g, dtype=torch.float64)),
              torch.nn.functional.normalize(r(B, H, T, K), dim=-1), r(B, H, T, V),
              torch.rand(B, H, T, 1, generator=g, dtype=torch.float64), r(B, H, K, V),
              r(B, H, T, K), r(B, H, T, K)]
    leaves = [t.to(dtype).requires_grad_() for t in leaves]
    weights = [r(B, H, T, V).to(dtype), None, r(B, H, K, V).to(dtype)]

    def grads(core):
        a, k, w, beta, S0, *qs = leaves
        results = core.apply(a, k, w, beta, S0, L, *qs)
        loss = sum((x * t).sum() for x, t in zip(weights, results) if x is not None)
        return [t.detach() for t in results], torch.autograd.grad(loss, leaves)

    (want, want_grads), (got, got_grads) = grads(cw._DeltaCore), grads(cw._NativeDeltaCore)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for x, y in zip(got + list(got_grads), want + list(want_grads)):
        assert rel(x, y) < tol


def test_the_cpu_core_flushes_subnormals_on_its_threads_only():
    # The runtime's chunk core runs with subnormal floats as zeros (a
    # chunk's decays of a strong gate fall below f32's normal range, and
    # each product with one is 100 times slower) on each of its threads, and
    # gives the caller's thread its own floating-point state back.
    from cellc import _chunkcore
    B, H, T, K, V = 2, 4, 3, 4, 4
    a = torch.zeros(B, H, T, K)
    a[:, :, 0] = -90.0                      # e^-90 = 8.2e-40: subnormal in f32
    k = torch.zeros(B, H, T, K)
    v = torch.zeros(B, H, T, V)
    S0, q = torch.ones(B, H, K, V), torch.ones(B, H, T, K)
    torch_out = _chunkcore._DiagonalCore.apply(a, k, v, S0, 16, True, q)[0]
    assert (torch_out[:, :, 0] > 0).all() and (torch_out[:, :, 0] < 1e-38).all()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        native_out = _chunkcore._NativeDiagonalCore.apply(a, k, v, S0, 16, True, q)[0]
    finally:
        torch.set_num_threads(threads)
    assert (native_out[:, :, 0] == 0).all()
    assert (torch.tensor([1e-20]) * torch.tensor([1e-20])).item() != 0
