#!/usr/bin/env bash
# Installs the Debian packages conveyor's build, tests and benchmarks need, when missing.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (checks first).
set -euo pipefail
# zlib1g-dev: the example model reads Fashion-MNIST's .gz files; dataset-fashion-mnist:
# those files (/usr/share/datasets/fashion-mnist), the demo's images.
conveyor_deps=(cmake ninja-build g++ catch2 libbenchmark-dev libboost-dev
               libreaderwriterqueue-dev libconcurrentqueue-dev libtbb-dev nlohmann-json3-dev
               zlib1g-dev dataset-fashion-mnist)
# CONVEYOR_DEPS_EXTRA: more packages for the caller (.ci/run: the clang tools).
read -r -a conveyor_extra <<< "${CONVEYOR_DEPS_EXTRA:-}"
conveyor_deps+=("${conveyor_extra[@]}")
missing=()
for p in "${conveyor_deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "conveyor: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The CUDA toolkit is not a Debian package here: use /usr/local/cuda when it is there.
if [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
