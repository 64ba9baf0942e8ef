# lit configuration that runs the GoogleTest binaries as part of check-cellc.

import os

import lit.formats

config.name = "CELLC-Unit"
config.suffixes = []
config.test_exec_root = os.path.join(config.cellc_obj_root, "test", "Unit")
config.test_source_root = config.test_exec_root
config.test_format = lit.formats.GoogleTest(".", "Tests")

# The runtime tests compile kernels: keep their cache inside the build tree.
config.environment["CELLC_CACHE_DIR"] = os.path.join(config.test_exec_root, "kernel-cache")
