#!/usr/bin/env bash
# The whole GPU check, in two halves:
#
#   scripts/gpu-check.sh prepare [--keys K1,K2] [--precisions fp32,bf16] [--layout channels_last|nchw]
#                                [--no-tests | --tests T1,T2] [--no-e2e | --e2e N1,N2]
#                                [--no-roofline] [--limit-mib 60] [--max-keys N]
#       here (no GPU needed): builds, exports the models of bench/model_zoo.py with KilnPartitioner
#       and packs everything the GPU machine needs into .gpu/stage.tar.xz (the install tree, the
#       executorch runtime libraries, the GPU test binaries, the exported programs with inputs and
#       eager outputs). .gpu/ is git-ignored; carry it to the GPU machine with the repository.
#       --keys real: the real models of bench/real_models.py (with --precisions fp32,tf32,bf16).
#       ExecuTorch's backend operator suite (tests/gpu_e2e/export_suite.py) is lowered again unless
#       KILN_SUITE_STAGED names a finished `tests/suite/run_suite.py --out DIR` to copy
#       (KILN_SUITE_SUBSET=ci lowers only the CI subset of its files). --e2e stages only the
#       named checks of tests/gpu_e2e (e.g. --e2e llm with KILN_LLM_BENCH=llama1b_2l and
#       KILN_LLM_VARIANTS=fp32,bf16: export_llm.py's options); KILN_E2E_FROM=BUNDLE copies the
#       end-to-end programs of an earlier bundle instead of exporting them again.
#       When the programs do not fit one transfer (--limit-mib) or one run (--max-keys models a
#       bundle), prepare splits them (bench/bundle.py) into .gpu/stage-1.tar.xz, stage-2, ...
#       (each with the install tree, the GPU tests and other programs in the first) and prints
#       the run command of each.
#   scripts/gpu-check.sh run [--compile default,reduce-overhead] [--iterations N] [--keys K1,K2] [--profile]
#                            [--kernels K1,K2]  (per-kernel times under ncu: bench/kernel_times.py)
#       on the GPU machine (CUDA 13 driver, python3 with torch): unpacks the bundle, runs the
#       engine's GPU tests, the end-to-end checks of tests/gpu_e2e (check_<name>.py over what
#       export_<name>.py staged; check_suite.py: every case of ExecuTorch's backend operator suite
#       that has a Kiln delegate), every staged program through kiln_runner against eager PyTorch, and the
#       latency comparison with torch eager / torch.compile, and bench/roofline.py (the FFN block
#       against the measured copy bandwidth and bf16 matrix rate). Results go to $OUT (or .gpu/results)
#       as JSON, a PNG chart and logs; the table is printed last.
#   scripts/gpu-check.sh pylib
#       here: .gpu/pylib.tar.xz, the pinned transformers trimmed to the Llama and Qwen3 models
#       (1.5 MiB), which run puts first on the LLM check's PYTHONPATH when it is carried (the whole
#       1B LLM bundle leaves no room for the 13 MiB wheel in .whl/).
#   scripts/gpu-check.sh switches
#       on the GPU machine: the staged engine GPU tests under each KILN_* engine switch (README,
#       "Engine settings") that changes their kernels, one line each; the tests that assert a
#       fold happens are left out where the switch turns that fold off (bench/results/
#       h100_switches_run.log: 44 tests of six binaries, prepared with --tests).
#   scripts/gpu-check.sh sanitize [--keys K1,K2] [--gtest-filter F]
#       on the GPU machine: compute-sanitizer memcheck over every staged program (or those of the
#       keys) through kiln_runner and over the engine's GPU tests (or those F selects), and
#       racecheck over the engine's reduction, softmax, layer-norm and KV-cache GPU tests.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# KILN_GPU_BUNDLE picks another bundle (e.g. one of those prepare split the programs into; a
# bundle is one or more concatenated xz streams of tar archives, hence ignore_zeros below).
bundle="${KILN_GPU_BUNDLE:-$root/.gpu/stage.tar.xz}"
mode="${1:-}"; shift || true

