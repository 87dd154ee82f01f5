#!/usr/bin/env bash
# The aio engine against fio (`make bench-nvme`), both in one run so the ratios compare figures
# taken side by side on the same file system, minutes apart at most.
#
#   bench/nvme/run.sh BUILD_DIR [--dir DIR] [--io-size N] [--block_size N] [--queue_depth N]
#                               [--intra_op_parallelism N] [--single_submit 0|1]
#                               [--overlap_events 0|1] [--reps R]
#
# Ours: `troupe nvme-bench` (tools/cmd_nvme_bench.c) writes N bytes into a fresh file under DIR
# with one request of the aio engine (libaio, O_DIRECT), then reads them back with one request,
# each pass timed alone; the request is cut into intra_op_parallelism equal slices, one I/O
# thread each, each slice into block_size iocbs with queue_depth in flight.
# fio does the same work: a fresh file under DIR, ioengine=libaio, direct=1, the same block size
# (bs), queue depth (iodepth) and numjobs = intra_op_parallelism, job i moving bytes
# [i*N/P, (i+1)*N/P) (offset_increment), a sequential write pass then a read pass of the same
# file. fallocate=none, because nvme-bench does not preallocate: both write into an empty file
# that grows (on ext4 that matters: writes past the end of the file are not the same work as
# writes into allocated blocks). The engine's batching maps onto fio's: single_submit 1 (one
# io_submit per iocb) is iodepth_batch_submit=1, single_submit 0 (one per batch) is
# iodepth_batch_submit=Q; overlap_events 1 (refill after every io_getevents with min 1) is
# iodepth_batch_complete_min=1, overlap_events 0 (reap a whole batch) is =Q.
#
# Each repetition runs both, alternating which goes first (ours then fio, then fio then ours,
# ...), after one unrecorded warm-up of each; the figures are the medians over the repetitions,
# GB/s = 1e9 bytes per second (fio: bw_bytes of its group report, from --output-format=json).
# Ratios are ours over fio's. The device under DIR is reported (findmnt, lsblk, the block
# driver): figures taken on anything but an NVMe drive say so.
#
# Defaults: DIR = BUILD_DIR/bench-nvme (created and removed), N = 1G, block_size 1M,
# queue_depth 8, intra_op_parallelism 1, single_submit 0, overlap_events 1 (the config's `aio`
# defaults), 5 repetitions.
# Sizes take a K, M or G suffix (powers of 1024). fio is installed with scripts/install-deps.sh
# when missing (Debian's package).
set -euo pipefail
usage="usage: run.sh BUILD_DIR [--dir DIR] [--io-size N] [--block_size N] [--queue_depth N] [--intra_op_parallelism N] [--single_submit 0|1] [--overlap_events 0|1] [--reps R]"
build=$(cd "${1:?$usage}" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
dir="" io_size=1G bs=1M qd=8 par=1 single=0 overlap=1 reps=5
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
    case $1 in
        --dir) dir=$2 ;;
        --io-size) io_size=$2 ;;
        --block_size) bs=$2 ;;
        --queue_depth) qd=$2 ;;
        --intra_op_parallelism) par=$2 ;;
        --single_submit) single=$2 ;;
        --overlap_events) overlap=$2 ;;
        --reps) reps=$2 ;;
        *) echo "run.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
    esac
    shift 2
done

