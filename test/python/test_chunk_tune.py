"""The chunk form's length as a tuner knob (cellc._chunktune): cellc.autotune(...,
form="chunk") and `python3 -m cellc cellc-tune --form=chunk` time each
candidate length, keep the winner in the tuning cache, and form="chunk"
calls and memory plans that name no chunk take it."""

import json
import os
import subprocess
import sys

import pytest
import torch

import cellc
from cellc import _chunktune, _chunkwise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLA = os.path.join(ROOT, "examples", "gla.cell")
SIZES = dict(I=12, NH=2, K=8, V=6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A tuning cache of the test's own."""
    monkeypatch.setenv("CELLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_chunktune, "_FOUND", {})
    return tmp_path / "cache"


def _lengths_run(monkeypatch):
    ran, real = [], _chunkwise._linear_state

    def spy(*args, **kwargs):
        ran.append(args[7])
        return real(*args, **kwargs)
    monkeypatch.setattr(_chunkwise, "_linear_state", spy)
    return ran


def test_autotune_times_each_length_and_calls_take_the_winner(cache, monkeypatch):
    cell = cellc.compile(GLA)
    result = cellc.autotune(cell, SIZES, batch=3, seq_len=70, form="chunk", budget=0.5,
                            progress=False)
    assert [c["chunk"] for c in result["candidates"]] == [16, 32, 64, 128]
    assert result["default_config"] == {"chunk": 64}
    assert all(c["error"] is None and c["ms"] > 0 for c in result["candidates"])
    winner = result["winner_config"]["chunk"]
    assert winner in (16, 32, 64, 128) and "winner" in result["table"]
    with open(result["stored"]) as f:
        assert json.load(f)["chunk"] == winner
    assert result["stored"].startswith(str(cache))
    # What a call takes: the tuned length, for this batch's and length's
    # buckets (3 -> 4, 70 -> 128), and not for another length's.
    assert _chunktune.tuned(cell, SIZES, torch.float32, 4, 100) == winner
    assert _chunktune.tuned(cell, SIZES, torch.float32, 3, 300) is None
    assert _chunktune.tuned(cell, SIZES, torch.float64, 3, 70) is None
    # Tuned in `none`: another recompute mode has its own entry, and so has
    # another thread count.
    assert _chunktune.tuned(cell, SIZES, torch.float32, 3, 70, "full") is None
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert _chunktune.tuned(cell, SIZES, torch.float32, 3, 70) is None
    finally:
        torch.set_num_threads(threads)
    assert oct(os.stat(result["stored"]).st_mode & 0o777) == "0o644"
    # Another winner planted: the call and the plan take it.
    # Another process's entry is seen (no stale cache of what was there).
    with open(result["stored"] + ".new", "w") as f:
        json.dump({"chunk": 16}, f)
    os.replace(result["stored"] + ".new", result["stored"])
    ran = _lengths_run(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, 3, SIZES["I"], generator=g)
    params = {n: 0.3 * torch.randn(*cell.shape(n, SIZES), generator=g)
              for n, _ in cell.params}
    tuned_out, _ = cell(x, params, sizes=SIZES, form="chunk")
    named_out, _ = cell(x, params, sizes=SIZES, form="chunk", chunk=16)
    assert ran == [16, 16]
    assert torch.equal(tuned_out, named_out)
    # form="auto" decides at the length the call takes: 70 steps are 4
    # chunks of 16 (the chunk form), not of the default 64 (the step form).
    x.requires_grad_()
    cell(x, params, sizes=SIZES, form="auto")
    assert ran == [16, 16, 16]
    assert cell.memory_plan(SIZES, 70, 3, "none", form="chunk")["chunk"] == 16
    assert cell.memory_plan(SIZES, 70, 3, "none", form="chunk", chunk=32)["chunk"] == 32
    # form="auto" plans what the call takes: the chunk form at 16.
    assert cell.memory_plan(SIZES, 70, 3, "none", form="auto")["chunk"] == 16


def test_a_broken_entry_warns_and_the_default_length_stands(cache, monkeypatch):
    cell = cellc.compile(GLA)
    path = _chunktune._path(_chunktune.key(cell, SIZES, torch.float32, 2, 40))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write('{"chunk": "sixteen"}')
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert _chunktune.tuned(cell, SIZES, torch.float32, 2, 40) is None
    ran = _lengths_run(monkeypatch)
    x = torch.randn(40, 2, SIZES["I"])
    params = {n: 0.3 * torch.randn(*cell.shape(n, SIZES)) for n, _ in cell.params}
    cell(x, params, sizes=SIZES, form="chunk")
    assert ran == [_chunkwise.chunk_length(40)]


def test_autotune_refuses_what_it_cannot_tune(cache):
    with pytest.raises(ValueError, match="no chunkwise form"):
        cellc.autotune(os.path.join(ROOT, "examples", "lstm.cell"), dict(I=4, H=4), batch=2,
                       seq_len=20, form="chunk", progress=False)
    with pytest.raises(ValueError, match="form must be"):
        cellc.autotune(GLA, SIZES, batch=2, seq_len=20, form="chunks")
    with pytest.raises(ValueError, match="on the CPU"):
        cellc.autotune(GLA, SIZES, batch=2, seq_len=20, form="chunk", target="cuda")
    with pytest.raises(TypeError, match="float32 and float64"):
        cellc.autotune(GLA, SIZES, batch=2, seq_len=20, form="chunk", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a cell compiled for the CPU"):
        cellc.autotune(cellc.compile(GLA, target="cuda-emu"), SIZES, batch=2, seq_len=20,
                       form="chunk")
    # Nothing was stored.
    assert not os.path.exists(cache / "tuning" / "chunk")


def test_the_command_line_tunes_the_chunk_length(cache, tmp_path):
    env = dict(os.environ, CELLC_CACHE_DIR=str(cache))
    out = tmp_path / "tune.json"
    done = subprocess.run([sys.executable, "-m", "cellc", "cellc-tune", "--form=chunk", GLA,
                           "-D", "I=12", "-D", "NH=2", "-D", "K=8", "-D", "V=6", "--batch",
                           "2", "--seq-len", "40", "--budget", "0.5s", "--no-store",
                           "--json", str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "chunk length for gla at T=40 B=2" in done.stdout and "winner" in done.stdout
    assert "[cellc-tune] round 1" in done.stderr
    assert json.loads(out.read_text())["stored"] is None
    assert not os.path.exists(cache / "tuning" / "chunk")
    # Bad input: exit 1 with the reason.
    bad = subprocess.run([sys.executable, "-m", "cellc", "cellc-tune", "--form", "chunk", GLA,
                          "-D", "I=x", "--batch", "2"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "-D I=x: expected NAME=N" in bad.stderr
    for budget in ("500ms", "0", "-5", "nan", "2mm"):
        bad = subprocess.run([sys.executable, "-m", "cellc", "cellc-tune", "--form=chunk", GLA,
                              "-D", "I=12", "--batch", "2", "--budget", budget],
                             capture_output=True, text=True, env=env)
        assert bad.returncode == 1 and f"--budget '{budget}'" in bad.stderr, budget
    # The C++ tool says where the chunk form is tuned.
    tool = os.path.join(os.environ.get("CELLC_BUILD_DIR", os.path.join(ROOT, "build")),
                        "bin", "cellc-tune")
    if os.path.exists(tool):
        native = subprocess.run([tool, "--form=chunk", GLA, "--batch", "2"],
                                capture_output=True, text=True)
        assert native.returncode == 1
        assert "python3 -m cellc cellc-tune --form=chunk" in native.stderr
        other = subprocess.run([tool, "--form=rows", GLA], capture_output=True, text=True)
        assert other.returncode == 1 and "--form must be step or chunk" in other.stderr
