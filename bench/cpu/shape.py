"""The command line of the one-process CPU benchmarks (lengths.py, cells.py):
the shape and how to time it."""

import argparse

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
