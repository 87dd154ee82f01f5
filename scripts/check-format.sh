#!/usr/bin/env bash
# check-format.sh: every C and CUDA file of the checkout is as .clang-format says, checked with
# the clang-format Debian ships (scripts/install-deps.sh installs it). `--fix` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null ||
    { echo "check-format: clang-format not found (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
    clang-format -i "${files[@]}"
    exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}"; then
    echo "check-format: the files above differ from .clang-format; scripts/check-format.sh --fix" \
         "rewrites them" >&2
    exit 1
fi
echo "check-format: ${#files[@]} files as .clang-format says ($(clang-format --version))"
