#!/usr/bin/env bash
# What to run on a machine with a GPU, from a build with CUDA (`bash scripts/test.sh` makes
# one): the GPU tests, the examples (the Fashion-MNIST demo), bench_inference's GPU rows
# and compute-sanitizer, in that order, so that a short lease gets the most important
# first. Logs and the benchmark's JSON go to OUT_DIR; a summary is printed last. This is
# the sequence behind benchmarks/RESULTS.md, section "GPU".
#
#   usage: scripts/gpu_check.sh [build_dir (default build)] [out_dir (default gpu-check)]
#   env:   FASHION_MNIST_DIR  the test set's two .gz files (default: the example's default,
#                             /usr/share/datasets/fashion-mnist)
#          DEMO_RUNS (3)      mlp_inference --runs
#          BENCH_FILTER       bench_inference rows (default: the rows the open GPU targets
#                             need; '.' for all of them, which takes over 20 minutes)
#          REPETITIONS (3)    bench_inference repetitions
#          BENCH_MIN_TIME (1) bench_inference's --benchmark_min_time, seconds per row: an
#                             iteration lasts about 0.1 s on an H200, and at 0.3 s (three
#                             of them) the efficiencies read lower
#          SANITIZE=quick|full|none (quick): quick runs memcheck over the pipeline and Thrust
#                             cases and racecheck/synccheck over the Thrust top-k; full adds
#                             memcheck over every non-[gate] case, initcheck and the demo
#          DEADLINE_S (0)     > 0: steps are cut (timeout) or skipped so that the script
#                             ends within this many seconds: fits a short device lease
#          STEPS              which steps, in this order (default: all of them):
#                             tests examples bench sanitize tuning host
#                             tuning: mlp_inference --autotune; online_serving with a fixed
#                             delay, then with a P99 target, at one rate
#                             host: bench_rings' SPSC regimes and bench_pipeline's trivial
#                             and bare chains on the GPU machine's CPUs (host-only
#                             binaries, in <build_dir>/benchmarks)
#          PIPE_FILTER        the host step's bench_pipeline rows
#          BASE_PIPELINE, ROUNDS (6), COMPARE_S (240)  the host step also compares older
#                             bench_pipeline binaries (one or more, separated by spaces)
#                             with this build's, row by row (benchmarks/ab_rows.py), ROUNDS
#                             rounds or COMPARE_S seconds; every run in
#                             <out_dir>/pipeline_rows/rows.jsonl
#          BASE_RINGS         likewise older bench_rings binaries, over RING_FILTER
#                             (default: conveyor's SPSC, rtt and mpmc2x2 rows), in
#                             <out_dir>/rings_rows
#
# The binaries may be copied to the GPU machine without the rest of the tree: the script
# needs <build_dir>/{tests/gpu_tests, examples/*, benchmarks/bench_inference} and
# benchmarks/summarize.py (and ab_rows.py for BASE_*) beside this script's folder.
# The spin-gate tests ([gate]) need kernels to run while the host goes on; the sanitizers
# serialize launches, so those runs take them out. API errors are not reported under
# memcheck: the tests cause some on purpose (failed allocations, an invalid launch).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu-check}
reps=${REPETITIONS:-3}
min_time=${BENCH_MIN_TIME:-1}
runs=${DEMO_RUNS:-3}
sanitize=${SANITIZE:-quick}
bench_filter=${BENCH_FILTER:-'cuda/(conveyor/(wait:|labels:|model:wide/real|frames/real)|thread_queue/model:wide/real|by_hand/frames/real|bandwidth/h2d:pinned)'}
data=(--weights data/fashion_mlp.bin)
if [ -n "${FASHION_MNIST_DIR:-}" ]; then
  data+=(--data "$FASHION_MNIST_DIR")
  export CONVEYOR_FASHION_MNIST_DIR=$FASHION_MNIST_DIR  # gpu_tests' trained-model case
