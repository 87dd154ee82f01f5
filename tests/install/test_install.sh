#!/usr/bin/env bash
# The installed package works for a user: install libtroupe into two temporary prefixes in a
# row (as `make install PREFIX=...` run twice; the second must land in its own prefix, not in
# the first or the one build/ was configured with), then build the README's example against the
# second with pkg-config (shared library) and with CMake's find_package(troupe), and run both;
# build and run its engine example on the demo's text. Keeps the README's snippets honest. Then
# build examples/embed_mlp with its own Makefile (pkg-config) and run it: it trains, saves,
# reloads. Then examples/custom_model the same way: a user's own layers with float targets,
# trained by both loops with its ds_config.json; its validation MSE falls and reloads the same.
set -euo pipefail
build_dir=$1
src_dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The Makefile's install target when build_dir is its build/ (-o build: install what is built,
# do not rebuild from inside the test run); cmake --install for a build dir of another name.
if [ "$(realpath "$build_dir")" = "$(realpath "$src_dir/build")" ]; then
    install_into() { make -s -C "$src_dir" -o build install PREFIX="$1" >/dev/null; }
    how="make install PREFIX=..."
else
    install_into() { cmake --install "$build_dir" --prefix "$1" >/dev/null; }
    how="cmake --install --prefix ..."
fi
install_into "$tmp/first"
install_into "$tmp/prefix"
for p in first prefix; do
    test -f "$tmp/$p/include/troupe.h" || { echo "install: $how put no troupe.h in $p/include"; exit 1; }
    ls "$tmp"/$p/lib*/libtroupe.so "$tmp"/$p/lib*/pkgconfig/troupe.pc \
       "$tmp"/$p/lib*/cmake/troupe/troupeConfig.cmake >/dev/null
done
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -n1)
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# the .pc is relocatable: it names the second prefix, where it lies
case "$(pkg-config --variable=libdir troupe)" in
"$tmp/prefix/"*) ;;
*) echo "install: troupe.pc's libdir $(pkg-config --variable=libdir troupe) is not under $tmp/prefix"; exit 1 ;;
esac
rm -rf "$tmp/first" # nothing below may use the first prefix

# the first C block of the README is the example
awk '/^```c$/{on=1; next} /^```$/{if(on) exit} on' "$src_dir/README.md" > "$tmp/app.c"
grep -q tr_runtime_init "$tmp/app.c"
sed -i '1a #include <stdio.h>' "$tmp/app.c"

cc -std=c11 -Wall -Wextra -Werror "$tmp/app.c" $(pkg-config --cflags --libs troupe) -o "$tmp/app"
LD_LIBRARY_PATH="$libdir" "$tmp/app" > "$tmp/out.txt"
test "$(grep -c '^ping ' "$tmp/out.txt")" -eq 3

mkdir -p "$tmp/cm"
cp "$tmp/app.c" "$tmp/cm/app.c"
cat > "$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(app C)
find_package(troupe REQUIRED)
add_executable(app app.c)
target_link_libraries(app troupe::troupe)
CM
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cm/build/app" | grep -q '^ping 3 '
# the second C block is the engine embedded in a trainer: run it on the demo's packed text
mkdir -p "$tmp/eng/data"
awk '/^```c$/{n++; on=(n==2); next} /^```$/{if(on) exit; next} on' "$src_dir/README.md" \
    > "$tmp/eng/eng.c"
grep -q tr_engine_train_batch "$tmp/eng/eng.c"
cc -std=c11 -Wall -Wextra -Werror "$tmp/eng/eng.c" $(pkg-config --cflags --libs troupe) \
    -o "$tmp/eng/eng"
# the same trainer linked statically: libtroupe.a and what `pkg-config --static` says it needs
# (Libs.private and Requires.private: MPI, oneDNN, libaio, ...), the archive named so that the
# linker cannot pick the .so; the engine pulls in every part (the comm backends too)
static_libs=$(pkg-config --static --libs troupe | sed "s|-ltroupe|$libdir/libtroupe.a|")
cc -std=c11 -Wall -Wextra -Werror "$tmp/eng/eng.c" $(pkg-config --cflags troupe) $static_libs \
    -o "$tmp/eng/eng_static" ||
    { echo "install: a static link with pkg-config --static --libs troupe failed"; exit 1; }
if ldd "$tmp/eng/eng_static" | grep -q libtroupe; then
    echo "install: the static build still loads libtroupe.so"; exit 1
fi
cp "$build_dir/demo-data/text_train.bin" "$tmp/eng/data/train_000.bin"
cp "$build_dir/demo-data/text_val.bin" "$tmp/eng/data/val_000.bin"
cat > "$tmp/eng/ds_config.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "gradient_clipping": 1.0,
 "troupe": {"runtime": {"workers": 2}}}
JSON
(cd "$tmp/eng" && LD_LIBRARY_PATH="$libdir" ./eng > out.txt 2>&1) || { cat "$tmp/eng/out.txt"; exit 1; }
# from ln 256 = 5.55 at the start; 100 steps of 256 bytes each get well under 4
awk '/^step 100: loss/{ok = $4 + 0 < 4.0 && $6 + 0 < 4.0} END{exit !ok}' "$tmp/eng/out.txt" ||
    { cat "$tmp/eng/out.txt"; exit 1; }
test -f "$tmp/eng/ckpt/latest"
rm -rf "$tmp/eng/ckpt"
(cd "$tmp/eng" && ./eng_static > out_static.txt 2>&1) || { cat "$tmp/eng/out_static.txt"; exit 1; }
cmp <(grep '^step' "$tmp/eng/out.txt") <(grep '^step' "$tmp/eng/out_static.txt") ||
    { echo "install: the static build trained differently"; exit 1; }
cp -r "$src_dir/examples/embed_mlp" "$tmp/embed_mlp"
make -s -C "$tmp/embed_mlp" >/dev/null
(cd "$tmp" && LD_LIBRARY_PATH="$libdir" ./embed_mlp/embed_mlp "$tmp/emb_ckpt" > "$tmp/emb.txt" 2>&1) ||
    { cat "$tmp/emb.txt"; exit 1; }
grep -q '^reloaded: val loss .* (same)$' "$tmp/emb.txt"
test -f "$tmp/emb_ckpt/latest"
cp -r "$src_dir/examples/custom_model" "$tmp/custom_model"
rm -f "$tmp/custom_model/custom_model" # a binary an in-tree `make` may have left
make -s -C "$tmp/custom_model" >/dev/null
(cd "$tmp/custom_model" && LD_LIBRARY_PATH="$libdir" ./custom_model ds_config.json "$tmp/cm_ckpt" \
    > "$tmp/cm.txt" 2>&1) || { cat "$tmp/cm.txt"; exit 1; }
grep -q '^reloaded: val MSE .* (same)$' "$tmp/cm.txt" || { cat "$tmp/cm.txt"; exit 1; }
grep -q '^val MSE .*: ok$' "$tmp/cm.txt" || { cat "$tmp/cm.txt"; exit 1; }
test -f "$tmp/cm_ckpt/latest"
echo "install: $how into two prefixes in a row; the second holds the package"
echo "install: pkg-config and find_package(troupe) builds of the README example ran;"
echo "install: the README's engine example trained, linked shared and static (pkg-config --static): $(grep '^step 100' "$tmp/eng/out.txt")"
echo "install: examples/embed_mlp built with pkg-config, trained, saved and reloaded"
echo "install: examples/custom_model built with its Makefile: $(grep '^val MSE' "$tmp/cm.txt")"
