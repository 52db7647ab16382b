#!/bin/sh
# valgrind_corpus.sh - the rmsnorm command under valgrind memcheck on every
# input of the fuzz corpus, each read two ways: as a file (mapped) and from a
# pipe (the stream reader), through `forward -o Y --rstd R`. It fails on any
# memcheck error (invalid read or write, use of uninitialised memory, a
# definitely lost block), on an exit other than 0 or 1, and on outputs that
# disagree with the exit (1 must leave no output) or temporaries left behind.
# usage: valgrind_corpus.sh RMSNORM_BINARY CORPUS_DIR [JOBS]
#        (runs JOBS inputs at a time, default 2)
set -eu

# one input: valgrind_corpus.sh --one RMSNORM_BINARY INPUT
if [ "${1:-}" = "--one" ]; then
  bin=$2 input=$3
  work=$(mktemp -d "${TMPDIR:-/tmp}/rmsnorm-vg.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  status=0
  for how in file pipe; do
    rm -f "$work/y.npy" "$work/r.npy"
    set -- valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
      --show-leak-kinds=definite --log-file="$work/vg.log"
    if [ "$how" = file ]; then
      rc=0
      "$@" "$bin" forward "$input" -o "$work/y.npy" --rstd "$work/r.npy" \
        >"$work/out" 2>"$work/err" || rc=$?
    else
      rc=0
      cat "$input" | "$@" "$bin" forward /dev/stdin -o "$work/y.npy" --rstd "$work/r.npy" \
        >"$work/out" 2>"$work/err" || rc=$?
    fi
    problem=
    case $rc in
      0) [ -f "$work/y.npy" ] && [ -f "$work/r.npy" ] || problem="exit 0 without both outputs" ;;
      1) [ ! -e "$work/y.npy" ] && [ ! -e "$work/r.npy" ] || problem="exit 1 left an output" ;;
      99) problem="memcheck errors" ;;
      *) problem="exit $rc" ;;
    esac
    leftover=$(cd "$work" && ls -A | grep '^\.' || true)
    [ -z "$leftover" ] || problem="${problem:+$problem; }temporaries left: $leftover"
    if [ -n "$problem" ]; then
      echo "valgrind_corpus: FAIL: $input ($how): $problem" >&2
      sed 's/^/  stderr: /' "$work/err" >&2
      sed 's/^/  valgrind: /' "$work/vg.log" >&2
      status=1
    fi
  done
  exit $status
fi

if [ $# -lt 2 ]; then
  echo "usage: $0 RMSNORM_BINARY CORPUS_DIR [JOBS]" >&2
  exit 2
fi
bin=$1 corpus=$2 jobs=${3:-2}
case $bin in /*) ;; *) bin=$(pwd)/$bin ;; esac
n=$(ls "$corpus" | wc -l)
echo "valgrind_corpus: $n inputs x (file, pipe) under memcheck, $jobs at a time"
if ls "$corpus"/* | xargs -n 1 -P "$jobs" sh "$0" --one "$bin"; then
  echo "valgrind_corpus: all $n inputs clean"
else
  echo "valgrind_corpus: FAILED (see above)" >&2
  exit 1
fi
