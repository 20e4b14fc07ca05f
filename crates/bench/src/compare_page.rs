//! The `bench compare` page: proxies side by side (RPS, CPS, MB/s and CPU bars, latency and CPU against the offered rate, percentile spectra), a table and the manifest.

use crate::error::BenchError;
use crate::manifest::{Manifest, Metric, ScenarioEntry, Summary};
use crate::page::{median_run, rate_text, Input, Page};
use crate::report::{rfc3339, Report};
use crate::rounds::AllRounds;
use crate::svg::{self, escape, BarGroup, LineChart, Series, XAxis};
use crate::sweep::{Step, SweepReport};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Results by (proxy, scenario).
pub type Results = HashMap<(String, String), Input>;

/// Load every result the manifest names from `dir` (missing or unreadable ones are left out; the
/// page says so): every round, and per proxy and scenario the round with the median figure.
pub fn load(m: &Manifest, dir: &Path) -> (Results, AllRounds) {
    let all = crate::rounds::load_all(m, dir);
    (representatives(m, &all), all)
}

/// Per proxy and scenario, the round whose figure is the median (see [`Summary::median_round`]).
pub fn representatives(m: &Manifest, all: &AllRounds) -> Results {
    let mut out = HashMap::new();
    for sum in crate::rounds::summaries(m, all) {
        let key = (sum.proxy.clone(), sum.scenario.clone());
        let Some(rounds) = all.get(&key) else {
            continue;
        };
        let pick = rounds
            .iter()
            .find(|(k, _)| Some(*k) == sum.median_round)
            .or(rounds.first());
        if let Some((_, i)) = pick {
            out.insert(key, i.clone());
        }
    }
    out
}

/// Every result as the only round (a page drawn from single results).
pub fn as_rounds(res: &Results) -> AllRounds {
    res.iter()
        .map(|(k, i)| (k.clone(), vec![(1, i.clone())]))
        .collect()
}

/// The proxies that have at least one result, with their palette index (their place in the
/// manifest, so that each keeps its colour whatever the others did).
fn shown(m: &Manifest, res: &Results) -> Vec<(String, usize)> {
    m.proxies
        .iter()
        .enumerate()
        .filter(|(_, p)| res.keys().any(|(proxy, _)| proxy == &p.name))
        .map(|(i, p)| (p.name.clone(), i))
        .collect()
}

fn sweep_of<'a>(res: &'a Results, proxy: &str, scenario: &str) -> Option<&'a SweepReport> {
    match res.get(&(proxy.to_string(), scenario.to_string()))? {
        Input::Sweep(s) => Some(s),
        Input::Run(_) => None,
    }
}

/// A grouped bar chart over the scenarios of `metrics`, one bar per proxy.
/// Runs whose figures `compare` found void (see `compare::check_run`): left out of the charts.
type Void = std::collections::HashSet<(String, String)>;

fn bars(
    title: &str,
    x_label: &str,
    proxies: &[(String, usize)],
    scenarios: &[&ScenarioEntry],
    (all, void): (&AllRounds, &Void),
    value: &dyn Fn(&Report) -> Option<f64>,
) -> Option<String> {
    // The median over rounds, and min..max when there were several.
    let figure = |p: &String, s: &ScenarioEntry| -> Option<crate::manifest::Spread> {
        if void.contains(&(p.clone(), s.name.clone())) {
            return None;
        }
        let rounds = all.get(&(p.clone(), s.name.clone()))?;
        let v: Vec<f64> = rounds
            .iter()
            .filter_map(|(_, i)| match i {
                Input::Run(r) => value(r),
                Input::Sweep(_) => None,
            })
            .collect();
        crate::rounds::spread(&v)
    };
    let groups: Vec<BarGroup> = scenarios
        .iter()
        .map(|s| {
            let f: Vec<Option<crate::manifest::Spread>> =
                proxies.iter().map(|(p, _)| figure(p, s)).collect();
            BarGroup {
                label: short_of(s).to_string(),
                values: f.iter().map(|x| x.map(|x| x.median)).collect(),
                spreads: f
                    .iter()
                    .map(|x| x.filter(|x| x.n > 1).map(|x| (x.min, x.max)))
                    .collect(),
            }
        })
        .filter(|g| g.values.iter().any(Option::is_some))
        .collect();
    if groups.is_empty() {
        return None;
    }
    let names: Vec<String> = proxies.iter().map(|(p, _)| p.clone()).collect();
    let colors: Vec<usize> = proxies.iter().map(|(_, c)| *c).collect();
    Some(svg::grouped_bar_chart(
        title, x_label, &names, &colors, &groups,
    ))
}

/// The offered rate at which the spectra are compared: the highest rate every proxy's sweep ran
/// and met the SLO at, else the lowest rate they all ran.
pub fn common_rate(sweeps: &[&SweepReport]) -> Option<f64> {
    let first = sweeps.first()?;
    let rates: Vec<f64> = first
        .by_rate()
        .iter()
        .map(|st| st.rate)
        .filter(|r| {
            sweeps
                .iter()
                .all(|s| s.steps.iter().any(|st| st.rate == *r))
        })
        .collect();
    let passing = rates.iter().copied().filter(|r| {
        sweeps.iter().all(|s| {
            s.steps
                .iter()
                .filter(|st| st.rate == *r)
                .all(|st| st.pass != Some(false) && !st.verdicts.iter().any(|v| v.void))
        })
    });
    passing
        .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.max(r))))
        .or_else(|| rates.iter().copied().reduce(f64::min))
}

