//! `bench compare --rounds N`: medians and spreads (min..max) over rounds per proxy and scenario, and the round that represents them.

use crate::manifest::{Manifest, Metric, Spread, Summary};
use crate::page::Input;
use crate::report::Report;
use std::collections::HashMap;
use std::path::Path;

/// Every round's result by (proxy, scenario), in round order.
pub type AllRounds = HashMap<(String, String), Vec<(u32, Input)>>;

/// The median (the mean of the two middle values for an even count), minimum and maximum of the
/// finite values; None when there is none.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

impl Spread {
    /// `41,000 (40,100..41,900)`, or the value alone for one round.
    pub fn text(&self, prec: usize) -> String {
        let f = |v: f64| {
            if v >= 1000.0 {
                crate::svg::tick_text(v, 1.0)
            } else {
                format!("{v:.prec$}")
            }
        };
        if self.n > 1 {
            format!("{} ({}..{})", f(self.median), f(self.min), f(self.max))
        } else {
            f(self.median)
        }
    }
}

/// The scenario's figure of one result.
pub fn primary(metric: Metric, input: &Input) -> Option<f64> {
    match (metric, input) {
        (Metric::Rps, Input::Run(r)) => Some(r.achieved_rate),
        (Metric::Cps, Input::Run(r)) => Some(r.connections_per_s),
        (Metric::Throughput, Input::Run(r)) => Some(r.bytes_per_s / 1e6),
        // A sweep whose lowest rate failed has its knee below every rate: it counts as 0 (left
        // out, the round would lift the median). One with no measured rate at all says nothing.
        (Metric::Latency, Input::Sweep(s)) => s
            .knee
            .as_ref()
            .and_then(|k| k.rate.or(k.failed_at.map(|_| 0.0))),
        _ => None,
    }
}

fn cpu(r: &Report) -> (Option<f64>, Option<f64>) {
    match &r.cpu {
        Some(c) => (c.us_per_request, Some(c.percent_of_core)),
        None => (None, None),
    }
}

/// Summarize one proxy × scenario from its rounds. A sweep's CPU is left out (it varies with the
/// offered rate; the page draws it against the rate).
pub fn summarize(proxy: &str, scenario: &str, metric: Metric, rounds: &[(u32, Input)]) -> Summary {
    let rates: Vec<(u32, f64)> = rounds
        .iter()
        .filter_map(|(k, i)| primary(metric, i).map(|v| (*k, v)))
        .collect();
    let rate = spread(&rates.iter().map(|(_, v)| *v).collect::<Vec<_>>());
    let median_round = rate.and_then(|s| {
        rates
            .iter()
            .min_by(|a, b| {
                (a.1 - s.median)
                    .abs()
                    .total_cmp(&(b.1 - s.median).abs())
                    .then(a.0.cmp(&b.0))
            })
            .map(|(k, _)| *k)
    });
    let (us, pct): (Vec<f64>, Vec<f64>) = rounds
        .iter()
        .filter_map(|(_, i)| match i {
            Input::Run(r) => Some(cpu(r)),
            Input::Sweep(_) => None,
        })
        .map(|(u, p)| (u.unwrap_or(f64::NAN), p.unwrap_or(f64::NAN)))
        .unzip();
    Summary {
        proxy: proxy.to_string(),
        scenario: scenario.to_string(),
        unit: metric.unit().to_string(),
        rate,
        cpu_us_per_request: spread(&us),
        cpu_percent_of_core: spread(&pct),
        median_round: median_round.or_else(|| rounds.first().map(|(k, _)| *k)),
        cpu_cap_percent: None,
    }
}

