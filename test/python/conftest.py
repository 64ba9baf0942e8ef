"""pytest setup: the cellc package from the build tree, and kernels cached
inside it."""

import os
import sys

BUILD = os.environ.get("CELLC_BUILD_DIR",
                       os.path.join(os.path.dirname(__file__), "..", "..", "build"))
sys.path.insert(0, os.path.join(os.path.abspath(BUILD), "python"))
os.environ.setdefault("CELLC_CACHE_DIR", os.path.join(os.path.abspath(BUILD), "test",
                                                      "kernel-cache"))
