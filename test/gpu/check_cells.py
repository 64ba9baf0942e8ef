"""The GPU check: every package that bench/gpu/prepare.py wrote, against its
float64 reference in each recompute mode with resets (and LSTM and GRU
against torch's float64 cells and cuDNN); then the benchmark table of time
and peak memory against cuDNN, torchrl's Triton LSTM, FlashRNN and fla.

It runs where there are only torch, the packages and libcellc_runtime.so (a
GPU machine, with no LLVM and no cellc extension): python/cellc/cuda.py is
loaded by path, alone. With --emulate, the same script runs the packages'
kernels in the SIMT emulator on the CPU (make test), where the peers, which
need a GPU, are left out.

Usage: check_cells.py check PACKAGES [--emulate] [--from=N]   exit 1 on a failure
       check_cells.py bench PACKAGES [--emulate]   a markdown table

A call that has not returned after $CELLC_CHECK_ROW_SECONDS (60 s) is a hang:
the script prints `HUNG at N` (N, the package's place in the check's order)
with Python's stacks, and exits 3; `--from=N+1` goes on after it
(bench/gpu/run.sh does). The first H200 run's check stopped after 24 rows
with nothing printed, most likely in a call that never returned.
"""

import faulthandler
import importlib.util
import json
import os
import signal
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "cellc_cuda", os.path.join(HERE, "..", "..", "python", "cellc", "cuda.py"))
cuda = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuda)

EMULATE = "--emulate" in sys.argv
#: How long a row may take before it is a hang.
ROW_SECONDS = float(os.environ.get("CELLC_CHECK_ROW_SECONDS", "60"))
# A phase's `timeout` (SIGTERM) prints where Python was.
faulthandler.register(signal.SIGTERM, all_threads=True)