fi
mkdir -p "$out"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S) UTC)"; }
deadline=${DEADLINE_S:-0}  # > 0: no step runs past this many seconds of the script
run() {  # run <log> <timeout_s> <command...>: logs, reports the exit status, remembers a failure
  local log=$1 limit=$2
  shift 2
  if [ "$deadline" -gt 0 ]; then
    local left=$((deadline - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
      echo "skipped (DEADLINE_S): $*"
      return 0
    fi
  fi
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$log" 2>&1
  local rc=$?
  echo "exit $rc after $((SECONDS - t0)) s: $*  (log: $out/$log)"
  [ $rc -eq 0 ] || status=1
  return $rc
}

steps=" ${STEPS:-tests examples bench sanitize tuning host} "
want() { [[ "$steps" == *" $1 "* ]]; }

step device
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv,noheader || {
  echo "gpu_check: nvidia-smi found no GPU"
  exit 77
}
nproc

if want tests; then
step gpu_tests
run gpu_tests.log 300 "$build/tests/gpu_tests" --durations yes
grep -E "^[0-9.]+ s: " "$out/gpu_tests.log" | sort -rn | head -n 8
tail -n 3 "$out/gpu_tests.log"
fi

if want examples; then
step examples
run mlp_fp32.log 120 "$build/examples/mlp_inference" "${data[@]}" --runs "$runs"
run mlp_fp16_graphs.log 120 "$build/examples/mlp_inference" "${data[@]}" --runs "$runs" \
  --precision fp16 --graphs
run mlp_thrust.log 120 "$build/examples/mlp_inference" "${data[@]}" --runs "$runs" --thrust
grep -h -E "accuracy|ratio|labels" "$out"/mlp_*.log
run online_serving.log 60 "$build/examples/online_serving" 20000 3
grep -E "served latency" "$out/online_serving.log"
fi

if want bench && [ "$bench_filter" != none ]; then
  step bench_inference
  export CONVEYOR_BENCH_REPORTS=1
  run bench_inference.log 420 "$build/benchmarks/bench_inference" \
    --benchmark_filter="$bench_filter" --benchmark_min_time="$min_time" \
    --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/inf.json" --benchmark_out_format=json
  python3 benchmarks/summarize.py "$out/inf.json"
fi

if want sanitize && [ "$sanitize" != none ]; then
  step compute-sanitizer
  san="compute-sanitizer --error-exitcode 9"
  tests="$build/tests/gpu_tests"
  run memcheck.log 180 $san --tool memcheck --leak-check full --report-api-errors no "$tests" \
    "thrust gpu: top-k on a stream*,models gpu: the MLP in a conveyor*,cuda gpu segment*"
  run racecheck.log 120 $san --tool racecheck "$tests" "thrust gpu: top-k on a stream*"
  run synccheck.log 120 $san --tool synccheck "$tests" "thrust gpu: top-k on a stream*"
  if [ "$sanitize" = full ]; then
    run memcheck_all.log 600 $san --tool memcheck --leak-check full --report-api-errors no \
      "$tests" "~[gate]"
    run racecheck_models.log 600 $san --tool racecheck "$tests" "models gpu*"
    run synccheck_models.log 600 $san --tool synccheck "$tests" "models gpu*"
    # initcheck is slow on the precision test (over 60 s on an H100): the other model cases.
    run initcheck.log 600 $san --tool initcheck "$tests" \
      "models gpu: normalize*,models gpu: argmax*,models gpu: the MLP in a conveyor*,models gpu: graphs*"
    run memcheck_mlp.log 600 $san --tool memcheck --leak-check full \
      "$build/examples/mlp_inference" "${data[@]}" --runs 1 --seconds 0 --images 2000 \
      --precision fp16
  fi
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|LEAK SUMMARY" "$out"/*check*.log
fi
if want tuning; then
  step tuning
  run autotune.log 120 "$build/examples/mlp_inference" "${data[@]}" --autotune
  tail -n 25 "$out/autotune.log"
  serving_rate=${SERVING_RATE:-20000}
  run serving_fixed.log 60 "$build/examples/online_serving" "$serving_rate" 3 2000 0
  run serving_target.log 60 "$build/examples/online_serving" "$serving_rate" 3 2000 5000
  grep -h -E "dynamic batching|served latency|latency target|missed:|met in" \
    "$out"/serving_fixed.log "$out"/serving_target.log
fi

if want host; then
  step host benchmarks
  grep -m1 "model name" /proc/cpuinfo
  run rings.log 150 "$build/benchmarks/bench_rings" --benchmark_filter='spsc/.*/[0-9]+/[0-9]+B/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/rings.json" --benchmark_out_format=json
  pipe_filter=${PIPE_FILTER:-'conveyor/trivial/workers:1/metrics:o|bare/trivial|tbb/trivial'}
  run pipeline.log 90 "$build/benchmarks/bench_pipeline" --benchmark_filter="$pipe_filter" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/pipe.json" --benchmark_out_format=json
  grep -h "_median" "$out/pipeline.log"
  # BASE_PIPELINE / BASE_RINGS: older binaries against this build's, row by row
  # (benchmarks/ab_rows.py: each row in every binary back to back, the order alternating
  # per round), with a copy of the first older binary as the control. Cut by its time
  # limit, it reports the rounds it finished.
  compare() {  # compare <prefix> <older binaries, space-separated> <this build's> <filter>
    local i
    local -a older specs
    read -r -a older <<<"$2"
    for i in "${!older[@]}"; do specs+=("base$((i + 1))=${older[$i]}"); done
    cp "${older[0]}" "$out/${1}_control" && specs+=("control=$out/${1}_control")
    specs+=("this=$3")
    run "${1}_rows.log" "${COMPARE_S:-240}" python3 benchmarks/ab_rows.py --filter "$4" \
      --rounds "${ROUNDS:-6}" --out "$out/${1}_rows" "${specs[@]}"
    grep -v "^round " "$out/${1}_rows.log"
  }
  if [ -n "${BASE_PIPELINE:-}" ]; then
    compare pipeline "$BASE_PIPELINE" "$build/benchmarks/bench_pipeline" "$pipe_filter"
  fi
  ring_filter=${RING_FILTER:-'^(spsc/conveyor/(try|block)/[0-9]+/min|rtt/conveyor/|mpmc2x2/conveyor/)'}
  if [ -n "${BASE_RINGS:-}" ]; then
    compare rings "$BASE_RINGS" "$build/benchmarks/bench_rings" "$ring_filter"
  fi
fi

echo "gpu_check: exit $status"
exit $status
