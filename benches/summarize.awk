# Turns criterion's `--output-format bencher` lines into the Markdown tables of BENCHMARKS.md.
#
#   awk -f benches/summarize.awk target/bench-results/*.txt
#
# Input lines look like: `test overhead/seawall_retry ... bench:   1,234 ns/iter (+/- 56)`
# (the median and its standard deviation, in ns). Every figure is computed from benches of the
# same run; a figure whose benches are missing prints as "n/a".

/^test .* bench:/ {
    id = $2
    ns = $0; sub(/.*bench: */, "", ns); sub(/ ns\/iter.*/, "", ns); gsub(/,/, "", ns)
    sd = $0; sub(/.*\(\+\/- */, "", sd); sub(/\).*/, "", sd); gsub(/,/, "", sd)
    t[id] = ns + 0; dev[id] = sd + 0
    if (!(id in seen)) { order[++n] = id; seen[id] = 1 }
}

function has(id) { return id in t }
function fmt(x) { return sprintf("%.0f", x) }
function cell(id) { return has(id) ? fmt(t[id]) " ± " fmt(dev[id]) : "n/a" }
function over(id, base) { return (has(id) && has(base)) ? sprintf("%+.0f", t[id] - t[base]) : "n/a" }
function ratio(a, b) { return (b > 0) ? sprintf("%.2fx", a / b) : "n/a" }
# Overhead of `id` over `base` divided by that of `peer` over `pbase`.
function oratio(id, base, peer, pbase) {
    if (!(has(id) && has(base) && has(peer) && has(pbase))) return "n/a"
    return ratio(t[id] - t[base], t[peer] - t[pbase])
}
function tratio(a, b) { return (has(a) && has(b)) ? ratio(t[a], t[b]) : "n/a" }
function line(label, value) { printf "| %s | %s |\n", label, value }

