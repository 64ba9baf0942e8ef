"""Starts cellc's command-line tools from an installed package.

`pip install .` puts the tools in `cellc/bin/` and these functions on the
PATH as `cellc`, `cellc-opt` and `cellc-tune`; `python3 -m cellc TOOL ...`
starts them too. In a build tree (`PYTHONPATH=build/python`) the tools are in
`build/bin/`. The wheel has no executables: each tool is a function of the
compiler library (cellc_tool_*, tools/CompilerC.h's library), run in this
process, which it ends.
"""

import os
import sys

TOOLS = ("cellc", "cellc-opt", "cellc-tune")


def tool_path(name):
    """The executable of tool `name`, or None when it is not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "bin", name),
                 os.path.join(here, "..", "..", "bin", name)):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    return None


#: Each tool's function in libcellc_compiler.so.
_ENTRIES = {"cellc": "cellc_tool_cellc", "cellc-opt": "cellc_tool_opt",
            "cellc-tune": "cellc_tool_tune"}


def command(name):
    """The command line that starts tool `name`: its executable, or this
    Python running it from the library, with this package first on the path
    (`python -m` would put the working directory there)."""
    path = tool_path(name)
    if path:
        return [path]
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from cellc._tools import run; sys.exit(run(sys.argv[1], sys.argv[2:]))",
            parent, name]


def run_in_process(name, args):
    """Runs tool `name` on `args` in this process, through the compiler
    library, and exits with its code. LLVM's parser ends the process itself
    on --help, --version and a bad option, and the tool's output goes to
    the file descriptors, after what Python has buffered."""
    import ctypes
    import signal
    from . import _cellc
    # Ctrl-C ends the tool: LLVM's handler re-raises the signal to the one
    # before it, which must not be Python's (a flag the tool never reads).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [os.fsencode(a) for a in [name] + list(args)]
    array = (ctypes.c_char_p * (len(argv) + 1))(*argv, None)
    entry = getattr(_cellc._LIB, _ENTRIES[name])
    entry.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    entry.restype = ctypes.c_int
    code = entry(len(argv), array)
    # LLVM's stdout is flushed when the process exits (its static's
    # destructor); os._exit would skip that.
    sys.exit(code)


def run(name, args):
    """Replaces this process with tool `name` run on `args`."""
    if name not in TOOLS:
        sys.stderr.write("cellc: unknown tool '%s'; expected one of %s\n"
                         % (name, ", ".join(TOOLS)))
        return 2
    if name == "cellc-tune" and ("--form=chunk" in args or "--form" in args and
                                 args[args.index("--form") + 1:][:1] == ["chunk"]):
        # The chunk form runs in Python, which tunes its length.
        from . import _chunktune
        return _chunktune.main([a for i, a in enumerate(args)
                                if a != "--form=chunk" and a != "--form" and
                                not (i and args[i - 1] == "--form")])
    path = tool_path(name)
    if path is None:
        return run_in_process(name, args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name] + list(args))


def cellc():
    return run("cellc", sys.argv[1:])


def cellc_opt():
    return run("cellc-opt", sys.argv[1:])


def cellc_tune():
    return run("cellc-tune", sys.argv[1:])
