# cellc: the two commands are `make demo` and `make test`. Each installs what
# it needs from Debian's archive first (scripts/install-deps.sh).

BUILD     ?= build
FUZZ_BUILD ?= build-fuzz
ASAN_BUILD ?= build-asan
JOBS      ?= 2
LLVM      := /usr/lib/llvm-19
LIT       := $(LLVM)/build/utils/lit/lit.py
PYTHON    := /usr/bin/python3
# Paths under the tree are hashed relative to it, so that another copy of the
# tree (test-install) reuses these objects.
export CCACHE_BASEDIR := $(CURDIR)
FUZZ_RUNS ?= 1000000
FUZZ_SMOKE_RUNS ?= 50000

CMAKE_FLAGS := -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMLIR_DIR=$(LLVM)/lib/cmake/mlir \
  -DLLVM_EXTERNAL_LIT=$(LIT) \
  -DPython3_EXECUTABLE=$(PYTHON) \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache

.PHONY: all deps configure build demo test check check-layers lit pytest test-emu test-docs test-install fuzz \
        wheel test-wheel test-wheel-lite \
        fuzz-smoke \
        test-sanitize test-torch2 bench-cpu clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@echo "== cellc examples/lstm.cell -D H=256 -D I=256 --emit=summary"
	@$(BUILD)/bin/cellc examples/lstm.cell -D H=256 -D I=256 --emit=summary
	@echo
	@echo "== cellc examples/lstm.cell -D H=256 -D I=256 --emit=mlir"
	@$(BUILD)/bin/cellc examples/lstm.cell -D H=256 -D I=256 --emit=mlir
	@echo
	@echo "== cellc examples/lstm.cell -D H=256 -D I=256 --emit=plan --seq-len 100 --batch 64"
	@$(BUILD)/bin/cellc examples/lstm.cell -D H=256 -D I=256 --emit=plan --seq-len 100 \
	  --batch 64
	@echo
	@echo "== LSTM forward and backward on the CPU, per recompute mode (medians of 3)"
	@$(BUILD)/bin/cellc-bench examples/lstm.cell -D H=256 -D I=256 --batch-size 64 \
	  --seq-len 100 --repeats 3 --mode none,full,chunk:16

bench-cpu: build
	bench/cpu/run.sh $(BUILD) 5

lit: build
	@rm -f $(BUILD)/lit.xml
	$(PYTHON) $(LIT) -sv --xunit-xml-output=$(BUILD)/lit.xml $(BUILD)/test || true
	@$(PYTHON) scripts/lit-summary.py $(BUILD)/lit.xml

# The files on JOBS workers (pytest-xdist, which install-deps.sh installs),
# each file's tests in order in one; `make pytest JOBS=1`, or a Python without
# xdist, runs them in one process.
PYTEST_WORKERS = $(if $(filter-out 1,$(JOBS)),$(shell $(PYTHON) -c 'import xdist' 2>/dev/null \
  && printf '%s' '-n $(JOBS) --dist loadfile'))

pytest: build
	PYTHONPATH=$(BUILD)/python CELLC_BUILD_DIR=$(BUILD) $(PYTHON) -m pytest -q -rs \
	  $(PYTEST_WORKERS) test/python

# The CUDA kernels in the SIMT emulator, the full matrix: every example cell
# in every strategy and precision, in every recompute mode (make test runs
# a slice of it, in test/python/test_emulator.py).
test-emu: build
	CELLC_EMU_FULL=1 PYTHONPATH=$(BUILD)/python CELLC_BUILD_DIR=$(BUILD) $(PYTHON) -m pytest \
	  -q -rs test/python/test_emulator.py

# The code blocks of README.md and docs/, the long ones too (a tune, a wheel
# pip builds): make test runs the others (test/python/test_docs.py).
test-docs: build
	CELLC_DOCS_LONG=1 PYTHONPATH=$(BUILD)/python CELLC_BUILD_DIR=$(BUILD) $(PYTHON) -m pytest \
	  -q -rs test/python/test_docs.py

