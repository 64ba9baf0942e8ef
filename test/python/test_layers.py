"""scripts/check-layers.py: no include crosses from a lower layer to a higher
one, and the runtime includes nothing of LLVM or MLIR."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "check-layers.py")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def run(root):
    done = subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True)
    return done.returncode, done.stdout


def write(root, path, text):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)


def test_the_tree_keeps_its_layers():
    code, out = run(ROOT)
    assert code == 0, out


def test_a_crossing_fails(tmp_path):
    write(tmp_path, "runtime/driver/Driver.cpp", '#include "dialects/Cell/IR/KernelInterface.h"\n')
    write(tmp_path, "jit/CpuJit.cpp", '#include "runtime/cpu/CpuCell.h"\n'
          '#include "compiler/Pipelines/Pipelines.h"\n#include "llvm/Support/Error.h"\n')
    assert run(tmp_path)[0] == 0
    # The runtime including the compiler, or LLVM: each named, with its line.
    write(tmp_path, "runtime/driver/Driver.cpp",
          '#include "dialects/Cell/IR/KernelInterface.h"\n'
          '#include "compiler/Frontend/AST.h"\n#include "llvm/Support/Error.h"\n')
    code, out = run(tmp_path)
    assert code == 1
    assert "runtime/driver/Driver.cpp:2: the runtime includes compiler/Frontend/AST.h" in out
    assert "runtime/driver/Driver.cpp:3: the runtime includes llvm/Support/Error.h" in out
    # The CPU runtime including MLIR, or the JIT above it.
    write(tmp_path, "runtime/cpu/CpuCell.cpp", '#include "mlir/IR/BuiltinOps.h"\n'
          '#include "jit/KernelCache.h"\n')
    code, out = run(tmp_path)
    assert "runtime/cpu/CpuCell.cpp:1: the runtime includes mlir/IR/BuiltinOps.h" in out
    assert "runtime/cpu/CpuCell.cpp:2" in out
    # The dialect including the compiler.
    write(tmp_path, "dialects/Cell/IR/CellOps.cpp", '#include "compiler/Pipelines/Pipelines.h"\n')
    code, out = run(tmp_path)
    assert "dialects/Cell/IR/CellOps.cpp:1: dialects/Cell/IR/CellOps.cpp (dialect) includes " \
           "compiler/Pipelines/Pipelines.h (compiler), a higher layer" in out
    # The compiler including the runtime (the crossing the tree had) or the JIT.
    write(tmp_path, "compiler/Pipelines/Pipelines.h", '#include "runtime/driver/SequenceDriver.h"\n')
    write(tmp_path, "compiler/Conversion/X.cpp", '#include "jit/CpuJit.h"\n')
    out = run(tmp_path)[1]
    assert "compiler/Pipelines/Pipelines.h:1: compiler/Pipelines/Pipelines.h (compiler) " \
           "includes runtime/driver/SequenceDriver.h (runtime), a higher layer" in out
    assert "compiler/Conversion/X.cpp:1" in out


def test_a_target_links_exactly_what_it_includes(tmp_path):
    write(tmp_path, "compiler/Frontend/CMakeLists.txt",
          "add_library(CellFrontend IRGen.cpp)\ntarget_link_libraries(CellFrontend PUBLIC CellDialect)\n")
    write(tmp_path, "compiler/Frontend/IRGen.cpp", '#include "dialects/Cell/IR/CellOps.h"\n')
    assert run(tmp_path)[0] == 0
    # An include of a library it does not link, and a link it does not use.
    write(tmp_path, "compiler/Frontend/IRGen.cpp", '#include "compiler/Conversion/Passes.h"\n')
    code, out = run(tmp_path)
    assert code == 1
    assert "CellFrontend includes CellConversion's headers but does not link CellConversion" in out
    assert "CellFrontend links CellDialect but includes none of its headers" in out
