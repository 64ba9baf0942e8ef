"""The GPU run's script (bench/gpu/run.sh) end to end in the SIMT emulator:
the packages and float64 references written here, the runtime built as a
GPU machine builds it (CMake, no OpenBLAS), every package checked against
its reference in each recompute mode with resets, and the benchmark table.
On a GPU the same script runs the same steps; here it cannot rot unseen."""

import glob
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "gpu", "run.sh")


def test_the_gpu_script_runs_in_the_emulator(tmp_path):
    build = os.environ.get("CELLC_BUILD_DIR", "build")
    # This Python (with its torch, and cellc where it is installed, as under
    # make test-torch2) writes the packages and checks them.
    env = dict(os.environ, OUT=str(tmp_path), CELLC_PYTHON=sys.executable,
               CELLC_GPU_BUILD=os.path.join(os.path.abspath(build), "gpu-runtime"))
    packages = str(tmp_path / "packages")
    # With the wheel (make wheel; make test builds it first), the "GPU
    # machine" installs it and compiles there: the check's packages and
    # cells at sizes no package has. Without it, they are written here.
    # A wheel older than this build's compiler (make pytest alone after a
    # change) would check another compiler's packages: then the run takes
    # the packages written here.
    wheel = glob.glob(os.path.join(ROOT, "dist", "cellc-*.whl"))
    compiler = os.path.join(build, "lib", "libcellc_compiler.so")
    if wheel and os.path.exists(compiler) and \
            os.path.getmtime(wheel[0]) < os.path.getmtime(compiler):
        wheel = []
        env["CELLC_NO_WHEEL"] = "1"
    if not wheel:
        made = subprocess.run([SCRIPT, "package", "--emulate", packages], env=env,
                              capture_output=True, text=True, timeout=600)
        assert made.returncode == 0, made.stdout + made.stderr
        assert "not built" not in made.stdout, made.stdout
    done = subprocess.run([SCRIPT, "run", "--emulate", packages], env=env,
                          capture_output=True, text=True, timeout=900)
    log = (tmp_path / "gpu-run-emulated.log").read_text()
    assert done.returncode == 0, log + done.stderr
    if wheel:
        assert "prepared here by the wheel's compiler" in log, log
        assert "3 of 3 cells compiled here passed" in log, log
        assert "from /tmp/cellc-site-emulated/cellc" in log, log
    else:
        assert "no wheel carried" in log, log
    # The runtime a GPU machine builds links no BLAS and no OpenMP.
    lib = os.path.join(env["CELLC_GPU_BUILD"], "lib", "libcellc_runtime.so")
    linked = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    assert "libcellc" not in linked and not any(
        name in linked for name in ("openblas", "libgomp", "libblas")), linked
    # It keeps its C++ to itself (libstdc++ linked in, the C interface alone
    # exported): on an H200 machine, torch 2.11's exported std:: instances
    # took the place of a runtime's own, and it crashed in its first call.
    assert "libstdc++" not in linked and "libgcc_s" not in linked, linked
    exported = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                              text=True, check=True).stdout.split("\n")
    others = [line for line in exported if line and not line.split()[-1].startswith("cellc_")]
    assert not others, others[:10]
    assert any(line.endswith(" cellc_cuda_package_open") for line in exported), exported[:10]
    # Three cells in three configurations, each in three recompute modes.
    assert "27 of 27 checks passed" in log and "FAIL" not in log, log
    # The chunk form's cores on their CUDA kernels: row and scalar gates,
    # and the delta rule.
    assert log.count("ok   chunk core B=1 H=2 T=37") == 4, log
    assert log.count("ok   delta core B=1 H=2 T=37") == 2, log
    assert "| lstm-B4-T4-H16 | cellc tiled none |" in log, log
    assert "| lstm-B4-T4-H16 | cellc tiled full |" in log, log
    # A call that never returns is a hang: the check says where, with
    # Python's stacks, and goes on from the next package (here every call
    # "hangs" after a millisecond: each of the nine packages in turn).
    env["CELLC_CHECK_ROW_SECONDS"] = "0.001"
    hung = subprocess.run([SCRIPT, "run", "--emulate", packages], env=env,
                          capture_output=True, text=True, timeout=900)
    log = (tmp_path / "gpu-run-emulated.log").read_text()
    assert hung.returncode != 0, log
    places = [line.split()[2] for line in log.splitlines() if line.startswith("HUNG at ")]
    assert places == [str(i) for i in range(9)], log
    assert "the check's time ran out" not in log, log
    assert "Current thread" in hung.stdout + hung.stderr + log, hung.stderr[-2000:]
