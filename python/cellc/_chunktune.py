"""The chunk form's length as a tuner knob: cellc.autotune(cell, sizes, batch=,
seq_len=, form="chunk") and `python3 -m cellc cellc-tune --form=chunk` time a
training step (forward and backward) of the chunk form on the CPU at each
candidate length, each first checked against the default length's results,
and keep the winner in the tuning cache. A form="chunk" call (or
memory_plan(form="chunk")) that names no chunk then takes the tuned length for
its cell, sizes, dtype, batch and sequence length, each rounded up to a power
of two; with none, the default rule (cellc._cellc.default_chunk_length)."""

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

from . import _cellc

#: The lengths tried (those up to the sequence's power of two, at least 16,
#: and the default).
CANDIDATES = (16, 32, 64, 128)
#: A winner must be this much faster than the default, as cellc-tune's.
MIN_WIN = 0.03
#: How far another length's results may be from the default length's.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}


def _bucket(n):
    b = 1
    while b < n:
        b *= 2
    return b


def _dtype_name(dtype):
    return "f64" if dtype == torch.float64 else "f32"


def key(cell, sizes, dtype, batch, steps, mode="none"):
    """The tuning cache's key: cellc-tune's (the cell's text, the CPU, the
    sizes, the dtype, the compiler and the batch's bucket), the sequence
    length's bucket, the recompute mode, and the threads the core and the
    compiled parts run on (torch's, and the cell's)."""
    base = _cellc.tuning_key(cell.source, dict(sizes), _dtype_name(dtype), _bucket(batch))
    threads = f"{torch.get_num_threads()}/{getattr(cell, 'threads', 0)}"
    text = f"{base}|chunk-length|T{_bucket(steps)}|{mode or 'none'}|threads {threads}"
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _path(k):
    return os.path.join(_cellc.cache_dir(), "tuning", "chunk", k + ".json")


_FOUND = {}


def tuned(cell, sizes, dtype, batch, steps, mode="none"):
    """The tuned chunk length for this call's shape and recompute mode, or
    None. What a file held is remembered (by its path and time); that there
    is none is not, so that another process's tune is seen."""
    path = _path(key(cell, sizes, dtype, batch, steps, mode))
    try:
        st = os.stat(path)
    except OSError:
        return None
    k = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    if k not in _FOUND:
        found = None
        try:
            with open(path) as f:
                found = json.load(f)["chunk"]
            if not isinstance(found, int) or found < 1:
                raise ValueError(f"chunk {found!r}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            warnings.warn(f"the tuned chunk length in {path} is unreadable ({e}); it is "
                          "ignored", RuntimeWarning, stacklevel=3)
            found = None
        _FOUND[k] = found
    return _FOUND[k]


def _arguments(cell, sizes, batch, steps, dtype):
    """Random inputs and params at the shape (the timings do not depend on
    the values): matrices scaled by their depth, vectors in (0.1, 0.9), so
    that gates and decays stay in range."""
    g = torch.Generator().manual_seed(0)
    xs = {n: torch.randn(steps, batch, *cell.shape(n, sizes), generator=g, dtype=dtype)
          for n, _ in cell.inputs}
    params = {}
    for n, _ in cell.params:
        shape = cell.shape(n, sizes)
        if len(shape) >= 2:
            t = torch.randn(*shape, generator=g, dtype=dtype) / shape[-1] ** 0.5
        else:
            t = 0.1 + 0.8 * torch.rand(*shape, generator=g, dtype=dtype)
        params[n] = t.requires_grad_()
    x = next(iter(xs.values())) if len(xs) == 1 else xs
    return x, params


