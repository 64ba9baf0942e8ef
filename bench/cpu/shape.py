"""The command line of the one-process CPU benchmarks (lengths.py, cells.py):
the shape and how to time it."""

import argparse
import ctypes
import statistics
import time

import torch


def parse_shape(description, steps):
    """Parses --batch, --steps (default `steps`), --size (I = H), --repeats
    and --threads, and sets torch's threads. Returns the arguments."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    return a


def settle(seconds=0.02):
    """Busy-waits `seconds` on this thread, so that the OpenMP threads of the
    run before have parked before the next run starts: torch's and oneDNN's
    (libgomp's) spin for 2 to 10 ms after each parallel region, and on two
    cores they took a core from the next run (OpenBLAS's GEMMs split over two
    threads ran at 135 instead of 190 GFLOP/s right after oneDNN's; see
    bench/cpu/gemms.py). A sleep instead lets the VM take the core away, and
    the next run starts slower."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def side_by_side(runs, repeats, before_each=lambda: None):
    """Times each of `runs` (name -> callable) once per round, the runs
    interleaved so that a noisy machine slows them alike. Returns the median
    seconds of each."""
    times = {n: [] for n in runs}
    for _ in range(repeats):
        for n, f in runs.items():
            before_each()
            t0 = time.perf_counter()
            f()
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(ts) for n, ts in times.items()}


def sgemm_gflops(repeats):
    """OpenBLAS's sgemm at 1024^3 in this process (torch's threads): the
    GFLOP/s (the median of `repeats` after a warm-up) and the kernels
    OpenBLAS chose (OPENBLAS_CORETYPE picks them; see bench/cpu/run.sh)."""
    m = torch.randn(1024, 1024)
    m @ m
    t = side_by_side({"sgemm": lambda: m @ m}, repeats)["sgemm"]
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        core = "unknown"
    return 2 * 1024 ** 3 / t / 1e9, core


def sgemm_ceiling(repeats, threads=1):
    """sgemm_gflops as a line to print."""
    gflops, core = sgemm_gflops(repeats)
    where = f" on {threads} threads" if threads > 1 else ""
    return f"ceiling: sgemm 1024^3 {gflops:.1f} GFLOP/s{where} (OpenBLAS's {core} kernels)"
