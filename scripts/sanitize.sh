#!/usr/bin/env bash
# Builds Kiln a second time, into build-asan/, with AddressSanitizer and UndefinedBehaviorSanitizer
# on all of its C++ (g++: -fsanitize=address,undefined, UB fatal), and runs the CPU CTest suite
# there (`ctest -LE gpu`, the same selection as scripts/test.sh). Fails on any test failure or
# sanitizer report.
#
# Usage: scripts/sanitize.sh            (runs scripts/setup.sh first and reuses its .venv)
#
# What is and is not covered, and why:
# - Every .cpp of the project and its tests is instrumented, including the blob reader, the
#   engine's host code in .cpp files, the backend, the device-copy kernels and the runner's option
#   parsing. Tests that load libkiln_executorch_backend.so with dlopen run it instrumented too:
#   the test executable links the ASan runtime, so it is loaded first.
# - The .cu files are compiled by nvcc without sanitizers (nvcc does not pass -fsanitize through
#   its host-compiler pass reliably), and their tests need a GPU (label `gpu`, excluded here as in
#   CI); compute-sanitizer covers them on the GPU machine.
# - The Python tests (pytest) do not run here: they load the instrumented backend library into the
#   uninstrumented Python interpreter, where ASan refuses to start unless libasan is preloaded into
#   Python itself, and would then report CPython's and torch's own allocations. scripts/test.sh
#   runs them against the normal build.
# LeakSanitizer is on; the only suppressions are ExecuTorch-internal ones, listed with the reason
# in scripts/sanitize-lsan.supp.
#
# Environment: KILN_ASAN_BUILD_DIR (default build-asan), KILN_ASAN_BUILD_TYPE (default
# RelWithDebInfo), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf 'sanitize: %s\n' "$*" >&2; }
die() { printf 'sanitize: error: %s\n' "$*" >&2; exit 1; }

bash scripts/setup.sh

venv="$root/.venv"
build="${KILN_ASAN_BUILD_DIR:-$root/build-asan}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
et_cmake=$("$venv/bin/python" -c 'import importlib.util as u; print(list(u.find_spec("executorch").submodule_search_locations)[0] + "/lib/cmake/executorch")') \
  || die "cannot locate the executorch package in $venv"

# The sanitizer runtimes' settings, for the build too: gtest_discover_tests runs every test
# executable at build time to list its tests, and a leak report there would fail the build.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/scripts/sanitize-lsan.supp:print_suppressions=0}"

source "$root/scripts/compiler_cache.sh"
configure=(-S "$root" -B "$build" -G Ninja
  -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja"
  -DCMAKE_BUILD_TYPE="${KILN_ASAN_BUILD_TYPE:-RelWithDebInfo}"
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san"
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCUDAToolkit_ROOT="$cuda"
  -Dexecutorch_DIR="$et_cmake" -DPython3_EXECUTABLE="$venv/bin/python")
stamp=$(printf '%s\n' "${configure[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$build/.kiln-configure" 2>/dev/null || true)" != "$stamp" ]; then
  say "configuring $build with $san"
  mkdir -p "$build"
  rm -f "$build/.kiln-configure"
  "$venv/bin/cmake" "${configure[@]}" > "$build/kiln-configure.log" 2>&1 \
    || { cat "$build/kiln-configure.log" >&2; die "CMake configure of $build failed (see above)"; }
  echo "$stamp" > "$build/.kiln-configure"
fi
"$venv/bin/cmake" --build "$build" || die "the sanitizer build failed (see above)"

echo "== C++ tests under ASan + UBSan (CTest, -LE gpu)"
(cd "$build" && "$venv/bin/ctest" --output-on-failure --no-tests=error -LE gpu -j2) \
  || die "a test failed or a sanitizer reported an error under ASan/UBSan (see above)"
