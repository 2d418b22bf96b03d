#!/usr/bin/env bash
# What to run on a machine with a GPU, from a build with CUDA (`bash scripts/test.sh` makes
# one): the GPU tests, compute-sanitizer over them, the examples, and bench_inference with
# repetitions. Logs and the benchmark's JSON go to OUT_DIR; a summary table is printed last.
# This is the sequence behind benchmarks/RESULTS.md, section "GPU".
#
#   usage: scripts/gpu_check.sh [build_dir (default build)] [out_dir (default gpu-check)]
#   env:   REPETITIONS (default 5), SKIP_SANITIZERS=1, SKIP_BENCH=1
#
# The binaries may also be copied to the GPU machine without the rest of the tree: the
# script only needs <build_dir>/{tests/gpu_tests, examples/*, benchmarks/bench_inference}
# and benchmarks/summarize.py beside this script's folder.
# The spin-gate tests ([gate]) need kernels to run while the host goes on; the sanitizers
# serialize launches, so those runs take them out. API errors are not reported under
# memcheck: the tests cause some on purpose (failed allocations, an invalid launch).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-check}
reps=${REPETITIONS:-5}
mkdir -p "$out"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S) UTC)"; }
run() {  # run <log> <timeout_s> <command...>: logs, reports the exit status, remembers a failure
  local log=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$out/$log" 2>&1
  local rc=$?
  echo "exit $rc: $*  (log: $out/$log)"
  [ $rc -eq 0 ] || status=1
  return $rc
}

step device
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || {
  echo "gpu_check: nvidia-smi found no GPU"
  exit 77
}

step gpu_tests
run gpu_tests.log 300 "$build/tests/gpu_tests" --durations yes
tail -n 2 "$out/gpu_tests.log"

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  step compute-sanitizer
  san="compute-sanitizer --error-exitcode 9"
  run memcheck.log 600 $san --tool memcheck --leak-check full --report-api-errors no \
    "$build/tests/gpu_tests" "~[gate]"
  run racecheck.log 600 $san --tool racecheck "$build/tests/gpu_tests" "models gpu*"
  run synccheck.log 600 $san --tool synccheck "$build/tests/gpu_tests" "models gpu*"
  # initcheck is slow on the precision test (over 60 s on an H100): the other model cases.
  run initcheck.log 600 $san --tool initcheck "$build/tests/gpu_tests" \
    "models gpu: normalize*,models gpu: argmax*,models gpu: the MLP in a conveyor*,models gpu: graphs*"
  run memcheck_mlp.log 600 $san --tool memcheck --leak-check full "$build/examples/mlp_inference" 2000 fp16
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|LEAK SUMMARY" "$out"/*check*.log
fi

step examples
for p in fp32 tf32 fp16 bf16; do
  run "mlp_$p.log" 120 "$build/examples/mlp_inference" 20000 "$p"
  grep -E "serial loop|conveyor  |results" "$out/mlp_$p.log"
done
run mlp_graphs.log 120 "$build/examples/mlp_inference" 20000 tf32 graphs
run online_serving.log 60 "$build/examples/online_serving" 20000 3
grep -E "client latency" "$out/online_serving.log"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  step bench_inference
  export CONVEYOR_BENCH_REPORTS=1
  run bench_inference.log 1800 "$build/benchmarks/bench_inference" \
    --benchmark_min_time=0.3 --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/inf.json" --benchmark_out_format=json
  python3 benchmarks/summarize.py "$out/inf.json"
fi
exit $status
