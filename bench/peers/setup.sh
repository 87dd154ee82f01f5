#!/usr/bin/env bash
# The benchmark peers' Python environment (`make peers`): a virtual environment with the pinned
# PyTorch 2 and DeepSpeed of bench/peers/requirements.txt, for the benches that run DeepSpeed
# or a current PyTorch beside Troupe. Troupe's own build, tests and CI never call this: they
# keep to Debian's packages.
#
#   bench/peers/setup.sh            create the environment, or reuse it; says which
#   bench/peers/setup.sh --python   the same, then prints only its python's path on stdout
#
# Where: $TROUPE_PEERS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/troupe/peers, outside the build
# tree so `make clean` keeps the gigabytes. A stamp file holds the hash of requirements.txt
# and the interpreter's version; a second run with the same pins reuses the environment, a
# run with other pins creates it anew.
#
# Exit status: 0 ready; 3 the peers cannot be had (no network to the package index, or the
# install failed): one line on stderr says why, and the benches skip the peer; 2 bad usage.
# DS_BUILD_OPS=0: DeepSpeed builds no C++/CUDA op at install; its CPU ops (cpu_adam, ...) are
# JIT-built with ninja at first use.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
dir=${TROUPE_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/troupe/peers}
venv=$dir/venv
py=${PYTHON:-python3}
quiet=0
case ${1:-} in
    --python) quiet=1 ;;
    "") ;;
    *) echo "usage: setup.sh [--python]" >&2; exit 2 ;;
esac
say() { [ "$quiet" -eq 1 ] && echo "$@" >&2 || echo "$@"; }
skip() { echo "peers: skipped: $*" >&2; exit 3; }

command -v "$py" > /dev/null || skip "no $py to create the environment with"
want="$(sha256sum < "$req" | cut -d' ' -f1) $("$py" -c 'import sys; print(sys.version.split()[0])')"
if [ -x "$venv/bin/python" ] && [ "$(cat "$dir/stamp" 2> /dev/null)" = "$want" ]; then
    say "peers: ready: $venv ($(grep -E '^(torch|deepspeed)==' "$req" | tr '\n' ' ')reused)"
    [ "$quiet" -eq 1 ] && echo "$venv/bin/python"
    exit 0
fi

index=${PIP_INDEX_URL:-https://pypi.org/simple}
why=$("$py" - "$index" 2>&1 << 'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/deepspeed/", timeout=15).read(1)
except Exception as e:
    sys.exit(str(getattr(e, "reason", e)))
PY
) || skip "cannot reach the package index $index ($why); DeepSpeed and PyTorch 2 are not installed"

say "peers: creating $venv (torch and deepspeed as pinned in bench/peers/requirements.txt;" \
    "PyPI's torch brings the CUDA libraries: about 5.4 GB, and 5 to 15 minutes)"
rm -rf "$venv" "$dir/stamp"
mkdir -p "$dir"
t0=$(date +%s)
log=$dir/install.log
if ! "$py" -m venv "$venv" > "$log" 2>&1 ||
    ! DS_BUILD_OPS=0 "$venv/bin/pip" install --no-cache-dir --disable-pip-version-check \
        -r "$req" >> "$log" 2>&1; then
    rm -rf "$venv"
    skip "pip install failed ($(grep -E 'ERROR' "$log" | head -1 | cut -c1-160)); log: $log"
fi
if ! DS_ACCELERATOR=cpu "$venv/bin/python" -c 'import torch, deepspeed' >> "$log" 2>&1; then
    rm -rf "$venv"
    skip "the installed deepspeed does not import ($(tail -1 "$log" | cut -c1-160)); log: $log"
fi
# DeepSpeed's CPU ops are JIT-built at first use (minutes on a small machine): build the ones
# the benches load now, into torch's extension cache (~/.cache/torch_extensions), so no bench
# times a compiler. A failure here is not fatal: the first use builds them, or says why.
say "peers: building DeepSpeed's CPU ops (deepspeed_shm_comm, fused_adam, cpu_adam, async_io," \
    "pin_memory: NVMe offload, libaio-dev) with ninja"
PATH="$venv/bin:$PATH" DS_ACCELERATOR=cpu "$venv/bin/python" - >> "$log" 2>&1 << 'PY' || say "peers: warning: the CPU ops did not build now (log: $log); their first use will"
from deepspeed.accelerator import get_accelerator
for name in ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder"):
    get_accelerator().create_op_builder(name).load()
PY
echo "$want" > "$dir/stamp"
say "peers: ready: $venv ($(grep -E '^(torch|deepspeed)==' "$req" | tr '\n' ' ')" \
    "installed in $(($(date +%s) - t0)) s, $(du -sh "$venv" | cut -f1) on disk)"
[ "$quiet" -eq 1 ] && echo "$venv/bin/python"
exit 0
