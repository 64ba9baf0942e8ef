"""Starts cellc's command-line tools from an installed package.

`pip install .` puts the tools in `cellc/bin/` and these functions on the
PATH as `cellc`, `cellc-opt` and `cellc-tune`; `python3 -m cellc TOOL ...`
starts them too. In a build tree (`PYTHONPATH=build/python`) the tools are in
`build/bin/`.
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
        sys.stderr.write("cellc: the '%s' executable is not installed beside "
                         "the package (%s)\n"
                         % (name, os.path.dirname(os.path.abspath(__file__))))
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name] + list(args))


def cellc():
    return run("cellc", sys.argv[1:])


def cellc_opt():
    return run("cellc-opt", sys.argv[1:])


def cellc_tune():
    return run("cellc-tune", sys.argv[1:])
