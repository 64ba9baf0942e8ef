"""CPU packages: `cellc --emit=package --target=cpu` writes one, and
`cellc.load_package` trains it with the runtime alone, in a process that
never loads MLIR or LLVM, matching torch.nn.LSTM."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import cellc
from conftest import BUILD, TOOLS

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
I, H = 5, 8


def write_package(path, cell="lstm.cell", *args):
    subprocess.run([os.path.join(TOOLS, "cellc"), os.path.join(EXAMPLES, cell),
                    "-D", f"H={H}", "-D", f"I={I}", "--emit=package", "--target=cpu",
                    "-o", str(path), *args], check=True)
    return path


@pytest.fixture(scope="module")
def lstm_package(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("pkg") / "lstm")


@pytest.fixture(scope="module")
def lstm64_package(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("pkg") / "lstm64", "lstm.cell", "--dtype=f64")


# Runs in a fresh interpreter: loads the package, trains two steps of an
# LSTM against torch.nn.LSTM with the same weights, and reports what the
# process mapped.
TRAIN = r"""
import json, sys
import torch
import cellc

torch.manual_seed(0)
pkg = cellc.load_package(sys.argv[1])
I, H, T, B = 5, 8, 7, 3
ref = torch.nn.LSTM(I, H).double()
params = {n: getattr(ref, n + "_l0").detach().clone().requires_grad_(True)
          for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
mine = {"W_ih": params["weight_ih"], "W_hh": params["weight_hh"],
        "b_ih": params["bias_ih"], "b_hh": params["bias_hh"]}
result = {"modules": sorted(m for m in sys.modules if m.startswith("cellc"))}
errors = []
for mode in ("none", "full", "chunk:3"):
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    out, final = pkg(x, mine, {"h": h0, "c": c0}, recompute=mode)
    w = torch.randn_like(out)
    loss = (out * w).sum() + final["c"].square().sum()
    grads = torch.autograd.grad(loss, [x, h0, c0, *mine.values()])
    want_out, (hT, cT) = ref(x, (h0[None], c0[None]))
    want = (want_out * w).sum() + cT.square().sum()
    want_grads = torch.autograd.grad(want, [x, h0, c0, ref.weight_ih_l0, ref.weight_hh_l0,
                                            ref.bias_ih_l0, ref.bias_hh_l0])
    errors.append(max([(out - want_out).abs().max().item(),
                       (final["h"] - hT[0]).abs().max().item()]
                      + [(g - v).abs().max().item() for g, v in zip(grads, want_grads)]))
    # Wrong shapes and dtypes are exceptions, not crashes.
    for bad, kind in ((lambda: pkg(x.float(), {n: t.float() for n, t in mine.items()}),
                       TypeError),
                      (lambda: pkg(x[:, :, :4], mine), ValueError)):
        try:
            bad()
            errors.append(1.0)
        except kind:
            pass
maps = open("/proc/self/maps").read()
result.update(errors=errors, mlir="libMLIR" in maps, llvm="libLLVM" in maps)
print(json.dumps(result))
"""


def run_fresh(script, *args):
    env = dict(os.environ)
    if os.environ.get("CELLC_INSTALLED") != "1":
        env["PYTHONPATH"] = os.path.join(os.path.abspath(BUILD), "python")
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_package_trains_without_mlir_and_matches_torch(lstm64_package):
    result = run_fresh(TRAIN, lstm64_package)
    # f64 against torch's f64 LSTM in every recompute mode.
    assert len(result["errors"]) == 3 and max(result["errors"]) < 1e-10, result
    # The runtime alone: no compiler extension, no MLIR or LLVM mapped.
    assert "cellc._cellc" not in result["modules"], result
    assert not result["mlir"] and not result["llvm"], result


def ldd(path):
    return subprocess.run(["ldd", str(path)], capture_output=True, text=True,
                          check=True).stdout


def test_the_runtime_and_a_package_link_no_llvm(lstm_package):
    # cellc._cellc_runtime loads the runtime library with ctypes: no extension.
    runtime = cellc._cellc_runtime.library_path("libcellc_runtime.so")
    assert cellc._cellc_runtime.__file__.endswith(".py")
    for lib in (runtime, lstm_package / "save.so", lstm_package / "replay.so"):
        text = ldd(lib)
        assert "LLVM" not in text and "MLIR" not in text, (lib, text)


def test_package_matches_the_jit(lstm_package):
    """The same cell through the JIT (which builds a package in the cache and
    loads it the same way) gives the same numbers."""
    torch.manual_seed(1)
    pkg = cellc.load_package(lstm_package)
    assert pkg.sizes == {"H": H, "I": I} and pkg.dtype == torch.float32
    assert [n for n, _ in pkg.params] == ["W_ih", "W_hh", "b_ih", "b_hh"]
    cell = cellc.compile(open(os.path.join(EXAMPLES, "lstm.cell")).read())
    x = torch.randn(6, 4, I)
    params = {n: 0.3 * torch.randn(*shape) for n, shape in pkg.params}
    out, final = pkg(x, params)
    want, want_final = cell(x, params)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(final["c"], want_final["c"], rtol=0, atol=1e-6)
    # batch-first and lengths, as a Cell takes them.
    lengths = torch.tensor([6, 2, 0, 5])
    out_bf, _ = pkg(x.transpose(0, 1).contiguous(), params, batch_first=True, lengths=lengths)
    want_bf, _ = cell(x.transpose(0, 1).contiguous(), params, batch_first=True,
                      lengths=lengths)
    torch.testing.assert_close(out_bf, want_bf, rtol=0, atol=1e-6)
    assert pkg.memory_plan(100, 64, "full")["kept"] > 0


def test_a_step_with_projections_is_not_bound(lstm_package):
    """A package's kernels leave the input's product to a GEMM around them.
    A bound step runs the kernel alone, so such a step runs, and gives
    torch's LSTM cell, but is not bound."""
    torch.manual_seed(2)
    pkg = cellc.load_package(lstm_package)
    ref = torch.nn.LSTMCell(I, H)
    params = {"W_ih": ref.weight_ih.detach(), "W_hh": ref.weight_hh.detach(),
              "b_ih": ref.bias_ih.detach(), "b_hh": ref.bias_hh.detach()}
    x, h, c = torch.randn(3, I), torch.randn(3, H), torch.randn(3, H)
    out, h2, c2 = torch.empty(3, H), torch.empty(3, H), torch.empty(3, H)
    buf = lambda *ts: [(t.data_ptr(), list(t.shape)) for t in ts]
    bound = pkg._compiled.bind_step(buf(x), buf(*params.values()), buf(h, c), buf(out),
                                    buf(h2, c2), [0, 0, 0, 0])
    assert bound is None
    with torch.no_grad():
        want_h, want_c = ref(x, (h, c))
    torch.testing.assert_close(out, want_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c2, want_c, rtol=1e-5, atol=1e-6)


OPENMP = r"""
import json
import torch
import cellc
from cellc import _cellc_runtime
print(json.dumps(_cellc_runtime.tasks_on_openmp()))
"""


GEMMS = r"""
import json, sys
import torch
import cellc
torch.manual_seed(0)
ref = torch.nn.LSTM(128, 128).double()
mine = cellc.nn.LSTM(128, 128)
mine.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
for m in mine.modules():
    if hasattr(m, "cell"):
        m.cell.threads = int(sys.argv[1])
x = torch.randn(40, 24, 128, dtype=torch.float64)
w = torch.randn(40, 24, 128, dtype=torch.float64)
errors = []
xr = x.clone().requires_grad_(True)
(ref(xr)[0] * w).sum().backward()
want = [xr.grad] + [p.grad for p in ref.parameters()]
xm = x.float().requires_grad_(True)
(mine(xm)[0] * w.float()).sum().backward()
got = [xm.grad] + [p.grad for p in mine.parameters()]
errors = [float((g.double() - v).abs().max() / v.abs().max()) for g, v in zip(got, want)]
print(json.dumps({"library": cellc._cellc_runtime.gemm_library(), "errors": errors}))
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_each_gemm_library_trains_as_torch_does(monkeypatch, threads):
    """The f32 GEMMs run on cellc's own AVX-512 kernel where the CPU has
    AVX-512F, unless $CELLC_CPU_GEMM=openblas; either way an LSTM's input
    and weight gradients match torch's float64 ones (B = 24, so that two
    threads share B's packed blocks)."""
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    monkeypatch.delenv("CELLC_CPU_GEMM", raising=False)
    mine = run_fresh(GEMMS, threads)
    assert mine["library"] == ("cellc-avx512" if "avx512f" in flags else "openblas"), mine
    monkeypatch.setenv("CELLC_CPU_GEMM", "openblas")
    theirs = run_fresh(GEMMS, threads)
    assert theirs["library"] == "openblas", theirs
    for result in (mine, theirs):
        assert len(result["errors"]) == 5 and max(result["errors"]) < 1e-4, result


def test_the_runtime_shares_torchs_openmp_threads_and_computes_the_same(lstm64_package,
                                                                         monkeypatch):
    """Where torch runs its ops on the OpenMP runtime the runtime links (one
    OpenMP in the process), the runtime's threads are OpenMP's, unless
    $CELLC_OPENMP says otherwise; three threads on OpenMP's team or on the
    runtime's pool give the same numbers, bit for bit."""
    rt = cellc._cellc_runtime
    runtimes = {os.path.realpath(line.split()[-1]) for line in open("/proc/self/maps")
                if os.path.basename(line.split()[-1]).startswith(("libgomp", "libiomp",
                                                                   "libomp"))}
    assert runtimes, "the runtime links an OpenMP"
    if "CELLC_OPENMP" not in os.environ:
        assert rt.tasks_on_openmp() == (torch._C.has_openmp and len(runtimes) == 1)
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv("CELLC_OPENMP", value)
        assert run_fresh(OPENMP) is want, value
    monkeypatch.delenv("CELLC_OPENMP", raising=False)
    if torch._C.has_openmp and len(runtimes) == 1:
        assert run_fresh(OPENMP) is True

    torch.manual_seed(3)
    pkg = cellc.load_package(lstm64_package, threads=3)
    T, B = 9, 5
    params = {n: (0.3 * torch.randn(*shape, dtype=torch.float64)).requires_grad_(True)
              for n, shape in pkg.params}
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    w = torch.randn(T, B, H, dtype=torch.float64)
    before = rt.tasks_on_openmp()
    results = []
    try:
        for on in (False, True):
            rt.set_tasks_on_openmp(on)
            for mode in ("none", "chunk:2"):
                out, final = pkg(x, params, recompute=mode)
                grads = torch.autograd.grad((out * w).sum() + final["c"].sum(),
                                            [x, *params.values()])
                results.append((on, mode, out.detach(), *grads))
    finally:
        rt.set_tasks_on_openmp(before)
    pool, team = results[:2], results[2:]
    for a, b in zip(pool, team):
        for u, v in zip(a[2:], b[2:]):
            assert torch.equal(u, v), (a[1], "OpenMP's threads changed a result")
    ref = torch.nn.LSTM(I, H).double()
    with torch.no_grad():
        for n, m in (("W_ih", "weight_ih_l0"), ("W_hh", "weight_hh_l0"),
                     ("b_ih", "bias_ih_l0"), ("b_hh", "bias_hh_l0")):
            getattr(ref, m).copy_(params[n])
    want, _ = ref(x)
    torch.testing.assert_close(team[0][2], want, rtol=0, atol=1e-12)


def test_bad_packages_are_clear_errors(tmp_path, lstm_package):
    with pytest.raises(ValueError, match="no package in .*cannot read .*kernels.json"):
        cellc.load_package(tmp_path / "missing")
    broken = tmp_path / "broken"
    shutil.copytree(lstm_package, broken)
    text = (broken / "kernels.json").read_text()
    (broken / "kernels.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="kernels.json: .* at byte"):
        cellc.load_package(broken)
    (broken / "kernels.json").write_text(text.replace('"kind": "projection"', '"kind": "proj"'))
    with pytest.raises(ValueError, match="unknown kernel argument kind 'proj'"):
        cellc.load_package(broken)
    (broken / "kernels.json").write_text(text)
    (broken / "save.so").write_bytes(b"not an ELF file")
    with pytest.raises(ValueError, match="cannot load the kernels .*save.so"):
        cellc.load_package(broken)
    (broken / "save.so").write_bytes((lstm_package / "save.so").read_bytes())
    # Code for a CPU with a feature this one lacks is refused, not run.
    other = json.loads(text)
    assert "avx2" in other["cpu_features"] or not other["cpu_features"]
    other["cpu_features"].append("not-a-feature")
    (broken / "kernels.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="compiled for a CPU with not-a-feature, which this "
                                         "one lacks"):
        cellc.load_package(broken)
    # A package from before the kernels' `stream` argument: refused, not
    # called with the wrong arguments.
    older = json.loads(text)
    for kernel in older["kernels"].values():
        kernel["args"] = [a for a in kernel["args"] if a["kind"] != "stream"]
    (broken / "kernels.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match="built by an older cellc: its kernels take no "
                                         "'stream' argument; build it again"):
        cellc.load_package(broken)
    cuda = json.loads(text)
    cuda["target"] = "cuda"
    cuda["ptx"] = cuda.pop("objects")
    (broken / "kernels.json").write_text(json.dumps(cuda))
    with pytest.raises(ValueError, match="is a cuda package"):
        cellc.load_package(broken)


def test_bad_tensors_are_exceptions(lstm_package):
    pkg = cellc.load_package(lstm_package, threads=1)
    assert pkg.threads == 1
    params = {n: torch.zeros(*shape) for n, shape in pkg.params}
    x = torch.zeros(3, 2, I)
    with pytest.raises(ValueError, match="param 'W_hh' is declared \\[32, 8\\] but the tensor "
                                         "for it has shape \\[32, 7\\]"):
        pkg(x, {**params, "W_hh": torch.zeros(32, 7)})
    with pytest.raises(ValueError, match="state 'h' must be \\[B, n\\] with B=2, got \\[3, 8\\]"):
        pkg(x, params, {"h": torch.zeros(3, 8)})
    with pytest.raises(ValueError, match="no tensor for param 'b_hh'"):
        pkg(x, {n: t for n, t in params.items() if n != "b_hh"})
    with pytest.raises(TypeError, match="runs torch.float32"):
        pkg(x.double(), params)
    with pytest.raises(ValueError, match="lengths must be in"):
        pkg(x, params, lengths=[4, 1])


def test_a_matrix_state_package_takes_its_declared_dims(tmp_path):
    """An mLSTM package takes and gives back C as [B, NH, K, V], as a Cell
    does (kernels.json's "state_dims"), with gradients through it; a flat C
    and dims that are not the state's are clear errors."""
    sizes = {"I": 5, "NH": 2, "K": 3, "V": 4}
    path = tmp_path / "mlstm"
    subprocess.run([os.path.join(TOOLS, "cellc"), os.path.join(EXAMPLES, "mlstm.cell"),
                    *[a for n, v in sizes.items() for a in ("-D", f"{n}={v}")],
                    "--emit=package", "--target=cpu", "--dtype=f64", "-o", str(path)],
                   check=True)
    pkg = cellc.load_package(path)
    assert pkg.states == [("C", [2, 3, 4]), ("n", [2, 3]), ("m", [2])]
    cell = cellc.compile(open(os.path.join(EXAMPLES, "mlstm.cell")).read())
    torch.manual_seed(3)
    f64 = {"dtype": torch.float64}
    x = torch.randn(6, 3, 5, **f64)
    params = {n: (0.4 * torch.randn(*shape, **f64)).requires_grad_() for n, shape in pkg.params}
    states = {"C": torch.randn(3, 2, 3, 4, **f64), "n": torch.randn(3, 2, 3, **f64),
              "m": torch.randn(3, 2, **f64)}
    runs = []
    for run in (pkg, cell):
        given = {n: t.clone().requires_grad_() for n, t in states.items()}
        out, final = run(x, params, given, recompute="full")
        assert final["C"].shape == (3, 2, 3, 4) and final["n"].shape == (3, 2, 3)
        loss = (out * torch.linspace(-1, 1, out.numel(), **f64).view_as(out)).sum() + \
            (final["C"] * torch.linspace(1, 2, 72, **f64).view(3, 2, 3, 4)).sum()
        grads = torch.autograd.grad(loss, [given["C"], given["n"], params["W_q"]])
        assert grads[0].shape == (3, 2, 3, 4) and grads[0].abs().sum() > 0
        runs.append((out, final["C"], *grads))
    for got, want in zip(*runs):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"state 'C' must be \[B, 2, 3, 4\] with B=3, "
                                         r"got \[3, 24\]"):
        pkg(x, params, {"C": torch.zeros(3, 24, **f64)})
    meta = json.loads((path / "kernels.json").read_text())
    meta["state_dims"]["C"] = [2, 3, 5]
    (path / "kernels.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"\"state_dims\" gives 'C' dims \[2, 3, 5\], which "
                                         r"are not a state's elements"):
        cellc.load_package(path)


def test_a_gru_per_row_f64_package(tmp_path):
    path = write_package(tmp_path / "gru", "gru.cell", "--strategy=per-row", "--dtype=f64")
    pkg = cellc.load_package(path)
    ref = torch.nn.GRU(I, H).double()
    params = {"W_ih": ref.weight_ih_l0, "W_hh": ref.weight_hh_l0, "b_ih": ref.bias_ih_l0,
              "b_hh": ref.bias_hh_l0}
    x = torch.randn(5, 1, I, dtype=torch.float64)
    out, _ = pkg(x, params)
    torch.testing.assert_close(out, ref(x)[0], rtol=0, atol=1e-10)


def _no_compiler_path(tmp_path):
    """A PATH with no cc, gcc or clang on it (the tools cellc runs for a CPU
    package are its own)."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("env", "true"):
        os.symlink(shutil.which(tool), bare / tool)
    return str(bare)


def test_cpu_kernels_link_with_no_c_compiler(tmp_path):
    # lld's ELF driver is built into cellc: with no C compiler on the PATH a
    # cell compiles and trains, and `cellc --emit=package` writes both
    # variants where -o says (lld resets a process's LLVM options, cellc's
    # -o among them: it links in a child).
    env = dict(os.environ, PATH=_no_compiler_path(tmp_path),
               CELLC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CELLC_CC", None)
    script = """
import torch, cellc
cell = cellc.compile("examples/gru.cell")
sizes = {"I": 6, "H": 5}
g = torch.Generator().manual_seed(0)
x = torch.randn(7, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
p = {n: torch.randn(*cell.shape(n, sizes), generator=g, dtype=torch.float64)
     for n, _ in cell.params}
out, _ = cell(x, p)
out.sum().backward()
print("ok", float(out.abs().sum()), float(x.grad.abs().sum()))
"""
    ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
    if shutil.which("cc"):
        with_cc = subprocess.run([sys.executable, "-c", script],
                                 env=dict(env, PATH=os.environ["PATH"], CELLC_CC="cc",
                                          CELLC_CACHE_DIR=str(tmp_path / "cache-cc")),
                                 cwd=ROOT, capture_output=True, text=True)
        assert with_cc.returncode == 0, with_cc.stderr
        # The same kernels, linked by lld or by cc: the same results.
        assert done.stdout == with_cc.stdout
    out = tmp_path / "pkg"
    made = subprocess.run([os.path.join(TOOLS, "cellc"), os.path.join(ROOT, "examples",
                           "gru.cell"), "-D", "H=16", "-D", "I=8", "--emit=package",
                           "--target=cpu", "-o", str(out)], env=env, capture_output=True)
    assert made.returncode == 0, made.stderr
    assert made.stdout == b""
    assert sorted(os.listdir(out)) == ["kernels.json", "replay.so", "save.so"]


def test_a_failed_link_is_an_error_that_says_why(tmp_path):
    # lld cannot write a variant (a directory is in its place): the message
    # is lld's, and the exit code says so even where the caller ignores
    # SIGCHLD (no exit status to wait for).
    out = tmp_path / "pkg"
    (out / "save.so").mkdir(parents=True)
    ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cellc_tool = os.path.join(TOOLS, "cellc")
    script = ("import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
              "os.execv(sys.argv[1], sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", script, cellc_tool,
                           os.path.join(ROOT, "examples", "gru.cell"), "-D", "H=16", "-D",
                           "I=8", "--emit=package", "--target=cpu", "-o", str(out)],
                          env=dict(os.environ, CELLC_CACHE_DIR=str(tmp_path / "cache")),
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "(lld) failed" in done.stderr and "Is a directory" in done.stderr


def test_a_named_linker_that_is_not_there_is_an_error(tmp_path):
    env = dict(os.environ, CELLC_CC="no-such-cc", CELLC_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([os.path.join(TOOLS, "cellc"), os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "examples", "gru.cell"), "-D", "H=16", "-D", "I=8", "--emit=package",
        "--target=cpu", "-o", str(tmp_path / "pkg")], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "CELLC_CC is 'no-such-cc', which is not a program on the PATH" in done.stderr
