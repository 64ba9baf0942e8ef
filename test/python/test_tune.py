"""Autotuning: cellc.autotune and cellc-tune write a tuning-cache entry that
the JIT then uses; broken candidates are skipped; keys bucket the batch."""

import json
import os
import subprocess

import pytest
import torch

import cellc
from cellc import _cellc
from conftest import TOOLS

TUNE = os.path.join(TOOLS, "cellc-tune")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
LSTM = os.path.join(EXAMPLES, "lstm.cell")
SIZES = {"I": 8, "H": 8}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel and tuning cache for one test."""
    monkeypatch.setenv("CELLC_CACHE_DIR", str(tmp_path))
    return tmp_path


def lstm_params(H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"W_ih": (4 * H, I), "W_hh": (4 * H, H), "b_ih": (4 * H,), "b_hh": (4 * H,)}
    return {n: torch.randn(*s, generator=g) * 0.3 for n, s in shapes.items()}


def test_a_short_tune_writes_an_entry_that_the_jit_uses(cache):
    cell = cellc.compile(LSTM)
    result = cellc.autotune(cell, SIZES, batch=4, seq_len=5, budget=3, progress=False)
    assert result["stored"] and result["winner"] >= 0
    winner = result["winner_config"]
    assert os.listdir(cache / "tuning"), "no tuning-cache entry written"
    assert _cellc.tuned_config(cell.source, SIZES, "f32", 3) == winner
    # Batch 3 is in the bucket tuned (4); batch 5 is not.
    tuned = cell.jit(SIZES, torch.float32, batch=3)
    assert tuned.config_source == "tuned"
    assert tuned.config == ",".join(f"{k}={v}" for k, v in sorted(winner.items()))
    assert cell.jit(SIZES, torch.float32, batch=5).config_source == "default"
    # The tuned kernels agree with the untuned ones (an explicit thread count
    # opts out of tuning) on a training step.
    x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(1))
    params = lstm_params(8, 8)
    outs = []
    for c in (cell, cellc.compile(LSTM, threads=1)):
        p = {n: t.clone().requires_grad_() for n, t in params.items()}
        xi = x.clone().requires_grad_()
        out, final = c(xi, p, save_gates=False)
        (out.square().sum() + final["c"].sum()).backward()
        outs.append([out, xi.grad] + [p[n].grad for n in sorted(p)])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_an_explicit_thread_count_keeps_the_batchs_default_shape(cache):
    # Threads given opt out of tuned configs, not of the batch's default
    # kernels: one row runs the per-row kernels and a batch of 5 a tile of 8
    # rows, not the 64 rows that a batch of unknown size gets (a step of one
    # row ran at half speed on that tile).
    cell = cellc.compile(LSTM, threads=1)
    config = lambda batch: dict(kv.split("=") for kv in
                                cell.jit(SIZES, torch.float32, batch=batch).config.split(","))
    assert config(1)["kernels"] == "0"
    assert config(5)["batch_tile"] == "8" and config(5)["kernels"] == "1"
    assert config(0)["batch_tile"] == "64"
    assert all(config(b)["threads"] == "1" for b in (0, 1, 5))
    assert cell.jit(SIZES, torch.float32, batch=5).config_source == "default"
    # On two threads one row runs the batched kernels, whose threads split
    # its units.
    two = cellc.compile(LSTM, threads=2).jit(SIZES, torch.float32, batch=1)
    assert dict(kv.split("=") for kv in two.config.split(","))["kernels"] == "1"
    assert two.thread_split(1) == (1, 2)


def test_two_threads_split_a_tiles_rows_unless_each_would_get_fewer_than_four(cache):
    """By default the threads split a batch's rows (no barriers; 3% to 8%
    faster training on two cores from 4 rows a thread), each in a tile of
    its share (B = 64 on two threads: tiles of 32), and a tile's units below
    4 rows a thread, or where each thread's copy of the packed weights would
    cost more than 4 MiB in all. Either can be forced, and the default comes
    back with None; every split matches torch."""
    compiled = cellc.compile(LSTM, threads=2).jit(SIZES, torch.float64, batch=64)
    assert compiled.unit_slices is None
    config = dict(kv.split("=") for kv in compiled.config.split(","))
    assert config["unit_slices"] == "-1" and config["batch_tile"] == "32"
    assert compiled.thread_split(64) == (2, 1)
    assert compiled.thread_split(8) == (2, 1)
    assert compiled.thread_split(7) == (1, 2)
    assert compiled.thread_split(1) == (1, 2)
    compiled.unit_slices = True
    assert compiled.unit_slices is True and compiled.thread_split(16) == (1, 2)
    # Asked for at compile time, unit slices keep the batch's 64-row tile.
    units = cellc.compile(LSTM, threads=2, unit_slices=True).jit(SIZES, torch.float64,
                                                                  batch=64)
    assert dict(kv.split("=") for kv in units.config.split(","))["batch_tile"] == "64"
    assert units.unit_slices is True and units.thread_split(64) == (1, 2)
    compiled.unit_slices = False
    assert compiled.unit_slices is False and compiled.thread_split(7) == (2, 1)
    compiled.unit_slices = None
    assert compiled.thread_split(64) == (2, 1)
    # H = 512: the weights (8 MiB) would be packed again by the second
    # thread, so its units are split, in one 64-row tile.
    big = cellc.compile(LSTM, threads=2).jit({"I": 512, "H": 512}, torch.float32, batch=64)
    assert dict(kv.split("=") for kv in big.config.split(","))["batch_tile"] == "64"
    assert big.thread_split(64) == (1, 2)
    cell = cellc.compile(LSTM, threads=2)
    p = {n: t.double() for n, t in lstm_params(8, 8).items()}
    ref = torch.nn.LSTM(8, 8).double()
    with torch.no_grad():
        for mine, theirs in (("W_ih", "weight_ih_l0"), ("W_hh", "weight_hh_l0"),
                             ("b_ih", "bias_ih_l0"), ("b_hh", "bias_hh_l0")):
            getattr(ref, theirs).copy_(p[mine])
    for B in (64, 7):
        x = torch.randn(5, B, 8, dtype=torch.float64)
        for slices in (None, True, False):
            cell.jit(SIZES, torch.float64, batch=B).unit_slices = slices
            torch.testing.assert_close(cell(x, p)[0], ref(x)[0], rtol=1e-12, atol=1e-12)
            split = cellc.compile(LSTM, threads=2, unit_slices=slices)
            torch.testing.assert_close(split(x, p)[0], ref(x)[0], rtol=1e-12, atol=1e-12)


def test_a_corrupt_entry_is_reported_and_the_default_config_runs(cache, capfd):
    cell = cellc.compile(LSTM)
    result = cellc.autotune(cell, SIZES, batch=4, seq_len=5, budget=2, progress=False)
    assert result["stored"]
    (entry,) = (cache / "tuning").iterdir()
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of the config: its checksum fails
    entry.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match=f"{entry}.*corrupt.*ignored"):
        assert _cellc.tuned_config(cell.source, SIZES, "f32", 4) is None
    capfd.readouterr()
    compiled = cell.jit(SIZES, torch.float32, batch=4)
    assert compiled.config_source == "default"
    err = capfd.readouterr().err
    assert "warning" in err and str(entry) in err and "corrupt" in err, err
    # And the cell still runs, on the default config.
    x = torch.randn(5, 4, 8)
    out, _ = cell(x, lstm_params(8, 8))
    assert torch.isfinite(out).all() and out.abs().sum() > 0


def test_broken_candidates_are_reported_and_skipped(cache, monkeypatch):
    monkeypatch.setenv("CELLC_TUNE_BREAK", "crash:1,wrong:2,compile:3")
    # A budget that reaches the fourth candidate on a loaded 2-core machine,
    # where each candidate builds its package (compile and link) first.
    result = cellc.autotune(LSTM, SIZES, batch=4, seq_len=5, budget=10, progress=False,
                            store=False)
    status = [c["status"] for c in result["candidates"]]
    assert status[1:4] == ["crashed", "wrong results", "compile error"], status
    assert "signal 11" in result["candidates"][1]["note"]
    assert result["winner"] not in (1, 2, 3) and result["winner"] >= 0
    assert "crashed" in result["table"] and "wrong results" in result["table"]
    assert not result["stored"] and not (cache / "tuning").exists()


def test_keys_bucket_the_batch_and_hold_the_problem():
    source = open(LSTM).read()
    key = lambda sizes=SIZES, dtype="f32", batch=64, src=source: _cellc.tuning_key(
        src, sizes, dtype, batch)
    assert key(batch=33) == key(batch=64)  # one bucket: 33..64
    assert key(batch=65) != key(batch=64)  # same H, next bucket
    assert key(batch=1) != key(batch=2)
    assert key(sizes={"I": 8, "H": 16}) != key()
    assert key(sizes={"I": 16, "H": 8}) != key()
    assert key(dtype="f64") != key()
    assert key(src=source + "\n") != key()


def test_autotune_on_first_use(cache, monkeypatch):
    monkeypatch.setenv("CELLC_AUTOTUNE", "1")
    monkeypatch.setenv("CELLC_AUTOTUNE_BUDGET", "2")
    cell = cellc.compile(LSTM)
    x = torch.randn(4, 2, 8)
    cell(x, lstm_params(8, 8))
    assert _cellc.tuned_config(cell.source, SIZES, "f32", 2) is not None
    assert cell.jit(SIZES, torch.float32, batch=2).config_source == "tuned"


def test_python_errors(cache):
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        cellc.autotune(LSTM, SIZES, batch=4, target="tpu")
    with pytest.raises(ValueError, match="batch and seq_len must be positive"):
        cellc.autotune(LSTM, SIZES, batch=0)
    with pytest.raises(ValueError, match="unbound size 'H'"):
        cellc.autotune(LSTM, {"I": 8}, batch=4, budget=1)
    with pytest.raises(TypeError, match="float32 and float64"):
        cellc.autotune(LSTM, SIZES, batch=4, dtype=torch.float16)


def run_tune(*args, env=None):
    return subprocess.run([TUNE, LSTM, "-D", "I=8", "-D", "H=8", *args],
                          capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_cli_exit_codes_and_json(cache, tmp_path):
    ok = run_tune("--batch", "4", "--seq-len", "5", "--budget", "3s", "--json",
                  str(tmp_path / "out.json"))
    assert ok.returncode == 0, ok.stderr
    assert "winner: " in ok.stdout and "stored in " in ok.stdout
    assert "[1/" in ok.stderr  # progress
    out = json.load(open(tmp_path / "out.json"))
    assert out["batch"] == 4 and out["sizes"] == SIZES and out["stored"]
    assert out["candidates"][0]["status"] == "ok"
    assert run_tune("--target", "tpu").returncode == 1
    assert run_tune("-D", "H=0").returncode == 1
    nogpu = run_tune("--target", "cuda", env={"CELLC_LIBCUDA": "/nonexistent/libcuda.so"})
    assert nogpu.returncode == 3 and "no CUDA driver/GPU" in nogpu.stderr


def test_tiles_are_not_tuned_for_a_step_without_products(cache, tmp_path):
    """RetNet's step has no recurrent product, so its kernels run one-row
    tiles whatever batch_tile says: the tuner prunes those candidates and
    times the rest. An LSTM's tiles are tuned."""
    notes = {}
    for cell, sizes in (("retnet.cell", ["I=16", "NH=2", "K=4", "V=4"]),
                        ("lstm.cell", ["I=8", "H=8"])):
        out = tmp_path / f"{cell}.json"
        run = subprocess.run([TUNE, os.path.join(EXAMPLES, cell),
                              *[a for s in sizes for a in ("-D", s)], "--batch", "8",
                              "--seq-len", "4", "--budget", "3s", "--json", str(out)],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        notes[cell] = {c["config"]["batch_tile"]: (c["status"], c["note"])
                       for c in json.load(open(out))["candidates"]
                       if c["config"]["kernels"] == 1}
    for tile in (16, 32, 64, 128):
        assert notes["retnet.cell"][tile] == (
            "pruned", "the step has no recurrent product: its tiles are one row")
        assert "no recurrent product" not in notes["lstm.cell"][tile][1]
