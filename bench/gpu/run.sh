#!/usr/bin/env bash
# The GPU run, in one call through the device tool, and the same run in the
# SIMT emulator (make test), so that it cannot rot unseen.
#
#   bench/gpu/run.sh package [--emulate] [DIR]  here (the compiler): every
#        example cell's CUDA packages and float64 references, and the
#        benchmark's packages, into DIR (bench/gpu/packages)
#   bench/gpu/run.sh wheels                     here (the network): the peers'
#        wheels for Python 3.12 into .whl/ (torchrl, FlashRNN, fla)
#   bench/gpu/run.sh run [--emulate] [DIR]      there (a CUDA driver, torch,
#        CMake and a C++ compiler; no LLVM, no OpenBLAS, no network): build
#        the runtime, check every package, then the benchmark table
#
# Through the device tool: carry bench/gpu/packages and .whl (and dist, the
# wheel of make wheel with scipy-openblas32's, to compile cells there: 39 MB,
# so that with the packages' 43 MB and the peers' 5 MB a run carries one of
# the two), and run
#   bench/gpu/run.sh run
# Each phase has its own time limit, so that a hung kernel costs one phase;
# the log is written as it comes, into $OUT when the device tool sets it.
# $CELLC_PYTHON: the Python that writes the packages (and checks them in the
# emulator); /usr/bin/python3 by default.
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-run}
shift || true
emulate=""
if [ "${1:-}" = "--emulate" ]; then
  emulate="--emulate"
  shift
fi
dir=${1:-bench/gpu/packages}
case "$what" in
package)
  rm -rf "$dir"
  PYTHONPATH=${PYTHONPATH:-build/python} ${CELLC_PYTHON:-/usr/bin/python3} \
    bench/gpu/prepare.py "$dir" $emulate
  du -sh "$dir"
  ;;
wheels)
  mkdir -p .whl
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >>"$exclude"
  for w in torchrl==0.14.1 "tensordict==0.14.3" pyvers hoptorch importlib_metadata zipp \
      orjson flashrnn==1.0.8 fla-core==0.6.0 einops; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$w" || python3 -m pip download -q --no-deps \
      --only-binary=:all: --python-version 3.12 -d .whl "$w"
  done
  ls -la .whl
  ;;
