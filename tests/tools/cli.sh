# Shared by the troupe command tests. Sourced with $1 = build dir; sets troupe and tmp (removed
# on exit, and the working directory), fail and expect_cmd.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
troupe=$build_dir/troupe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_cmd CODE PATTERN COMMAND ARGS...: troupe COMMAND ARGS exits CODE and stderr matches
# PATTERN.
expect_cmd() {
    local code=$1 pattern=$2 rc=0
    shift 2
    "$troupe" "$@" > out.txt 2> err.txt || rc=$?
    [ "$rc" -eq "$code" ] || { cat out.txt err.txt; fail "troupe $*: exit $rc, expected $code"; }
    grep -q -- "$pattern" err.txt || { cat err.txt; fail "troupe $*: stderr lacks '$pattern'"; }
}
