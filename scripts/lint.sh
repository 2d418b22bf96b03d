#!/usr/bin/env bash
# The format and static-analysis checks CI runs (.ci/run), from a build directory that has
# compile_commands.json (scripts/test.sh's, or any configured with
# -DCMAKE_EXPORT_COMPILE_COMMANDS=ON):
#   - clang-format: every C++ and CUDA source as .clang-format says (no file rewritten);
#   - clang-tidy: the checks in .clang-tidy over every public header (the header
#     self-containment TUs, tests/cmake/headers.cmake) and the library's compiled sources.
#     Findings are errors; each suppression in the code names its check and a reason.
#   usage: scripts/lint.sh [build_dir (default build)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
format=${CLANG_FORMAT:-clang-format-16}
tidy=${CLANG_TIDY:-clang-tidy-16}

echo "=== clang-format ($format)"
git ls-files '*.hpp' '*.cpp' '*.cu' | xargs "$format" --dry-run -Werror

echo "=== clang-tidy ($tidy)"
[[ -f $build/compile_commands.json ]] || {
  echo "lint.sh: $build/compile_commands.json is missing; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON" >&2
  exit 2
}
# C++ TUs only (clang-tidy does not compile the .cu sources): every header alone, the
# CUDA runtime's included where CUDA is built, and the library's sources.
python3 - "$build/compile_commands.json" <<'PY' | xargs -0 -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet
import json, sys
files = sorted({e["file"] for e in json.load(open(sys.argv[1]))
                if "/header_check/" in e["file"] or "/src/conveyor/" in e["file"]})
sys.stdout.write("\0".join(files))
PY
echo "lint: clean"