run)
  log=${OUT:-/tmp}/gpu-run${emulate:+-emulated}.log
  : >"$log"
  say() { echo "$@" | tee -a "$log"; }
  python=python3
  if [ -n "$emulate" ]; then
    python=${CELLC_PYTHON:-/usr/bin/python3}
  elif ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  build=${CELLC_GPU_BUILD:-build-gpu${emulate:+-emulated}}
  if [ -n "${CELLC_RUNTIME_LIB:-}" ]; then
    # A runtime built elsewhere (carried), rather than one built here; a
    # relative path is from the repository's root.
    lib=$CELLC_RUNTIME_LIB
    say "== the runtime: $lib (given)"
    if [ ! -f "$lib" ]; then
      say "FAIL: CELLC_RUNTIME_LIB=$lib: no such file"; exit 1
    fi
  else
    say "== the runtime, without OpenBLAS (cmake -S runtime -DCELLC_RUNTIME_CPU=OFF)"
    start=$(date +%s)
    # Each phase has a limit: a hung kernel costs one phase (in the check,
    # one package). The four after the build add to 525 s; the build and
    # ptxas took 12 s on an H200, against limits of 150: call the run with
    # timeout_s 580.
    timeout 30 cmake -S runtime -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DCELLC_RUNTIME_CPU=OFF >>"$log" 2>&1
    timeout 60 cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1
    say "   built in $(( $(date +%s) - start )) s"
    lib=$build/lib/libcellc_runtime.so
  fi
  if ldd "$lib" | grep -Eq 'openblas|gomp|blas'; then
    say "FAIL: $lib links a BLAS or OpenMP:"; ldd "$lib" | tee -a "$log"; exit 1
  fi
  case "$lib" in /*) ;; *) lib=$PWD/$lib ;; esac
  export CELLC_CUDA_LIB=$lib PYTHONUNBUFFERED=1
  command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
  # Every package's PTX assembled for this GPU, all cores at once: the
  # runtime loads a cubin beside its PTX (<variant>.ptx.cubin) where there is
  # one, rather than have the driver compile each package's PTX in turn.
  ptxas=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
  if [ -z "$emulate" ] && [ -x "$ptxas" ] &&
      cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) &&
      [ -n "$cap" ]; then
    arch=sm_${cap/./}
    say "== $ptxas -arch=$arch on every package's PTX, $(nproc) at a time"
    start=$(date +%s)
    find "$dir" -name '*.ptx' -print0 | timeout 60 xargs -0 -P "$(nproc)" -I{} \
      "$ptxas" -arch="$arch" {} -o {}.cubin >>"$log" 2>&1 ||
      say "   not all assembled: the driver compiles the PTX of the others"
    say "   $(find "$dir" -name '*.cubin' | wc -l) cubins in $(( $(date +%s) - start )) s"
  fi
  status=0
  # The compiler from the wheel (make wheel), where one is carried (dist/,
  # with the scipy-openblas32 wheel beside it): installed here, offline,
  # it compiles any cell at any size on this machine, and writes the check's
  # packages where none were carried (the packages and the wheel do not both
  # fit in what travels).
  wheel=$(ls dist/cellc-*.whl 2>/dev/null | head -1 || true)
  # CELLC_NO_WHEEL=1: the carried packages alone, a wheel in dist/ or not.
  [ "${CELLC_NO_WHEEL:-0}" = 1 ] && wheel=
  if [ -n "$wheel" ]; then
    say "== the compiler from the wheel: $wheel, installed here"
    site=/tmp/cellc-site${emulate:+-emulated}
    rm -rf "$site"
    if timeout 60 $python -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        "$wheel" dist/scipy_openblas32-*.whl >>"$log" 2>&1; then
      if ! ls "$dir"/*/kernels.json >/dev/null 2>&1; then
        # No packages carried: this machine writes them, with the wheel.
        say "== no packages in $dir: prepared here by the wheel's compiler"
        start=$(date +%s)
        PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} timeout "${CELLC_PREPARE_SECONDS:-180}" \
          $python bench/gpu/prepare.py "$dir" $emulate >>"$log" 2>&1 || status=1
        say "   $(ls "$dir" | wc -l) packages in $(( $(date +%s) - start )) s"
      fi
      say "== cells compiled here, at sizes no package has, against float64 on the CPU"
      # The wheel's cellc with its own runtime, not the one built above.
      (unset CELLC_CUDA_LIB; PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} \
        timeout "${CELLC_COMPILE_SECONDS:-120}" $python bench/gpu/compile_here.py $emulate) \
        2>&1 | tee -a "$log" || status=1
    else
      say "FAIL: the wheel did not install (pip's output above)"; status=1
    fi
  else
    say "== no wheel carried (dist/cellc-*.whl): the prepared packages alone"
  fi
  say "== check: every package against its float64 reference"
  # A call that hangs ends its process (exit 3, "HUNG at N"): the check goes
  # on from the next package while the phase's time lasts.
  deadline=$(( $(date +%s) + ${CELLC_CHECK_SECONDS:-150} ))
  from=0
  while :; do
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 10 ]; then
      say "   the check's time ran out"; status=1; break
    fi
    rc=0
    timeout "$left" $python test/gpu/check_cells.py check "$dir" $emulate --from=$from \
      2>&1 | tee -a "$log" || rc=$?
    if [ "$rc" = 3 ] && hung=$(grep -o '^HUNG at [0-9]*' "$log" | tail -1) && [ -n "$hung" ]; then
      status=1; from=$(( ${hung##* } + 1 )); continue
    fi
    [ "$rc" = 0 ] || status=1
    break
  done
  say "== the chunk form's core on its CUDA kernels (ChunkKernels.cu), then timed"
  timeout "${CELLC_CHUNK_SECONDS:-150}" $python test/gpu/chunk_core.py $emulate \
    2>&1 | tee -a "$log" || status=1
  say "== bench"
  timeout "${CELLC_BENCH_SECONDS:-180}" $python test/gpu/check_cells.py bench "$dir" $emulate \
    2>&1 | tee -a "$log" || status=1
  # Last, as it is slow: the chunk kernels at the small shape under
  # compute-sanitizer's memcheck (out-of-bounds and misaligned accesses,
  # which the emulator's bounds do not see in the driver's allocations).
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -z "$emulate" ] && [ -x "$sanitizer" ] && [ "${CELLC_SANITIZER:-1}" != 0 ]; then
    say "== compute-sanitizer memcheck: the chunk kernels at a small shape"
    timeout "${CELLC_SANITIZER_SECONDS:-45}" "$sanitizer" --tool memcheck --error-exitcode 3 \
      $python test/gpu/chunk_core.py --small 2>&1 | tail -40 | tee -a "$log" || status=1
  fi
  exit $status
  ;;
*) echo "usage: $0 package|wheels|run [--emulate] [DIR]" >&2; exit 2 ;;
esac