case "$mode" in
prepare)
  keys=""; precisions="fp32,bf16"; layout=channels_last; tests=1; e2e=1; only_e2e=""; only_tests=""; roofline=1; limit_mib=60; max_keys=1000
  while [ $# -gt 0 ]; do
    case "$1" in
      --limit-mib) limit_mib="$2"; shift 2 ;;  # the largest bundle: one transfer carries 64 MiB
      --max-keys) max_keys="$2"; shift 2 ;;  # the most models a bundle (a run's time limit)
      --keys) keys="$2"; shift 2 ;;
      --precisions) precisions="$2"; shift 2 ;;
      --layout) layout="$2"; shift 2 ;;  # channels_last (default) or nchw: the conv nets' layout
      --no-tests) tests=0; shift ;;
      --tests) only_tests="$2"; shift 2 ;;  # stage only these GPU test binaries (comma list)
      --no-e2e) e2e=0; shift ;;
      --e2e) only_e2e="$2"; shift 2 ;;  # stage only these end-to-end checks (comma list)
      --no-roofline) roofline=0; shift ;;
      *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
  done
  set -e
  bash scripts/setup.sh
  stage=$(mktemp -d)
  trap 'rm -rf "$stage" "$stage.bundles"' EXIT
  mkdir -p "$stage/site/executorch/lib" "$stage/tests"
  cp -a build/install/kiln_executorch "$stage/site/"
  et_lib=$(.venv/bin/python -c 'import importlib.util as u; print(list(u.find_spec("executorch").submodule_search_locations)[0] + "/lib")')
  cp "$et_lib"/*.so "$stage/site/executorch/lib/"  # 15 MB: every runtime library of the wheel
  # executorch's headers and CMake package, so examples/cpp_consumer can be built there.
  cp -a "$et_lib/cmake" "$stage/site/executorch/lib/"
  cp -a "$et_lib/../include" "$et_lib/../share" "$stage/site/executorch/"
  if [ "$tests" = 1 ]; then
    find build/tests -type f -perm -u+x -name '*gpu*' | while read -r t; do
      case ",${only_tests:-$(basename "$t")}," in *",$(basename "$t"),"*) cp "$t" "$stage/tests/" ;; esac
    done
  fi
  # Debug info stays here: the transfer to the GPU machine is limited in size.
  strip --strip-debug "$stage"/site/kiln_executorch/lib/*.so "$stage"/site/kiln_executorch/bin/* "$stage"/tests/* 2>/dev/null || true
  PYTHONPATH="$root/python:$root/bench" .venv/bin/python bench/export_models.py --out "$stage/models" \
    ${keys:+--keys "$keys"} --precisions "$precisions" --layout "$layout"
  # The roofline benchmark's programs (bench/roofline.py).
  if [ "$roofline" = 1 ]; then
    PYTHONPATH="$root/python" .venv/bin/python bench/roofline.py export --out "$stage/roofline"
  fi
  # The end-to-end checks of tests/gpu_e2e: each export_<name>.py writes its programs here, and
  # check_<name>.py runs them on the GPU machine. KILN_E2E_FROM=BUNDLE takes them from an earlier
  # bundle instead (the runtime changed, the programs did not: no export).
  if [ -n "${KILN_E2E_FROM:-}" ]; then
    .venv/bin/python - "$KILN_E2E_FROM" "$stage" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1], ignore_zeros=True) as t:
    members = [m for m in t.getmembers() if m.name.startswith("e2e/")]
    if not members:
        sys.exit(f"gpu-check: {sys.argv[1]} has no e2e/ programs")
    t.extractall(sys.argv[2], members=members)
PY
  elif [ "$e2e" = 1 ]; then
    for script in tests/gpu_e2e/export_*.py; do
      [ -e "$script" ] || continue
      name=$(basename "$script" .py); name=${name#export_}
      case ",${only_e2e:-$name}," in *",$name,"*) ;; *) continue ;; esac
      PYTHONPATH="$root/python" .venv/bin/python "$script" --out "$stage/e2e/$name"
    done
  fi
  # Each bundle is a .tar.xz under the limit; its run line names it (KILN_GPU_BUNDLE) and the
  # device call carries it.
  prefix=${bundle%.tar.xz}
  .venv/bin/python bench/bundle.py --stage "$stage" --prefix "$prefix" --limit-mib "$limit_mib" \
    --max-keys "$max_keys" | tee "$stage.bundles"
  echo "run each bundle on the GPU machine (carry the bundle's path):"
  grep -E '\.tar\.xz [0-9.]+ MiB' "$stage.bundles" | while read -r path _; do
    echo "  KILN_GPU_BUNDLE=${path#"$root"/} scripts/gpu-check.sh run --compile default,reduce-overhead"
  done
  ;;
run|sanitize|switches)
  out="${OUT:-$root/.gpu/results}"; mkdir -p "$out"
  compile=""; iterations=200; keys=""; profile=""; kernels=""; gtest_filter="*"
  while [ $# -gt 0 ]; do
    case "$1" in
      --compile) compile="$2"; shift 2 ;;
      --gtest-filter) gtest_filter="$2"; shift 2 ;;  # sanitize: the engine tests to run
      --iterations) iterations="$2"; shift 2 ;;
      --keys) keys="$2"; shift 2 ;;
      --profile) profile=1; shift ;;  # also kiln_runner --profile per program -> OUT/profiles.txt
      --kernels) kernels="$2"; shift 2 ;;  # these keys' per-kernel times under ncu -> OUT/kernels.txt
      *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
  done
  stage=$(mktemp -d)
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], ignore_zeros=True).extractall(sys.argv[2])' "$bundle" "$stage" \
    || { echo "gpu-check: cannot unpack $bundle (run prepare first)" >&2; exit 1; }
  # cuBLASLt and cuDNN: the toolkit's, else the ones the machine's PyTorch brought (nvidia-* wheels).
  py_site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$stage/site/executorch/lib:$stage/site/kiln_executorch/lib:/usr/local/cuda/lib64:$py_site/nvidia/cu13/lib:$py_site/nvidia/cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
  # Wheels carried in .whl/ (e.g. the pinned transformers, for the real models' eager references,
  # when the machine's own differs): installed without dependencies into the stage, ahead of the
  # machine's packages.
  if compgen -G "$root/.whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage/pylib" \
      "$root"/.whl/*.whl || { echo "gpu-check: cannot install the wheels of .whl/" >&2; exit 1; }
    export PYTHONPATH="$stage/pylib${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # Or a trimmed copy of the pinned transformers (.gpu/pylib.tar.xz, from `gpu-check.sh pylib`):
  # the LLM check's eager reference where the wheel does not fit beside a large bundle. Only that
  # check sees it: it holds the Llama and Qwen3 models alone, so it (or a pylib left on the GPU
  # machine by an earlier call) must not shadow the machine's full transformers for BERT.
  llm_pythonpath=""
  if [ -f "$root/.gpu/pylib.tar.xz" ]; then
    mkdir -p "$stage/pylib_llm" && tar -xJf "$root/.gpu/pylib.tar.xz" -C "$stage/pylib_llm" \
      || { echo "gpu-check: cannot unpack .gpu/pylib.tar.xz" >&2; exit 1; }
    llm_pythonpath="$stage/pylib_llm"
  fi
  python3 -c 'import importlib.metadata as m
for p in ("torch", "torchvision", "transformers"):
    try: print(f"{p}: {m.version(p)}")  # "name: version": a record of that machine, not a pin
    except m.PackageNotFoundError: print(f"{p}: not installed")' | tee "$out/packages.txt"
  status=0
  # Programs for program_threads_gpu_test (tests/gpu_e2e/export_concurrency.py staged them).
  # Programs the program-level GPU tests load (staged by tests/gpu_e2e/export_*.py).
  export KILN_TEST_PROGRAMS="$stage/e2e/concurrency" KILN_SHARED_WEIGHTS_DIR="$stage/e2e/shared_weights"
  # A fresh algorithm cache, for runs with KILN_AUTOTUNE=1: each program's first load times its
  # convolution algorithms, later loads (the warm load, the device-resident copy) read them back.
  export KILN_CACHE_DIR="$stage/algo-cache"
  if [ "$mode" = sanitize ]; then
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    runner="$stage/site/kiln_executorch/bin/kiln_runner"
    for pte in "$stage"/models/*.pte; do
      name=$(basename "$pte" .pte); base=${name%_device}
      key=${base%_*}  # mlp_bf16(_device) -> mlp: one input set per model
      [ -z "$keys" ] || [[ ",$keys," == *",$key,"* ]] || continue
      inputs=(); i=0  # in index order (input_10 after input_9), however many the model has
      while [ -e "$stage/models/${key}_input_$i.bin" ]; do
        inputs+=(--input "$i=$stage/models/${key}_input_$i.bin"); i=$((i + 1))
      done
      "$cs" --tool memcheck --leak-check full --error-exitcode 99 "$runner" "$pte" "${inputs[@]}" \
        --iterations 2 > "$out/memcheck_$name.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || status=1
      echo "memcheck $name: rc=$rc $(grep -E 'ERROR SUMMARY' "$out/memcheck_$name.log" | tail -1)"
    done
    # The engine's own GPU tests under memcheck: every op family, program state and the
    # shape-specialised plans, including the error paths those tests provoke.
    # (engine_executor_gpu_test's HugeArena test runs the device out of memory on purpose:
    # memcheck would count that cudaMalloc failure as an error.)
    for name in engine_copy_gpu_test engine_elementwise_gpu_test engine_matmul_conv_gpu_test \
                engine_reduce_gpu_test engine_executor_gpu_test state_gpu_test \
                backend_variant_set_gpu_test; do
      "$cs" --tool memcheck --leak-check full --error-exitcode 99 "$stage/tests/$name" \
        --gtest_filter="$gtest_filter-*HugeArena*" \
        > "$out/memcheck_$name.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || status=1
      echo "memcheck $name: rc=$rc $(grep -E 'ERROR SUMMARY' "$out/memcheck_$name.log" | tail -1) $(grep -cE '^\[       OK \]' "$out/memcheck_$name.log") tests"
    done
    # The kernels that share memory between threads: softmax, layer norm, the reductions
    # (engine_reduce_gpu_test), the KV-cache row write (state_gpu_test) and the quantized matmul's
    # staged activations (engine_quant_matmul_gpu_test, without its timing tests).
    for spec in "engine_reduce_gpu_test:*" "state_gpu_test:*" \
                "engine_quant_matmul_gpu_test:*-*Bandwidth*:*PrefillTimes*"; do
      t="$stage/tests/${spec%%:*}"
      "$cs" --tool racecheck --error-exitcode 99 "$t" --gtest_filter="${spec#*:}" \
        > "$out/racecheck_$(basename "$t").log" 2>&1
      rc=$?; [ $rc -eq 0 ] || status=1
      echo "racecheck $(basename "$t"): rc=$rc $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck_$(basename "$t").log" | tail -1) $(grep -cE '^\[       OK \]' "$out/racecheck_$(basename "$t").log") tests"
    done
    # The decode attention kernel, and the generic one its cases run on with
    # KILN_ATTENTION_DECODE=off: memcheck, and racecheck (their warps share memory) with
    # KILN_ATTENTION=kiln, which keeps cuDNN's kernels out (racecheck reports hazards inside them).
    t="$stage/tests/engine_attention_gpu_test"
    "$cs" --tool memcheck --error-exitcode 99 "$t" --gtest_filter='*AttentionDecodeKernel*' \
      > "$out/memcheck_attention_decode.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "memcheck attention decode: rc=$rc $(grep -E 'ERROR SUMMARY' "$out/memcheck_attention_decode.log" | tail -1)"
    KILN_ATTENTION=kiln "$cs" --tool racecheck --error-exitcode 99 "$t" \
      --gtest_filter='*AttentionDecodeKernel*' > "$out/racecheck_attention_decode.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "racecheck attention decode: rc=$rc $(grep -E 'RACECHECK SUMMARY' "$out/racecheck_attention_decode.log" | tail -1)"
    exit $status
  fi
  if [ "$mode" = switches ]; then
    # SWITCH=VALUE:the binaries it concerns[:gtest filter].
    folds='-*FoldsIntoTheGemvAfterIt*'
    for spec in "KILN_ATTENTION_DECODE=off:engine_attention_gpu_test" \
                "KILN_ATTENTION_CLUSTER=off:engine_attention_gpu_test" \
                "KILN_ATTENTION=kiln:engine_attention_gpu_test" \
                "KILN_ROPE_APPEND=off:engine_rope_gpu_test,engine_decode_times_gpu_test" \
                "KILN_PDL=off:engine_decode_times_gpu_test,engine_rope_gpu_test" \
                "KILN_GEMV=off:engine_matmul_conv_gpu_test,engine_decode_times_gpu_test:$folds" \
                "KILN_GEMV_NORM=on:engine_matmul_conv_gpu_test,engine_decode_times_gpu_test" \
                "KILN_GEMV_GLU=off:engine_matmul_conv_gpu_test,engine_decode_times_gpu_test:$folds" \
                "KILN_QUANT_MMA=off:engine_quant_matmul_gpu_test" \
                "KILN_QUANT_DENSE=off:engine_quant_matmul_gpu_test" \
                "KILN_CONV=legacy:engine_conv_gpu_test"; do
      IFS=: read -r setting bins filter <<< "$spec"
      for name in ${bins//,/ }; do
        t="$stage/tests/$name"
        [ -x "$t" ] || { echo "$setting $name: not staged"; continue; }
        log="$out/switch_${setting%%=*}_$name.log"
        env "$setting" "$t" --gtest_filter="${filter:-*}" > "$log" 2>&1
        rc=$?; [ $rc -eq 0 ] || status=1
        passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$log")
        failed=$(sed -nE 's/^\[  FAILED  \] ([0-9]+) tests?, listed below.*/\1/p' "$log")
        echo "$setting $name: rc=$rc, ${passed:-0} passed, ${failed:-0} failed"
      done
    done
    exit $status
  fi
  for t in "$stage"/tests/*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")"
    "$t" --gtest_brief=1 2>&1 | tee "$out/$(basename "$t").log" | tail -25
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  echo "== examples/cpp_consumer built against the staged packages, on a Kiln-delegated program"
  if command -v cmake > /dev/null; then
    consumer="$stage/consumer"
    if cmake -S examples/cpp_consumer -B "$consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_PREFIX_PATH="$stage/site/kiln_executorch;$stage/site/executorch/lib/cmake/executorch" > "$out/consumer_build.log" 2>&1 \
       && cmake --build "$consumer" >> "$out/consumer_build.log" 2>&1; then
      # The consumer feeds float inputs: the first host-I/O program whose inputs are all float.
      first=$(python3 -c 'import json, sys
for e in json.load(open(sys.argv[1] + "/manifest.json")):
    if all(i["dtype"] == "Float" for i in e["inputs"]):
        print(sys.argv[1] + "/" + e["pte"]); break' "$stage/models")
      if [ -z "$first" ]; then
        echo "consumer built; no staged program takes float inputs only, so none was run" | tee "$out/consumer.log"
      else
        "$consumer/consumer" "$first" 2>&1 | tail -3 | tee "$out/consumer.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      fi
    else
      tail -20 "$out/consumer_build.log"; status=1
    fi
  else
    echo "no cmake on this machine: consumer not built"
  fi
  # A check that writes machine-readable results puts them here (check_suite.py: suite_gpu.json,
  # for bench/suite_summary.py --gpu).
  export KILN_E2E_OUT="$out"
  for check in tests/gpu_e2e/check_*.py; do
    [ -e "$check" ] || continue
    name=$(basename "$check" .py); name=${name#check_}
    [ -d "$stage/e2e/$name" ] || { echo "== e2e $name: not staged (prepare --no-e2e?)"; continue; }
    echo "== e2e $name"
    check_path="${PYTHONPATH:-}"
    [ "$name" = llm ] && [ -n "$llm_pythonpath" ] && check_path="$llm_pythonpath${check_path:+:$check_path}"
    PYTHONPATH="$check_path" PYTHONUNBUFFERED=1 python3 "$check" --dir "$stage/e2e/$name" \
      --runner "$stage/site/kiln_executorch/bin/kiln_runner" --bin "$stage/tests" \
      --install "$stage/site/kiln_executorch" 2>&1 | tee "$out/e2e_$name.log" | tail -40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  [ "${KILN_GPU_E2E_ONLY:-0}" = 1 ] && exit $status
  echo "== programs through kiln_runner vs eager PyTorch"
  PYTHONUNBUFFERED=1 python3 bench/gpu_run.py --models "$stage/models" \
    --runner "$stage/site/kiln_executorch/bin/kiln_runner" --out "$out" --iterations "$iterations" \
    ${compile:+--compile "$compile"} ${keys:+--keys "$keys"} ${profile:+--profile} 2>&1 \
    | tee "$out/gpu_run.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if [ -n "$kernels" ]; then
    echo "== per-kernel GPU times of one warm execute (ncu over kiln_runner --profiler-range)"
    PYTHONUNBUFFERED=1 python3 bench/kernel_times.py --models "$stage/models" \
      --runner "$stage/site/kiln_executorch/bin/kiln_runner" --keys "$kernels" \
      --out "$out/kernels.txt" 2>&1 | tee "$out/kernel_times.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  if [ -d "$stage/roofline" ]; then
    echo "== roofline: the FFN block against the measured copy bandwidth and bf16 matrix rate"
    PYTHONUNBUFFERED=1 python3 bench/roofline.py run --models "$stage/roofline" \
      --runner "$stage/site/kiln_executorch/bin/kiln_runner" --out "$out" 2>&1 | tee "$out/roofline.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  exit $status
  ;;
pylib)
  # .gpu/pylib.tar.xz: the pinned transformers wheel's package with only the Llama and Qwen3
  # models and the auto classes (1.5 MiB instead of the wheel's 13), for runs whose bundle leaves
  # no room for the wheel (the whole 1B int8 / int4 programs); carry it with the bundle.
  set -e
  bash scripts/setup.sh > /dev/null
  version=$(sed -n 's/^transformers==//p' pins.txt)
  [ -n "$version" ] || { echo "gpu-check: pins.txt pins no transformers" >&2; exit 1; }
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  .venv/bin/pip download -q --no-deps -d "$tmp/wheel" "transformers==$version"
  .venv/bin/python -m zipfile -e "$tmp"/wheel/transformers-*.whl "$tmp/pkg"
  find "$tmp/pkg/transformers/models" -mindepth 1 -maxdepth 1 -type d \
    ! -name llama ! -name qwen3 ! -name auto -exec rm -rf {} +
  mkdir -p .gpu
  tar -C "$tmp/pkg" -cf - transformers "transformers-$version.dist-info" | xz -9e > .gpu/pylib.tar.xz
  echo "gpu-check: .gpu/pylib.tar.xz ($(du -h .gpu/pylib.tar.xz | cut -f1)), transformers $version"
  ;;
*)
  echo "usage: scripts/gpu-check.sh prepare [--keys K] [--precisions P] [--no-tests] | run [--compile MODES] [--iterations N] [--keys K] [--profile] | switches | sanitize | pylib" >&2
  exit 2
  ;;
esac
