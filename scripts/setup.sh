#!/usr/bin/env bash
# Sets up everything Kiln needs, idempotently: a project-local virtual environment with the pinned
# packages (pins.txt), then a CMake configure against the executorch wheel's CMake package and a
# build. A second run with nothing changed only asks Ninja whether anything is stale (seconds).
#
# Environment: KILN_PYTHON (interpreter that creates the venv, default python3),
# KILN_BUILD_DIR (default build), KILN_BUILD_TYPE (default RelWithDebInfo),
# CUDA_HOME (default /usr/local/cuda).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="$root/.venv"
build="${KILN_BUILD_DIR:-$root/build}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ -x "$cuda/bin/nvcc" ] || die "no CUDA toolkit at $cuda (nvcc missing); install CUDA 13 or set CUDA_HOME"

# 0. System packages the build needs beyond the toolchain: GoogleTest for the C++ tests.
if [ ! -f /usr/include/gtest/gtest.h ]; then
  say "installing GoogleTest (libgtest-dev)"
  { apt-get update -q && apt-get install -y -q libgtest-dev; } >&2 || die "could not install libgtest-dev; install GoogleTest"
fi

# 1. Virtual environment with the pinned packages. The stamp holds the hash of pins.txt, so a pin
#    change reinstalls and an unchanged pin file costs nothing.
if [ ! -x "$venv/bin/python" ]; then
  say "creating virtual environment $venv"
  "${KILN_PYTHON:-python3}" -m venv "$venv" || die "could not create $venv"
fi
stamp="$venv/.kiln-pins"
want=$(sha256sum pins.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  say "installing pinned packages from pins.txt (first run downloads a few GB)"
  # Header-only pins (a line ending in "# headers-only": the cuDNN frontend) are not pip's
  # business here: each is installed alone, without its Python dependencies, below.
  "$venv/bin/python" -m pip install --disable-pip-version-check -q \
    -r <(grep -v '# headers-only' pins.txt) \
    || die "pip install -r pins.txt failed (see above)"
  for pin in $(grep '# headers-only' pins.txt | grep -v '^ *#' | sed 's/ *#.*//'); do
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --upgrade \
      --target "$venv/opt/${pin%%==*}" "$pin" || die "pip install $pin (headers) failed (see above)"
  done
  "$venv/bin/python" "$root/tools/check_pins.py" || die "installed packages do not match pins.txt"
  echo "$want" > "$stamp"
fi

# 2. Compiler cache (ccache, when installed): see compiler_cache.sh.
source "$root/scripts/compiler_cache.sh"

# 3. Configure once; afterwards Ninja re-runs CMake by itself when a CMakeLists changes.
et_cmake=$("$venv/bin/python" -c 'import importlib.util as u; print(list(u.find_spec("executorch").submodule_search_locations)[0] + "/lib/cmake/executorch")') \
  || die "cannot locate the executorch package in $venv"
[ -f "$et_cmake/executorch-config.cmake" ] || die "the executorch wheel has no CMake package at $et_cmake"
if [ ! -f "$build/build.ninja" ]; then
  say "configuring $build"
  "$venv/bin/cmake" -S "$root" -B "$build" -G Ninja \
    -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DCMAKE_BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}" \
    -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DCUDAToolkit_ROOT="$cuda" \
    -Dexecutorch_DIR="$et_cmake" \
    -DPython3_EXECUTABLE="$venv/bin/python" \
    || { rm -f "$build/build.ninja"; die "CMake configure failed (see above)"; }
fi

# 4. Build.
"$venv/bin/cmake" --build "$build" || die "build failed (see above)"

# 5. The install tree (the wheel's layout) and the kiln_executorch wheel, installed into the venv
#    beside executorch, so `import kiln_executorch` and find_package(kiln_executorch) work here as
#    they do for users. The wheel is byte-for-byte reproducible, so an unchanged one is not
#    reinstalled.
install_dir="$build/install/kiln_executorch"
"$venv/bin/cmake" --install "$build" --prefix "$install_dir" > /dev/null || die "cmake --install failed"
wheel=$("$venv/bin/python" tools/build_wheel.py --install-dir "$install_dir" --out "$build/dist") \
  || die "building the kiln_executorch wheel failed"
wheel_stamp="$venv/.kiln-wheel"
wheel_hash=$(sha256sum "$wheel" | cut -d' ' -f1)
if [ "$(cat "$wheel_stamp" 2>/dev/null || true)" != "$wheel_hash" ]; then
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --force-reinstall "$wheel" \
    || die "installing $wheel failed"
  echo "$wheel_hash" > "$wheel_stamp"
fi
say "ready: $build (wheel: $wheel)"
