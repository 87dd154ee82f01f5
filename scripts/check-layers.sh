#!/usr/bin/env bash
# check-layers.sh: holds every #include of the library and its programs against the dependency
# table in docs/architecture.md, the one place where the allowed folder dependencies are written.
#
#   scripts/check-layers.sh [ROOT]     ROOT defaults to this checkout
#
# The table between `<!-- layers:begin -->` and `<!-- layers:end -->` has a row per folder: the
# folder, then the folders (or single headers) its files may include besides their own folder.
# The table between `<!-- public:begin -->` and `<!-- public:end -->` gives each public header
# (include/troupe/*.h) the folder it belongs to, so `#include "troupe/model.h"` counts as an
# arrow to model/. A file belongs to the longest folder row its path starts with. tests/ is not
# checked: a test may include what it tests. Exits 1 on the first pass that finds any include
# outside the table, naming each, and 2 when the table itself cannot be read.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
doc="$root/docs/architecture.md"
[ -f "$doc" ] || { echo "check-layers: $doc: no such file (the dependency table lives there)" >&2; exit 2; }
cd "$root"

files=$(git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.def' 2>/dev/null | grep -v '^tests/' || true)
[ -n "$files" ] || files=$(find . -name '*.[ch]' -not -path './tests/*' -not -path './build*' | sed 's#^\./##')

# One line per include: FILE<TAB>KIND<TAB>PATH, KIND "q" for "..." and "a" for <...>.
for f in $files; do
    sed -n -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/q\t\1/p;
               s/^[[:space:]]*#[[:space:]]*include[[:space:]]*<(troupe[^>]*)>.*/a\t\1/p' "$f" |
        while IFS= read -r line; do printf '%s\t%s\n' "$f" "$line"; done
done | awk -F'\t' -v doc="$doc" '
function ticks(s, arr,    n, rest, m) {
    n = 0; rest = s
    while (match(rest, /`[^`]+`/)) {
        arr[++n] = substr(rest, RSTART + 1, RLENGTH - 2)
        rest = substr(rest, RSTART + RLENGTH)
    }
    return n
}
function owner(path,    best, k) {          # the longest folder row that path starts with
    best = ""
    for (k in allow)
        if (substr(path, 1, length(k)) == k && length(k) > length(best)) best = k
    return best
}
function layer_of(inc, src,    dir, p) {     # the folder an include points at, "" if unknown
    if (inc == "troupe.h") return "include/"
    if (inc in public) return public[inc]   # public headers, and generated ones (generated/...)
    if (inc ~ /^troupe\//) return "?public"
    if (exists[inc]) return owner(inc)
    dir = src; sub(/[^\/]*$/, "", dir)
    p = dir inc
    while (p ~ /[^\/]+\/\.\.\//) sub(/[^\/]+\/\.\.\//, "", p)
    if (exists[p]) return owner(p)
    return "?missing"
}
function allowed(from, to,    n, i, a) {
    if (from == to) return 1
    n = split(allow[from], a, " ")
    for (i = 1; i <= n; i++) if (a[i] == to) return 1
    return 0
}
BEGIN {
    while ((getline line < doc) > 0) {
        if (line ~ /<!-- layers:begin -->/) { mode = "layers"; continue }
        if (line ~ /<!-- public:begin -->/) { mode = "public"; continue }
        if (line ~ /<!-- (layers|public):end -->/) { mode = ""; continue }
        if (mode == "" || line !~ /^\|/ || line ~ /^\|[ -]*\|/) continue
        split(line, c, "|")
        if (ticks(c[2], key) != 1) continue
        if (mode == "layers") {
            nrows++
            n = ticks(c[3], tgt)
            s = ""
            for (i = 1; i <= n; i++) s = s " " tgt[i]
            allow[key[1]] = s
        } else {
            npub++
            n = ticks(c[3], tgt)
            if (n != 1) { printf "check-layers: %s: public header %s names %d folders, expected 1\n", doc, key[1], n > "/dev/stderr"; bad_table = 1 }
            name = key[1]
            sub(/^(include|generated)\//, "", name)
            public[name] = tgt[1]
            if (key[1] ~ /^include\//) pubfile[key[1]] = tgt[1]
        }
    }
    if (!nrows || !npub) { printf "check-layers: %s: no dependency table (layers:begin/end, public:begin/end)\n", doc > "/dev/stderr"; exit 2 }
    if (bad_table) exit 2
    while (("git ls-files 2>/dev/null" | getline f) > 0) exists[f] = 1
}
{
    src = $1; inc = $3
    if (src == "include/troupe.h") next     # the umbrella: every public header
    from = (src in pubfile) ? pubfile[src] : owner(src)
    if (from == "") { printf "%s: no row in the dependency table for this file'"'"'s folder\n", src; fails++; next }
    if (src ~ /^include\// && !(src in pubfile) && src != "include/troupe.h") {
        printf "%s: a public header missing from the public-header table\n", src; fails++; next
    }
    to = layer_of(inc, src)
    if (to == "?public") { printf "%s: includes %s, a public header missing from the public-header table\n", src, inc; fails++; next }
    if (to == "?missing") { printf "%s: includes \"%s\", which is no file of this checkout\n", src, inc; fails++; next }
    if (to == "include/" && allowed(from, "include/")) next
    if (to != "include/" && inc ~ /^troupe/ && allowed(from, "include/") && from !~ /^include/) next
    if (!allowed(from, to) && !allowed(from, inc)) {
        printf "%s: includes %s (%s), which %s may not (docs/architecture.md, dependency table)\n", src, inc, to, from
        fails++
    }
    checked++
}
END {
    if (fails) { printf "check-layers: %d include(s) outside the dependency table\n", fails; exit 1 }
    printf "check-layers: %d includes across the folders of the table, all allowed\n", checked
}'