END {
    if (n == 0) { print "no bencher lines found (run the benches with --output-format bencher)"; exit 1 }

    print "### Per-call time, layer by layer (benches/overhead.rs), ns"
    print ""
    print "| variant | uncontended | over baseline | over ref_prepare_only | contended, 2 threads | over baseline |"
    print "|---|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
        id = order[i]
        if (id !~ /^overhead\//) continue
        v = id; sub(/^overhead\//, "", v)
        c = "overhead_2_threads/" v
        base = (v ~ /^pending_/) ? "pending_baseline" : "baseline"
        own = (v ~ /seawall_/) ? over(id, "overhead/ref_prepare_only") : ""
        if (v ~ /^pending_/ && v ~ /seawall_/) own = ""
        printf "| %s | %s | %s | %s | %s | %s |\n", v, cell(id), over(id, "overhead/" base), own, cell(c), over(c, "overhead_2_threads/" base)
    }
    print ""
    print "`over baseline`: the variant's time minus the inner service's alone (same request, same"
    print "body read). `over ref_prepare_only`: minus the request's one JSON parse as well, which"
    print "only the outermost seawall layer of a stack pays: the layer's own cost inside a stack."
    print ""

    U = "overhead/"; C = "overhead_2_threads/"
    print "### Figures for the issues"
    print ""
    print "| figure | value |"
    print "|---|---|"
    line("sanity: contended ÷ uncontended baseline (≈ 1.0 when the two threads really ran in parallel)", tratio(C "baseline", U "baseline"))
    line("retry (#3): seawall retry, own overhead ÷ tower Retry overhead, HTTP request (aim ≤ 1.2x)", oratio(U "seawall_retry", U "ref_prepare_only", U "tower_retry", U "baseline"))
    line("retry (#3): seawall retry ÷ tower Retry, whole call, HTTP request", tratio(U "seawall_retry", U "tower_retry"))
    line("retry (#3): crate bench, typed request, backoff_retry ÷ tower_retry (aim ≤ 1.2x)", tratio("no_retry_needed/typed_request/backoff_retry", "no_retry_needed/typed_request/tower_retry"))
    line("retry (#3): crate bench, prepared HTTP request, backoff_retry ÷ tower_retry (aim ≤ 1.2x)", tratio("no_retry_needed/http_request/backoff_retry", "no_retry_needed/http_request/tower_retry"))
    line("breaker (#4): closed, seawall own overhead ÷ tower-resilience overhead (aim < 0.5x)", oratio(U "seawall_breaker", U "ref_prepare_only", U "resilience_breaker", U "baseline"))
    line("breaker (#4): closed, crate bench, seawall ÷ tower-resilience overhead over baseline (aim < 0.5x)", oratio("closed/seawall", "closed/baseline", "closed/tower_resilience", "closed/baseline"))
    line("breaker (#4): closed, seawall own overhead, ns (contended)", over(U "seawall_breaker", U "ref_prepare_only") " (" over(C "seawall_breaker", C "ref_prepare_only") ")")
    line("breaker (#4): closed, tower-resilience overhead, ns (contended)", over(U "resilience_breaker", U "baseline") " (" over(C "resilience_breaker", C "baseline") ")")
    line("breaker (#4): open rejection, seawall ns (request parse included) vs tower-resilience ns", cell(U "seawall_breaker_open") " vs " cell(U "resilience_breaker_open"))
    line("breaker (#4): open rejection, crate bench, seawall ÷ tower-resilience", tratio("open/seawall", "open/tower_resilience"))
    line("gate (#5): uncontended own overhead, seawall gate / with RPM+TPM, ns", over(U "seawall_gate", U "ref_prepare_only") " / " over(U "seawall_gate_rates", U "ref_prepare_only"))
    line("gate (#5): uncontended overhead, tower ConcurrencyLimit / tower-resilience bulkhead, ns", over(U "tower_concurrency_limit", U "baseline") " / " over(U "resilience_bulkhead", U "baseline"))
    line("gate (#5): 2-thread overhead, seawall gate / ConcurrencyLimit / bulkhead, ns", over(C "seawall_gate", C "ref_prepare_only") " / " over(C "tower_concurrency_limit", C "baseline") " / " over(C "resilience_bulkhead", C "baseline"))
    line("gate (#5): crate bench, uncontended, seawall_gate ÷ tower_concurrency_limit", tratio("uncontended/seawall_gate", "uncontended/tower_concurrency_limit"))
    line("gate (#5): crate bench, uncontended, seawall_gate ÷ tower_resilience_bulkhead", tratio("uncontended/seawall_gate", "uncontended/tower_resilience_bulkhead"))
    line("budget (#6): own overhead with 12-model price table and 3 budgets, ns (contended)", over(U "seawall_budget", U "ref_prepare_only") " (" over(C "seawall_budget", C "ref_prepare_only") ")")
    line("budget (#6): crate bench, admit_and_settle over noop_service_alone, ns", over("budget/admit_and_settle", "budget/noop_service_alone"))
    line("budget (#6): crate bench, admit_settle_and_record over noop_service_alone, ns", over("budget/admit_settle_and_record", "budget/noop_service_alone"))
    line("observe (#9): own overhead with NoopRecorder, ns (contended)", over(U "seawall_observe", U "ref_prepare_only") " (" over(C "seawall_observe", C "ref_prepare_only") ")")
    line("observe (#9): crate bench, observe_noop_recorder over bare, ns", over("observe/observe_noop_recorder", "observe/bare"))
    line("stack (#10): seawall stack overhead, ns (contended)", over(U "seawall_stack", U "baseline") " (" over(C "seawall_stack", C "baseline") ")")
    line("stack (#10): tower stack / tower-resilience stack overhead, ns", over(U "tower_stack", U "baseline") " / " over(U "resilience_stack", U "baseline"))
    line("stack: README's recommended stack (seawall_stack + continue + guard) overhead, ns (contended)", over(U "seawall_recommended", U "baseline") " (" over(C "seawall_recommended", C "baseline") ")")
    line("stack: recommended stack ÷ tower-resilience stack, whole call time (aim ≤ 1.5x)", tratio(U "seawall_recommended", U "resilience_stack"))
    line("stack: recommended stack overhead ÷ tower-resilience stack overhead", oratio(U "seawall_recommended", U "baseline", U "resilience_stack", U "baseline"))
    line("stack (#10): inner Pending once: seawall / tower / tower-resilience stack overhead, ns", over(U "pending_seawall_stack", U "pending_baseline") " / " over(U "pending_tower_stack", U "pending_baseline") " / " over(U "pending_resilience_stack", U "pending_baseline"))
    line("request JSON parse (`prepare`), paid once per call by the outermost seawall layer, ns", over(U "ref_prepare_only", U "baseline"))
    print ""

    print "### Every bench, as measured (median ± std. dev., ns)"
    print ""
    print "| bench | ns/iter |"
    print "|---|---:|"
    for (i = 1; i <= n; i++) printf "| %s | %s |\n", order[i], cell(order[i])
}
