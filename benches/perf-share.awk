# What a call costs with something added, as a share of the call without it, from two native
# profiles of overhead rows when the clock on a shared machine is too noisy to tell.
#
#   B=$(cargo bench -p seawall-benches --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .* (\(.*\))$/\1/p')
#   for row in recommended_new_questions cache_miss_over_recommended_new_questions; do
#       perf record -e cpu-clock:u -F 8000 -o $row.data $B --bench --profile-time 8 "^overhead/$row\$"
#       perf report -i $row.data --no-children --sort symbol --stdio > $row.txt
#   done
#   awk -v own='seawall_cache|sha2' -f benches/perf-share.awk \
#       recommended_new_questions.txt cache_miss_over_recommended_new_questions.txt
#
# Why it works: a function only the first row's work runs (the stack's own, say the request's
# keep or the answer's scan) costs the same per call in both runs, so the ratio of its shares
# of the two runs' samples is the ratio of the two calls' times, however busy the machine was.
# The ratio taken is the median over seawall's functions that are at least 0.4% of the first
# run and do not match `own` (the added layer's functions); library helpers that both may
# call (copies, the allocator, the clock, maps) are left out of it. The added cost is then
# split into the added layer's own functions and the growth of everything else.

function pct(line) { p = line; sub(/%.*/, "", p); return p + 0 }
function name(line) { s = line; sub(/^ *[0-9.]+% +\[[^]]*\] +/, "", s); sub(/ +-? +-? *$/, "", s); return s }

/^ *[0-9.]+% +\[/ {
    if (FNR == 1 || FILENAME != last) { file++; last = FILENAME }
    if (file == 1) base[name($0)] += pct($0); else with[name($0)] += pct($0)
}

END {
    n = 0
    for (s in base)
        if (base[s] >= 0.4 && (s in with) && s ~ /seawall_/ && (own == "" || s !~ own)) r[++n] = base[s] / with[s]
    if (n == 0) { print "no function common to both runs: not the same rows?"; exit 1 }
    for (i = 2; i <= n; i++) { v = r[i]; for (j = i - 1; j >= 1 && r[j] > v; j--) r[j + 1] = r[j]; r[j + 1] = v }
    ratio = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
    owned = 0
    for (s in with) if (own != "" && s ~ own) owned += with[s]
    printf "functions compared: %d, their ratios %.2f (lowest quarter) %.2f (median) %.2f (highest quarter)\n", n, r[int(n / 4) + 1], ratio, r[int(3 * n / 4) + 1]
    printf "a call with the addition takes %.2fx the time of one without: %+.1f%% of it\n", ratio, (ratio - 1) * 100
    printf "  the added functions (%s): %.1f%%\n", own, owned * ratio
    printf "  everything else's growth: %.1f%%\n", (ratio - 1) * 100 - owned * ratio
    print "largest growths outside the added functions (% of the call without it):"
    m = 0
    for (s in with) if (own == "" || s !~ own) { g = with[s] * ratio - base[s]; if (g > 0.2) { gs[++m] = g; gn[m] = s } }
    for (s in base) if (!(s in with) && base[s] > 0.2) { gs[++m] = -base[s]; gn[m] = s }
    for (i = 2; i <= m; i++) { v = gs[i]; t = gn[i]; for (j = i - 1; j >= 1 && gs[j] < v; j--) { gs[j + 1] = gs[j]; gn[j + 1] = gn[j] } gs[j + 1] = v; gn[j + 1] = t }
    for (i = 1; i <= m && i <= 12; i++) printf "  %+6.2f%%  %s\n", gs[i], substr(gn[i], 1, 100)
}
