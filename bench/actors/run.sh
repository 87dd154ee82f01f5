#!/usr/bin/env bash
# run.sh BUILD_DIR [--reps N] [--only NAME] [--workers N]
#
# Runs Troupe's actor benchmarks (BUILD_DIR/bench/actors/troupe_actors) and, when it was
# built (-DTR_BENCH_PEERS=ON), the CAF peer (BUILD_DIR/bench/peers/caf/savina_caf) with the
# same arguments, alternating benchmark by benchmark, then prints:
#   - one table: name, troupe, caf, unit, caf/troupe, target, met;
#   - machine-readable lines: `NAME: V UNIT` (Troupe), `caf.NAME: V UNIT`, `ratio.NAME: R x`.
# caf/troupe compares times, so > 1 means Troupe is faster; for rates (Mmsg/s) it is
# troupe/caf, the same meaning. Exits 1 if either program reported a wrong result.
set -uo pipefail

build=${1:?usage: run.sh BUILD_DIR [--reps N] [--only NAME] [--workers N]}
shift
troupe="$build/bench/actors/troupe_actors"
caf="$build/bench/peers/caf/savina_caf"
[[ -x $troupe ]] || { echo "run.sh: $troupe not built" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
     "$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
"$troupe" --only none "$@" | grep '^#'
[[ -x $caf ]] && "$caf" --only none "$@" | grep '^#'
[[ -x $caf ]] || echo "# no CAF peer: configure with -DTR_BENCH_PEERS=ON (make bench-actors does)"
: >"$tmp/troupe"
: >"$tmp/caf"

# One benchmark group at a time, Troupe then CAF, so that both sides of a comparison run
# close together in time even when the machine's load drifts. An explicit --only is passed
# through as it is.
groups=(pingpong counting threadring chameneos big fjthrput fib skynet fanin latency idle_cpu)
[[ " $* " == *" --only "* ]] && groups=("")
for g in "${groups[@]}"; do
    only=()
    [[ -n $g ]] && only=(--only "$g")
    "$troupe" "$@" "${only[@]}" | grep -v '^#' | tee -a "$tmp/troupe" || status=1
    if [[ -x $caf ]]; then
        "$caf" "$@" "${only[@]}" | grep -v '^#' | sed 's/^/caf./' | tee -a "$tmp/caf" || status=1
    fi
done
sed -i 's/^caf\.//' "$tmp/caf"
echo

awk '
    # Targets of issue #2; every benchmark with a peer must also beat it (caf/troupe > 1),
    # so "met" needs both the bound and the ratio.
    BEGIN {
        bound["skynet"] = "< 300 ms";  lim["skynet"] = 300;  dir["skynet"] = -1
        bound["idle_cpu"] = "< 1 %";   lim["idle_cpu"] = 1;  dir["idle_cpu"] = -1
        bound["latency_p99"] = "< 50 us"; lim["latency_p99"] = 50; dir["latency_p99"] = -1
        for (p = 1; p <= 8; p *= 2) {
            n = "fanin_" p; bound[n] = ">= 5 Mmsg/s"; lim[n] = 5; dir[n] = 1
        }
    }
    /^#/ || !/: / { next }
    FNR == NR { name = $1; sub(/:$/, "", name); order[++n_names] = name
                troupe[name] = $2; unit[name] = $3; next }
    { name = $1; sub(/:$/, "", name); caf[name] = $2 }
    END {
        printf "%-14s %12s %12s %-7s %11s %13s %s\n", "name", "troupe", "caf", "unit",
               "caf/troupe", "target", "met"
        for (i = 1; i <= n_names; i++) {
            nm = order[i]; t = troupe[nm]; u = unit[nm]
            c = (nm in caf) ? caf[nm] : ""
            r = ""
            if (c != "" && t > 0 && c > 0)
                r = (u == "Mmsg/s") ? t / c : c / t
            target = (nm in bound) ? bound[nm] : (r != "" ? "beat CAF" : "")
            has = 0; ok = 1
            if (nm in bound) {
                has = 1
                if (!(dir[nm] < 0 ? t < lim[nm] : t >= lim[nm])) ok = 0
            }
            if (r != "") { has = 1; if (r <= 1) ok = 0 }
            met = has ? (ok ? "yes" : "NO") : ""
            printf "%-14s %12.3f %12s %-7s %11s %13s %s\n", nm, t,
                   c == "" ? "-" : sprintf("%.3f", c), u,
                   r == "" ? "-" : sprintf("%.2f", r), target, met
            lines = lines sprintf("%s: %s %s\n", nm, t, u)
            if (c != "") lines = lines sprintf("caf.%s: %s %s\n", nm, c, u)
            if (r != "") lines = lines sprintf("ratio.%s: %.3f x\n", nm, r)
        }
        printf "\n%s", lines
    }
' "$tmp/troupe" "$tmp/caf"
exit $status
