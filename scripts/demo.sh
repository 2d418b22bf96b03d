#!/usr/bin/env bash
# Builds conveyor and runs the main demo.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target cpu_pipeline
"$build/examples/cpu_pipeline" "$@"
