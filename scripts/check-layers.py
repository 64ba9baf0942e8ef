#!/usr/bin/env python3
"""The layers of cellc's sources, checked: a file may include only files of
its own layer or of lower ones, and the runtime (the driver, the CPU and
the CUDA runtimes) includes nothing of LLVM or MLIR. From the bottom:

  words     dialects/Cell/IR/KernelInterface.{h,def}, Knobs.{h,def}, EmulatorHooks.def,
            Checked.h: plain C++
  dialect   dialects/
  compiler  compiler/Frontend, Conversion, Pipelines
  runtime   runtime/driver, runtime/cpu, runtime/cuda, runtime/emu: no LLVM, no MLIR,
            nothing of the dialect or the compiler (the words only)
  jit       jit/: compile to a CPU package, the kernel and tuning caches
  tuner     tuner/
  tools     tools/, bench, test

And each CMake target links, directly, exactly the project libraries whose
headers its files include (OWNERS says which library a file is in).

A crossing that must stay a while is listed in KNOWN, with why it is there;
a crossing not listed fails, and so does a listed one that is gone (so that
the list only shrinks). It is empty. Usage: check-layers.py [ROOT]. Exit 1 on a
failure, with each one on a line."""

import os
import re
import sys

LAYERS = ["words", "dialect", "compiler", "runtime", "jit", "tuner", "tools"]

# (including file's directory or file, included path prefix): why.
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# The library each source directory (or file) is built into; the words are
# header-only.
OWNERS = [
    ("dialects/Cell/IR/KernelInterface.", None), ("dialects/Cell/IR/EmulatorHooks.", None),
    ("dialects/Cell/IR/Checked.", None), ("dialects/Cell/IR/Knobs.", None),
    ("dialects/Cell/IR/", "CellDialect"), ("dialects/Cell/Transforms/", "CellTransforms"),
    ("compiler/Frontend/", "CellFrontend"), ("compiler/Conversion/", "CellConversion"),
    ("compiler/Pipelines/", "CellPipelines"), ("tuner/", "CellTuner"),
    ("jit/", "CellJit"),
    ("runtime/driver/", "cellc_runtime"), ("runtime/cpu/", "cellc_runtime"),
    ("runtime/cuda/", "cellc_runtime"), ("runtime/emu/", "cellc_runtime"),
]
TARGET = re.compile(r"(?:add_library|add_executable|add_llvm_executable)"
                    r"\s*\(([^)]*)\)")
LINK = re.compile(r"target_link_libraries\s*\(([^)]*)\)")


def owner(path):
    return next((lib for prefix, lib in OWNERS if path.startswith(prefix)), None)


def includes(full):
    if not os.path.exists(full):
        return []
    with open(full, errors="replace") as f:
        return [m.group(1) for m in map(INCLUDE.match, f) if m]


def check_links(root):
    """Each target's direct links against the libraries its files include."""
    libraries = {lib for _, lib in OWNERS if lib}
    targets = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("build", ".")) and d not in ("test", "bench")]
        if "CMakeLists.txt" not in files:
            continue
        rel = os.path.relpath(dirpath, root)
        with open(os.path.join(dirpath, "CMakeLists.txt")) as f:
            text = re.sub(r"#.*", "", f.read())
        for body in TARGET.findall(text):
            name, *words = body.split()
            sources = {os.path.normpath(os.path.join(rel, w.replace("${CELLC_ROOT}/",
                                                                     os.path.relpath(".", rel) + "/")))
                       for w in words if w.endswith(".cpp")}
            targets.setdefault(name, [set(), set()])[0].update(sources)
        for body in LINK.findall(text):
            name, *words = body.split()
            targets.setdefault(name, [set(), set()])[1].update(w for w in words if w in libraries)
    failures = []
    for name, (sources, links) in sorted(targets.items()):
        files = set(sources)
        for d in {os.path.dirname(s) for s in sources}:  # its own headers
            for h in os.listdir(os.path.join(root, d)) if os.path.isdir(os.path.join(root, d)) else []:
                if h.endswith(".h") and owner(os.path.join(d, h)) == name:
                    files.add(os.path.join(d, h))
        used = {owner(i) for f in files for i in includes(os.path.join(root, f))}
        used -= {None, name}
        failures += [f"CMake: {name} includes {lib}'s headers but does not link {lib}"
                     for lib in sorted(used - links)]
        failures += [f"CMake: {name} links {lib} but includes none of its headers"
                     for lib in sorted(links - used)]
    return failures
SOURCES = (".h", ".cpp", ".def", ".inc")


def layer_of(path):
    """The layer of a repository path (None: not a cellc source)."""
    if path.startswith(("dialects/Cell/IR/KernelInterface.", "dialects/Cell/IR/EmulatorHooks.",
                        "dialects/Cell/IR/Checked.", "dialects/Cell/IR/Knobs.")):
        return "words"
    if path.startswith("dialects/"):
        return "dialect"
    if path.startswith(("compiler/Frontend/", "compiler/Conversion/", "compiler/Pipelines/")):
        return "compiler"
    if path.startswith("runtime/"):
        return "runtime"
    if path.startswith("jit/"):
        return "jit"
    if path.startswith("tuner/"):
        return "tuner"
    if path.startswith(("tools/", "bench/", "test/")):
        return "tools"
    return None


def check(root):
    failures, seen = [], set()
    for top in ("dialects", "compiler", "runtime", "jit", "tuner", "tools",
                "bench", "test"):
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
    failures = check(os.path.abspath(root)) + check_links(os.path.abspath(root))
    for f in failures:
        print(f)
    if failures:
        return 1
    print(f"layers: {' < '.join(LAYERS)}; no crossing beyond the {len(KNOWN)} known; "
          "every CMake target links what it includes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