fn step_at(s: &SweepReport, rate: f64) -> Option<&Step> {
    s.by_rate().into_iter().find(|st| st.rate == rate)
}

fn f2(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite()).map_or("–".to_string(), |v| {
        if v >= 1000.0 {
            svg::tick_text(v, 1.0)
        } else {
            format!("{v:.prec$}")
        }
    })
}

/// Build the page from the representative round of each result (`res`) and every round (`all`).
pub fn build(m: &Manifest, res: &Results, all: &AllRounds, generated: &str) -> Page {
    let proxies = shown(m, res);
    let summaries = crate::rounds::summaries(m, all);
    let void: Void = m
        .results
        .iter()
        .filter(|r| !r.warnings.is_empty())
        .map(|r| (r.proxy.clone(), r.scenario.clone()))
        .collect();
    let rv = (all, &void);
    let of = |metric: Metric| -> Vec<&ScenarioEntry> {
        m.scenarios.iter().filter(|s| s.metric == metric).collect()
    };
    let mut svgs: Vec<(String, String, String)> = Vec::new();
    let conns = m.connections;
    if let Some(s) = bars(
        "Requests per second (closed loop, keep-alive)",
        "completed requests/s",
        &proxies,
        &of(Metric::Rps),
        rv,
        &|r| Some(r.achieved_rate),
    ) {
        svgs.push((
            "compare-rps.svg".into(),
            format!(
                "Saturation throughput: {conns} connections sending their next request as soon as \
                 the previous response arrived (closed loop, like wrk). Higher is better."
            ),
            s,
        ));
    }
    if let Some(s) = bars(
        "New connections per second",
        "connections/s (one request each)",
        &proxies,
        &of(Metric::Cps),
        rv,
        &|r| Some(r.connections_per_s),
    ) {
        svgs.push((
            "compare-cps.svg".into(),
            "A new connection (and, for HTTPS, a TLS 1.3 handshake with X25519, full or resumed as \
             named) for every request, closed loop. Higher is better."
                .into(),
            s,
        ));
    }
    if let Some(s) = bars(
        "Throughput, 1 MB responses",
        "MB/s (10^6 bytes)",
        &proxies,
        &of(Metric::Throughput),
        rv,
        &|r| Some(r.bytes_per_s / 1e6),
    ) {
        svgs.push((
            "compare-throughput.svg".into(),
            "Response bytes per second with 1 MB responses, closed loop, keep-alive. Higher is better."
                .into(),
            s,
        ));
    }
    let measured: Vec<(String, usize)> = proxies
        .iter()
        .filter(|(p, _)| p != "direct")
        .cloned()
        .collect();
    let cpu_us = |r: &Report| r.cpu.as_ref().and_then(|c| c.us_per_request);
    for (file, title, x, scen, caption) in [
        (
            "compare-cpu.svg",
            "Proxy CPU time per request",
            "µs of CPU (user + system) per request",
            of(Metric::Rps),
            "CPU time of the proxy's processes (from /proc) during each keep-alive closed-loop \
             run, divided by the requests completed. Lower is better; direct has no proxy and so \
             no bar.",
        ),
        (
            "compare-cpu-cps.svg",
            "Proxy CPU time per new connection",
            "µs of CPU (user + system) per connection (one request each)",
            of(Metric::Cps),
            "CPU time of the proxy's processes per connection in the new-connection-per-request \
             runs (accept, TLS handshake, one request, close). Lower is better.",
        ),
    ] {
        if let Some(svg) = bars(title, x, &measured, &scen, rv, &cpu_us) {
            svgs.push((file.into(), caption.into(), svg));
        }
    }
    if let Some(svg) = bars(
        "Proxy CPU time per GB",
        "ms of CPU (user + system) per GB (10^9 bytes) of responses",
        &measured,
        &of(Metric::Throughput),
        rv,
        &|r| {
            let c = r.cpu.as_ref()?;
            (r.bytes > 0).then(|| c.seconds * 1e3 / (r.bytes as f64 / 1e9))
        },
    ) {
        svgs.push((
            "compare-cpu-gb.svg".into(),
            "CPU time of the proxy's processes per GB of 1 MB responses relayed. Lower is better."
                .into(),
            svg,
        ));
    }
    // The latency sweep, one line per proxy.
    let sweeps: Vec<(&str, usize, &SweepReport)> = proxies
        .iter()
        .filter_map(|(p, c)| Some((p.as_str(), *c, sweep_of(res, p, "latency")?)))
        .collect();
    let mut spectrum_rate = None;
    if !sweeps.is_empty() {
        let per_rate = |f: &dyn Fn(&Step) -> Option<f64>| -> Vec<Series> {
            sweeps
                .iter()
                .map(|(p, _, s)| Series {
                    label: p.to_string(),
                    points: s
                        .by_rate()
                        .iter()
                        // A step where nothing completed has no latency to draw.
                        .filter(|st| st.runs.iter().any(|r| r.requests.completed > 0))
                        .filter_map(|st| f(st).map(|y| (st.rate, y)))
                        .collect(),
                    markers: true,
                })
                .collect()
        };
        // Colours follow the proxies' indexes: pad the series list with empty ones.
        let coloured = |series: Vec<Series>| -> Vec<Series> {
            let mut out: Vec<Series> = Vec::new();
            for ((_, c, _), s) in sweeps.iter().zip(series) {
                while out.len() < *c {
                    out.push(Series {
                        label: String::new(),
                        points: Vec::new(),
                        markers: false,
                    });
                }
                out.push(s);
            }
            out
        };
        let slo = sweeps.iter().find_map(|(_, _, s)| s.slo.clone());
        // Saturated steps reach seconds: cut the latency axes at 10x the SLO bound.
        let latency_cap = slo.as_ref().map(|s| s.below_ms * 10.0);
        let spectrum_cap = slo.as_ref().map_or(f64::INFINITY, |s| s.below_ms * 10.0);
        let chart = |title: &str,
                     y: &str,
                     series: Vec<Series>,
                     hl: Vec<(f64, String)>,
                     cap: Option<f64>| {
            svg::line_chart(&LineChart {
                title: title.to_string(),
                x_label: "offered rate (requests/s)".into(),
                y_label: y.to_string(),
                x_axis: XAxis::Linear,
                series: coloured(series),
                hlines: hl,
                y_cap: cap,
            })
        };
        let p99_line = slo
            .as_ref()
            .filter(|s| s.percentile == 99.0)
            .map(|s| vec![(s.below_ms, format!("SLO {}", s.text))])
            .unwrap_or_default();
        svgs.push((
            "compare-latency-p99.svg".into(),
            "p99 latency against the offered rate (open loop, from each request's intended send \
             time: coordinated omission corrected). Lower and further right is better."
                .into(),
            chart(
                "p99 latency vs offered rate",
                "p99 latency (ms)",
                per_rate(&|st| Some(st.figures.p99_ms)),
                p99_line,
                latency_cap,
            ),
        ));
        svgs.push((
            "compare-latency-mean.svg".into(),
            "Average latency against the offered rate (open loop, corrected).".into(),
            chart(
                "Average latency vs offered rate",
                "average latency (ms)",
                per_rate(&|st| Some(st.figures.mean_ms)),
                Vec::new(),
                latency_cap,
            ),
        ));
        let cpu = per_rate(&|st| st.figures.cpu_percent_of_core);
        if cpu.iter().any(|s| !s.points.is_empty()) {
            svgs.push((
                "compare-cpu-percent.svg".into(),
                "CPU of the proxy's processes against the offered rate, % of one core (the proxy \
                 has one worker on one core)."
                    .into(),
                chart(
                    "Proxy CPU vs offered rate",
                    "CPU (% of one core)",
                    cpu,
                    Vec::new(),
                    None,
                ),
            ));
        }
        let all: Vec<&SweepReport> = sweeps.iter().map(|(_, _, s)| *s).collect();
        spectrum_rate = common_rate(&all);
        if let Some(rate) = spectrum_rate {
            let series = sweeps
                .iter()
                .map(|(p, _, s)| Series {
                    label: p.to_string(),
                    points: step_at(s, rate)
                        .and_then(median_run)
                        .map(|r| r.spectrum.clone())
                        .unwrap_or_default(),
                    markers: false,
                })
                .collect();
            svgs.push((
                "compare-percentiles.svg".into(),
                format!(
                    "Latency by percentile at {} req/s offered (the highest rate every proxy met \
                     the SLO at, else the lowest), on the HdrHistogram plotter's axis: each tick \
                     adds a nine. Lower is better.",
                    rate_text(rate)
                ),
                svg::line_chart(&LineChart {
                    title: format!("Latency by percentile at {} req/s", rate_text(rate)),
                    x_label: "percentile".into(),
                    y_label: "latency (ms)".into(),
                    x_axis: XAxis::Nines,
                    series: coloured(series),
                    hlines: Vec::new(),
                    y_cap: Some(spectrum_cap),
                }),
            ));
        }
    }

    let any_knee = sweeps
        .iter()
        .any(|(_, _, s)| s.knee.as_ref().and_then(|k| k.rate).is_some());
    if any_knee {
        let slo = sweeps
            .iter()
            .find_map(|(_, _, s)| s.slo.as_ref().map(|x| x.text.clone()))
            .unwrap_or_default();
        let names: Vec<String> = sweeps.iter().map(|(p, _, _)| p.to_string()).collect();
        let colors: Vec<usize> = sweeps.iter().map(|(_, c, _)| *c).collect();
        let group = BarGroup {
            label: format!("knee, {slo}"),
            values: sweeps
                .iter()
                .map(|(_, _, s)| s.knee.as_ref().and_then(|k| k.rate))
                .collect(),
            spreads: Vec::new(),
        };
        svgs.push((
            "compare-knee.svg".into(),
            format!(
                "The knee: the highest offered rate of the sweep at which p99 and every other                  condition of the SLO held ({slo}, no errors, every request sent and finished, the                  generator on schedule). n/a: not even the lowest rate measured met it. Higher is better."
            ),
            svg::grouped_bar_chart(
                "Highest offered rate meeting the SLO",
                "offered requests/s",
                &names,
                &colors,
                &[group],
            ),
        ));
    }

    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{t}</title>\n\
         <style>\nbody {{ font-family: DejaVu Sans, Verdana, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 92em; padding: 0 1em; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}\n\
         th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }}\n\
         th {{ background: #f3f3f3; }} td.l, th.l {{ text-align: left; }}\n\
         tr.first td {{ border-top: 2px solid #888; }} td.scen {{ min-width: 14em; }} td.note {{ min-width: 14em; }}\n\
         figure {{ margin: 1.5em 0; }} figcaption {{ color: #555; font-size: 0.9em; max-width: 50em; }}\n\
         code, pre {{ font-size: 0.85em; }} code {{ word-break: break-all; }} .skip {{ color: #a60; }} .fail {{ color: #b00; }}\n\
         </style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(&m.title)
    );
    let _ = writeln!(
        h,
        "<p>{} to {} on {} ({} CPUs), Linux {}{}. {}. Each run: {} s measured after a {} s warm-up \
         that is excluded from the results; {} client connections; {}. Closed-loop runs measure \
         saturation throughput and CPU; latency claims come from the open-loop sweep only.</p>",
        escape(&m.started),
        escape(&m.finished),
        escape(&m.host.cpu),
        m.host.cpus,
        escape(&m.host.kernel),
        match (m.load_at_start, m.host.load_average) {
            (Some(a), Some(b)) => format!(
                "; load average (1 minute) {:.2} at the start, {:.2} at the end{}",
                a[0],
                b[0],
                if a[0].max(b[0]) > m.host.cpus as f64 {
                    ", above the CPU count"
                } else {
                    ""
                }
            ),
            _ => String::new(),
        },
        escape(&match &m.cpu_cap {
            Some(c) => format!("{}; {}", m.pinning, c.how),
            None => m.pinning.clone(),
        }),
        m.duration_s,
        m.warmup_s,
        m.connections,
        if m.rounds > 1 {
            format!(
                "{} rounds, each proxy in turn within a round (A B C, A B C...), each proxy \
                 started afresh per round; bars are medians over the rounds with a whisker from \
                 the lowest to the highest, the table shows the round with the median figure",
                m.rounds
            )
        } else {
            "one round".to_string()
        }
    );
    // What did not run.
    let mut notes: Vec<String> = Vec::new();
    for p in &m.proxies {
        if let Some(why) = &p.skipped {
            notes.push(format!(
                "<b>{}</b>: skipped, {}",
                escape(&p.name),
                escape(why)
            ));
        }
        if let Some(e) = &p.error {
            notes.push(format!(
                "<b>{}</b>: <span class=\"fail\">{}</span>",
                escape(&p.name),
                escape(e)
            ));
        }
    }
    for r in &m.results {
        let proxy_skipped = m
            .proxies
            .iter()
            .any(|p| p.name == r.proxy && (p.skipped.is_some() || p.error.is_some()));
        if proxy_skipped {
            continue;
        }
        if let Some(why) = &r.skipped {
            notes.push(format!(
                "<b>{}</b> × {}: skipped, {}",
                escape(&r.proxy),
                escape(&r.scenario),
                escape(why)
            ));
        }
        for e in r.error.iter().chain(&r.warnings) {
            notes.push(format!(
                "<b>{}</b> × {}: <span class=\"fail\">{}</span>",
                escape(&r.proxy),
                escape(&r.scenario),
                escape(e)
            ));
        }
        if let Some(t) = &r.throttling {
            notes.push(format!(
                "<b>{}</b> × {}{}: CPU cap {}",
                escape(&r.proxy),
                escape(&r.scenario),
                if m.rounds > 1 {
                    format!(" (round {})", r.round)
                } else {
                    String::new()
                },
                escape(t)
            ));
        }
    }
    if let Some(t) = &m.tls {
        notes.push(format!("HTTPS: {}", escape(t)));
    }
    if !notes.is_empty() {
        h.push_str("<ul class=\"skip\">\n");
        for n in &notes {
            let _ = writeln!(h, "<li>{n}</li>");
        }
        h.push_str("</ul>\n");
    }
    // The verdict: each proxy's own work, above the floor.
    let mut verdict = crate::rounds::verdict(&summaries);
    // And at one offered rate for all (open loop): the cost at a realistic load, not at each
    // proxy's own saturation.
    if let Some(rate) = spectrum_rate {
        // Each proxy's median over the rounds whose sweep ran that rate.
        let cpus: Vec<(&str, crate::manifest::Spread)> = sweeps
            .iter()
            .filter_map(|(p, _, _)| {
                let rounds = all.get(&(p.to_string(), "latency".to_string()))?;
                let at: Vec<f64> = rounds
                    .iter()
                    .filter_map(|(_, i)| match i {
                        Input::Sweep(s) => step_at(s, rate).and_then(median_run),
                        Input::Run(_) => None,
                    })
                    .filter_map(|r| r.cpu.as_ref()?.us_per_request)
                    .collect();
                Some((*p, crate::rounds::spread(&at)?))
            })
            .collect();
        let label = format!(
            "latency sweep at {} req/s offered to every proxy",
            rate_text(rate)
        );
        verdict.extend(crate::rounds::own_work(&label, &cpus));
    }
    if !verdict.is_empty() {
        let _ = writeln!(
            h,
            "<h2>Own work above the floor</h2>\n<p>CPU time per request above the relay's (a blind \
             TCP relay: what the kernel charges any proxy on this machine for the same bytes), \
             medians over {}; a ratio below 1 means Portico does less work of its own than that \
             proxy. <i>Ahead</i> or <i>behind</i>: every round of one cost less than every round \
             of the other; <i>level</i>: their rounds overlap, and the ratio is within the \
             noise. In the closed-loop scenarios each proxy ran as fast as the loop let it (its \
             own saturation rate, unless listed below as not the bottleneck); the latency \
             sweep's line compares them at one offered rate.</p>\n<ul>",
            match m.rounds {
                1 => "one round (a single measurement: repeat with --rounds 3 or more)".to_string(),
                n => format!("{n} rounds"),
            }
        );
        for line in &verdict {
            let _ = writeln!(h, "<li>{}</li>", escape(line));
        }
        h.push_str("</ul>\n");
    }
    // Closed-loop rates that are not saturation rates: the proxy was not what limited them.
    let idle: Vec<String> = summaries
        .iter()
        .filter_map(|s| s.not_the_bottleneck(m.pinned()))
        .collect();
    if !idle.is_empty() {
        let _ = writeln!(
            h,
            "<h2>Rates that are not saturation rates</h2>\n<p>In these closed-loop runs the proxy \
             used less than {:.0}% of its one core, or of its CPU cap (median over the rounds): \
             the generator, the \
             origin or the machine limited the rate, so it says nothing of the proxy's \
             capacity, and its CPU per request was measured at less than full load (fewer \
             requests per wake-up: not quite comparable with a saturated proxy's).</p>\n<ul>",
            crate::manifest::SATURATED_PERCENT
        );
        for line in &idle {
            let _ = writeln!(h, "<li>{}</li>", escape(line));
        }
        h.push_str("</ul>\n");
    }
    // Charts.
    h.push_str("<h2>Charts</h2>\n");
    for (file, caption, s) in &svgs {
        let _ = write!(
            h,
            "<figure id=\"{}\">\n{s}<figcaption>{} (<code>{}</code>)</figcaption>\n</figure>\n",
            escape(file.trim_end_matches(".svg")),
            escape(caption),
            escape(file)
        );
    }
    // The table.
    let multi = m.rounds > 1;
    let _ = write!(
        h,
        "<h2>Results</h2>\n{}<table>\n<tr><th class=\"l\">scenario</th><th class=\"l\">proxy</th>\
         <th>req/s</th><th>conn/s</th><th>MB/s</th><th>proxy CPU % of a core</th>\
         <th>proxy CPU µs / req</th><th>p50 ms</th><th>p99 ms</th><th>max ms</th><th>errors</th>\
         <th>non-2xx</th><th>TLS handshakes full / resumed</th>{}<th class=\"l\">notes</th></tr>\n",
        if multi {
            format!(
                "<p>{} rounds: the columns up to the TLS handshakes are those of the round with the \
                 median figure; the rounds column gives the median (min..max) over all rounds.</p>\n",
                m.rounds
            )
        } else {
            String::new()
        },
        if multi {
            "<th class=\"l\">over rounds: median (min..max)</th>"
        } else {
            ""
        }
    );
    for s in &m.scenarios {
        let mut first = true;
        for (p, _) in &proxies {
            let row_class = if first { " class=\"first\"" } else { "" };
            let scen = if first {
                let at = match (s.metric, spectrum_rate) {
                    (Metric::Latency, Some(rate)) => format!(
                        "<br>figures at {} req/s offered (open loop)",
                        rate_text(rate)
                    ),
                    _ => String::new(),
                };
                format!(
                    "<b>{}</b><br>{}<br><code>{}</code>{at}",
                    escape(short_of(s)),
                    escape(&s.title),
                    escape(&s.name)
                )
            } else {
                String::new()
            };
            first = false;
            let (cells, note) = match res.get(&(p.clone(), s.name.clone())) {
                Some(Input::Run(r)) => (row_cells(r), warn_note(&r.warnings)),
                Some(Input::Sweep(sw)) => {
                    let at = spectrum_rate.and_then(|rate| step_at(sw, rate));
                    let cells = at
                        .and_then(median_run)
                        .map(row_cells)
                        .unwrap_or_else(|| empty_cells(11));
                    (cells, escape(&knee_text(sw)))
                }
                None => {
                    let why = m
                        .results
                        .iter()
                        .find(|r| &r.proxy == p && r.scenario == s.name)
                        .and_then(|r| r.skipped.clone().or(r.error.clone()))
                        .unwrap_or_else(|| "no result".into());
                    (empty_cells(11), escape(&why))
                }
            };
            let over = if multi {
                format!(
                    "<td class=\"l\">{}</td>",
                    summaries
                        .iter()
                        .find(|x| &x.proxy == p && x.scenario == s.name)
                        .map(|x| escape(&rounds_text(x, m.pinned())))
                        .unwrap_or_else(|| "–".into())
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                h,
                "<tr{row_class}><td class=\"l scen\">{scen}</td><td class=\"l\">{}</td>{cells}{over}<td class=\"l note\">{note}</td></tr>",
                escape(p)
            );
        }
    }
    h.push_str("</table>\n");
    // Manifest.
    let _ = writeln!(
        h,
        "<h2>Manifest</h2>\n<p>Page made {} by portico {}. Origin: <code>{}</code> ({}). \
         Load generator: <code>portico bench</code> ({}){}. The raw results are the JSON files \
         named below, with <code>manifest.json</code>.</p>",
        escape(generated),
        env!("CARGO_PKG_VERSION"),
        escape(&m.origin.command.join(" ")),
        escape(&m.origin.version),
        escape(&m.generator.version),
        m.generator
            .cpus
            .as_ref()
            .map(|c| format!(" on CPU {}", escape(c)))
            .unwrap_or_default()
    );
    if let Some(c) = &m.command {
        let _ = writeln!(h, "<p>Command: <code>{}</code></p>", escape(c));
    }
    h.push_str(
        "<table>\n<tr><th class=\"l\">proxy</th><th class=\"l\">version</th><th class=\"l\">CPU</th>\
         <th class=\"l\">command</th><th class=\"l\">configuration</th></tr>\n",
    );
    for p in &m.proxies {
        let env: Vec<String> = p
            .environment
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let cmd = format!("{} {}", env.join(" "), p.command.join(" "));
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\"><code>{}</code></td>\
             <td class=\"l\">{}</td></tr>",
            escape(&p.name),
            escape(p.version.as_deref().or(p.skipped.as_deref()).unwrap_or("")),
            escape(p.cpus.as_deref().unwrap_or("not pinned")),
            escape(cmd.trim()),
            match (&p.config_file, &p.config) {
                (Some(f), Some(c)) => format!(
                    "<details><summary><code>{}</code></summary><pre>{}</pre></details>",
                    escape(f),
                    escape(c)
                ),
                _ => "–".to_string(),
            }
        );
    }
    h.push_str("</table>\n<table>\n<tr><th class=\"l\">scenario</th><th class=\"l\">what</th><th class=\"l\">path</th><th class=\"l\">generator command (per proxy)</th></tr>\n");
    for s in &m.scenarios {
        let cmds: Vec<String> = m
            .results
            .iter()
            .filter(|r| r.scenario == s.name && !r.command.is_empty())
            .map(|r| {
                format!(
                    "{}: <code>{}</code>{}",
                    escape(&r.proxy),
                    escape(&r.command.join(" ")),
                    r.file
                        .as_ref()
                        .map(|f| format!(" → <code>{}</code>", escape(f)))
                        .unwrap_or_default()
                )
            })
            .collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td class=\"l\"><code>{}</code></td>\
             <td class=\"l\"><details><summary>{} runs</summary>{}</details></td></tr>",
            escape(&s.name),
            escape(&s.title),
            escape(&s.path),
            cmds.len(),
            cmds.join("<br>")
        );
    }
    h.push_str("</table>\n</body>\n</html>\n");
    Page {
        html: h,
        svgs: svgs.into_iter().map(|(f, _, s)| (f, s)).collect(),
    }
}

/// A summary over rounds in a few words: `41,000 (40,100..41,900) req/s; CPU 17.50 (17.20..18.00)
/// µs/req; 3 rounds`.
fn rounds_text(x: &Summary, pinned: bool) -> String {
    let mut parts = Vec::new();
    if let Some(r) = &x.rate {
        let idle = match x.not_the_bottleneck(pinned) {
            Some(_) => " (not the bottleneck)",
            None => "",
        };
        let figure = r.text(x.rate_decimals());
        parts.push(format!("{figure} {}{idle}", x.unit));
    }
    if let Some(c) = &x.cpu_us_per_request {
        parts.push(format!("CPU {} µs/req", c.text(2)));
    }
    let n = x.rate.map_or(0, |r| r.n);
    parts.push(format!("{n} rounds"));
    parts.join("; ")
}

/// A scenario's chart label.
fn short_of(s: &ScenarioEntry) -> &str {
    if s.short.is_empty() {
        &s.name
    } else {
        &s.short
    }
}

/// The knee of a sweep in a few words.
pub fn knee_text(s: &SweepReport) -> String {
    match (&s.slo, &s.knee) {
        (Some(slo), Some(k)) => match (k.rate, k.failed_at) {
            (Some(r), Some(f)) => format!(
                "knee {} req/s for {} ({} req/s failed)",
                rate_text(r),
                slo.text,
                rate_text(f)
            ),
            (Some(r), None) => format!(
                "knee at or above {} req/s for {} (every rate measured met it)",
                rate_text(r),
                slo.text
            ),
            (None, None) => format!(
                "no knee for {}: no rate measured the server (the generator fell behind at each)",
                slo.text
            ),
            (None, _) => format!(
                "no rate met {} (lowest: {} req/s)",
                slo.text,
                rate_text(s.rates.first().copied().unwrap_or(0.0))
            ),
        },
        _ => "no SLO".to_string(),
    }
}

fn empty_cells(n: usize) -> String {
    "<td>–</td>".repeat(n)
}

fn warn_note(w: &[String]) -> String {
    match w.len() {
        0 => String::new(),
        1 => format!("<span class=\"fail\">warning</span>: {}", escape(&w[0])),
        n => format!(
            "<span class=\"fail\">{n} warnings</span>: {}",
            escape(&w.join(" / "))
        ),
    }
}

fn row_cells(r: &Report) -> String {
    let non_2xx = r.non_2xx();
    let tls = r
        .tls
        .as_ref()
        .map(|t| {
            let h = t.handshakes;
            match t.settings.early_data {
                true => format!(
                    "{} / {} (0-RTT {} accepted, {} refused)",
                    h.full, h.resumed, h.early, h.early_refused
                ),
                false => format!("{} / {}", h.full, h.resumed),
            }
        })
        .unwrap_or_else(|| "–".into());
    let conn = if r.connections_opened > 0 {
        f2(Some(r.connections_per_s), 0)
    } else {
        "–".into()
    };
    format!(
        "<td>{}</td><td>{conn}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{non_2xx}</td><td>{tls}</td>",
        f2(Some(r.achieved_rate), 0),
        f2(Some(r.bytes_per_s / 1e6), 1),
        f2(r.cpu.as_ref().map(|c| c.percent_of_core), 1),
        f2(r.cpu.as_ref().and_then(|c| c.us_per_request), 2),
        f2(Some(r.latency.at(50.0)), 3),
        f2(Some(r.latency.at(99.0)), 3),
        f2(Some(r.latency.max_ms), 3),
        r.requests.errors,
    )
}

/// Write `index.html` and the SVGs into `out` from a manifest whose result files are under
/// `dir`; returns the page's path.
pub fn write(m: &Manifest, dir: &Path, out: &Path) -> Result<PathBuf, BenchError> {
    let (res, all) = load(m, dir);
    let page = build(m, &res, &all, &rfc3339(std::time::SystemTime::now()));
    let file_err = |path: PathBuf| move |source| BenchError::File { path, source };
    std::fs::create_dir_all(out).map_err(file_err(out.to_path_buf()))?;
    for (name, text) in &page.svgs {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(file_err(p.clone()))?;
    }
    // PNG copies of the charts: a missing one is said, not fatal (the page is complete without).
    for problem in crate::png::write_all(out, &page.svgs) {
        eprintln!("warning: {problem}");
    }
    let index = out.join("index.html");
    std::fs::write(&index, &page.html).map_err(file_err(index.clone()))?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::SCENARIOS;
    use crate::manifest::{ProcessEntry, ProxyEntry, ResultEntry};
    use crate::report::{test_report, CpuReport, Host};

    fn proxy(name: &str, skipped: Option<&str>) -> ProxyEntry {
        ProxyEntry {
            name: name.into(),
            version: Some(format!("{name} 1.0")),
            command: vec![name.into()],
            environment: Vec::new(),
            cpus: Some("0".into()),
            config_file: None,
            config: None,
            skipped: skipped.map(String::from),
            error: None,
        }
    }

    fn manifest() -> Manifest {
        let scen = |n: &str| {
            let s = SCENARIOS.iter().find(|s| s.name == n).unwrap();
            ScenarioEntry {
                name: s.name.into(),
                short: s.short.into(),
                title: s.title.into(),
                path: s.path.into(),
                metric: s.metric,
                https: s.https,
                close: s.close,
                resume: s.resume,
                h2: s.h2,
                h3: s.h3,
            }
        };
        let result = |p: &str, s: &str| ResultEntry {
            proxy: p.into(),
            scenario: s.into(),
            round: 1,
            file: None,
            command: vec!["portico".into(), "bench".into()],
            skipped: None,
            error: None,
            warnings: Vec::new(),
            throttling: None,
        };
        Manifest {
            version: 1,
            kind: "compare".into(),
            title: "T <1>".into(),
            started: "2026-01-01T00:00:00Z".into(),
            finished: "2026-01-01T00:01:00Z".into(),
            command: Some("portico bench compare --out x".into()),
            portico_version: "portico 0.1.0".into(),
            host: Host {
                cpu: "Test CPU".into(),
                cpus: 2,
                kernel: "6.1-test".into(),
                load_average: Some([3.5, 1.0, 0.5]),
            },
            load_at_start: Some([0.25, 0.5, 0.5]),
            pinning: "taskset: proxy on CPU 0".into(),
            cpu_cap: None,
            duration_s: 1.0,
            warmup_s: 0.0,
            connections: 10,
            rates: "1000,2000".into(),
            slo: "p99<10ms".into(),
            tls: None,
            origin: ProcessEntry::default(),
            generator: ProcessEntry::default(),
            proxies: vec![
                proxy("direct", None),
                proxy("nginx", Some("nginx is not installed")),
                proxy("portico", None),
            ],
            scenarios: vec![scen("rps-1k"), scen("cps"), scen("latency")],
            rounds: 1,
            summary: Vec::new(),
            results: vec![
                result("direct", "rps-1k"),
                result("portico", "rps-1k"),
                result("portico", "cps"),
                result("direct", "latency"),
                result("portico", "latency"),
            ],
        }
    }

    #[test]
    fn the_page_compares_proxies_side_by_side() {
        let m = manifest();
        let mut res: Results = HashMap::new();
        let mut run = |p: &str, s: &str, rate: f64, cpu: Option<f64>, close: bool| {
            let mut r = test_report(None, &[1; 100], 0, 0);
            r.achieved_rate = rate;
            r.keep_alive = !close;
            if close {
                r.connections_opened = 100;
                r.connections_per_s = rate;
            }
            r.cpu = cpu.map(|u| CpuReport {
                pids: vec![1],
                processes: 1,
                seconds: 1.0,
                percent_of_core: 50.0,
                us_per_request: Some(u),
            });
            res.insert((p.into(), s.into()), Input::Run(Box::new(r)));
        };
        run("direct", "rps-1k", 50_000.0, None, false);
        run("portico", "rps-1k", 40_000.0, Some(17.5), false);
        run("portico", "cps", 3_210.0, Some(99.0), true);
        for p in ["direct", "portico"] {
            res.insert(
                (p.into(), "latency".into()),
                Input::Sweep(Box::new(crate::page::tests::sweep(p))),
            );
        }
        let page = build(&m, &res, &as_rounds(&res), "2026-01-01T00:02:00Z");
        let names: Vec<&str> = page.svgs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "compare-rps.svg",
                "compare-cps.svg",
                "compare-cpu.svg",
                "compare-cpu-cps.svg",
                "compare-latency-p99.svg",
                "compare-latency-mean.svg",
                "compare-cpu-percent.svg",
                "compare-percentiles.svg",
                "compare-knee.svg"
            ]
        );
        let h = &page.html;
        assert!(h.contains("<h1>T &lt;1&gt;</h1>"));
        assert!(h.contains("<b>nginx</b>: skipped, nginx is not installed"));
        // Colours follow the manifest's order: portico is the third proxy, even with nginx
        // skipped, in every chart.
        let rps = &page.svgs[0].1;
        assert!(rps.contains(">50,000<") && rps.contains(">40,000<") && rps.contains(">RPS 1 KB<"));
        assert!(rps.contains(svg::PALETTE[2]) && !rps.contains(svg::PALETTE[1]));
        assert!(page.svgs[7].1.contains(svg::PALETTE[2]));
        // direct has no proxy CPU: only portico in the CPU chart.
        assert!(!page.svgs[2].1.contains(">direct<") && page.svgs[2].1.contains(">17.5<"));
        // The spectra are compared at the highest rate both sweeps passed.
        assert!(page.svgs[7].1.contains("at 1,000 req/s"));
        assert!(page.svgs[3].1.contains(">99.0<"), "CPU per connection");
        assert!(h.contains("knee 1,000 req/s for p99&lt;10ms (2,000 req/s failed)"));
        assert!(h.contains("<td>3,210</td>"), "connections per second");
        assert!(h.contains("<td>17.50</td>"), "CPU per request");
        assert!(h.contains("Test CPU") && h.contains("portico bench compare --out x"));
        assert!(
            h.contains(
                "load average (1 minute) 0.25 at the start, 3.50 at the end, above the CPU count"
            ),
            "{h}"
        );
        for (_, svg) in &page.svgs {
            assert!(h.contains(svg.as_str()));
        }
    }

    #[test]
    fn rounds_give_medians_whiskers_and_the_median_round() {
        let mut m = manifest();
        m.rounds = 3;
        m.scenarios.truncate(1);
        let run = |rate: f64, us: f64| {
            let mut r = test_report(None, &[1; 100], 0, 0);
            r.achieved_rate = rate;
            r.cpu = Some(CpuReport {
                pids: vec![1],
                processes: 1,
                seconds: 1.0,
                percent_of_core: 50.0,
                us_per_request: Some(us),
            });
            Input::Run(Box::new(r))
        };
        let mut all: AllRounds = HashMap::new();
        all.insert(
            ("portico".into(), "rps-1k".into()),
            vec![
                (1, run(30_000.0, 20.0)),
                (2, run(41_000.0, 16.0)),
                (3, run(45_000.0, 15.0)),
            ],
        );
        let res = representatives(&m, &all);
        let Some(Input::Run(r)) = res.get(&("portico".into(), "rps-1k".into())) else {
            panic!("no representative");
        };
        assert_eq!(r.achieved_rate, 41_000.0, "the round with the median rate");
        let page = build(&m, &res, &all, "2026-01-01T00:02:00Z");
        let rps = &page.svgs[0].1;
        // The bar is the median, with a whisker from 30,000 to 45,000.
        assert!(
            rps.contains(">41,000<") && rps.matches("<path").count() == 1,
            "{rps}"
        );
        let cpu = &page
            .svgs
            .iter()
            .find(|(n, _)| n == "compare-cpu.svg")
            .unwrap()
            .1;
        assert!(cpu.contains(">16.0<"), "median CPU: {cpu}");
        let h = &page.html;
        assert!(h.contains("3 rounds, each proxy in turn"), "{h}");
        // Half a core: the rate is flagged as no saturation rate (the CPU figure stands).
        assert!(
            h.contains("41,000 (30,000..45,000) req/s (not the bottleneck); CPU 16.00 (15.00..20.00) µs/req; 3 rounds"),
            "{h}"
        );
        assert!(
            h.contains("<h2>Rates that are not saturation rates</h2>")
                && h.contains(
                    "<li>rps-1k portico: not the bottleneck (the proxy used 50% of its core)"
                ),
            "{h}"
        );
    }

    #[test]
    fn common_rate_prefers_the_highest_rate_all_passed() {
        let a = crate::page::tests::sweep("a");
        let mut b = a.clone();
        assert_eq!(common_rate(&[&a, &b]), Some(1000.0));
        // A void step (the generator fell behind in every try) is not a pass.
        let mut both = a.clone();
        both.steps[1].pass = Some(true);
        assert_eq!(common_rate(&[&both, &both]), Some(2000.0));
        let mut v = both.clone();
        v.steps[1].pass = None;
        v.steps[1].verdicts[0].void = true;
        assert_eq!(common_rate(&[&both, &v]), Some(1000.0), "void at 2,000");
        v.steps[1].verdicts[0].void = false;
        assert_eq!(
            common_rate(&[&both, &v]),
            Some(2000.0),
            "no verdict is no failure"
        );
        // When one failed everywhere, the lowest common rate.
        for st in &mut b.steps {
            st.pass = Some(false);
        }
        assert_eq!(common_rate(&[&a, &b]), Some(1000.0));
        b.steps.retain(|st| st.rate == 2000.0);
        assert_eq!(common_rate(&[&a, &b]), Some(2000.0));
        assert_eq!(common_rate(&[]), None);
        assert_eq!(
            knee_text(&a),
            "knee 1,000 req/s for p99<10ms (2,000 req/s failed)"
        );
    }
}
