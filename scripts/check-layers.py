#!/usr/bin/env python3
"""The layers of cellc's sources, checked: a file may include only files of
its own layer or of lower ones, and the runtime (the driver and the CUDA
runtime) includes nothing of LLVM or MLIR. From the bottom:

  words     dialects/Cell/IR/KernelInterface.{h,def}: plain C++
  dialect   dialects/
  compiler  compiler/Frontend, Conversion, Pipelines
  runtime   runtime/driver, runtime/cuda: no LLVM, no MLIR, nothing of the
            dialect or the compiler (the words only)
  jit       runtime/*.{h,cpp}: the JIT, its caches and the CPU backend
  tuner     compiler/Tuner
  tools     compiler/tools, python/src, bench, test

Known crossings that issue 25 removes are listed in KNOWN, each with why it
is there; a crossing not listed fails, and so does a listed one that is gone
(so that the list only shrinks). Usage: check-layers.py [ROOT]. Exit 1 on a
failure, with each one on a line."""

import os
import re
import sys

LAYERS = ["words", "dialect", "compiler", "runtime", "jit", "tuner", "tools"]

# (including file's directory or file, included path prefix): why.
KNOWN = {
    ("compiler/Pipelines/Pipelines.h", "runtime/driver/"):
        "declares readKernels and printMemoryPlan (DriverInterface.cpp), which build the "
        "driver's Interface and run its plan for --emit=plan; they move above the "
        "runtime with the JIT (issue 25)",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cpp", ".def", ".inc")


def layer_of(path):
    """The layer of a repository path (None: not a cellc source)."""
    if path.startswith("dialects/Cell/IR/KernelInterface."):
        return "words"
    if path.startswith("dialects/"):
        return "dialect"
    if path.startswith(("compiler/Frontend/", "compiler/Conversion/", "compiler/Pipelines/")):
        return "compiler"
    if path.startswith(("runtime/driver/", "runtime/cuda/")):
        return "runtime"
    if path.startswith("runtime/"):
        return "jit"
    if path.startswith("compiler/Tuner/"):
        return "tuner"
    if path.startswith(("compiler/tools/", "python/src/", "bench/", "test/")):
        return "tools"
    return None


def check(root):
    failures, seen = [], set()
    for top in ("dialects", "compiler", "runtime", "python/src", "bench", "test"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                path = os.path.relpath(full, root)
                mine = layer_of(path)
                if mine is None:
                    continue
                with open(full, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        included = m.group(1)
                        where = f"{path}:{number}"
                        theirs = layer_of(included)
                        if mine == "runtime" and (included.startswith(("llvm/", "mlir/"))
                                                  or theirs in ("dialect", "compiler")):
                            failures.append(f"{where}: the runtime includes {included}; it "
                                            "runs without LLVM, MLIR and the compiler")
                            continue
                        if theirs is None or LAYERS.index(theirs) <= LAYERS.index(mine):
                            continue
                        key = next((k for k in KNOWN if path.startswith(k[0])
                                    and included.startswith(k[1])), None)
                        if key:
                            seen.add(key)
                            continue
                        failures.append(f"{where}: {path} ({mine}) includes {included} "
                                        f"({theirs}), a higher layer")
    for key in KNOWN:
        if key not in seen:
            failures.append(f"scripts/check-layers.py: the known crossing {key[0]} -> "
                            f"{key[1]} is gone: take it off KNOWN")
    return failures


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    failures = check(os.path.abspath(root))
    for f in failures:
        print(f)
    if failures:
        return 1
    print(f"layers: {' < '.join(LAYERS)}; no crossing beyond the {len(KNOWN)} known")
    return 0


if __name__ == "__main__":
    sys.exit(main())
