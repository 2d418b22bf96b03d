#!/usr/bin/env bash
# Builds conveyor and runs the main demo: Fashion-MNIST's 10,000 test images classified by
# a trained MLP (data/fashion_mlp.bin) in the serial inference loop and through conveyor
# (on the GPU when one answers, else on the host runtime): each path's test accuracy, the
# throughput ratio as median and range over 5 runs of >= 1 s each, then conveyor's report.
#   usage: scripts/demo.sh [--runs N] [--seconds S] [--data DIR] [--precision P] [--graphs]
# deps.sh installs the data set (Debian's dataset-fashion-mnist); where it cannot be
# installed, copy its four .gz files and pass --data DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target mlp_inference
"$build/examples/mlp_inference" "$@"