/// Load every round of every result the manifest names from `dir` (unreadable ones left out).
/// Runs `compare` found void (warnings) are left out too: they must not move a median.
pub fn load_all(m: &Manifest, dir: &Path) -> AllRounds {
    let mut out: AllRounds = HashMap::new();
    for r in m.results.iter().filter(|r| r.warnings.is_empty()) {
        let Some(file) = &r.file else { continue };
        if let Ok(i) = Input::load(&dir.join(file)) {
            out.entry((r.proxy.clone(), r.scenario.clone()))
                .or_default()
                .push((r.round.max(1), i));
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|(k, _)| *k);
    }
    out
}

/// Every proxy × scenario's summary, in the manifest's order (scenarios, then proxies).
pub fn summaries(m: &Manifest, all: &AllRounds) -> Vec<Summary> {
    let mut out = Vec::new();
    for s in &m.scenarios {
        for p in &m.proxies {
            if let Some(rounds) = all.get(&(p.name.clone(), s.name.clone())) {
                let mut sum = summarize(&p.name, &s.name, s.metric, rounds);
                if p.name != "direct" {
                    sum.cpu_cap_percent = m.cpu_cap.as_ref().map(|c| c.percent);
                }
                out.push(sum);
            }
        }
    }
    out
}

pub use crate::manifest::FLOOR;

/// What `s`'s proxy spends per request above the floor in the same scenario (medians over
/// rounds): its own work. None for the floor itself, or without both CPU figures.
pub fn above_floor(summaries: &[Summary], s: &Summary) -> Option<f64> {
    if s.proxy == FLOOR {
        return None;
    }
    let mine = s.cpu_us_per_request?.median;
    let floor = summaries
        .iter()
        .find(|x| x.scenario == s.scenario && x.proxy == FLOOR)?
        .cpu_us_per_request?
        .median;
    Some(mine - floor)
}

/// Per scenario with a floor and a Portico CPU figure, one line: Portico's own work above the
/// floor against each other proxy's, with whether the rounds separate them
/// (`rps-1k: portico 3.60 µs/req above the floor (19.95): 0.90x nginx (4.00, level),
/// 0.54x haproxy (6.70, ahead)`). Own work within 5% of the floor is no figure to divide (noise,
/// not work): said as such, without a ratio.
pub fn verdict(summaries: &[Summary]) -> Vec<String> {
    let mut scenarios: Vec<&str> = summaries.iter().map(|s| s.scenario.as_str()).collect();
    scenarios.dedup();
    scenarios
        .into_iter()
        .filter_map(|scenario| {
            let cpus: Vec<(&str, Spread)> = summaries
                .iter()
                .filter(|s| s.scenario == scenario)
                .filter_map(|s| Some((s.proxy.as_str(), s.cpu_us_per_request?)))
                .collect();
            own_work(scenario, &cpus)
        })
        .collect()
}

/// Whether Portico's rounds and a peer's are apart: `ahead` when Portico's costliest round cost
/// less than the peer's cheapest, `behind` the other way, `level` when they overlap; None from
/// a single round (nothing to tell a difference from noise with).
pub fn separation(portico: &Spread, peer: &Spread) -> Option<&'static str> {
    if portico.n < 2 || peer.n < 2 {
        None
    } else if portico.max < peer.min {
        Some("ahead")
    } else if portico.min > peer.max {
        Some("behind")
    } else {
        Some("level")
    }
}

/// One verdict line for `label` from each proxy's CPU µs per request over the rounds (`cpus`,
/// the floor's among them); None without the floor's or Portico's figure.
pub fn own_work(label: &str, cpus: &[(&str, Spread)]) -> Option<String> {
    let of = |p: &str| cpus.iter().find(|(name, _)| *name == p).map(|(_, c)| *c);
    let floor = of(FLOOR)?.median;
    let portico = of("portico")?;
    let mine = portico.median - floor;
    let noise = floor * 0.05;
    let peers: Vec<String> = cpus
        .iter()
        .filter(|(p, _)| ![FLOOR, "portico", "direct"].contains(p))
        .map(|(p, c)| {
            let theirs = c.median - floor;
            match (mine > noise && theirs > noise, separation(&portico, c)) {
                (true, Some(w)) => format!("{:.2}x {p} ({theirs:.2}, {w})", mine / theirs),
                (true, None) => format!("{:.2}x {p} ({theirs:.2})", mine / theirs),
                (false, Some(w)) => format!("{p} {theirs:.2} ({w})"),
                (false, None) => format!("{p} {theirs:.2}"),
            }
        })
        .collect();
    let within = match mine > noise {
        true => "",
        false => " (within 5% of the floor: no ratio)",
    };
    Some(format!(
        "{label}: portico {mine:.2} µs/req above the floor ({floor:.2}){within}{}{}",
        if peers.is_empty() { "" } else { ": " },
        peers.join(", ")
    ))
}

