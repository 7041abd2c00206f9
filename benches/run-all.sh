#!/usr/bin/env bash
# Runs every benchmark behind BENCHMARKS.md in one go and prints its tables, ready to paste.
#
#   benches/run-all.sh              # everything: about 6-8 minutes on 2 cores, plus the build
#   QUICK=1 benches/run-all.sh      # a smoke run (a few seconds per file): checks, no figures
#
# Run it on a quiet machine (no builds, no browsers); the figures are meaningless otherwise.
# Raw outputs go to target/bench-results/ (override with OUT=...); the summary is printed at
# the end and saved as target/bench-results/summary.md.
#
#   - benches/overhead.rs      every layer alone, the stack, tower and tower-resilience peers
#   - crates/*/benches/*.rs    each crate's own criterion bench (retry, breaker, gate, budget,
#                              observe, and any other found there)
#   - benches/allocs.rs        heap allocations per call (exact counts, machine-independent)
#   - crates/seawall-redis/benches/shared_state.rs
#                              what shared state on Redis costs (a plain `main`, not criterion;
#                              starts its own redis-server, and is left out, saying so, when
#                              there is none on the PATH)
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench-results}
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/summary.md

if [[ -n "${QUICK:-}" ]]; then
    ROOT_ARGS=(--warm-up-time 0.1 --measurement-time 0.2 --sample-size 10)
    CRATE_ARGS=(--warm-up-time 0.1 --measurement-time 0.2 --sample-size 10)
else
    ROOT_ARGS=()  # the bench's own settings: 0.5 s warm-up, 1.5 s measurement, 30 samples
    # Per-crate benches keep criterion's defaults unless told otherwise; shorten them a little.
    read -r -a CRATE_ARGS <<<"${CRATE_BENCH_ARGS:---warm-up-time 1 --measurement-time 3}"
fi

machine() {
    echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates src benches || echo ' (with local changes)')"
    echo "- rustc: $(rustc --version)"
    echo "- os: $(uname -srm)"
    if command -v lscpu >/dev/null; then
        echo "- cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) logical CPUs available"
    else
        echo "- cpu: $(nproc) logical CPUs available"
    fi
    if [[ -r /proc/meminfo ]]; then
        echo "- memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
    fi
    echo "- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
}

echo "== building (release, benches of the facade and every crate that has one)"
cargo bench -p seawall-benches --no-run
crate_benches=()
for f in crates/*/benches/*.rs; do
    [[ -e "$f" ]] || continue
    # Only criterion benches take criterion's flags and print bencher lines; others run below.
    grep -q criterion_main "$f" || continue
    crate=$(basename "$(dirname "$(dirname "$f")")")
    crate_benches+=("$crate:$(basename "$f" .rs)")
done
for cb in "${crate_benches[@]}"; do
    cargo bench -p "${cb%%:*}" --bench "${cb##*:}" --no-run
done
cargo bench -p seawall-redis --bench shared_state --no-run

machine >"$OUT/machine.md"

echo "== benches/overhead.rs"
cargo bench -p seawall-benches --bench overhead -- --output-format bencher "${ROOT_ARGS[@]}" \
    | tee "$OUT/overhead.txt"

for cb in "${crate_benches[@]}"; do
    echo "== crates/${cb%%:*}/benches/${cb##*:}.rs"
    cargo bench -p "${cb%%:*}" --bench "${cb##*:}" -- --output-format bencher "${CRATE_ARGS[@]}" \
        | tee "$OUT/${cb%%:*}-${cb##*:}.txt"
done

echo "== benches/allocs.rs"
cargo bench -p seawall-benches --bench allocs | tee "$OUT/allocs.md"

echo "== crates/seawall-redis/benches/shared_state.rs"
if command -v redis-server >/dev/null; then
    # QUICK, when set, reaches the bench through the environment.
    cargo bench -p seawall-redis --bench shared_state | tee "$OUT/shared_state.md"
else
    echo "Not measured: redis-server is not on the PATH." | tee "$OUT/shared_state.md"
fi

{
    echo "## Machine"
    echo
    cat "$OUT/machine.md"
    echo
    awk -f benches/summarize.awk "$OUT"/*.txt
    echo
    echo "### Heap allocations per call (benches/allocs.rs)"
    echo
    grep '^|' "$OUT/allocs.md"
    echo
    echo "### Shared state on Redis (crates/seawall-redis/benches/shared_state.rs)"
    echo
    cat "$OUT/shared_state.md"
} >"$OUT/summary.md"

echo
echo "================ summary (also in $OUT/summary.md) ================"
echo
cat "$OUT/summary.md"
