#!/usr/bin/env bash
# Troupe beside DeepSpeed on CPU (`make bench-peers`): the equivalence table
# (bench/peers/equivalence.py: per config, the per-step losses from the same weights, data and
# JSON), then the speed and memory table (bench/peers/speed.py: tokens/s and peak RSS per rank,
# the ratios troupe / deepspeed). Each script says why in one line when the peer environment
# (bench/peers/setup.sh) cannot be had. Each DeepSpeed run's shared-memory buffers
# (/dev/shm/deepspeed_allreduce_buffer_*, 67 MB of RAM per rank, which DeepSpeed never
# unlinks) are removed when it ends, also after a failure, a timeout or Ctrl-C (peerlib.py).
#
#   bench/peers/run.sh BUILD_DIR                       both tables
#   bench/peers/run.sh BUILD_DIR --equiv-only [OPTS]   equivalence.py BUILD_DIR OPTS
#   bench/peers/run.sh BUILD_DIR --speed-only [OPTS]   speed.py BUILD_DIR OPTS
# (OPTS: the script's own, e.g. --only NAME, --steps N, --list; `--help` lists them.)
set -euo pipefail
usage="usage: run.sh BUILD_DIR [--equiv-only|--speed-only [OPTIONS]]"
build=${1:?$usage}
shift
here=$(cd "$(dirname "$0")" && pwd)
case ${1:-} in
    --equiv-only) shift; exec "$here/equivalence.py" "$build" "$@" ;;
    --speed-only) shift; exec "$here/speed.py" "$build" "$@" ;;
    "") ;;
    *) echo "run.sh: options go to one table: $usage" >&2; exit 2 ;;
esac
"$here/equivalence.py" "$build"
echo
"$here/speed.py" "$build"
