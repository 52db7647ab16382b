#!/usr/bin/env bash
# Installs the build into a fresh prefix, then builds the seed example against
# it through pkg-config (shared and static) and through find_package, runs
# each program and checks the numbers it prints.
# usage: check_install.sh BUILD_DIR SOURCE_DIR
# A cross build (tests/CMakeLists.txt sets these) gives the target's compiler
# in CC, its nm in NM, a command that runs the target's programs in
# RMSNORM_TEST_RUN (qemu-aarch64 ...) and its toolchain file in
# RMSNORM_TEST_TOOLCHAIN.
set -euo pipefail
CC=${CC:-cc}
NM=${NM:-nm}
run=${RMSNORM_TEST_RUN:-}
toolchain=()
[ -z "${RMSNORM_TEST_TOOLCHAIN:-}" ] || toolchain=(-DCMAKE_TOOLCHAIN_FILE="$RMSNORM_TEST_TOOLCHAIN"
  -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=BOTH)
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name rmsnorm.pc)")
libdir=$(dirname "$pcdir")
example=$src/examples/seed_example.c

check() { # name, program
  out=$($run "$2")
  for want in 1.870831 1.369310 1.069043 -0.534522 1.603565 0.365147 1.095442 -1.460590 0.730295; do
    grep -q -- "$want" <<<"$out" || { echo "$1: missing $want in:"; echo "$out"; exit 1; }
  done
  echo "$1: ok"
}

export PKG_CONFIG_PATH=$pcdir
"$CC" -std=c11 -Wall -Werror $example $(pkg-config --cflags --libs rmsnorm) -o "$work/pc_shared"
LD_LIBRARY_PATH=$libdir check pkg-config-shared "$work/pc_shared"
"$CC" -std=c11 -Wall -Werror -DRMSNORM_STATIC_DEFINE $example $(pkg-config --cflags rmsnorm) \
  -L"$libdir" -Wl,-Bstatic -lrmsnorm -Wl,-Bdynamic $(pkg-config --libs-only-other --static rmsnorm) -lm \
  -o "$work/pc_static"
check pkg-config-static "$work/pc_static"

cmake -S "$src/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DSEED_EXAMPLE="$example" "${toolchain[@]}" >/dev/null
cmake --build "$work/consumer" >/dev/null
LD_LIBRARY_PATH=$libdir check find_package-shared "$work/consumer/consumer_shared"
check find_package-static "$work/consumer/consumer_static"
# the shared library exports only rmsnorm_ symbols
bad=$("$NM" -D --defined-only "$libdir/librmsnorm.so" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -v '^rmsnorm_' || true)
[ -z "$bad" ] || { echo "non-rmsnorm_ exports: $bad"; exit 1; }
echo "exports: ok"
# librmsnorm_mpi, where it was built, exports only rmsnorm_mpi_ symbols
if [ -e "$libdir/librmsnorm_mpi.so" ]; then
  bad=$("$NM" -D --defined-only "$libdir/librmsnorm_mpi.so" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -v '^rmsnorm_mpi_' || true)
  [ -z "$bad" ] || { echo "non-rmsnorm_mpi_ exports: $bad"; exit 1; }
  echo "mpi exports: ok"
fi
