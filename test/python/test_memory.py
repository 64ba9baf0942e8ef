"""Training memory: the driver runs a sequence in pieces (about 1024 rows
each), keeps only what the recompute mode keeps (an output that is a state
is that state's history, not a copy), and says what a step holds
(memory_plan) and held (memory_stats). Checked against torch in float64
over several pieces with resets and lengths, against the process's measured
peak, and against an in-place change of a kept output."""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

import cellc
from conftest import lstm_problem
from test_lengths import LSTM, _reference

MODES = ["none", "full", "chunk:3", "chunk:20"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths", [None, "unsorted", "longest first"])
def test_pieces_match_torch_in_float64(mode, lengths):
    # B = 64 rows: pieces of 16 steps, so T = 40 runs in three, the last
    # short; chunk:20 splits a chunk in two pieces; with lengths, pieces also
    # end at every sample's last step.
    torch.manual_seed(0)
    T, B, I, H = 40, 64, 3, 4
    g = torch.Generator().manual_seed(1)
    if lengths is None:
        steps = [T] * B
    else:
        steps = torch.randint(0, T + 1, (B,), generator=g).tolist()
        steps[0] = T
        if lengths == "longest first":
            steps.sort(reverse=True)
    ref, params, x, h0, c0 = lstm_problem(T, B, I, H)
    resets = torch.rand(T, B, generator=g) < 0.05
    g_out = torch.randn(T, B, H, dtype=torch.float64)
    g_h, g_c = torch.randn(B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64)

    cell = cellc.compile(LSTM)
    out, final = cell(x, params, {"h": h0, "c": c0}, resets=resets, recompute=mode,
                      lengths=None if lengths is None else steps)
    want_out, want_h, want_c = _reference(ref, x, h0, c0, resets, steps)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(final["h"], want_h, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(final["c"], want_c, rtol=1e-10, atol=1e-12)
    wrt = [x, h0, c0] + list(params.values())
    got = torch.autograd.grad((out * g_out).sum() + (final["h"] * g_h).sum()
                              + (final["c"] * g_c).sum(), wrt)
    want = torch.autograd.grad((want_out * g_out).sum() + (want_h * g_h).sum()
                               + (want_c * g_c).sum(), wrt)
    for name, a, b in zip(["x", "h0", "c0"] + list(params), got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)

# A projection that no value of the step reads (an unused local) is a kernel
# argument all the same; the backward's replay computes the others again.
# Each must read its own buffer and fold into its own weight: the kernels
# once matched the replay's projections to the step's by position, and the
# driver the gradients it folds by a count that skipped the zero one, so
# that `full` trained on another projection's values.
UNUSED_PROJECTION = """cell m {
  input x: [I]
  state m: [N]
  param W_k: [K, I], w_i: [N, I], w_f: [N, I], b_i: [N], b_f: [N]
  k = tanh(W_k @ x)
  m = max(logsigmoid(w_f @ x + b_f) + m, w_i @ x + b_i)
}
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,target", [(3, None), (1, None), (3, "cuda-emu")])
def test_an_unused_projection_leaves_the_others_gradients_alone(mode, B, target):
    import torch.nn.functional as F
    with pytest.warns(UserWarning, match="never used"):
        cell = cellc.compile(UNUSED_PROJECTION, target=target)
    T, I, N, K = 7, 6, 2, 5
    g = torch.Generator().manual_seed(3)
    dtype = torch.float32 if target else torch.float64
    x = torch.randn(T, B, I, generator=g, dtype=dtype, requires_grad=True)
    params = {n: torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True)
              for n, shape in [("W_k", (K, I)), ("w_i", (N, I)), ("w_f", (N, I)),
                               ("b_i", (N,)), ("b_f", (N,))]}
    out, _ = cell(x, params, recompute=mode)
    m, want = torch.zeros(B, N, dtype=torch.float64), []
    p = {n: t.double() for n, t in params.items()}
    for t in range(T):
        xt = x[t].double()
        m = torch.maximum(F.logsigmoid(xt @ p["w_f"].t() + p["b_f"]) + m,
                          xt @ p["w_i"].t() + p["b_i"])
        want.append(m)
    want = torch.stack(want)
    g_out = torch.randn(T, B, N, generator=g, dtype=torch.float64)
    wrt = [x] + list(params.values())
    got = torch.autograd.grad((out.double() * g_out).sum(), wrt)
    ref = torch.autograd.grad((want * g_out).sum(), wrt, allow_unused=True)
    tol = dict(rtol=1e-4, atol=1e-5) if target else dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(out.double(), want, **tol)
    for name, a, b in zip(["x"] + list(params), got, ref):
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a.double(), b.double(), **tol, msg=name)



@pytest.mark.parametrize("mode", ["none", "full"])
def test_an_output_kept_as_a_state_cannot_change_in_place(mode):
    # The backward reads h's history from the output itself: autograd must
    # refuse a backward after the output changed.
    torch.manual_seed(1)
    lstm = cellc.nn.LSTM(3, 4, recompute=mode)
    x = torch.randn(5, 2, 3, requires_grad=True)
    out, _ = lstm(x)
    out.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_an_output_not_kept_can_change_in_place():
    # chunk:K keeps the states before chunks only; the output is not read.
    torch.manual_seed(1)
    lstm = cellc.nn.LSTM(3, 4, recompute="chunk:2")
    x = torch.randn(5, 2, 3, requires_grad=True)
    out, _ = lstm(x)
    out.mul_(2.0)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", ["none", "full", "chunk:8"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_plan_is_what_the_runtime_holds(kind, mode):
    # The plan runs the driver on a backend that only counts; the runtime's
    # ledger counts the same buffers as they come and go.
    torch.manual_seed(2)
    T, B, I, H = 50, 32, 16, 24
    module = getattr(cellc.nn, kind)(I, H, recompute=mode)
    x = torch.randn(T, B, I, requires_grad=True)
    out, _ = module(x)
    out.backward(torch.randn_like(out))
    stats = module.cell.memory_stats()
    plan = module.cell.memory_plan({"I": I, "H": H}, T, B, mode)
    assert stats["kept_bytes"] == plan["kept"]
    assert stats["forward_peak_bytes"] == plan["forward_peak"]
    assert stats["backward_peak_bytes"] == plan["backward_peak"]
    # What a mode keeps: LSTM's c (h is the output) in full, GRU nothing
    # beyond its output, chunk:8 a state per chunk.
    states = {"LSTM": 2, "GRU": 1}[kind]
    if mode == "full":
        assert plan["kept"] == (states - 1) * T * B * H * 4
    if mode == "chunk:8":
        assert plan["kept"] == states * ((T + 7) // 8) * B * H * 4
    assert plan["outputs"] == T * B * H * 4
    assert plan["grad_inputs"] == T * B * I * 4
    assert plan["piece_steps"] == 1024 // B
    assert plan["floor"] <= plan["peak"]


def test_no_buffer_spans_the_sequence_in_full():
    # Beyond what full keeps, the driver's buffers do not grow with T.
    cell = cellc.compile(LSTM)
    sizes = {"I": 64, "H": 64}
    short, long = (cell.memory_plan(sizes, T, 64, "full") for T in (100, 1000))
    grown = long["backward_peak"] - short["backward_peak"]
    assert grown == long["kept"] - short["kept"]
    assert long["kept"] == 1000 * 64 * 64 * 4


MEMORY = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "cpu", "memory.py")


@pytest.mark.parametrize("mode", ["none", "full", "chunk:16"])
@pytest.mark.parametrize("threads,split", [(1, "auto"), (2, "auto"), (2, "units")])
def test_the_plan_predicts_the_measured_peak(mode, threads, split):
    # The process's peak resident memory over a training step (VmHWM after
    # 5 to clear_refs), in a fresh process, within 10% of the plan's.
    # The measure is bench/cpu/memory.py's, for one configuration. On two
    # threads the default splits the rows, each thread with its own packed
    # weights and buffers; unit slices share the tile's.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, MEMORY, "--steps", "200", "--batch", "64",
                           "--size", "256", "--threads", str(threads), "--unit-slices", split,
                           "--one", "lstm", "cellc", mode],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    predicted = r["plan"]["peak"]
    assert abs(r["peak"] - predicted) <= 0.10 * predicted, (r["peak"], predicted)


@functools.lru_cache(maxsize=None)
def _measure(impl, mode, loop=0, cache="1"):
    # bench/cpu/memory.py's measure of one configuration, in a fresh process.
    # glibc's mmap threshold is fixed at 1 MiB: left to move, it rises to
    # the size of the largest mapped block freed, and later blocks of that
    # size (12.5 MiB tensors here) come from the heap, which keeps them
    # after they are freed. A loop's peak then grew by 26 to 88 MiB, in steps
    # of 12.5, with what the heap's layout kept rather than what was live
    # (under torch 2.9.1, where the kept buffers are torch tensors). Fixed,
    # a freed block goes back at once: cellc's loop grew 15.1 to 15.3 MiB
    # in 7 runs under torch 1.13 and 2.9.1, torch 2.9.1's own 15.0.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               CELLC_BUFFER_CACHE=cache, MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    done = subprocess.run([sys.executable, MEMORY, "--steps", "200", "--batch", "64",
                           "--size", "256", "--one", "lstm", impl, mode, "--loop", str(loop)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_training_loop_holds_one_steps_buffers():
    # A training loop's next forward runs while the last step's output is
    # still held. What cellc kept for that step's backward went with the
    # backward: without the buffer cache, over three more steps the peak
    # grows as torch's own loop grows (the output and the input's gradient
    # held across the step), not by a second copy of what `none` keeps (75
    # MiB here; it grew by 123 MiB when the kept buffers lived as long as
    # the output). The peaks move by a few MiB from run to run (torch
    # 1.13's growth: 36 to 48 MiB; huge pages come 2 MiB at a time), so the
    # bound is half the kept bytes.
    torch_grown = _measure("torch", "-", 3)
    torch_grown = torch_grown["loop_peak"] - torch_grown["peak"]
    run = _measure("cellc", "none", 3, cache="0")
    grown = run["loop_peak"] - run["peak"]
    assert grown <= torch_grown + 0.5 * run["stats"]["kept_bytes"], (grown, torch_grown)
    assert run["emptied"] < 0.05 * run["plan"]["peak"], run


# A call runs through the operator cellc::sequence (torch >= 2.4) or the
# same code under an autograd.Function (cellc._ops._Shim): its kept buffers
# are torch tensors that autograd saves and frees. On the CPU the runtime
# lends their pages (CpuRunner.empty), which go back to its buffer cache
# when autograd frees them; the runtime's ledger holds none of them.


@pytest.mark.parametrize("mode", ["none", "full"])
def test_the_buffer_cache_holds_at_most_one_steps_peak(mode):
    # With the cache (the default), what cellc released stays mapped for the
    # next call, at most the most it had mapped: the loop's peak grows by no
    # more than torch's loop does plus cellc's own peak.
    torch_grown = _measure("torch", "-", 3)
    torch_grown = torch_grown["loop_peak"] - torch_grown["peak"]
    run = _measure("cellc", mode, 3)
    grown = run["loop_peak"] - run["peak"]
    assert grown <= torch_grown + 1.05 * run["plan"]["peak"], (grown, torch_grown)


@pytest.mark.parametrize("mode", ["none", "full", "chunk:8"])
def test_what_forward_kept_goes_with_the_backward(mode):
    # What forward kept is held through a backward that retains the graph,
    # and freed by the last one, while the output (and the graph behind it)
    # still lives; the runtime itself holds none of it. Its pages are lent
    # by the runtime, and given back by the last backward.
    import weakref
    from cellc import _cellc_runtime
    torch.manual_seed(4)
    lstm = cellc.nn.LSTM(16, 24, recompute=mode)
    x = torch.randn(30, 8, 16, requires_grad=True)
    saved = []
    lent = _cellc_runtime.lent_bytes()

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = lstm(x)
    kept = lstm.saved_bytes
    assert kept > 0 and lstm.cell.memory_stats()["live_bytes"] == 0
    # What is saved besides the input, the output and the params.
    theirs = {t.data_ptr() for t in (x, out, *lstm.parameters())}
    held = lambda: sum(r().numel() * r().element_size() for r in saved
                       if r() is not None and r().data_ptr() not in theirs)
    assert held() >= kept
    assert _cellc_runtime.lent_bytes() == lent + kept
    g = torch.randn_like(out)
    out.backward(g, retain_graph=True)
    assert held() >= kept and _cellc_runtime.lent_bytes() == lent + kept
    out.backward(g)
    assert held() == 0 and _cellc_runtime.lent_bytes() == lent
    assert out.grad_fn is not None


def test_a_lent_buffer_goes_back_to_the_runtimes_cache():
    # CpuRunner.empty's buffers: a tensor on the runtime's pages, which go
    # back to its cache when torch frees it, so the next of its size runs on
    # the same pages; a capsule no tensor took gives its pages back as well.
    from torch.utils.dlpack import from_dlpack
    from cellc import _cellc_runtime as runtime
    buffer = runtime.CompiledCell.buffer
    cellc.empty_cache()
    lent, shape = runtime.lent_bytes(), [64, 128, 32]
    t = from_dlpack(buffer(shape, "f32"))
    assert t.shape == tuple(shape) and t.dtype == torch.float32 and t.is_contiguous()
    assert runtime.lent_bytes() == lent + t.numel() * 4
    t.fill_(1.5)
    assert t.sum().item() == 1.5 * t.numel()
    where = t.data_ptr()
    del t
    assert runtime.lent_bytes() == lent and runtime.cached_bytes() >= 64 * 128 * 32 * 4
    u = from_dlpack(buffer(shape, "f32"))
    assert u.data_ptr() == where and u.sum().item() == 1.5 * u.numel()
    del u
    capsule = buffer(shape, "f64")
    assert runtime.lent_bytes() == lent + 64 * 128 * 32 * 8
    del capsule
    assert runtime.lent_bytes() == lent and runtime.cached_bytes() >= 64 * 128 * 32 * 8
    v = from_dlpack(buffer([3, 0, 2], "f64"))
    assert v.shape == (3, 0, 2) and v.dtype == torch.float64
    with pytest.raises(ValueError, match="'f32' or 'f64'"):
        buffer([2], "f16")
    with pytest.raises(ValueError, match="negative"):
        buffer([-1, 2], "f32")
    with pytest.raises(ValueError, match="int64"):
        buffer([2**31, 2**31, 4], "f32")
    assert runtime.lent_bytes() == lent  # v holds no bytes; the failed calls lent none


@pytest.mark.parametrize("mode", ["none", "full", "chunk:3"])
def test_a_second_call_on_the_first_calls_buffers_matches_torch(mode):
    # The runtime keeps the buffers a call released for the next call of the
    # same sizes. The second call runs on the first's pages, which hold the
    # first call's values, not zeros, and must match torch all the same.
    # Without initial states the runtime starts from zeros, whose buffers
    # ([B, H]) are 64 KiB at these sizes: mapped, and reused.
    cell = cellc.compile(LSTM)
    cellc.empty_cache()
    T, B, I, H = 12, 64, 3, 128
    for seed in (5, 6):
        torch.manual_seed(seed)
        ref, params, x, _, _ = lstm_problem(T, B, I, H)
        out, final = cell(x, params, recompute=mode)
        want, (want_h, want_c) = ref(x)
        torch.testing.assert_close(out, want, rtol=1e-11, atol=1e-11)
        torch.testing.assert_close(final["c"], want_c[0], rtol=1e-11, atol=1e-11)
        g = torch.randn_like(want)
        leaves = [x] + list(params.values())
        got = torch.autograd.grad((out * g).sum() + final["c"].sum(), leaves)
        expected = torch.autograd.grad((want * g).sum() + want_c.sum(), leaves)
        for name, a, b in zip(["x"] + list(params), got, expected):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"d{name}, seed {seed}")


def test_a_second_backward_through_the_graph_gives_the_same_gradients():
    # retain_graph: what forward kept (the output as h's history included)
    # lives as long as the graph.
    torch.manual_seed(3)
    lstm = cellc.nn.LSTM(3, 4, recompute="full")
    x = torch.randn(6, 2, 3, requires_grad=True)
    out, _ = lstm(x)
    out.sum().backward(retain_graph=True)
    first = x.grad.clone()
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)


@pytest.mark.parametrize("lent", [False, True])
@pytest.mark.parametrize("mode", ["none", "full", "chunk:4"])
def test_the_operators_kept_buffers_may_be_empty(mode, lent):
    # What cellc::sequence runs: the caller allocates the kept buffers as
    # torch tensors, torch's own or lent by the runtime (CpuRunner.empty, what
    # the op does). A cell that saves no gates keeps a [T, B, 0] buffer in
    # none, and torch gives an empty tensor no address. Run here through the
    # operators' runner directly, on any torch, in float64.
    from cellc import _ops
    cell = cellc.compile("cell t {\n  input x: [H]\n  state h: [H]\n  h = logsigmoid(x) + h\n"
                         "  output h\n}\n")
    T, B, H = 6, 3, 5
    torch.manual_seed(5)
    x = 3 * torch.randn(T, B, H, dtype=torch.float64)
    runner = _ops.CpuRunner(cell.jit({"H": H}, torch.float64, batch=B))
    layout = runner.layout(mode, False)
    out, final = torch.empty(T, B, H, dtype=torch.float64), torch.empty(B, H, dtype=torch.float64)
    empty = runner.empty if lent else lambda shape, dtype: torch.empty(shape, dtype=dtype)
    kept = [empty((_ops._lead(mode, T) if per_chunk else T, B, n), torch.float64)
            for per_chunk, n, _ in layout["kept"]]
    assert any(t.numel() == 0 for t in kept) or mode != "none"
    runner.forward_kept(mode, [x], [], [], None, [], [out], [final], kept)
    ref_x = x.clone().requires_grad_()
    ref = torch.cumsum(torch.nn.functional.logsigmoid(ref_x), 0)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    g = torch.randn(T, B, H, dtype=torch.float64)
    ref.backward(g)
    dx = torch.empty_like(x)
    runner.backward_kept(mode, [x], [], [], None, [], [out], kept, [g], [None], [dx], [],
                         [])
    torch.testing.assert_close(dx, ref_x.grad, rtol=1e-12, atol=1e-12)