/// The terminal's table of medians: one line per proxy × scenario.
pub fn table(summaries: &[Summary], rounds: u32, pinned: bool) -> String {
    let mut t = if rounds > 1 {
        format!(
            "Summary ({rounds} rounds, proxies alternating within each; median (min..max) over rounds):\n"
        )
    } else {
        "Summary (1 round):\n".to_string()
    };
    for s in summaries {
        let rate = s
            .rate
            .map(|r| {
                let figure = r.text(s.rate_decimals());
                match r.n < rounds as usize {
                    true => format!("{figure} {} (from {} of {rounds} rounds)", s.unit, r.n),
                    false => format!("{figure} {}", s.unit),
                }
            })
            .unwrap_or_else(|| format!("no {}", s.unit));
        let cpu = s
            .cpu_us_per_request
            .map(|c| format!(", proxy CPU {} us/req", c.text(2)))
            .unwrap_or_default();
        let above = above_floor(summaries, s)
            .map(|a| format!(", {a:.2} above the floor"))
            .unwrap_or_default();
        let idle = s
            .cpu_percent_of_core
            .filter(|_| s.not_the_bottleneck(pinned).is_some())
            .map(|c| format!(" (not the bottleneck: {:.0}% of its core)", c.median))
            .unwrap_or_default();
        t.push_str(&format!(
            "  {:<20} {:<8} {rate}{idle}{cpu}{above}\n",
            s.scenario, s.proxy
        ));
    }
    let verdict = verdict(summaries);
    if !verdict.is_empty() {
        t.push_str(match rounds {
            1 => {
                "Own work (CPU per request above the relay's; one round: repeat with --rounds 3 \
                  to tell a difference from noise):\n"
            }
            _ => {
                "Own work (CPU per request above the relay's, medians; ahead or behind: every \
                  round of one cost less than every round of the other; level: they overlap):\n"
            }
        });
        for line in verdict {
            t.push_str(&format!("  {line}\n"));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{test_report, CpuReport};

    #[test]
    fn median_and_spread() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[f64::NAN]), None);
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        // Even count: the mean of the two middle values.
        let s = spread(&[4.0, 1.0, 3.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.5, 1.0, 10.0, 4));
        // Non-finite values are not figures (a run without CPU samples).
        let s = spread(&[5.0, f64::NAN, 7.0]).unwrap();
        assert_eq!((s.median, s.n), (6.0, 2));
        let one = spread(&[41_000.0]).unwrap();
        assert_eq!(one.text(1), "41,000");
        assert_eq!(
            spread(&[40_100.0, 41_000.0, 41_900.0]).unwrap().text(1),
            "41,000 (40,100..41,900)"
        );
        assert_eq!(
            spread(&[17.25, 18.0]).unwrap().text(2),
            "17.62 (17.25..18.00)"
        );
    }

    #[test]
    fn a_round_whose_lowest_rate_failed_counts_as_a_knee_of_zero() {
        use crate::sweep::Knee;
        let with = |rate: Option<f64>, failed_at: Option<f64>| {
            let mut s = crate::page::tests::sweep("portico");
            s.knee = Some(Knee {
                rate,
                failed_at,
                note: String::new(),
            });
            Input::Sweep(Box::new(s))
        };
        let rounds = vec![
            (1, with(Some(10_000.0), Some(11_000.0))),
            (2, with(None, Some(7_000.0))),
            (3, with(Some(9_000.0), Some(10_000.0))),
            // Every rate void: nothing measured, nothing counted.
            (4, with(None, None)),
        ];
        let s = summarize("portico", "latency", Metric::Latency, &rounds);
        let r = s.rate.unwrap();
        assert_eq!((r.median, r.min, r.max, r.n), (9_000.0, 0.0, 10_000.0, 3));
        assert!(table(&[s], 4, true).contains("9,000 (0..10,000) knee req/s (from 3 of 4 rounds)"));
    }

    fn run(rate: f64, us: Option<f64>) -> Input {
        let mut r = test_report(None, &[1; 10], 0, 0);
        r.achieved_rate = rate;
        r.cpu = us.map(|u| CpuReport {
            pids: vec![1],
            processes: 1,
            seconds: 1.0,
            percent_of_core: u * 2.0,
            us_per_request: Some(u),
        });
        Input::Run(Box::new(r))
    }

    #[test]
    fn summary_over_rounds() {
        let rounds = vec![
            (1, run(1000.0, Some(20.0))),
            (2, run(3000.0, Some(10.0))),
            (3, run(2000.0, Some(12.0))),
        ];
        let s = summarize("portico", "rps-1k", Metric::Rps, &rounds);
        assert_eq!(s.unit, "req/s");
        let r = s.rate.unwrap();
        assert_eq!((r.median, r.min, r.max, r.n), (2000.0, 1000.0, 3000.0, 3));
        let c = s.cpu_us_per_request.unwrap();
        assert_eq!((c.median, c.min, c.max), (12.0, 10.0, 20.0));
        assert_eq!(s.cpu_percent_of_core.unwrap().median, 24.0);
        // Round 3 has the median rate.
        assert_eq!(s.median_round, Some(3));
        // Even count: the median is between rounds 1 and 2; the earliest nearest is taken.
        let s = summarize("p", "rps-1k", Metric::Rps, &rounds[..2]);
        assert_eq!(s.rate.unwrap().median, 2000.0);
        assert_eq!(s.median_round, Some(1));
        // direct: no CPU figures; a sweep in an RPS scenario has no rate.
        let s = summarize("direct", "rps-1k", Metric::Rps, &[(1, run(5.0, None))]);
        assert_eq!(s.cpu_us_per_request, None);
        let t = table(&[s], 1, true);
        assert!(t.starts_with("Summary (1 round):\n"), "{t}");
        assert!(t.contains("rps-1k") && t.contains("5.0 req/s"), "{t}");
        assert!(!t.contains("CPU"), "{t}");
        assert_eq!(s_direct_note(), None, "no CPU figure: no claim either way");
    }

    fn s_direct_note() -> Option<String> {
        summarize("direct", "rps-1k", Metric::Rps, &[(1, run(5.0, None))]).not_the_bottleneck(true)
    }

    #[test]
    fn a_proxy_short_of_its_core_did_not_set_the_rate() {
        // 24% of a core: the generator or the origin set the rate
        let idle = summarize(
            "nginx",
            "rps-1k",
            Metric::Rps,
            &[(1, run(2000.0, Some(12.0)))],
        );
        let note = idle.not_the_bottleneck(true).unwrap();
        assert!(
            note.starts_with("rps-1k nginx: not the bottleneck (the proxy used 24% of its core)"),
            "{note}"
        );
        assert_eq!(idle.not_the_bottleneck(false), None, "unpinned: no claim");
        let mut floor = idle.clone();
        floor.proxy = "relay".into();
        assert_eq!(
            floor.not_the_bottleneck(true),
            None,
            "the floor sets no rate to claim"
        );
        let t = table(&[idle], 1, true);
        assert!(
            t.contains("req/s (not the bottleneck: 24% of its core), proxy CPU"),
            "{t}"
        );
        // 90%: its own rate
        let busy = summarize(
            "nginx",
            "rps-1k",
            Metric::Rps,
            &[(1, run(45000.0, Some(45.0)))],
        );
        assert_eq!(busy.not_the_bottleneck(true), None);
        // a sweep's knee is no saturation claim
        let mut knee = busy.clone();
        knee.unit = "knee req/s".into();
        knee.cpu_percent_of_core = idle_spread();
        assert_eq!(knee.not_the_bottleneck(true), None);
        // capped to half a core: 45% of a core is its saturation, 30% is not (85% of its cap:
        // 42.5%)
        let mut capped = summarize(
            "nginx",
            "rps-1k",
            Metric::Rps,
            &[(1, run(45000.0, Some(22.5)))],
        );
        capped.cpu_cap_percent = Some(50.0);
        assert_eq!(capped.not_the_bottleneck(true), None);
        capped.cpu_percent_of_core = spread(&[30.0]);
        let note = capped.not_the_bottleneck(true).unwrap();
        assert!(
            note.contains("(the proxy used 30% of a core, capped to 50%)"),
            "{note}"
        );
    }

    fn idle_spread() -> Option<crate::manifest::Spread> {
        spread(&[10.0])
    }

    #[test]
    fn own_work_is_measured_above_the_floor() {
        let one = |proxy: &str, us: Option<f64>| {
            summarize(proxy, "rps-1k", Metric::Rps, &[(1, run(1000.0, us))])
        };
        let all = vec![
            one("direct", None),
            one("relay", Some(20.0)),
            one("portico", Some(23.0)),
            one("nginx", Some(24.0)),
            one("haproxy", Some(19.5)),
        ];
        assert_eq!(above_floor(&all, &all[2]), Some(3.0));
        assert_eq!(above_floor(&all, &all[1]), None);
        assert_eq!(above_floor(&all, &all[0]), None);
        assert_eq!(
            verdict(&all),
            ["rps-1k: portico 3.00 µs/req above the floor (20.00): 0.75x nginx (4.00), haproxy -0.50"]
        );
        // Over rounds: whether the rounds keep them apart.
        let three = |proxy: &str, us: [f64; 3]| {
            let rounds: Vec<(u32, Input)> = (1..=3)
                .map(|k| (k, run(1000.0, Some(us[k as usize - 1]))))
                .collect();
            summarize(proxy, "rps-1k", Metric::Rps, &rounds)
        };
        let rounds = vec![
            three("relay", [20.0, 20.5, 19.5]),
            three("portico", [22.0, 23.0, 22.5]),
            three("nginx", [24.0, 25.0, 23.5]),
            three("haproxy", [22.8, 26.0, 27.0]),
            three("caddy", [21.0, 21.5, 21.9]),
        ];
        assert_eq!(
            verdict(&rounds),
            [
                "rps-1k: portico 2.50 µs/req above the floor (20.00): 0.62x nginx (4.00, ahead), \
              0.42x haproxy (6.00, level), 1.67x caddy (1.50, behind)"
            ]
        );
        assert!(table(&rounds, 3, true).contains("ahead or behind"));
        let t = table(&all, 1, true);
        assert!(t.contains("23.00 us/req, 3.00 above the floor"), "{t}");
        assert!(t.contains("Own work"), "{t}");
        // Portico within the floor's noise: no ratio.
        let mut close = all.clone();
        close[2] = one("portico", Some(20.5));
        assert_eq!(
            verdict(&close),
            ["rps-1k: portico 0.50 µs/req above the floor (20.00) (within 5% of the floor: no ratio): nginx 4.00, haproxy -0.50"]
        );
        // Without the floor: no verdict.
        assert!(verdict(&all[2..]).is_empty());
    }
}
