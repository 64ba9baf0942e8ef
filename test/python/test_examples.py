"""The Python examples run and their losses fall, read from what they print."""

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def run_example(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_train_lstm_learns_in_every_recompute_mode():
    out = run_example("train_lstm.py")
    # The summary table: mode, first loss, last loss, ms/step, kept KiB.
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)), float(m.group(5)))
            for m in re.finditer(r"^(none|full|chunk:\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                                 r"\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"none", "full", "chunk:10"}, out
    for mode, (first, last, _) in rows.items():
        assert last < 0.3 * first, f"{mode}: loss {first} -> {last}"
    # What the forward keeps: the gates and states (none), the states at
    # every step (full), every tenth (chunk:10).
    assert rows["chunk:10"][2] < rows["full"][2] < rows["none"][2], rows


def assert_loss_halves(name):
    """Runs an example that prints its mean loss at the start and the end."""
    out = run_example(name)
    m = re.search(r"mean loss of the first 5 steps ([\d.]+), of the last 10 ([\d.]+)", out)
    assert m, out
    first, last = float(m.group(1)), float(m.group(2))
    assert last < 0.5 * first, f"{name}: loss {first} -> {last}"


def test_custom_cell_learns():
    assert_loss_halves("custom_cell.py")


def test_block_gru_learns():
    # Block-diagonal weights and a reduction (examples/block_gru.cell).
    assert_loss_halves("train_block_gru.py")


def test_gated_deltanet_learns_associative_recall():
    # A matrix state [NH, K, V], written and read by key (examples/gated_deltanet.cell).
    assert_loss_halves("train_deltanet.py")


def test_ddp_gradients_equal_one_process_over_the_whole_batch():
    # Two gloo processes, each on half of every batch, for five SGD steps.
    out = run_example("ddp_lstm.py")
    m = re.search(r"largest difference between DDP's gradients and one process's: (\S+)", out)
    assert m, out
    assert float(m.group(1)) < 1e-5, out
    losses = re.findall(r"^step \d+  loss", out, re.M)
    assert len(losses) == 5, out