# The wheel, built from a clean copy and used from a fresh virtual environment.
test-install: build
	scripts/test-install.sh

# One wheel for every CPython from 3.9 that needs nothing of this machine's
# (scripts/make-wheel.sh): dist/cellc-<version>-py3-none-manylinux_*.whl.
wheel: build
	JOBS=$(JOBS) scripts/make-wheel.sh

# The wheel on a stranger's machine (scripts/test-wheel.sh): LLVM, oneDNN,
# OpenBLAS and the tree hidden in a private mount namespace, torch from PyPI
# (about 4 GB of wheels, downloaded once). `make test` runs its lite part
# (test-wheel-lite): Debian's torch, which needs Debian's OpenBLAS, so that
# OpenBLAS stays visible there and the wheel's libraries are checked not to
# need it. It runs before pytest, whose GPU script test then installs the
# wheel on its "GPU machine" and compiles cells there.
test-wheel: wheel
	scripts/test-wheel.sh full

test-wheel-lite: wheel
	scripts/test-wheel.sh lite

# No include crosses from a lower layer to a higher one (scripts/check-layers.py).
check-layers:
	$(PYTHON) scripts/check-layers.py

test: check-layers lit test-wheel-lite pytest test-install fuzz-smoke
check: test

# The pytest suite, torch.compile and torch.export on a pinned torch 2.x from
# PyPI, with cellc installed by pip into a venv (scripts/test-torch2.sh). Not
# in `make test`: the wheels are about 4 GB (cached after the first run).
test-torch2: build
	scripts/test-torch2.sh

# The lit suite (FileCheck tests and the GoogleTest binaries) with every
# tool and test built with AddressSanitizer and UndefinedBehaviorSanitizer,
# in its own tree. Not in `make test`: the instrumented build alone takes
# about as long as the rest of CI. Leaks inside LLVM's and MLIR's own
# libraries (not instrumented, never freed at exit) are suppressed by
# scripts/lsan.supp. allow_user_poisoning=0: Debian's libMLIR is not
# instrumented, so the slabs that our inline copy of BumpPtrAllocator poisons
# are never unpoisoned by libMLIR's copy (every attribute it uniques there
# would read as use-after-poison).
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -fno-omit-frame-pointer
$(ASAN_BUILD)/build.ninja:
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="$(SANITIZE)" -DCMAKE_C_FLAGS="$(SANITIZE)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(SANITIZE)" -DCMAKE_SHARED_LINKER_FLAGS="$(SANITIZE)"

test-sanitize: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target cellc cellc-opt cellc-bench \
	  cellc-tune CellUnitTests
	@rm -f $(ASAN_BUILD)/lit.xml
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allow_user_poisoning=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 \
	  $(PYTHON) $(LIT) -sv --xunit-xml-output=$(ASAN_BUILD)/lit.xml $(ASAN_BUILD)/test || true
	@$(PYTHON) scripts/lit-summary.py $(ASAN_BUILD)/lit.xml

# The libFuzzer target, built with clang-19 in its own tree.
$(FUZZ_BUILD)/build.ninja:
	CC=clang-19 CXX=clang++-19 cmake -S . -B $(FUZZ_BUILD) $(CMAKE_FLAGS) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCELLC_ENABLE_FUZZER=ON

$(FUZZ_BUILD)/bin/cellc-fuzz-frontend: deps $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target cellc-fuzz-frontend

# A bounded fuzz run that is part of `make test`.
fuzz-smoke: $(FUZZ_BUILD)/bin/cellc-fuzz-frontend
	@scripts/fuzz.sh $(FUZZ_BUILD)/bin/cellc-fuzz-frontend $(FUZZ_SMOKE_RUNS)

# The long run: a million inputs by default (FUZZ_RUNS=...).
fuzz: $(FUZZ_BUILD)/bin/cellc-fuzz-frontend
	@scripts/fuzz.sh $(FUZZ_BUILD)/bin/cellc-fuzz-frontend $(FUZZ_RUNS)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(ASAN_BUILD)
