//! The results of a run, the table, the goals and the chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::policies::Outcome;
use crate::scenario::{PRICE_IN, PRICE_OUT};

/// What one run of the workload produced.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) label: String,
    /// Latency (call to the end of its answer, or to its failure) and outcome of every call.
    pub(crate) calls: Vec<(Duration, Outcome)>,
    /// Requests the upstreams received (both providers).
    pub(crate) upstream_calls: u64,
    /// Dollars billed, and billed for answers the caller did not get whole.
    pub(crate) spend: f64,
    pub(crate) wasted: f64,
    /// Extra facts worth a line under the table.
    pub(crate) notes: Vec<String>,
}

/// Dollars for `input` and `output` tokens.
pub(crate) fn dollars(input: u64, output: u64) -> f64 {
    (input as f64 * PRICE_IN + output as f64 * PRICE_OUT) / 1e6
}

/// The figures of one row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) label: String,
    /// Logical calls in the run.
    pub(crate) calls: usize,
    pub(crate) success: f64,
    pub(crate) amplification: f64,
    /// P50, P95, P99 of the time to a complete answer; `None` when that percentile falls on
    /// calls that never got one.
    pub(crate) latency: [Option<Duration>; 3],
    pub(crate) spend: f64,
    pub(crate) wasted: f64,
    pub(crate) per_answer: f64,
    /// Wasted dollars per 1,000 complete answers: the waste a row pays for what it delivers
    /// (raw waste rewards a row that gives up early).
    pub(crate) wasted_per_answer: f64,
    pub(crate) overrun: f64,
    pub(crate) failures: BTreeMap<&'static str, usize>,
    /// Time to the first content the caller read, P50 and P95 over the answered calls.
    pub(crate) first_token: [Option<Duration>; 2],
}

impl Row {
    pub(crate) fn new(r: &RunResult, limit: f64) -> Row {
        let n = r.calls.len().max(1);
        let mut ok: Vec<Duration> = r
            .calls
            .iter()
            .filter(|(_, o)| o.is_ok())
            .map(|(d, _)| *d)
            .collect();
        ok.sort_unstable();
        let mut first: Vec<Duration> = r
            .calls
            .iter()
            .filter_map(|(_, o)| o.ok()?.first_token)
            .collect();
        first.sort_unstable();
        let mut failures = BTreeMap::new();
        for (_, o) in &r.calls {
            if let Err(why) = o {
                *failures.entry(*why).or_default() += 1;
            }
        }
        Row {
            label: r.label.clone(),
            calls: r.calls.len(),
            success: ok.len() as f64 / n as f64,
            amplification: r.upstream_calls as f64 / n as f64,
            latency: [0.50, 0.95, 0.99].map(|q| percentile(&ok, q, n)),
            spend: r.spend,
            wasted: r.wasted,
            per_answer: if ok.is_empty() {
                f64::INFINITY
            } else {
                r.spend / ok.len() as f64 * 1000.0
            },
            wasted_per_answer: if ok.is_empty() {
                f64::INFINITY
            } else {
                r.wasted / ok.len() as f64 * 1000.0
            },
            overrun: (r.spend - limit).max(0.0),
            failures,
            first_token: [0.50, 0.95].map(|q| percentile(&first, q, first.len())),
        }
    }
}

/// The `q` quantile of `n` values of which `sorted` are the known ones, smallest first (the
/// others, failed calls, count as slower than any): `None` when it falls among the others.
pub(crate) fn percentile<T: Copy>(sorted: &[T], q: f64, n: usize) -> Option<T> {
    let rank = ((q * n as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

pub(crate) fn secs(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
        None => "no answer".to_owned(),
    }
}

/// The table, one line per row, with a header.
pub(crate) fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<20} {:>8} {:>13} {:>10} {:>10} {:>10} {:>8} {:>8} {:>12} {:>12} {:>11}",
        "policy",
        "success",
        "upstream/call",
        "P50",
        "P95",
        "P99",
        "spend",
        "wasted",
        "$/1k answers",
        "wasted/1k",
        "over budget"
    );
    let _ = writeln!(s, "{}", "-".repeat(131));
    let usd = |v: f64, places: usize| format!("${v:.places$}");
    for r in rows {
        let _ = writeln!(
            s,
            "{:<20} {:>7.2}% {:>12.3}x {:>10} {:>10} {:>10} {:>8} {:>8} {:>12} {:>12} {:>11}",
            r.label,
            r.success * 100.0,
            r.amplification,
            secs(r.latency[0]),
            secs(r.latency[1]),
            secs(r.latency[2]),
            usd(r.spend, 2),
            usd(r.wasted, 3),
            usd(r.per_answer, 3),
            usd(r.wasted_per_answer, 4),
            usd(r.overrun, 2),
        );
    }
    s
}

