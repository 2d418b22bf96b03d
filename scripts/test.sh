#!/usr/bin/env bash
# Builds conveyor (CUDA parts too when the toolkit is found) and runs every test with
# CTest. GPU tests report "skipped" on machines without a GPU.
#   usage: scripts/test.sh [extra cmake args...]     build dir: $BUILD_DIR (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
build=${BUILD_DIR:-build}
werror=OFF; [[ ${CI:-} == true ]] && werror=ON
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_WERROR=$werror "$@"
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)"
