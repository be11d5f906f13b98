#!/usr/bin/env bash
# Installs the build to a temporary prefix (not the configured one), then
# builds the README's C example against it twice, with find_package(eccl)
# and with pkg-config (after moving the prefix: both must be relocatable),
# and runs each under the installed eccl-run; the installed ecclcoord and a
# perf program must run too.
#   install_test.sh BUILD_DIR SOURCE_DIR
# CONSUMER_FLAGS (sanitizer builds): compile and link flags for the
# consumers, so they load the same sanitizer runtime as the library.
set -euo pipefail
flags=${CONSUMER_FLAGS:-}
consumer_cc=${CONSUMER_CC:-cc}  # the build's own C compiler: a sanitizer runtime is the compiler's
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The README's example, exactly as the README shows it.
awk '/^## Use it from C/{f=1} f&&/^```c$/{g=1;next} g&&/^```$/{exit} g' "$src/README.md" > "$work/example.c"
grep -q ecclAllReduce "$work/example.c" || { echo "FAIL: no C example found in README.md"; exit 1; }

check_run() {  # check_run PREFIX PROGRAM
  local out
  out=$(ECCL_SOCKET_IFNAME=lo "$1/bin/eccl-run" -np 2 --timeout 60 "$2")
  echo "$out"
  grep -q '^\[0\] rank 0 of 2: v\[3\] = 1$' <<<"$out" && grep -q '^\[1\] rank 1 of 2: v\[3\] = 1$' <<<"$out" ||
    { echo "FAIL: unexpected output from $2"; exit 1; }
}

mkdir "$work/cmake-consumer"
cat > "$work/cmake-consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(eccl 0.1 REQUIRED)
add_executable(example ../example.c)
target_link_libraries(example PRIVATE eccl::eccl)
set_target_properties(example PROPERTIES C_STANDARD 99 BUILD_RPATH "${eccl_DIR}/../..")
CM
cmake -S "$work/cmake-consumer" -B "$work/cmake-consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_C_COMPILER="$consumer_cc" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$work/cmake-consumer/build" >/dev/null
echo "find_package(eccl):"
check_run "$work/prefix" "$work/cmake-consumer/build/example"

mv "$work/prefix" "$work/moved"
pc=$(find "$work/moved" -name eccl.pc)
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir eccl)
[ -f "$libdir/libeccl.so" ] || { echo "FAIL: eccl.pc's libdir $libdir has no libeccl.so"; exit 1; }
# shellcheck disable=SC2046
"$consumer_cc" -std=c99 $flags "$work/example.c" -o "$work/example-pc" $(pkg-config --cflags --libs eccl) -Wl,-rpath,"$libdir"
echo "pkg-config (prefix moved after install):"
check_run "$work/moved" "$work/example-pc"

"$work/moved/bin/ecclcoord" --help >/dev/null
ECCL_SOCKET_IFNAME=lo "$work/moved/bin/eccl-run" -np 2 --timeout 60 "$work/moved/bin/all_reduce_perf" -b 8 -e 64 -n 2 -w 1 -c 1 |
  grep -q "Out of bounds values : 0 OK" || { echo "FAIL: installed all_reduce_perf"; exit 1; }
echo "install: ok"
