#!/bin/sh
# stage_times.sh - the table `make test` prints at its end: each stage's
# wall time and when it started, from the files the Makefile's stage_begin
# and stage_end write (STAGE.begin, STAGE.end: seconds since the epoch) into
# DIR, whose `start` is make test's own start. Stages ran side by side, so
# their times add up to more than the total.
# usage: stage_times.sh DIR
dir=$1
[ -f "$dir/start" ] || exit 0
t0=$(cat "$dir/start")
now=$(date +%s.%N)
echo
echo "make test: the stages' wall times (side by side: JOBS at a time)"
printf '%-22s %9s %9s  %s\n' stage "start s" "time s" ""
for b in "$dir"/*.begin; do
  [ -e "$b" ] || continue
  name=$(basename "$b" .begin)
  begin=$(cat "$b")
  if [ -f "$dir/$name.end" ]; then
    end=$(cat "$dir/$name.end") note=""
  else
    end=$now note="(did not finish)"
  fi
  awk -v n="$name" -v t0="$t0" -v b="$begin" -v e="$end" -v note="$note" \
    'BEGIN { printf "%-22s %9.0f %9.0f  %s\n", n, b - t0, e - b, note }'
done | sort -k2 -n
awk -v t0="$t0" -v e="$now" 'BEGIN { printf "%-22s %9s %9.0f\n", "total", "", e - t0 }'
