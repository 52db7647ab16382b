#!/usr/bin/env bash
# test_train_cli.sh - rmsnorm-train from the user's side: bad arguments exit
# 2 and bad data exit 1, each with a message naming the problem and without
# output files; a short run of all four norms on real text (the licence
# texts every Debian system ships in /usr/share/common-licenses, package
# base-files) writes the CSVs it promises, and every run's validation loss
# falls well below the uniform guess ln 256 = 5.545 nats.
# Usage: test_train_cli.sh PATH/TO/rmsnorm-train   (exit 77: skipped)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checks=0
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect STATUS PATTERN ARGS...: exit status and a stderr line matching PATTERN
expect() {
  local want=$1 pattern=$2
  shift 2
  checks=$((checks + 1))
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    fail "rmsnorm-train $*: exit $got, want $want ($(head -c 300 "$tmp/err"))"
  elif ! grep -q -- "$pattern" "$tmp/err"; then
    fail "rmsnorm-train $*: stderr lacks '$pattern': $(head -c 300 "$tmp/err")"
  fi
}

licenses=/usr/share/common-licenses
data="$licenses/GPL-3,$licenses/GPL-2,$licenses/LGPL-2.1,$licenses/Apache-2.0"

# ---- bad arguments: exit 2, nothing written
expect 2 "out DIR is required" --norm rms
expect 2 "--norm: expected none, layer, rms, prms or all, got 'bogus'" --norm bogus --out "$tmp/x"
expect 2 "--norm: expected each norm once" --norm rms,rms --out "$tmp/x"
expect 2 "--layers: expected an integer in 1..256, got '0'" --layers 0 --out "$tmp/x"
expect 2 "--steps: expected an integer" --steps 12abc --out "$tmp/x"
expect 2 "--heads 3 does not divide --dim 128" --heads 3 --out "$tmp/x"
expect 2 "--lr: expected a number" --lr fast --out "$tmp/x"
expect 2 "--partial: expected a fraction in (0, 1]" --partial 0 --out "$tmp/x"
expect 2 "unknown option '--depth'" --depth 3 --out "$tmp/x"
expect 2 "--seed needs a value" --out "$tmp/x" --seed
expect 2 "--seed: expected a list" --seed 1,,2 --out "$tmp/x"
checks=$((checks + 1))
[ -e "$tmp/x" ] && fail "bad arguments created the output folder"

# ---- bad data: exit 1, the file named
expect 1 "$tmp/missing.txt: No such file or directory" --data "$tmp/missing.txt" --out "$tmp/x"
: >"$tmp/empty.txt"
expect 1 "$tmp/empty.txt: empty file" --data "$tmp/empty.txt" --out "$tmp/x"
printf 'too short to train on\n' >"$tmp/short.txt"
expect 1 "$tmp/short.txt: too little text" --data "$tmp/short.txt" --out "$tmp/x"
checks=$((checks + 1))
[ -e "$tmp/x" ] && fail "bad data created the output folder"

if [ ! -r "$licenses/GPL-3" ]; then
  echo "test_train_cli: $checks checks, $((checks - failures)) passed, $failures failed"
  echo "skipped the training run: no $licenses (not a Debian system)"
  [ "$failures" = 0 ] && exit 77
  exit 1
fi

# ---- a short run of every norm, two seeds
out="$tmp/run"
checks=$((checks + 1))
if ! "$bin" --norm all --seed 1,2 --layers 2 --dim 64 --heads 4 --seq 64 --batch 8 \
  --steps 60 --lr 3e-3 --eval-every 20 --eval-batches 4 --threads 2 --data "$data" \
  --out "$out" >"$tmp/table" 2>"$tmp/err"; then
  fail "training run failed: $(cat "$tmp/err")"
fi
cat "$tmp/table"

checks=$((checks + 1))
header=$(head -n 1 "$out/summary.csv" 2>/dev/null)
case $header in
norm,layers,final_val_loss,ms_per_step,norm_ms_per_step,diverged,*) ;;
*) fail "summary.csv header: '$header'" ;;
esac
checks=$((checks + 1))
[ "$(tail -n +2 "$out/summary.csv" | cut -d, -f1 | tr '\n' ' ')" = "none layer rms prms " ] ||
  fail "summary.csv rows: $(cat "$out/summary.csv")"
checks=$((checks + 1))
[ "$(tail -n +2 "$out/runs.csv" | wc -l)" = 8 ] || fail "runs.csv: want 8 runs: $(cat "$out/runs.csv")"
checks=$((checks + 1))
ls "$out"/*.tmp >/dev/null 2>&1 && fail "temporary files left in $out"

for norm in none layer rms prms; do
  for seed in 1 2; do
    f="$out/$norm-L2-s$seed.csv"
    checks=$((checks + 1))
    if [ ! -s "$f" ]; then
      fail "$f missing"
      continue
    fi
    # step 0: the initial validation loss, near ln 256; step 60: well below it
    verdict=$(awk -F, '
      NR == 1 { if ($0 != "step,train_loss,val_loss,ms_per_step,norm_ms,wall_ms,cpu_ms,norm_cpu_ms") { print "header " $0; exit } next }
      { rows++ }
      $1 == 0 { v0 = $3 }
      $1 == 60 { v60 = $3; t60 = $2 }
      $1 > 0 && ($2 == "" || $4 <= 0 || $6 < prev) { print "bad row " $0; exit }
      { prev = $6 }
      END {
        if (rows != 61) print "rows " rows
        else if (v0 < 5.3 || v0 > 5.8) print "initial val loss " v0
        else if (v60 > 3.6) print "final val loss " v60 " (from " v0 ")"
        else print "ok"
      }' "$f")
    [ "$verdict" = ok ] || fail "$f: $verdict"
  done
done
awk -F, 'NR > 1 && $6 != 0 { bad = 1 } END { exit bad }' "$out/summary.csv" ||
  fail "a run diverged: $(cat "$out/summary.csv")"
checks=$((checks + 1))

# ---- a run does not depend on the runs beside it or on when it is evaluated:
# RMSNorm alone, evaluated every step, and beside none and LayerNorm,
# evaluated every 5th, train on the same batches to the same losses
small="--layers 1 --dim 32 --heads 2 --seq 32 --batch 4 --steps 12 --eval-batches 2 --data $data --quiet"
checks=$((checks + 1))
if "$bin" $small --norm rms --eval-every 1 --out "$tmp/alone" >/dev/null 2>"$tmp/err" &&
  "$bin" $small --norm none,layer,rms --eval-every 5 --out "$tmp/beside" >/dev/null 2>>"$tmp/err"; then
  cut -d, -f1,2 "$tmp/alone/rms-L1-s1.csv" >"$tmp/alone.txt"
  cut -d, -f1,2 "$tmp/beside/rms-L1-s1.csv" >"$tmp/beside.txt"
  cmp -s "$tmp/alone.txt" "$tmp/beside.txt" ||
    fail "RMSNorm's training losses change with the runs beside it: $(diff "$tmp/alone.txt" "$tmp/beside.txt" | head -5)"
else
  fail "small runs failed: $(cat "$tmp/err")"
fi

echo "test_train_cli: $checks checks, $((checks - failures)) passed, $failures failed"
[ "$failures" = 0 ]