/// A row of the fleet run: the figures of [`Row`] and what a fleet adds.
#[derive(Debug, Clone)]
pub(crate) struct FleetRow {
    pub(crate) row: Row,
    /// The calm reference: no budget and no rate limits to go over (shown as "-").
    pub(crate) reference: bool,
    /// 429s the providers answered.
    pub(crate) rate_limited: u64,
    /// Round trips to Redis in the run and the replicas' failed calls; `None` without Redis.
    pub(crate) redis: Option<(u64, u64)>,
}

/// The fleet run's table: what sharing the state changes, and what it costs.
pub(crate) fn fleet_table(rows: &[FleetRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<26} {:>11} {:>6} {:>13} {:>8} {:>10} {:>10} {:>8} {:>20}",
        "run", "over budget", "429s", "upstream/call", "success", "P50", "P99", "spend", "redis"
    );
    let _ = writeln!(s, "{}", "-".repeat(120));
    for f in rows {
        let r = &f.row;
        let redis = match f.redis {
            Some((round_trips, failed)) => {
                let per_call = round_trips as f64 / (r.calls as f64).max(1.0);
                format!("{per_call:.1}/call, {failed} failed")
            }
            None => "-".to_owned(),
        };
        let (over, rate_limited) = if f.reference {
            ("-".to_owned(), "-".to_owned())
        } else {
            (format!("${:.2}", r.overrun), f.rate_limited.to_string())
        };
        let _ = writeln!(
            s,
            "{:<26} {:>11} {:>6} {:>12.3}x {:>7.2}% {:>10} {:>10} {:>8} {:>20}",
            r.label,
            over,
            rate_limited,
            r.amplification,
            r.success * 100.0,
            secs(r.latency[0]),
            secs(r.latency[2]),
            format!("${:.2}", r.spend),
            redis,
        );
    }
    s
}

/// Why calls failed, per row.
pub(crate) fn failures(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        if r.failures.is_empty() {
            continue;
        }
        let list: Vec<String> = r
            .failures
            .iter()
            .map(|(why, n)| format!("{why} {n}"))
            .collect();
        let _ = writeln!(s, "  {:<20} {}", r.label, list.join(", "));
    }
    s
}

/// The time to the caller's first token, per row: what holding a stream's first tokens back
/// costs is seen here, not in the answers' latency.
pub(crate) fn first_tokens(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<20} P50 {}, P95 {}",
            r.label,
            secs(r.first_token[0]),
            secs(r.first_token[1])
        );
    }
    s
}

/// Relative tolerance under which two figures count as a tie: the upstream draws its random
/// latencies in call order, so two policies never see exactly the same draws.
const TIE: f64 = 0.02;

fn lat(d: Option<Duration>) -> f64 {
    d.map_or(f64::INFINITY, |d| d.as_secs_f64())
}

/// A few lines comparing seawall's row without and with the cache.
pub(crate) fn cache_effect(plain: &Row, cached: &Row) -> String {
    let mut s = String::new();
    let change = |a: f64, b: f64| if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 };
    let p50 = |r: &Row| r.latency[0].map(|d| d.as_secs_f64());
    let _ = writeln!(
        s,
        "  spend          ${:.2} -> ${:.2} ({:+.0}%)",
        plain.spend,
        cached.spend,
        change(plain.spend, cached.spend)
    );
    let calls = |r: &Row| r.amplification * r.calls as f64;
    let _ = writeln!(
        s,
        "  upstream calls {:.0} -> {:.0} ({:+.0}%)",
        calls(plain),
        calls(cached),
        change(calls(plain), calls(cached))
    );
    match (p50(plain), p50(cached)) {
        (Some(a), Some(b)) => {
            let _ = writeln!(
                s,
                "  P50            {a:.2} s -> {b:.2} s ({:+.0}%)",
                change(a, b)
            );
        }
        _ => {
            let _ = writeln!(s, "  P50            no answer in one of the runs");
        }
    }
    let _ = writeln!(
        s,
        "  success        {:.2}% -> {:.2}%",
        plain.success * 100.0,
        cached.success * 100.0
    );
    s
}

/// The share of calls a row must deliver for its waste per answer to be a yardstick.
pub(crate) const DELIVERS: f64 = 0.95;

/// The goals the demo checks for seawall's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Goal {
    Success,
    P95,
    P99,
    Overrun,
    Waste,
}

impl Goal {
    pub(crate) const ALL: [Goal; 5] = [
        Goal::Success,
        Goal::P95,
        Goal::P99,
        Goal::Overrun,
        Goal::Waste,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Goal::Success => "success",
            Goal::P95 => "P95",
            Goal::P99 => "P99",
            Goal::Overrun => "overrun",
            Goal::Waste => "waste",
        }
    }
}

