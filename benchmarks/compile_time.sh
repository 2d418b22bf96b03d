#!/usr/bin/env bash
# What a minimal pipeline costs its includer to compile: one TU, from_range | map (2
# workers, ordered) | sink, compiled with this tree's headers, an older tree's and
# Taskflow's (the same pipeline as a tf::DataPipeline), alternating, one compile of each
# per round. Run it with nothing else running: compile times follow the machine's load.
#
#   benchmarks/compile_time.sh [rounds]          # default 8; 0 with INSTRUCTIONS=1
#   BASE=/path/to/older/conveyor   its include/ (and build/include/, if configured)
#   TASKFLOW=/path/to/taskflow     the folder that holds taskflow/taskflow.hpp
#   CXX=g++  CXXFLAGS="-std=c++20 -O2"
#
#   INSTRUCTIONS=1                 also compile each TU once under valgrind (Debian:
#                                  valgrind) and count the instructions the compiler ran
#
# Prints each compile (wall s, the compiler's peak resident memory in MiB), then per TU
# the median and the fastest of its rounds, and this tree's ratio to it (of the medians,
# the median of the rounds' ratios, of the fastest). BASE and TASKFLOW may be left out.
# With INSTRUCTIONS=1, then per TU the instructions its compile ran (the driver, cc1plus
# and the assembler) and this tree's ratio to it: a count that other processes on the
# host do not move, where the seconds drift with their load from round to round.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
cxx=${CXX:-g++}
read -r -a flags <<<"${CXXFLAGS:--std=c++20 -O2}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/conveyor.cpp" <<'EOF'
#include <conveyor/pipeline.hpp>
#include <cstdio>
#include <ranges>
int main() {
  long sum = 0;
  conveyor::pipeline p{conveyor::from_range(std::views::iota(0, 100000)) |
                       conveyor::map([](int x) { return x * 2; }).workers(2).ordered() |
                       conveyor::sink([&](int x) { sum += x; })};
  p.run();
  std::printf("%ld\n", sum);
}
EOF
cat >"$work/taskflow.cpp" <<'EOF'
#include <taskflow/algorithm/data_pipeline.hpp>
#include <taskflow/taskflow.hpp>
#include <cstdio>
int main() {
  tf::Taskflow taskflow;
  tf::Executor executor(2);
  long sum = 0;
  int next = 0;
  tf::DataPipeline pl(
      4,
      tf::make_data_pipe<void, int>(tf::PipeType::SERIAL,
                                    [&](tf::Pipeflow& pf) -> int {
                                      if (next == 100000) {
                                        pf.stop();
                                        return 0;
                                      }
                                      return next++;
                                    }),
      tf::make_data_pipe<int, int>(tf::PipeType::PARALLEL, [](int& x) { return x * 2; }),
      tf::make_data_pipe<int, void>(tf::PipeType::SERIAL, [&](int& x) { sum += x; }));
  taskflow.composed_of(pl);
  executor.run(taskflow).wait();
  std::printf("%ld\n", sum);
}
EOF

# name, source, include folders
entries=("this|conveyor.cpp|$PWD/include")
if [[ -n ${BASE:-} ]]; then
  base_inc="$BASE/include"
  [[ -d $BASE/build/include ]] && base_inc+=" $BASE/build/include"
  entries+=("base|conveyor.cpp|$base_inc")
fi
[[ -n ${TASKFLOW:-} ]] && entries+=("taskflow|taskflow.cpp|$TASKFLOW")

# Compiles $src with the include folders $incs into $name.o, run by the command given
# after the three (a timer, valgrind).
compile() {
  local name=$1 src=$2 incs=$3 i args=()
  shift 3
  for i in $incs; do args+=("-I$i"); done
  "$@" "$cxx" "${flags[@]}" "${args[@]}" -c "$work/$src" -o "$work/$name.o"
}

: >"$work/all"  # rounds may be 0 (INSTRUCTIONS=1 alone)
for ((r = 1; r <= rounds; ++r)); do
  for e in "${entries[@]}"; do
    IFS='|' read -r name src incs <<<"$e"
    compile "$name" "$src" "$incs" /usr/bin/time -f "$name %e %M" -o "$work/time"
    read -r _ wall kb <"$work/time"
    printf 'round %d %-8s %6.2f s %5d MiB\n' "$r" "$name" "$wall" $((kb / 1024))
    echo "$name $wall" >>"$work/all"
  done
done

python3 - "$work/all" <<'EOF'
import collections, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, wall = line.split()
    t[name].append(float(wall))
med = {n: statistics.median(v) for n, v in t.items()}
low = {n: min(v) for n, v in t.items()}
for n, v in t.items():
    print(f"{n:8s} median {med[n]:6.2f} s  fastest {low[n]:6.2f} s", end="")
    if n != "this":
        paired = statistics.median(a / b for a, b in zip(t["this"], v))
        print(f"   this / {n}: {med['this'] / med[n]:.3f} (medians), {paired:.3f} (median of"
              f" rounds), {low['this'] / low[n]:.3f} (fastest)", end="")
    print()
EOF

[[ ${INSTRUCTIONS:-0} == 1 ]] || exit 0
for e in "${entries[@]}"; do
  IFS='|' read -r name src incs <<<"$e"
  compile "$name" "$src" "$incs" valgrind --tool=cachegrind --cache-sim=no --trace-children=yes \
    --cachegrind-out-file=/dev/null --log-file="$work/vg.$name.%p"
  # One log per process; its "I refs" line: instructions executed.
  cat "$work"/vg."$name".* | sed -n 's/.*I *refs: *//p' | tr -d , |
    awk -v n="$name" '{ s += $1 } END { printf "%s %.0f\n", n, s }' >>"$work/instructions"
done
python3 - "$work/instructions" <<'EOF'
import sys
ins = dict((n, int(v)) for n, v in (line.split() for line in open(sys.argv[1])))
for n, v in ins.items():
    ratio = f"   this / {n}: {ins['this'] / v:.3f}" if n != "this" else ""
    print(f"{n:8s} {v / 1e9:6.2f} G instructions{ratio}")
EOF