# A size with an optional K/M/G suffix (powers of 1024), in bytes.
bytes() {
    local flag=$1 s=$2
    [[ $s =~ ^([0-9]+)([KMG]?)$ ]] || { echo "run.sh: $flag: expected a size like 256M, got '$s'" >&2; exit 2; }
    local v=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in K) v=$((v << 10)) ;; M) v=$((v << 20)) ;; G) v=$((v << 30)) ;; esac
    echo "$v"
}
n=$(bytes --io-size "$io_size")
bsb=$(bytes --block_size "$bs")
[[ $qd =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --queue_depth: expected a positive integer, got '$qd'" >&2; exit 2; }
[[ $par =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --intra_op_parallelism: expected a positive integer, got '$par'" >&2; exit 2; }
[[ $single =~ ^[01]$ ]] || { echo "run.sh: --single_submit: expected 0 or 1, got '$single'" >&2; exit 2; }
[[ $overlap =~ ^[01]$ ]] || { echo "run.sh: --overlap_events: expected 0 or 1, got '$overlap'" >&2; exit 2; }
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --reps: expected a positive integer, got '$reps'" >&2; exit 2; }
slice=$((n / par))
if [ $((slice * par)) -ne "$n" ] || [ "$bsb" -eq 0 ] || [ $((slice % bsb)) -ne 0 ]; then
    echo "run.sh: --io-size $n bytes must divide into $par slices that are whole multiples of" \
         "--block_size $bsb bytes, so both tools issue the same requests" >&2
    exit 2
fi

troupe=$build/troupe
[ -x "$troupe" ] || { echo "run.sh: $troupe is not built (make build)" >&2; exit 1; }
# nvme-bench's --single_submit is a bare switch in some builds and takes 0|1 in others.
if "$troupe" nvme-bench --help | grep -q -- '--single_submit 0|1'; then
    single_flag=(--single_submit "$single")
elif [ "$single" -eq 1 ]; then single_flag=(--single_submit)
else single_flag=()
fi
fio_batch=(--iodepth_batch_submit=$((single ? 1 : qd)) --iodepth_batch_complete_min=$((overlap ? 1 : qd)))
command -v fio >/dev/null || "$here/../../scripts/install-deps.sh" fio
command -v fio >/dev/null || { echo "run.sh: fio is not installed and could not be" >&2; exit 1; }

made_dir=0
if [ -z "$dir" ]; then
    dir=$build/bench-nvme
    [ -d "$dir" ] || made_dir=1
    mkdir -p "$dir"
fi
[ -d "$dir" ] && [ -w "$dir" ] || { echo "run.sh: --dir $dir: expected a writable directory" >&2; exit 2; }
dir=$(cd "$dir" && pwd)
avail=$(df -B1 --output=avail "$dir" | tail -1 | tr -d ' ')
if [ "$avail" -lt $((n + (1 << 30))) ]; then
    echo "run.sh: $dir has $avail bytes free; the benchmark needs --io-size ($n) plus 1 GiB" >&2
    exit 1
fi
tmp=$(mktemp -d /tmp/troupe-bench-nvme.XXXXXX)
fiofile=$dir/fio_nvme_bench.$$
cleanup() {
    rm -rf "$tmp"
    rm -f "$fiofile"
    [ "$made_dir" -eq 0 ] || rmdir "$dir" 2>/dev/null || true
}
trap cleanup EXIT

# What lies under DIR: file system, block device, its driver, and whether it is NVMe.
describe_device() {
    local src fstype disk tran model driver rota kind
    read -r src fstype < <(findmnt -n -o SOURCE,FSTYPE -T "$dir")
    echo "nvme.filesystem: $fstype on $src (findmnt -T $dir)"
    if [ ! -b "$src" ]; then
        echo "nvme.device: $src is not a block device: not an NVMe drive; the figures are $fstype's"
        return
    fi
    disk=$(lsblk -ndo PKNAME "$src" 2>/dev/null | head -1)
    [ -n "$disk" ] || disk=$(basename "$(readlink -f "$src")")
    tran=$(lsblk -ndo TRAN "/dev/$disk" 2>/dev/null | tr -d ' ')
    model=$(lsblk -ndo MODEL "/dev/$disk" 2>/dev/null | sed 's/ *$//')
    rota=$(lsblk -ndo ROTA "/dev/$disk" 2>/dev/null | tr -d ' ')
    driver=$(basename "$(readlink -f "/sys/block/$disk/device/driver" 2>/dev/null)" 2>/dev/null || true)
    if [[ $disk == nvme* || $tran == nvme ]]; then kind="an NVMe drive"
    elif [ "$driver" = virtio_blk ]; then
        kind="NOT an NVMe drive: a virtio block device (a virtual machine's disk; the host's storage and cache lie behind it)"
    else kind="NOT an NVMe drive (transport '${tran:-none}')"
    fi
    echo "nvme.device: /dev/$disk, driver ${driver:-unknown}, model '${model:-none}', rotational $rota, $(lsblk -ndo SIZE "/dev/$disk" | tr -d ' '): $kind"
}

# ours: appends "write read" (GB/s) to $tmp/ours.
ours() {
    local out
    out=$("$troupe" nvme-bench --dir "$dir" --io-size "$n" --block_size "$bsb" \
        --queue_depth "$qd" --intra_op_parallelism "$par" "${single_flag[@]}" \
        --overlap_events "$overlap") || { echo "run.sh: troupe nvme-bench failed" >&2; exit 1; }
    local w r
    w=$(awk '$1 == "nvme.write:" { print $2 }' <<< "$out")
    r=$(awk '$1 == "nvme.read:" { print $2 }' <<< "$out")
    [ -n "$w" ] && [ -n "$r" ] || { echo "run.sh: no nvme.write/nvme.read in troupe's output:" >&2; echo "$out" >&2; exit 1; }
    echo "$w $r" >> "$tmp/ours"
}

# One fio pass (write|read) over $fiofile; prints GB/s.
fio_pass() {
    local rw=$1 json=$tmp/fio_$1.json
    fio --name="troupe_$rw" --filename="$fiofile" --rw="$rw" --bs="$bsb" --iodepth="$qd" \
        --numjobs="$par" --size="$slice" --offset_increment="$slice" --ioengine=libaio \
        --direct=1 --fallocate=none "${fio_batch[@]}" --thread --group_reporting \
        --output-format=json --output="$json" > "$tmp/fio.log" 2>&1 \
        || { echo "run.sh: fio --rw=$rw failed:" >&2; cat "$tmp/fio.log" "$json" >&2; exit 1; }
    python3 - "$json" "$rw" "$n" <<'PY'
import json, sys
path, rw, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
jobs = json.load(open(path))["jobs"]
if len(jobs) != 1 or jobs[0].get("error"):
    sys.exit(f"run.sh: {path}: expected one group report without error, got {len(jobs)} job(s)")
r = jobs[0][rw]
if r["io_bytes"] != n:
    sys.exit(f"run.sh: {path}: fio moved {r['io_bytes']} bytes, expected {n}")
print(f"{r['bw_bytes'] / 1e9:.3f}")
PY
}

# theirs: a fresh file written then read, then removed; appends "write read" to $tmp/fio.
theirs() {
    rm -f "$fiofile"
    local w r
    w=$(fio_pass write) && r=$(fio_pass read) || exit 1
    rm -f "$fiofile"
    echo "$w $r" >> "$tmp/fio"
}

# Median of column $2 of file $1.
median() {
    awk -v c="$2" '{ print $c }' "$1" | sort -g |
        awk '{ v[NR] = $1 } END { printf "%.3f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM, Linux $(uname -r)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "load_average_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
describe_device
echo "nvme.workload: $n bytes written then read in one fresh file, block_size $bsb, queue_depth $qd," \
     "intra_op_parallelism $par (fio numjobs), single_submit $single, overlap_events $overlap" \
     "(fio ${fio_batch[*]}), O_DIRECT; $reps repetitions after 1 warm-up, medians"
echo "fio: $(fio --version)"

ours; theirs
rm -f "$tmp/ours" "$tmp/fio"
for ((i = 1; i <= reps; i++)); do
    if ((i % 2)); then ours; theirs; else theirs; ours; fi
    read -r ow or_ < <(tail -1 "$tmp/ours")
    read -r fw fr < <(tail -1 "$tmp/fio")
    echo "rep $i: troupe write $ow read $or_ GB/s; fio write $fw read $fr GB/s"
done

ow=$(median "$tmp/ours" 1) or_=$(median "$tmp/ours" 2)
fw=$(median "$tmp/fio" 1) fr=$(median "$tmp/fio" 2)
echo "nvme.write: $ow GB/s"
echo "nvme.read: $or_ GB/s"
echo "fio.write: $fw GB/s"
echo "fio.read: $fr GB/s"
awk -v a="$ow" -v b="$fw" 'BEGIN { printf "nvme.write.fio_ratio: %.3f\n", a / b }'
awk -v a="$or_" -v b="$fr" 'BEGIN { printf "nvme.read.fio_ratio: %.3f\n", a / b }'
echo "nvme.target: fio_ratio >= 0.90 for both"
echo "nvme.gpt2_offload_step: not built (the NVMe swapper of issue 12 does not exist yet; nothing measured)"
