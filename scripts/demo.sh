#!/usr/bin/env bash
# Builds conveyor and runs the main demo: the serial inference loop next to the same work
# through conveyor (on the GPU when one answers, else on the host runtime), then the report.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target mlp_inference
"$build/examples/mlp_inference" "$@"
