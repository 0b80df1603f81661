#!/usr/bin/env bash
# The whole GPU check, in two halves:
#
#   scripts/gpu-check.sh prepare [--keys K1,K2] [--precisions fp32,bf16]
#       here (no GPU needed): builds, exports the models of bench/model_zoo.py with KilnPartitioner
#       and stages everything the GPU machine needs under .gpu/ (the install tree, the executorch
#       runtime libraries, the GPU test binaries, the exported programs with inputs and eager
#       outputs). .gpu/ is git-ignored; carry it to the GPU machine with the repository.
#   scripts/gpu-check.sh run [--compile default,reduce-overhead] [--iterations N]
#       on the GPU machine (CUDA 13 driver, python3 with torch): runs the engine's GPU tests, every
#       staged program through kiln_runner against eager PyTorch, and the latency comparison with
#       torch eager / torch.compile. Results go to $OUT (or .gpu/results) as JSON, a PNG chart and
#       logs; the table is printed last.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
stage="$root/.gpu"
mode="${1:-}"; shift || true

case "$mode" in
prepare)
  keys=""; precisions="fp32,bf16"
  while [ $# -gt 0 ]; do
    case "$1" in
      --keys) keys="$2"; shift 2 ;;
      --precisions) precisions="$2"; shift 2 ;;
      *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
  done
  set -e
  bash scripts/setup.sh
  rm -rf "$stage"; mkdir -p "$stage/site/executorch/lib" "$stage/tests"
  cp -a build/install/kiln_executorch "$stage/site/"
  et_lib=$(.venv/bin/python -c 'import importlib.util as u; print(list(u.find_spec("executorch").submodule_search_locations)[0] + "/lib")')
  cp "$et_lib"/libexecutorch.so "$et_lib"/libexecutorch_kernels_optimized.so "$et_lib"/libexecutorch_threadpool.so "$stage/site/executorch/lib/"
  find build/tests -type f -perm -u+x -name '*gpu*' -exec cp {} "$stage/tests/" \;
  PYTHONPATH="$root/python:$root/bench" .venv/bin/python bench/export_models.py --out "$stage/models" \
    ${keys:+--keys "$keys"} --precisions "$precisions"
  du -sh "$stage"
  ;;
run)
  out="${OUT:-$stage/results}"; mkdir -p "$out"
  compile=""; iterations=200
  while [ $# -gt 0 ]; do
    case "$1" in
      --compile) compile="$2"; shift 2 ;;
      --iterations) iterations="$2"; shift 2 ;;
      *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
  done
  export LD_LIBRARY_PATH="$stage/site/executorch/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
  status=0
  for t in "$stage"/tests/*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")"
    "$t" --gtest_brief=1 2>&1 | tee "$out/$(basename "$t").log" | tail -25
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  echo "== programs through kiln_runner vs eager PyTorch"
  PYTHONUNBUFFERED=1 python3 bench/gpu_run.py --models "$stage/models" \
    --runner "$stage/site/kiln_executorch/bin/kiln_runner" --out "$out" \
    --iterations "$iterations" ${compile:+--compile "$compile"} 2>&1 | tee "$out/gpu_run.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  exit $status
  ;;
*)
  echo "usage: scripts/gpu-check.sh prepare [--keys K] [--precisions P] | run [--compile MODES] [--iterations N]" >&2
  exit 2
  ;;
esac