/// The row seawall's waste per answer is held to: the least wasteful per answer of the rows
/// that deliver at least [`DELIVERS`] of the calls.
pub(crate) fn yardstick<'a>(others: &[&'a Row]) -> Option<&'a Row> {
    others
        .iter()
        .copied()
        .filter(|r| r.success >= DELIVERS)
        .min_by(|a, b| a.wasted_per_answer.total_cmp(&b.wasted_per_answer))
}

/// Checks the goals for `seawall` against the other rows; one line each, and how many failed.
///
/// Seawall's row must be best (ties within [`TIE`]) on success, P95 and P99, stay within the
/// run's budget, and waste no more per delivered answer than the best row that delivers at
/// least [`DELIVERS`] of the calls: raw waste would reward a row that gives up early.
pub(crate) fn goals(seawall: &Row, others: &[&Row]) -> (String, Vec<Goal>) {
    let mut s = String::new();
    let mut failed = Vec::new();
    let mut check = |goal: Goal, ok: bool, text: String| {
        if !ok {
            failed.push(goal);
        }
        let _ = writeln!(s, "  [{}] {text}", if ok { "pass" } else { "FAIL" });
    };
    let with = |r: &Row, v: String| {
        format!(
            "{} ({v} with {:.2}% success)",
            r.label.trim(),
            r.success * 100.0
        )
    };
    // Success: no row higher by more than a tenth of a point (3 calls of 3,000).
    let beaten: Vec<String> = others
        .iter()
        .filter(|r| r.success > seawall.success + 0.001)
        .map(|r| with(r, format!("{:.2}%", r.success * 100.0)))
        .collect();
    check(
        Goal::Success,
        beaten.is_empty(),
        if beaten.is_empty() {
            format!("best on success: {:.2}%", seawall.success * 100.0)
        } else {
            format!(
                "best on success: {:.2}% is beaten by {}",
                seawall.success * 100.0,
                beaten.join(", ")
            )
        },
    );
    for (goal, i) in [(Goal::P95, 1), (Goal::P99, 2)] {
        let name = goal.name();
        let mine = lat(seawall.latency[i]);
        let beaten: Vec<String> = others
            .iter()
            .filter(|r| {
                let theirs = lat(r.latency[i]);
                if mine.is_infinite() {
                    theirs.is_finite()
                } else {
                    theirs < mine * (1.0 - TIE) - 1e-9
                }
            })
            .map(|r| with(r, secs(r.latency[i])))
            .collect();
        check(
            goal,
            beaten.is_empty(),
            if beaten.is_empty() {
                format!(
                    "best (or within 2%) on {name}: {}",
                    secs(seawall.latency[i])
                )
            } else {
                format!(
                    "best on {name}: {} is beaten by {}",
                    secs(seawall.latency[i]),
                    beaten.join(", ")
                )
            },
        );
    }
    check(
        Goal::Overrun,
        seawall.overrun == 0.0,
        format!("no budget overrun: ${:.2} over", seawall.overrun),
    );
    let usd = |v: f64| format!("${v:.4}");
    let mine = seawall.wasted_per_answer;
    match yardstick(others) {
        None => check(
            Goal::Waste,
            true,
            format!(
                "waste per 1k answers {}: no other row delivers {:.0}% to compare with",
                usd(mine),
                DELIVERS * 100.0
            ),
        ),
        Some(best) => check(
            Goal::Waste,
            mine <= best.wasted_per_answer * (1.0 + TIE) + 1e-9,
            format!(
                "waste per 1k answers no worse (within 2%) than the best row delivering {:.0}%: {} \
                 against {}",
                DELIVERS * 100.0,
                usd(mine),
                with(best, usd(best.wasted_per_answer))
            ),
        ),
    }
    (s, failed)
}

