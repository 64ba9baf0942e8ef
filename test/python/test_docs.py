"""The code blocks of README.md and docs/*.md, run as written, as doctests
are: the docs cannot drift from the code.

A block's fence says what it is, its first word the language and the words
after it when it runs (docs/testing.md, "The docs' code blocks"):

- `python`: run, the blocks of one file in order in one namespace, in a
  scratch directory where `examples/` is the tree's.
- `sh`: run by `bash -e` there, with the tools on PATH. A `make TARGET` line
  is checked with `make -n TARGET` in the tree (the block that runs this
  test cannot run it again).
- `cell`: compiled by `cellc.compile`.
- `c++`: compiled against the tree's headers (`-fsyntax-only`).
- `text`: output or a drawing, not run.

and the flags: `gpu` (skipped without a CUDA device), `torch2` (skipped on
a torch older than 2.4: `make test-torch2` runs them), `long` (over half a
minute: run by `make test-docs`, with CELLC_DOCS_LONG=1), `tree` (a `sh`
block run in the tree's root, not the scratch directory). Whatever a block
tunes or caches goes to a scratch CELLC_CACHE_DIR when it is long.
"""

import os
import re
import subprocess

import pytest
import torch

from conftest import BUILD, TOOLS

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
LANGUAGES = {"python", "sh", "cell", "c++", "text"}
FLAGS = {"gpu", "torch2", "long", "tree"}
LONG = os.environ.get("CELLC_DOCS_LONG") == "1"
TORCH2 = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 4)


def blocks(path):
    """Each fenced block of `path`: (line of its fence, language, flags, text)."""
    found, fence, lines = [], None, []
    with open(os.path.join(ROOT, path)) as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                if fence is None:
                    words = line[3:].split()
                    fence = (number, words[0] if words else "", set(words[1:]))
                    lines = []
                else:
                    found.append((*fence, "".join(lines)))
                    fence = None
            elif fence is not None:
                lines.append(line)
    assert fence is None, f"{path}:{fence[0]}: a fence that is not closed"
    return found


ALL = [(path, *block) for path in FILES for block in blocks(path)]


def test_every_block_says_what_it_is():
    for path, line, language, flags, _ in ALL:
        assert language in LANGUAGES, (
            f"{path}:{line}: a fence names its language, one of {sorted(LANGUAGES)}, "
            f"not {language!r}")
        assert flags <= FLAGS, f"{path}:{line}: unknown flags {sorted(flags - FLAGS)}"


def test_the_harness_sees_the_blocks_it_runs():
    # The README's cell, its Python and its two commands; every kind of block.
    readme = [language for path, _, language, _, _ in ALL if path == "README.md"]
    assert readme == ["sh", "cell", "python"]
    assert {language for _, _, language, _, _ in ALL} == LANGUAGES


def not_runnable(flags):
    """Why a block with `flags` does not run here, or None."""
    if "gpu" in flags and not torch.cuda.is_available():
        return "needs a CUDA device"
    if "torch2" in flags and not TORCH2:
        return f"needs torch >= 2.4 (make test-torch2), not {torch.__version__}"
    if "long" in flags and not LONG:
        return "long: make test-docs runs it"
    return None


def tools_env(scratch):
    env = dict(os.environ)
    env["PATH"] = TOOLS + os.pathsep + env["PATH"]
    if os.environ.get("CELLC_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(BUILD, "python"),
                                                         env.get("PYTHONPATH")) if p)
    env["HOME"] = str(scratch)  # what a block puts in ~ stays in the scratch directory
    env["CELLC_CACHE_DIR"] = str(scratch / "cache")  # and what it tunes
    return env


def run_sh(where, flags, text, scratch):
    env = tools_env(scratch)
    makes = [m.group(1) for m in re.finditer(r"^make (\S+)", text, re.M)]
    if makes and "tree" not in flags:
        # The block that runs this suite (make demo, make test): each target
        # exists and its recipe expands. Nothing else is in it.
        others = [l for l in text.splitlines()
                  if l.strip() and not l.startswith("make ") and not l.lstrip().startswith("#")]
        assert not others, f"{where}: a block of make lines has other commands: {others}"
        for target in makes:
            done = subprocess.run(["make", "-n", target], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            assert done.returncode == 0, f"{where}: make -n {target}: {done.stderr}"
        return
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text],
                          cwd=ROOT if "tree" in flags else scratch, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (f"{where}: exit {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def run_cpp(where, text, scratch):
    source = scratch / "block.cpp"
    source.write_text(text)
    command = ["c++", "-std=c++17", "-fsyntax-only", f"-I{ROOT}", f"-I{BUILD}",
               "-I/usr/lib/llvm-19/include", str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, f"{where}:\n{done.stderr[-4000:]}"


RUN_FILES = sorted({path for path, _, language, _, _ in ALL if language != "text"})


@pytest.mark.parametrize("path", RUN_FILES)
def test_the_blocks_run_in_order(path, tmp_path, monkeypatch):
    """A file's blocks in order, as a reader runs them: in a scratch
    directory where examples/ is the tree's, the Python blocks in one
    namespace."""
    scratch = tmp_path
    os.symlink(os.path.join(ROOT, "examples"), scratch / "examples")
    monkeypatch.chdir(scratch)
    namespace = {"__name__": "__docs__"}
    ran, skipped = 0, []
    for line, language, flags, text in blocks(path):
        where = f"{path}:{line}"
        if language == "text":
            continue
        why = not_runnable(flags)
        if why:
            skipped.append(f"{where} ({why})")
            continue
        torch.manual_seed(0)
        if language == "python":
            if "long" in flags:
                monkeypatch.setenv("CELLC_CACHE_DIR", str(scratch / "cache"))
            # A failure's traceback names the doc's file and line.
            exec(compile("\n" * line + text, os.path.join(ROOT, path), "exec"), namespace)
        elif language == "sh":
            run_sh(where, flags, text, scratch)
        elif language == "cell":
            import cellc
            cell = cellc.compile(text)
            assert cell.params and cell.states, where
        elif language == "c++":
            run_cpp(where, text, scratch)
        ran += 1
    if skipped:
        print("skipped: " + ", ".join(skipped))
    if ran == 0:
        pytest.skip("every block here needs what this machine lacks: " + ", ".join(skipped))


def test_the_names_the_docs_give_exist():
    # Every `cellc.a.b` the docs name, in their text and blocks, is there.
    import cellc
    import cellc.cuda  # noqa: F401
    import cellc.nn  # noqa: F401
    missing = []
    for path in FILES:
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        for match in sorted(set(re.findall(r"(?<![\w/.-])cellc(?:\.[A-Za-z_]\w*)+", text))):
            obj = cellc
            for part in match.split(".")[1:]:
                if not hasattr(obj, part):
                    missing.append(f"{path}: {match}")
                    break
                obj = getattr(obj, part)
    assert not missing, "names the docs give that do not exist:\n" + "\n".join(missing)
