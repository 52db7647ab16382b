#!/usr/bin/env bash
# Plots rmsnorm-train's runs in a folder: validation loss against step (left)
# and against the run's own training time (right), one colour per norm, one
# line per seed (the legend names the first seed's).
# usage: examples/train/plot.sh DIR OUT.png [TITLE]
set -euo pipefail
dir=$1
png=$2
title=${3:-"rmsnorm-train: validation loss"}
shopt -s nullglob
runs=("$dir"/*-L*-s*.csv)
[ ${#runs[@]} -gt 0 ] || { echo "plot.sh: no runs (*-L*-s*.csv) in $dir" >&2; exit 1; }
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

# one file per run with the evaluated steps only: step, val loss, seconds
lo=
for f in "${runs[@]}"; do
  base=$(basename "$f" .csv)
  awk -F, 'NR > 1 && $3 != "" && $3 != "nan" { print $1, $3, $6 / 1000 }' "$f" > "$data/$base.dat"
done
# zoom on the end of training: from the best loss to 1.5 nats above it
read -r lo hi < <(cat "$data"/*.dat | awk 'NR == 1 || $2 < lo { lo = $2 } END { printf "%.3f %.3f\n", lo - 0.05, lo + 1.5 }')

color() {
  case $1 in
  none) echo "#555555" ;;
  layer) echo "#1f77b4" ;;
  rms) echo "#d62728" ;;
  prms) echo "#ff9f1c" ;;
  *) echo "#2ca02c" ;;
  esac
}

# plot clauses for one panel; $1: the x column (1 step, 3 seconds)
clauses() {
  local sep="" seen=" " files=()
  for norm in none layer rms prms; do files+=("$data/$norm"-L*.dat); done
  for f in "$data"/*.dat; do [[ " ${files[*]} " == *" $f "* ]] || files+=("$f"); done
  for f in "${files[@]}"; do
    [ -e "$f" ] || continue
    base=$(basename "$f" .dat)
    norm=${base%%-L*}
    if [[ $seen == *" $norm "* ]]; then t="notitle"; else t="title \"$norm\""; seen="$seen$norm "; fi
    printf '%s"%s" using %s:2 with lines lw 1.6 lc rgb "%s" %s' "$sep" "$f" "$1" "$(color "$norm")" "$t"
    sep=", \\"$'\n'
  done
}

gnuplot <<GP
set terminal pngcairo size 1200,500 font ",11"
set output "$png"
set multiplot layout 1,2 title "$title"
set grid
set key top right
set yrange [$lo:$hi]
set ylabel "validation loss (nats per byte)"
set xlabel "step"
plot $(clauses 1)
set xlabel "training time of the run (s)"
plot $(clauses 3)
unset multiplot
GP
echo "wrote $png"
