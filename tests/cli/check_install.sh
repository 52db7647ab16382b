#!/bin/sh
# Installs the build into a fresh prefix and checks that PREFIX/bin/rmsnorm
# is there, runs on its own (no librmsnorm.so needed: it links the static
# library) and prints the worked example.
# usage: check_install.sh BUILD_DIR
# (RMSNORM_TEST_RUN: a command that runs the target's programs, for a cross
# build: qemu-aarch64 ...)
set -eu
run=${RMSNORM_TEST_RUN:-}
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
bin=$work/prefix/bin/rmsnorm
[ -x "$bin" ] || { echo "not installed: $bin"; exit 1; }
if [ -z "$run" ] && command -v ldd >/dev/null 2>&1 && ldd "$bin" | grep -q librmsnorm; then
  echo "$bin needs librmsnorm.so:"; ldd "$bin"; exit 1
fi
out=$(cd / && $run "$bin" demo)
for want in 1.870831 1.369310 1.069043 -0.534522 1.603565 0.365147 1.095442 -1.460590 \
            0.730295 0.848528 1.131371 -1.000000; do
  case $out in *"$want"*) ;; *) echo "installed demo lacks $want:"; echo "$out"; exit 1 ;; esac
done
$run "$bin" --version
echo "cli install: ok"
