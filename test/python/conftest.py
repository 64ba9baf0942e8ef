"""pytest setup: the cellc package from the build tree (or, with
CELLC_INSTALLED=1, the one pip installed, as make test-torch2 runs it), and
kernels cached inside the build tree."""

import os
import sys

BUILD = os.environ.get("CELLC_BUILD_DIR",
                       os.path.join(os.path.dirname(__file__), "..", "..", "build"))
if os.environ.get("CELLC_INSTALLED") == "1":
    # The tools pip installed beside the interpreter.
    TOOLS = os.path.dirname(sys.executable)
else:
    sys.path.insert(0, os.path.join(os.path.abspath(BUILD), "python"))
    TOOLS = os.path.join(os.path.abspath(BUILD), "bin")
os.environ.setdefault("CELLC_CACHE_DIR", os.path.join(os.path.abspath(BUILD), "test",
                                                      "kernel-cache"))
