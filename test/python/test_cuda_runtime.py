"""The CUDA runtime without a GPU: a clear error and no crash, and AOT
packages that round-trip from `cellc --emit=package` to `cellc.cuda`."""

import json
import os
import subprocess

import pytest

from conftest import BUILD
from cellc import cuda

CELLC = os.path.join(os.path.abspath(BUILD), "bin", "cellc")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def make_package(tmp_path, cell="lstm", *flags):
    out = tmp_path / cell
    subprocess.run([CELLC, os.path.join(EXAMPLES, cell + ".cell"), "-D", "H=32", "-D", "I=16",
                    "--emit=package", "-o", str(out), *flags], check=True)
    return out


def test_package_round_trip(tmp_path):
    pkg = cuda.Package(str(make_package(tmp_path, "lstm", "--arch=sm_80")))
    assert pkg.cell == "lstm"
    assert pkg.meta["arch"] == "sm_80" and pkg.meta["sizes"] == {"H": 32, "I": 16}
    assert set(pkg.kernels) == {"lstm_fwd", "lstm_bwd"}
    for variant in ("save", "replay"):
        assert ".target sm_80" in pkg.ptx[variant]
        assert ".entry lstm_fwd" in pkg.ptx[variant] and ".entry lstm_bwd" in pkg.ptx[variant]
    fwd = pkg.kernels["lstm_fwd"]
    assert 1 <= fwd["batch_tile"] <= 4 and fwd["threads"] == 256
    kinds = [a["kind"] for a in fwd["args"]]
    assert kinds[:3] == ["input", "projection", "resets"]
    assert kinds[-2:] == ["batch_begin", "batch_end"]
    proj = fwd["args"][1]
    assert proj["name"] == "W_ih" and proj["biases"] == ["b_ih", "b_hh"]
    assert proj["shape"] == [-1, -1, 128]
    # The variants differ only in the gate stores and loads.
    assert pkg.ptx["save"] != pkg.ptx["replay"]


def test_bad_packages_are_errors(tmp_path):
    with pytest.raises(ValueError, match="not a cellc package"):
        cuda.Package(str(tmp_path))
    (tmp_path / "kernels.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="unknown package format 99"):
        cuda.Package(str(tmp_path))
    bad = subprocess.run([CELLC, os.path.join(EXAMPLES, "lstm.cell"), "-D", "H=8", "-D", "I=4",
                          "--emit=package"], capture_output=True, text=True)
    assert bad.returncode == 1 and "give it with -o DIR" in bad.stderr


@pytest.mark.skipif(cuda.available()[0], reason="a CUDA driver and GPU are present")
def test_no_driver_is_a_clear_error(tmp_path):
    ok, why = cuda.available()
    assert not ok and why.startswith("no CUDA driver/GPU")
    pkg = cuda.Package(str(make_package(tmp_path)))
    with pytest.raises(cuda.CudaUnavailable, match="no CUDA driver/GPU"):
        cuda.CudaCell(pkg)
    # Asking again gives the same answer: a failed load is not cached broken.
    assert cuda.available() == (ok, why)
