#!/usr/bin/env bash
# Before and after a change, on the same table in one session: two workers of one build,
# pinned to cores 0 and 1, warmed by one pass of the scale-out benchmark's throughput part,
# then measured by a second pass (the coordinator on core 0); prints its lines and the
# workers' CPU ticks for the measured pass.
#
#   FRAGVEC_SCALE_ROWS=2000000 FRAGVEC_SCALE_DIR=DIR cargo bench --bench scale_out  # keeps the table
#   cp target/release/fragvec OLD/fragvec; cp target/release/deps/scale_out-HASH OLD/scale_out
#   (the same for the other build into NEW), then, alternating:
#   bench/scale_out_ab.sh OLD DIR/db-2000000 "q/s"; bench/scale_out_ab.sh NEW DIR/db-2000000 "q/s"
set -euo pipefail
build=$1 db=$2 only=$3
out=$(mktemp -d)
trap 'kill "${a:-}" "${b:-}" 2>/dev/null || true; rm -rf "$out"' EXIT
taskset -c 0 "$build/fragvec" worker --listen 127.0.0.1:0 >"$out/a" 2>&1 &
a=$!
taskset -c 1 "$build/fragvec" worker --listen 127.0.0.1:0 >"$out/b" 2>&1 &
b=$!
for _ in $(seq 50); do [[ -s $out/a && -s $out/b ]] && break; sleep 0.1; done
urls="$(sed 's/.*on //' "$out/a"),$(sed 's/.*on //' "$out/b")"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
measure() { FRAGVEC_SCALE_ONLY="$only" taskset -c 0 "$build/scale_out" --measure "$db" "$urls" v32; }
measure >/dev/null
a0=$(ticks $a) b0=$(ticks $b)
measure | grep -v "index cache"
echo "workers' CPU ticks: $(($(ticks $a) - a0)) + $(($(ticks $b) - b0))"
