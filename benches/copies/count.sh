#!/usr/bin/env bash
# What one overhead row copies per call, by function: bytes and copies (memcpy/memmove).
#
#   benches/copies/count.sh seawall_stack            # any row of the overhead bench
#
# Builds the counting shim (count.c) with the C compiler, runs the row's bench binary under
# it for two seconds, and names each call site with addr2line. Per call = the site totals
# divided by the bench's iterations, taken as the commonest call count among busy sites (the
# sites run once per call). Needs cc and addr2line (binutils).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROW=${1:?usage: count.sh <overhead row>}
OUT=${OUT:-target/bench-results}
mkdir -p "$OUT"
cc -O2 -fPIC -shared -o "$OUT/copy-count.so" benches/copies/count.c
BIN=$(cargo bench -p seawall-benches --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .* (\(.*\))$/\1/p')
MC_ON=1 MC_OUT="$OUT/copies-$ROW.txt" LD_PRELOAD="$OUT/copy-count.so" \
    "$BIN" --bench --profile-time 2 "^overhead/$ROW\$" > /dev/null
ITERS=$(awk '$2 > 1000 { n[$2]++ } END { for (k in n) if (n[k] > best) { best = n[k]; it = k }; print it }' "$OUT/copies-$ROW.txt")
awk '{ print "0x" $1 }' "$OUT/copies-$ROW.txt" | addr2line -f -C -e "$BIN" | awk 'NR % 2 == 1' \
    | paste -d '\t' "$OUT/copies-$ROW.txt" - \
    | awk -F '\t' -v it="$ITERS" '
        { split($1, f, " "); fn = substr($2, 1, 110); b[fn] += f[3] / it; c[fn] += f[2] / it; tb += f[3] / it; tc += f[2] / it }
        END {
            printf "%s: %.0f bytes in %.1f copies per call (%d iterations)\n", row, tb, tc, it
            for (fn in b) if (b[fn] >= 8) printf "%8.0f B %5.1f  %s\n", b[fn], c[fn], fn | "sort -rn"
        }' row="$ROW"