/// Writes the CDF of the time to a complete answer, one line per row, as SVG.
pub(crate) fn chart(path: &Path, runs: &[RunResult]) -> Result<(), String> {
    use plotters::prelude::*;

    let mut x_max: f64 = 1.0;
    let curves: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let n = r.calls.len().max(1) as f64;
            let mut ok: Vec<f64> = r
                .calls
                .iter()
                .filter(|(_, o)| o.is_ok())
                .map(|(d, _)| d.as_secs_f64())
                .collect();
            ok.sort_by(f64::total_cmp);
            if let Some(p) = ok.get(ok.len().saturating_sub(1) * 99 / 100) {
                x_max = x_max.max(*p * 1.1);
            }
            let mut pts = vec![(0.0, 0.0)];
            pts.extend(ok.iter().enumerate().map(|(i, x)| (*x, (i + 1) as f64 / n)));
            (r.label.clone(), pts)
        })
        .collect();
    let x_max = x_max.min(120.0);
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Storm demo: share of calls with a complete answer within t",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds from call to the end of a complete answer")
        .y_desc("share of calls")
        .draw()
        .map_err(|e| err(&e))?;
    let palette = [
        RGBColor(0, 0, 0),
        RGBColor(140, 140, 140),
        RGBColor(214, 39, 40),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(44, 160, 44),
        RGBColor(31, 119, 180),
    ];
    for (i, (label, pts)) in curves.into_iter().enumerate() {
        let color = palette[i % palette.len()];
        let style = ShapeStyle::from(&color).stroke_width(if i + 1 == runs.len() { 3 } else { 2 });
        chart
            .draw_series(LineSeries::new(
                pts.into_iter().filter(|(x, _)| *x <= x_max),
                style,
            ))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::Delivered;

    /// A row with `answers` of 100 calls answered in `secs` each and `wasted` dollars wasted.
    fn row(label: &str, answers: usize, secs: u64, wasted: f64) -> Row {
        let mut calls = vec![
            (
                Duration::from_secs(secs),
                Ok(Delivered {
                    input: 1,
                    output: 1,
                    first_token: None,
                })
            );
            answers
        ];
        calls.resize(100, (Duration::from_secs(1), Err("overloaded")));
        let run = RunResult {
            label: label.to_owned(),
            calls,
            upstream_calls: 100,
            spend: 1.0,
            wasted,
            notes: Vec::new(),
        };
        Row::new(&run, 10.0)
    }

    #[test]
    fn the_first_token_figures_are_over_the_answered_calls() {
        let answered = |ms: u64| {
            (
                Duration::from_secs(9),
                Ok(Delivered {
                    input: 1,
                    output: 1,
                    first_token: Some(Duration::from_millis(ms)),
                }),
            )
        };
        // 20 answers whose first tokens came after 1..=20 ms, and 80 failed calls.
        let mut calls: Vec<_> = (1..=20).rev().map(answered).collect();
        calls.resize(100, (Duration::from_secs(1), Err("overloaded")));
        let run = RunResult {
            label: "r".to_owned(),
            calls,
            upstream_calls: 100,
            spend: 1.0,
            wasted: 0.0,
            notes: Vec::new(),
        };
        let r = Row::new(&run, 10.0);
        let ms = |v: u64| Some(Duration::from_millis(v));
        assert_eq!(r.first_token, [ms(10), ms(19)]);
        assert!(first_tokens(&[r]).contains("P50 0.01 s, P95 0.02 s"));
    }

    #[test]
    fn a_row_that_gives_up_early_is_no_yardstick_for_waste_per_answer() {
        // Seawall wastes more in all than a row that answered 60 calls, and less per answer
        // than the only row that delivers 95%.
        let seawall = row("seawall", 100, 5, 0.02);
        let quitter = row("quitter", 60, 5, 0.001);
        let steady = row("steady", 96, 5, 0.03);
        let (text, failed) = goals(&seawall, &[&quitter, &steady]);
        assert!(failed.is_empty(), "{text}");
        assert!(text.contains("steady"), "{text}");
    }

    #[test]
    fn more_waste_per_answer_than_a_row_delivering_95_percent_fails() {
        let seawall = row("seawall", 100, 5, 0.05);
        let steady = row("steady", 99, 5, 0.01);
        let (text, failed) = goals(&seawall, &[&steady]);
        assert_eq!(failed, [Goal::Waste], "{text}");
        assert!(text.contains("[FAIL] waste per 1k answers"), "{text}");
    }

    #[test]
    fn a_higher_success_or_a_faster_p99_elsewhere_fails_its_goal() {
        let seawall = row("seawall", 98, 5, 0.0);
        let better = row("better", 100, 4, 0.0);
        let (text, failed) = goals(&seawall, &[&better]);
        assert!(text.contains("[FAIL] best on success"), "{text}");
        assert!(text.contains("[FAIL] best on P99"), "{text}");
        assert_eq!(failed, [Goal::Success, Goal::P95, Goal::P99], "{text}");
    }

    #[test]
    fn a_latency_within_two_percent_is_a_tie() {
        let seawall = row("seawall", 100, 100, 0.0);
        let close = row("close", 100, 99, 0.0);
        let (text, failed) = goals(&seawall, &[&close]);
        assert!(failed.is_empty(), "{text}");
    }

    #[test]
    fn waste_per_answer_is_per_thousand_complete_answers() {
        let r = row("r", 50, 5, 0.5);
        assert!((r.wasted_per_answer - 10.0).abs() < 1e-9);
        assert!(row("none", 0, 5, 0.5).wasted_per_answer.is_infinite());
    }
}
