#!/usr/bin/env bash
# Plots `rmsnorm bench --csv` output: % of the copy limit per shape for
# fp32 RMSNorm forward and backward, 1 thread and all threads.
# usage: bench/c/plot.sh RESULTS.csv OUT.png (`make bench`: bench/results.csv -> bench/bandwidth.png)
set -euo pipefail
csv=$1
png=$2
data=$(mktemp)
trap 'rm -f "$data"' EXIT
# columns: shape, fwd 1 thread, fwd N threads, bwd 1 thread, bwd N threads
awk -F, 'NR > 1 && $2 == "f32" && ($1 == "rms_forward" || $1 == "rms_backward") {
  shape = $3 "x" $4
  if (!(shape in seen)) { seen[shape] = 1; order[n++] = shape }
  key = shape SUBSEP $1 SUBSEP ($5 == 1 ? "1" : "N")
  val[key] = $9
  if ($5 != 1) nthreads = $5
}
END {
  for (i = 0; i < n; i++) {
    s = order[i]
    printf "%s %s %s %s %s\n", s, val[s, "rms_forward", "1"], val[s, "rms_forward", "N"] == "" ? "NaN" : val[s, "rms_forward", "N"],
      val[s, "rms_backward", "1"], val[s, "rms_backward", "N"] == "" ? "NaN" : val[s, "rms_backward", "N"]
  }
  print nthreads > "/dev/stderr"
}' "$csv" > "$data" 2> "$data.threads"
threads=$(cat "$data.threads"); rm -f "$data.threads"
gnuplot <<GP
set terminal pngcairo size 1100,520 font ",11"
set output "$png"
set title "librmsnorm fp32 RMSNorm: % of the copy limit (best of memcpy and non-temporal copy, same bytes, same run)"
set ylabel "% of the copy limit"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:140]
set grid ytics
set xtics rotate by -25
set key top center horizontal
set arrow from graph 0, first 90 to graph 1, first 90 nohead dt 2 lc rgb "gray40"
plot "$data" using 2:xtic(1) title "forward, 1 thread", \
     "" using 3 title "forward, ${threads:-N} threads", \
     "" using 4 title "backward, 1 thread", \
     "" using 5 title "backward, ${threads:-N} threads"
GP
echo "wrote $png"