class watchdog:
    """A block that has not ended after ROW_SECONDS is a hang: say which, with
    Python's stacks, and exit 3 (a hung kernel never gives the thread back)."""

    def __init__(self, what, seconds=None):
        self.what, self.seconds = what, seconds or ROW_SECONDS

    def fire(self):
        print(f"HUNG {self.what}: no return after {self.seconds:g} s", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    def __enter__(self):
        self.timer = threading.Timer(self.seconds, self.fire)
        self.timer.daemon = True
        self.timer.start()

    def __exit__(self, *exc):
        self.timer.cancel()
DEV = torch.device("cpu" if EMULATE else "cuda")
#: Relative to the largest magnitude of the float64 reference (as
#: test_emulator.py's): fp32 FMAs; tf32 products (10-bit mantissas); bf16
#: storage and products (8 bits, 2^-9 a rounding).
TOLERANCE = {"ieee": 1e-4, "tf32": 1e-2, "bf16": 6e-2}
#: Every recompute mode, chunk:K with chunks that do not divide T.
MODES = ("none", "full", "chunk:4")
#: The cells checked first, in this order; the others follow as written.
FIRST = ("lstm", "gru", "gated_deltanet", "mlstm", "slstm", "gla")


def load(path):
    return cuda.CudaCell(cuda.Package(path), emulate=EMULATE)


def manifest(root):
    with open(os.path.join(root, "manifest.json")) as f:
        return json.load(f)


def run_cell(cell, data, mode, dtype):
    """The cell's outputs, final states and gradients on `data` (a
    reference's), on DEV, with the sequences stored as `dtype`."""
    params, inputs, states, resets, out_w, final_w = data
    leaves = {("input", n): t.to(DEV, dtype).requires_grad_() for n, t in inputs.items()}
    leaves.update({("param", n): t.to(DEV, torch.float32).requires_grad_()
                   for n, t in params.items()})
    leaves.update({("state", n): t.to(DEV, torch.float32).requires_grad_()
                   for n, t in states.items()})
    out, final = cell({n: leaves[("input", n)] for n in inputs},
                      {n: leaves[("param", n)] for n in params},
                      {n: leaves[("state", n)] for n in states}, resets.to(DEV), mode)
    loss = sum((out[n].float() * w.to(DEV, torch.float32)).sum() for n, w in out_w.items())
    loss = loss + sum((final[n] * w.to(DEV, torch.float32)).sum() for n, w in final_w.items())
    loss.backward()
    got = {"out:" + n: t.detach() for n, t in out.items()}
    got.update({"final:" + n: t.detach() for n, t in final.items()})
    got.update({f"d{kind}:{n}": t.grad for (kind, n), t in leaves.items()})
    return got


def as_tf32(t):
    """`t`'s values as the tensor cores read an f32 passed to mma.sync as a
    tf32 operand (cellc's tf32 kernels convert nothing): the low 13 mantissa
    bits dropped. prepare.py's tf32 references run on data rounded so."""
    return (t.float().view(torch.int32) & ~0x1fff).view(torch.float32).double()


def reference_of(refs, storage, precision):
    """The reference a package is held to, and the data it ran on. A tf32
    package's runs on the f32 data rounded as its kernels read it: at a
    max (sLSTM's stabiliser), a tf32 rounding of the weights alone moved a
    gradient by 0.14 in float64, while the kernels agreed with the rounded
    reference to 1e-3."""
    if storage == "f32" and precision == "tf32" and "tf32" in refs:
        params, inputs, states, *rest = refs["f32"]["data"]
        rounded = [{n: as_tf32(t) for n, t in ts.items()} for ts in (params, inputs, states)]
        return refs["tf32"]["want"], tuple(rounded) + tuple(rest)
    return refs[storage]["want"], refs[storage]["data"]


def worst_error(got, want):
    """The largest error relative to the largest magnitude, over every
    result: (name, error)."""
    flat = {"out:" + n: t for n, t in want["out"].items()}
    flat.update({"final:" + n: t for n, t in want["final"].items()})
    flat.update({"d" + n: t for n, t in want["grads"].items()})
    errors = {}
    for name, w in flat.items():
        g = got[name].double().cpu().reshape(w.shape)
        errors[name] = ((g - w).abs().max() / (w.abs().max() + 1e-3)).item()
    name = max(errors, key=errors.get)
    return name, errors[name]


def check(root, first=0):
    m = manifest(root)
    failed, rows = 0, 0
    # The cells users train most first: a phase cut off by its time limit
    # has checked those.
    order = sorted(m["checks"], key=lambda e: (FIRST.index(e["cell"])
                                               if e["cell"] in FIRST else len(FIRST)))
    for place, entry in enumerate(order):
        if place < first:
            continue
        label = f"{entry['cell']:15} {entry['variant']:16}"
        path = os.path.join(root, entry["dir"])
        if not entry["built"]:
            with open(os.path.join(path, "not-built.txt")) as f:
                print(f"{label} not built: {f.read().strip()}", flush=True)
            continue
        # Our own file, written by prepare.py: tensors in dicts and tuples (torch
        # 2.6+ loads weights only by default).
        refs = torch.load(os.path.join(root, f"reference-{entry['cell']}.pt"),
                          weights_only=False)
        started = time.perf_counter()
        try:
            with watchdog(f"at {place} {label} loading"):
                cell = load(path)
        except Exception as e:  # noqa: BLE001 - a failure is a row
            print(f"{label} FAIL to load: {e}", flush=True)
            failed += 1
            continue
        storage = "bf16" if cell.storage == torch.bfloat16 else "f32"
        precision = cell.package.meta.get("precision", "ieee")
        tolerance = max(TOLERANCE[precision], TOLERANCE["bf16"] if storage == "bf16" else 0)
        want, data = reference_of(refs, storage, precision)
        # The first H200 run checked 8 packages in 150 s: each row says
        # where its time went (the load in the first row's).
        loaded = time.perf_counter() - started
        for mode in MODES:
            rows += 1
            started = time.perf_counter()
            try:
                with watchdog(f"at {place} {label} {mode}"):
                    got = run_cell(cell, data, mode, cell.storage)
                    name, error = worst_error(got, want)
                ok = error <= tolerance
            except Exception as e:  # noqa: BLE001
                name, error, ok = f"{type(e).__name__}: {e}", float("nan"), False
            failed += not ok
            took = f"{time.perf_counter() - started:.2f} s"
            if loaded is not None:
                took, loaded = f"{took}, load {loaded:.2f} s", None
            print(f"{label} {mode:8} worst {name} {error:.1e} (tolerance {tolerance:.0e}) "
                  f"{'ok' if ok else 'FAIL'} ({took})", flush=True)
        if entry["cell"] in ("lstm", "gru") and not EMULATE:
            with watchdog(f"at {place} {label} against torch"):
                failed += not check_against_torch(entry["cell"], cell,
                                                  refs[storage]["data"], tolerance, label)
    print(f"{rows - failed} of {rows} checks passed", flush=True)
    return failed


class strict_fp32:
    """torch's float32 RNNs and products in strict fp32 for a block: cuDNN
    runs its fp32 RNNs in TF32 by default (torch.backends.cudnn.allow_tf32),
    about 1e-3 off at H = 64, which no fair check of an ieee package holds
    against."""

    def __enter__(self):
        self.saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved


def check_against_torch(kind, cell, data, tolerance, label):
    """LSTM and GRU against torch's: float64 on the GPU (no resets: torch's
    cells have none) and cuDNN in strict float32 (TF32 off), forward and
    gradients."""
    with strict_fp32():
        return _check_against_torch(kind, cell, data, tolerance, label)


def _check_against_torch(kind, cell, data, tolerance, label):
    params, inputs, states, _, out_w, _ = data
    I, H = inputs["x"].shape[-1], states["h"].shape[-1]
    ok = True
    for dtype in (torch.float64, torch.float32):
        ref = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(I, H).to(DEV, dtype)
        with torch.no_grad():
            for name, t in (("weight_ih_l0", "W_ih"), ("weight_hh_l0", "W_hh"),
                            ("bias_ih_l0", "b_ih"), ("bias_hh_l0", "b_hh")):
                getattr(ref, name).copy_(params[t])
        x = inputs["x"].to(DEV, dtype).requires_grad_()
        h0 = states["h"].to(DEV, dtype)[None]
        init = (h0, states["c"].to(DEV, dtype)[None]) if kind == "lstm" else h0
        want, _ = ref(x, init)
        (want * out_w["h"].to(DEV, dtype)).sum().backward()
        xs = inputs["x"].to(DEV, cell.storage).requires_grad_()
        ps = {n: t.to(DEV, torch.float32).requires_grad_() for n, t in params.items()}
        got, _ = cell({"x": xs}, ps, {n: t.to(DEV, torch.float32) for n, t in states.items()})
        (got["h"].float() * out_w["h"].to(DEV)).sum().backward()
        pairs = [("h", got["h"], want), ("dx", xs.grad, x.grad),
                 ("dW_hh", ps["W_hh"].grad, ref.weight_hh_l0.grad)]
        errors = {n: ((a.double() - b.double()).abs().max()
                      / (b.double().abs().max() + 1e-3)).item() for n, a, b in pairs}
        worst = max(errors, key=errors.get)
        # Against cuDNN (float32, its own order of sums) twice the tolerance.
        limit = tolerance * (1 if dtype == torch.float64 else 2)
        good = errors[worst] <= limit
        ok &= good
        print(f"{label} vs torch {'float64' if dtype == torch.float64 else 'cuDNN'} worst "
              f"{worst} {errors[worst]:.1e} (tolerance {limit:.0e}) {'ok' if good else 'FAIL'}",
              flush=True)
    return ok


# The benchmark ------------------------------------------------------------------


def median_ms(fn, reps=10):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if EMULATE:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def peak_mib(fn):
    """Peak device memory of `fn` above what was allocated before it (none
    in emulation: the host's allocator keeps no such figure)."""
    if EMULATE:
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def row(shape, name, forward, train):
    try:
        # Twice a check row's time: Triton compiles the peers' kernels here.
        with watchdog(f"in the bench: {shape} {name}", 2 * ROW_SECONDS):
            with torch.no_grad():
                f = median_ms(forward)
            t = median_ms(train)
            m = peak_mib(train)
        print(f"| {shape} | {name} | {f:.3f} | {t:.3f} | {m:.0f} |", flush=True)
    except Exception as e:  # noqa: BLE001 - a miss is a row too
        print(f"| {shape} | {name} | error: {type(e).__name__}: {str(e)[:160]} | | |",
              flush=True)


def lstm_params(I, H, dtype=torch.float32):
    ref = torch.nn.LSTM(I, H).to(DEV, dtype)
    return ref, {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0, "b_ih": ref.bias_ih_l0,
                 "b_hh": ref.bias_hh_l0}


def bench(root):
    m = manifest(root)
    print("| shape | implementation | forward ms | forward+backward ms | peak MiB |")
    print("|---|---|---|---|---|")
    # The LSTM's shapes first (the peers' published charts), then the rest.
    for name in sorted({e["name"] for e in m["bench"]},
                       key=lambda n: (not n.startswith("lstm"), n)):
        entries = [e for e in m["bench"] if e["name"] == name]
        first = entries[0]
        B, T, sizes = first["B"], first["T"], first["sizes"]
        torch.manual_seed(0)
        if first["cell"] == "lstm":
            I, H = sizes["I"], sizes["H"]
            x = torch.randn(T, B, I, device=DEV, requires_grad=True)
            _, params = lstm_params(I, H)
            inputs, cellc_params = {"x": x}, params
        else:
            NH, K, V, I = sizes["NH"], sizes["K"], sizes["V"], sizes["I"]
            x = torch.randn(T, B, I, device=DEV, requires_grad=True)
            cellc_params = {
                "W_q": 0.05 * torch.randn(NH * K, I), "W_k": 0.05 * torch.randn(NH * K, I),
                "W_v": 0.05 * torch.randn(NH * V, I), "w_b": 0.05 * torch.randn(NH, I),
                "w_a": 0.05 * torch.randn(NH, I), "A_log": torch.zeros(NH),
                "dt_bias": torch.zeros(NH)}
            cellc_params = {n: t.to(DEV).requires_grad_() for n, t in cellc_params.items()}
            inputs = {"x": x}
        for entry in entries:
            path = os.path.join(root, entry["dir"])
            if not entry["built"]:
                with open(os.path.join(path, "not-built.txt")) as f:
                    print(f"| {name} | cellc {entry['variant']} | not built: "
                          f"{f.read().strip()} | | |", flush=True)
                continue
            try:
                cell = load(path)
            except Exception as e:  # noqa: BLE001
                print(f"| {name} | cellc {entry['variant']} | error: {e} | | |", flush=True)
                continue
            xs = {n: t.detach().to(cell.storage).requires_grad_() for n, t in inputs.items()}
            out_name = cell.outputs[0][0]
            for mode in ("none", "full"):
                def train(cell=cell, mode=mode, xs=xs):
                    out, _ = cell(xs, cellc_params, None, None, mode)
                    out[out_name].float().sum().backward()

                def forward(cell=cell, xs=xs):
                    cell(xs, cellc_params, None, None, "none")
                row(name, f"cellc {entry['variant']} {mode}", forward, train)
        # The peers after cellc's rows: a phase cut off by its limit has
        # timed cellc.
        if not EMULATE and first["cell"] == "lstm":
            lstm_peers(name, x, sizes["I"], sizes["H"])
        elif not EMULATE:
            fla_peer(name, B, T, sizes["NH"], sizes["K"], sizes["V"])


def lstm_peers(name, x, I, H):
    """cuDNN fp32 and bf16, torchrl's Triton LSTM (with and without
    recompute) and FlashRNN's triton_fused, on the same shape."""
    T, B = x.shape[:2]
    ref, params = lstm_params(I, H)

    def cudnn_train(ref=ref, x=x):
        out, _ = ref(x)
        out.sum().backward()
    # torch's default runs cuDNN's fp32 RNN in TF32; both, named so.
    tf32 = torch.backends.cudnn.allow_tf32
    row(name, f"cuDNN fp32 ({'TF32' if tf32 else 'strict'}, torch's default)",
        lambda: ref(x), cudnn_train)
    with strict_fp32():
        row(name, "cuDNN fp32 (strict, allow_tf32=False)", lambda: ref(x), cudnn_train)
    ref16, _ = lstm_params(I, H, torch.bfloat16)
    x16 = x.detach().to(torch.bfloat16).requires_grad_()

    def cudnn16_train():
        out, _ = ref16(x16)
        out.float().sum().backward()
    row(name, "cuDNN bf16", lambda: ref16(x16), cudnn16_train)
    try:
        from torchrl.modules.tensordict_module._rnn_triton import lstm_triton
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"| {name} | torchrl Triton | not available: {type(e).__name__}: {e} | | |")
    else:
        xb = x.detach().transpose(0, 1).contiguous().requires_grad_()
        hb = torch.zeros(B, T, H, device=DEV)
        is_init = torch.zeros(B, T, dtype=torch.bool, device=DEV)
        args = (params["W_ih"], params["W_hh"], params["b_ih"], params["b_hh"], is_init)
        for compute in (torch.float32, torch.bfloat16):
            for recompute in (False, True):
                def train(recompute=recompute, compute=compute):
                    out = lstm_triton(xb, hb, hb, *args, compute, recompute=recompute)[0]
                    out.float().sum().backward()
                row(name, f"torchrl Triton {str(compute)[6:]} recompute={recompute}",
                    lambda compute=compute: lstm_triton(xb, hb, hb, *args, compute,
                                                        recompute=True), train)
    try:
        from flashrnn.flashrnn import flashrnn
    except Exception as e:  # noqa: BLE001
        print(f"| {name} | FlashRNN | not available: {type(e).__name__}: {e} | | |")
        return
    # FlashRNN's LSTM in heads of 64 (block-diagonal R), as its chart runs.
    heads = max(1, H // 64)
    D = H // heads
    Wx = torch.randn(B, T, 4, heads, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    R = (torch.randn(4, heads, D, D, device=DEV, dtype=torch.bfloat16) / D ** 0.5
         ).requires_grad_()
    b = torch.zeros(4, heads, D, device=DEV, dtype=torch.bfloat16, requires_grad=True)

    def fr_train():
        out = flashrnn(Wx, R, b, function="lstm", backend="triton_fused",
                       dtype="bfloat16")[0]
        out.float().sum().backward()
    row(name, f"FlashRNN triton_fused bf16 ({heads} heads x {D})",
        lambda: flashrnn(Wx, R, b, function="lstm", backend="triton_fused",
                         dtype="bfloat16"), fr_train)


def fla_peer(name, B, T, NH, K, V):
    """fla's chunk kernel of gated DeltaNet, with its backward (its fused
    recurrent kernel has none)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        print(f"| {name} | fla chunk | not available: {type(e).__name__}: {e} | | |")
        return
    q = torch.nn.functional.normalize(torch.randn(B, T, NH, K, device=DEV), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, NH, K, device=DEV), dim=-1)
    v = torch.randn(B, T, NH, V, device=DEV)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, NH, device=DEV))
    beta = torch.rand(B, T, NH, device=DEV)
    for t in (q, k, v, g, beta):
        t.requires_grad_()

    def train():
        out = chunk_gated_delta_rule(q, k, v, g, beta)[0]
        out.sum().backward()
    sys.path.insert(0, HERE)
    from chunk_core import fla_refusal_lifted
    row(name, "fla chunk_gated_delta_rule fp32" + fla_refusal_lifted(), lambda: chunk_gated_delta_rule(q, k, v, g, beta),
        train)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    start = [int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--from=")]
    if len(args) != 2 or args[0] not in ("check", "bench"):
        sys.exit(__doc__)
    what, root = args
    if not EMULATE:
        ok, why = cuda.available()
        if not ok:
            sys.exit(f"check_cells: {why}")
        print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    else:
        print("the SIMT emulator, on the CPU; torch", torch.__version__, flush=True)
    if what == "check":
        sys.exit(1 if check(root, start[-1] if start else 0) else 0)
    bench(root)
