# lit configuration for cellc: FileCheck tests on every stage, and the
# GoogleTest binaries, in one run.

import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "CELLC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".cell"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.cellc_obj_root, "test")
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Fuzz"]

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%examples", os.path.join(config.cellc_src_root, "examples")))

# Kernels compiled by the tests are cached inside the build tree.
config.environment["CELLC_CACHE_DIR"] = os.path.join(config.cellc_obj_root, "test", "kernel-cache")

# As upstream MLIR does: captured variables do not leak across CHECK-LABELs,
# and every check prefix a RUN line names must be used.
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

tool_dirs = [config.cellc_tools_dir, config.llvm_tools_dir]
tools = ["cellc", "cellc-opt", "cellc-bench", "cellc-tune", "FileCheck", "not", "count"]
llvm_config.add_tool_substitutions(tools, tool_dirs)

# The CUDA toolkit's assembler checks the generated PTX where it is installed.
ptxas = os.environ.get("CELLC_PTXAS", "/usr/local/cuda/bin/ptxas")
if os.access(ptxas, os.X_OK):
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", ptxas))
elif os.environ.get("CELLC_REQUIRE_PTXAS") == "1":
    lit_config.fatal(f"CELLC_REQUIRE_PTXAS=1, but there is no ptxas at {ptxas} "
                     "(set CELLC_PTXAS)")
else:
    # Said, not quiet: the tests that assemble PTX will be UNSUPPORTED.
    lit_config.warning(f"no ptxas at {ptxas} (CELLC_PTXAS): the tests that assemble the "
                       "generated PTX are UNSUPPORTED; CELLC_REQUIRE_PTXAS=1 makes this "
                       "an error")
