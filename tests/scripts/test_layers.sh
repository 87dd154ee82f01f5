#!/usr/bin/env bash
# The dependency check (scripts/check-layers.sh) passes on this checkout, and fails, naming the
# file and the include, on a checkout with one include that runs up.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
"$src/scripts/check-layers.sh" "$src"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/base" "$tmp/runtime/core" "$tmp/model"
cp "$src/docs/architecture.md" "$tmp/docs/"
printf '#include "base/errf.h"\n' > "$tmp/model/ok.c"
printf '/* up */\n#include "runtime/core/internal.h"\n' > "$tmp/base/up.c"
printf '#include "base/errf.h"\n' > "$tmp/runtime/core/internal.h"
: > "$tmp/base/errf.h"
printf '#include "nowhere/gone.h"\n' > "$tmp/model/gone.c"
(cd "$tmp" && git init -q && git add -A)
if out=$("$src/scripts/check-layers.sh" "$tmp" 2>&1); then
    echo "FAIL: an include from base/ up to runtime/core/ passed the check"; exit 1
fi
grep -q 'base/up.c: includes runtime/core/internal.h (runtime/core/), which base/ may not' <<<"$out" ||
    { echo "FAIL: the up-include was not named:"; echo "$out"; exit 1; }
grep -q 'model/gone.c: includes "nowhere/gone.h", which is no file of this checkout' <<<"$out" ||
    { echo "FAIL: the missing include was not named:"; echo "$out"; exit 1; }
if grep -q 'model/ok.c' <<<"$out"; then echo "FAIL: an allowed include was reported"; exit 1; fi
grep -q 'check-layers: 2 include(s) outside the dependency table' <<<"$out" ||
    { echo "FAIL: the count is wrong:"; echo "$out"; exit 1; }
echo "test_layers: the tree passes; an up-include and a missing one are named"
