"""The Python examples run and their losses fall."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("name", ["train_lstm.py", "custom_cell.py"])
def test_example_runs(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loss" in result.stdout
