#!/usr/bin/env bash
# Builds the blob reader's libFuzzer target (tests/fuzz/blob_reader_fuzzer.cpp) with clang and
# AddressSanitizer + UndefinedBehaviorSanitizer, replays the regression blobs
# (tests/fuzz/regressions/*.blob), then fuzzes for SECONDS starting from the seed corpus
# (tests/fuzz/corpus/). Fails on any crash, sanitizer report or contract violation, printing the
# end of the fuzzer's log and where the reproducer was written.
#
# Usage: scripts/fuzz.sh [SECONDS]      default 60; 0 builds and replays the corpus only.
#
# The main build uses g++, and libFuzzer comes with clang, so this is a separate small build into
# build-fuzz/ (ignored by git): the four blob reader sources plus the target, compiled directly
# with clang++-14 against the executorch wheel's headers in .venv (scripts/setup.sh creates it;
# this script runs setup only when the venv is missing) and linked against its libexecutorch.so.
# Rebuilds only when a source, a flag or the compiler changed.
#
# Environment: KILN_FUZZ_DIR (build and work folder, default build-fuzz), KILN_FUZZ_JOBS (fuzzing
# processes in libFuzzer's fork mode, default 1), KILN_FUZZ_ARGS (extra libFuzzer flags).
# New inputs the fuzzer finds go to $KILN_FUZZ_DIR/corpus (kept between local runs, never
# committed); crash reproducers to $KILN_FUZZ_DIR/artifacts. A crash becomes a regression test:
# copy the reproducer to tests/fuzz/regressions/<what>.blob and fix the reader.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf 'fuzz: %s\n' "$*" >&2; }
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 1; }

seconds=${1:-60}
[[ "$seconds" =~ ^[0-9]+$ ]] || die "SECONDS must be a whole number, got '$seconds'"
jobs=${KILN_FUZZ_JOBS:-1}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "KILN_FUZZ_JOBS must be a positive number, got '$jobs'"
out="${KILN_FUZZ_DIR:-$root/build-fuzz}"
mkdir -p "$out/obj" "$out/corpus" "$out/artifacts"

# 1. clang 14 and its libFuzzer runtime (Debian: clang-14, libclang-rt-14-dev).
cxx=clang++-14
runtime_lib() { echo "$("$cxx" -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-x86_64.a"; }
if ! command -v "$cxx" > /dev/null || [ ! -f "$(runtime_lib)" ]; then
  say "installing clang-14 and its libFuzzer runtime (clang-14, libclang-rt-14-dev)"
  { apt-get update -q && apt-get install -y -q clang-14 libclang-rt-14-dev; } >&2 \
    || die "could not install clang-14 / libclang-rt-14-dev; install clang 14 with libFuzzer"
  [ -f "$(runtime_lib)" ] || die "clang-14 has no libFuzzer runtime at $(runtime_lib)"
fi

# 2. The executorch wheel's headers and runtime library.
if [ ! -x .venv/bin/python ]; then
  say "no .venv yet: running scripts/setup.sh"
  bash scripts/setup.sh
fi
et=$(.venv/bin/python -c 'import importlib.util as u; print(list(u.find_spec("executorch").submodule_search_locations)[0])') \
  || die "cannot locate the executorch package in .venv; run scripts/setup.sh"
[ -f "$et/lib/libexecutorch.so" ] && [ -d "$et/include/executorch" ] \
  || die "the executorch wheel at $et has no include/executorch or lib/libexecutorch.so"

# 3. Build. The definitions are the ones executorch::runtime's CMake target gives every consumer
#    (see build/compile_commands.json), so the headers mean here what they mean in the real build.
defs=(-DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED -DET_USE_THREADPOOL)
incs=(-I"$root" -isystem "$et/include" -isystem "$et/include/executorch/runtime/core/portable_type/c10")
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all -Wall -Wextra
       -Wno-unused-parameter)
reader=(format/*.cpp)
target=tests/fuzz/blob_reader_fuzzer.cpp
bin="$out/blob_reader_fuzzer"
stamp=$({ "$cxx" --version; echo "${defs[*]} ${incs[*]} ${flags[*]} $et";
          cat "${reader[@]}" "$target" format/*.h format/*.def runtime/engine/*.h tests/fuzz/*.h; } | sha256sum | cut -d' ' -f1)
if [ ! -x "$bin" ] || [ "$(cat "$out/.stamp" 2>/dev/null || true)" != "$stamp" ]; then
  say "building $bin"
  rm -f "$out/.stamp"
  pids=()
  for src in "${reader[@]}"; do
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link,address,undefined "${defs[@]}" "${incs[@]}" \
      -c "$src" -o "$out/obj/$(basename "$src" .cpp).o" & pids+=($!)
  done
  "$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined "${defs[@]}" "${incs[@]}" \
    -c "$target" -o "$out/obj/blob_reader_fuzzer.o" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || die "compiling the fuzzer failed (see above)"; done
  "$cxx" -fsanitize=fuzzer,address,undefined "$out"/obj/*.o "$et/lib/libexecutorch.so" \
    -Wl,-rpath,"$et/lib" -o "$bin" || die "linking the fuzzer failed (see above)"
  echo "$stamp" > "$out/.stamp"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
log="$out/fuzz.log"
fail_with_log() {
  tail -n 80 "$log" >&2
  ls "$out"/artifacts/ 2>/dev/null | sed 's/^/fuzz: reproducer: /' >&2 || true
  die "$1 (full log: $log); turn each reproducer into tests/fuzz/regressions/<what>.blob"
}

# 4. Every regression blob once (each was a crash; now each must be a clean rejection).
shopt -s nullglob
regressions=(tests/fuzz/regressions/*.blob)
if [ ${#regressions[@]} -gt 0 ]; then
  "$bin" -artifact_prefix="$out/artifacts/" "${regressions[@]}" > "$log" 2>&1 \
    || fail_with_log "a regression blob crashes the reader again"
  say "replayed ${#regressions[@]} regression blob(s): no crash"
fi
[ -n "$(ls tests/fuzz/corpus)" ] || die "the seed corpus tests/fuzz/corpus is empty"

# 5. Fuzz (or, for 0 seconds, only run the corpus once).
if [ "$seconds" -eq 0 ]; then
  run=(-runs=0)
else
  run=(-max_total_time="$seconds")
  [ "$jobs" -gt 1 ] && run+=(-fork="$jobs")
fi
# shellcheck disable=SC2086 # KILN_FUZZ_ARGS is a list of flags
"$bin" "${run[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" ${KILN_FUZZ_ARGS:-} "$out/corpus" tests/fuzz/corpus \
  > "$log" 2>&1 || fail_with_log "the fuzzer found a crash"
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE|pulse|NEW|REDUCE)|^stat::|^INFO: (exiting|fuzzed)' "$log" | tail -n 6 >&2 || true
say "no crash in ${seconds}s (log: $log)"