def tune(cell, sizes, *, batch, seq_len, dtype=torch.float32, budget=60.0, store=True,
         progress=True, recompute="none"):
    """Times the chunk form's training step at each candidate chunk length
    (see the module's docstring). Returns a dict: "candidates" (each
    length's "chunk", "ms" median or None, "error"), "winner_config" and
    "default_config" ({"chunk": L}), "seconds", "key", "stored" (the cache
    file, or None) and "table" (what it printed)."""
    from . import _chunkwise
    if dtype not in TOLERANCE:
        raise TypeError(f"the chunk form runs float32 and float64, not {dtype}")
    p = _chunkwise.plan(cell, sizes, dtype)
    if not p["linear"]:
        raise ValueError(_chunkwise.not_qualifying(cell, p))
    start = time.perf_counter()
    default = _chunkwise.chunk_length(seq_len)
    lengths = sorted({c for c in CANDIDATES if c <= max(16, _bucket(seq_len))} | {default})
    x, params = _arguments(cell, sizes, batch, seq_len, dtype)
    leaves = list(params.values())
    xs = [x] if torch.is_tensor(x) else list(x.values())

    def say(text):
        if progress:
            sys.stderr.write(f"[cellc-tune] {text}\n")
            sys.stderr.flush()

    def step(L):
        for t in xs:
            t.requires_grad_(True)
        out, final = cell(x, params, None, sizes=sizes, form="chunk", chunk=L,
                          recompute=recompute)
        outs = list(out.values()) if isinstance(out, dict) else [out]
        loss = sum(o.square().sum() for o in outs) + sum(f.square().sum()
                                                          for f in final.values())
        grads = torch.autograd.grad(loss, xs + leaves)
        return [o.detach() for o in outs] + list(final.values()) + list(grads)

    def far(a, b):
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

    say(f"chunk form of {p['name']}: {len(lengths)} lengths at T={seq_len} B={batch}")
    reference = step(default)
    if not all(torch.isfinite(r).all() for r in reference):
        raise ValueError(f"the chunk form's results at the default length ({default}) are not "
                         "finite on random data: no length to compare against")
    results = {L: {"chunk": L, "ms": None, "error": None} for L in lengths}
    for L in lengths:
        try:
            got = step(L)
            worst = max(far(a, b) for a, b in zip(got, reference))
            if not worst <= TOLERANCE[dtype]:
                results[L]["error"] = f"differs from chunk {default} by {worst:.1e}"
        except Exception as e:  # a length the form refuses: reported, skipped
            results[L]["error"] = f"{type(e).__name__}: {e}"
        if results[L]["error"]:
            say(f"chunk {L}: {results[L]['error']}")
    live = [L for L in lengths if not results[L]["error"]]
    times = {L: [] for L in live}
    # Interleaved rounds, at least 3 and at most 15, within the budget.
    rounds = 0
    while rounds < 15 and (rounds < 3 or time.perf_counter() - start < budget):
        for L in live:
            t0 = time.perf_counter()
            step(L)
            times[L].append(time.perf_counter() - t0)
        rounds += 1
        say(f"round {rounds}: " + "  ".join(f"{L}: {times[L][-1] * 1e3:.1f} ms" for L in live))
    for L in live:
        results[L]["ms"] = statistics.median(times[L]) * 1e3
    winner = default
    if default in live:
        best = min(live, key=lambda L: results[L]["ms"])
        if results[best]["ms"] < (1 - MIN_WIN) * results[default]["ms"]:
            winner = best
    lines = [f"chunk length for {p['name']} at T={seq_len} B={batch} "
             f"({_dtype_name(dtype)}, {recompute}), {rounds} rounds:",
             f"{'chunk':>6} {'ms':>9} {'speedup':>8}"]
    for L in lengths:
        r = results[L]
        if r["ms"] is None:
            lines.append(f"{L:>6} {'-':>9} {'-':>8}  {r['error']}")
        else:
            note = "  winner" if L == winner else ("  default" if L == default else "")
            lines.append(f"{L:>6} {r['ms']:>9.2f} {results[default]['ms'] / r['ms']:>7.2f}x"
                         + note)
    table = "\n".join(lines) + "\n"
    k = key(cell, sizes, dtype, batch, seq_len, recompute)
    stored = None
    if store:
        stored = _path(k)
        os.makedirs(os.path.dirname(stored), exist_ok=True)
        entry = {"chunk": winner, "cell": p["name"], "sizes": dict(sizes),
                 "dtype": _dtype_name(dtype), "batch": batch, "seq_len": seq_len,
                 "medians_ms": {str(L): results[L]["ms"] for L in lengths}}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(stored), suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=2)
            # Readable by whoever shares the cache, as cellc-tune's entries.
            os.chmod(tmp, 0o644)
            os.replace(tmp, stored)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        _FOUND.clear()
    return {"candidates": [results[L] for L in lengths], "winner_config": {"chunk": winner},
            "default_config": {"chunk": default}, "seconds": time.perf_counter() - start,
            "key": k, "stored": stored, "table": table}


def main(argv):
    """`python3 -m cellc cellc-tune --form=chunk CELL -D N=V... --batch B
    --seq-len T [--dtype f32|f64] [--budget 60s] [--recompute MODE] [--json F]
    [--no-store]`: the chunk length, tuned; exit 0, 1 on bad input."""
    import argparse
    from .core import compile as compile_cell
    parser = argparse.ArgumentParser(prog="cellc-tune --form=chunk")
    parser.add_argument("cell")
    parser.add_argument("-D", dest="sizes", action="append", default=[], metavar="NAME=N")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq-len", type=int, default=100)
    parser.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    parser.add_argument("--budget", default="60s")
    parser.add_argument("--recompute", default="none")
    parser.add_argument("--json")
    parser.add_argument("--no-store", action="store_true")
    parser.add_argument("--form", choices=["chunk"], default="chunk")
    args = parser.parse_args(argv)
    try:
        sizes = {}
        for d in args.sizes:
            name, _, value = d.partition("=")
            if not name or not value.isdigit():
                raise ValueError(f"-D {d}: expected NAME=N")
            sizes[name] = int(value)
        text, scale = args.budget, 1.0
        if text.endswith("m"):
            text, scale = text[:-1], 60.0
        elif text.endswith("s"):
            text = text[:-1]
        try:
            budget = float(text) * scale
        except ValueError:
            budget = float("nan")
        if not budget > 0 or budget == float("inf"):
            raise ValueError(f"--budget '{args.budget}': expected seconds (90, 60s) or "
                             "minutes (2m)")
        if args.batch < 1 or args.seq_len < 1:
            raise ValueError("--batch and --seq-len must be positive")
        cell = compile_cell(args.cell)
        result = tune(cell, sizes, batch=args.batch, seq_len=args.seq_len,
                      dtype=torch.float64 if args.dtype == "f64" else torch.float32,
                      budget=budget, store=not args.no_store, recompute=args.recompute)
    except (ValueError, TypeError, OSError, RuntimeError) as e:
        sys.stderr.write(f"cellc-tune: error: {e}\n")
        return 1
    sys.stdout.write(result["table"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
