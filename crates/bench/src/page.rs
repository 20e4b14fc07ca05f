//! `portico bench report`: one self-contained HTML page (and SVG files) from `--json` results.

use crate::error::BenchError;
use crate::report::{rfc3339, Host, Report};
use crate::svg::{self, escape, LineChart, Series, XAxis};
use crate::sweep::{Step, StepFigures, SweepReport};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The `portico bench report` flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReportFlags {
    /// Directory to write index.html and the SVG files to (created if missing).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Title of the page.
    #[arg(long)]
    pub title: Option<String>,
    /// Percentile distribution of sweeps at the step nearest this offered rate (default: the knee,
    /// else the highest rate without errors).
    #[arg(long, value_name = "REQ/S")]
    pub at: Option<f64>,
    /// JSON results of `portico bench --json` (single runs or sweeps).
    #[arg(required = true, value_name = "RESULT.json")]
    pub files: Vec<PathBuf>,
}

/// One input file.
#[derive(Debug, Clone)]
pub enum Input {
    Run(Box<Report>),
    Sweep(Box<SweepReport>),
}

impl Input {
    pub fn label(&self) -> &str {
        match self {
            Input::Run(r) => &r.label,
            Input::Sweep(s) => &s.label,
        }
    }

    fn set_label(&mut self, l: String) {
        match self {
            Input::Run(r) => r.label = l,
            Input::Sweep(s) => s.label = l,
        }
    }

    /// Parse a JSON result: a sweep when `kind` is `sweep`, else a run.
    pub fn parse(text: &str) -> Result<Input, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("run");
        let mut input = match kind {
            "sweep" => Input::Sweep(Box::new(
                serde_json::from_value(v).map_err(|e| format!("not a sweep result: {e}"))?,
            )),
            "run" => Input::Run(Box::new(
                serde_json::from_value(v)
                    .map_err(|e| format!("not a portico bench result: {e}"))?,
            )),
            other => return Err(format!("unknown kind {other:?}")),
        };
        if input.label().is_empty() {
            let target = match &input {
                Input::Run(r) => r.target.clone(),
                Input::Sweep(s) => s.target.clone(),
            };
            input.set_label(target);
        }
        Ok(input)
    }

    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<Input, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
            path: path.to_path_buf(),
            source,
        })?;
        Input::parse(&text).map_err(|reason| BenchError::Json {
            path: path.to_path_buf(),
            reason,
        })
    }
}

/// The page and its charts.
#[derive(Debug, Clone)]
pub struct Page {
    pub html: String,
    /// (file name, SVG text), each also inline in `html`.
    pub svgs: Vec<(String, String)>,
}

/// Options of the page.
#[derive(Debug, Clone, Default)]
pub struct PageOptions {
    pub title: Option<String>,
    pub at: Option<f64>,
    /// When the page is made (shown in the manifest).
    pub generated: String,
}

/// Make labels unique: a repeated label gets ` (2)`, ` (3)`...
fn unique_labels(inputs: &mut [(String, Input)]) {
    let mut seen: Vec<String> = Vec::new();
    for (_, input) in inputs.iter_mut() {
        let base = input.label().to_string();
        let mut label = base.clone();
        let mut n = 1;
        while seen.contains(&label) {
            n += 1;
            label = format!("{base} ({n})");
        }
        input.set_label(label.clone());
        seen.push(label);
    }
}

/// The run of a step whose p99 is the median of its runs.
pub(crate) fn median_run(step: &Step) -> Option<&Report> {
    let mut runs: Vec<&Report> = step.runs.iter().collect();
    runs.sort_by(|a, b| a.latency.at(99.0).total_cmp(&b.latency.at(99.0)));
    runs.get(runs.len().saturating_sub(1) / 2).copied()
}

/// The step of a sweep whose distribution the page shows: nearest `at`, else the knee's, else the
/// highest rate without errors, unsent or unfinished requests, else the lowest.
pub fn chosen_step(s: &SweepReport, at: Option<f64>) -> Option<&Step> {
    let steps = s.by_rate();
    if let Some(at) = at {
        return steps
            .into_iter()
            .min_by(|a, b| (a.rate - at).abs().total_cmp(&(b.rate - at).abs()));
    }
    if let Some(rate) = s.knee.as_ref().and_then(|k| k.rate) {
        if let Some(st) = steps.iter().find(|st| st.rate == rate) {
            return Some(st);
        }
    }
    let clean = |st: &&&Step| {
        st.runs
            .iter()
            .all(|r| r.requests.errors == 0 && r.requests.unsent == 0 && r.requests.in_flight == 0)
    };
    steps.iter().rev().find(clean).or(steps.first()).copied()
}

/// A row of the summary table.
struct Row {
    label: String,
    what: String,
    achieved: f64,
    fig: StepFigures,
    knee: String,
    warnings: usize,
}

fn figures_of_run(r: &Report) -> StepFigures {
    StepFigures::of(std::slice::from_ref(r))
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.prec$}"))
}

pub(crate) fn rate_text(v: f64) -> String {
    svg::tick_text(v, if v.fract() == 0.0 { 1.0 } else { 0.1 })
}

/// Build the page from labelled inputs (file name, input).
pub fn build(mut inputs: Vec<(String, Input)>, opts: &PageOptions) -> Page {
    unique_labels(&mut inputs);
    let sweeps: Vec<&SweepReport> = inputs
        .iter()
        .filter_map(|(_, i)| match i {
            Input::Sweep(s) => Some(s.as_ref()),
            Input::Run(_) => None,
        })
        .collect();
    let mut svgs: Vec<(String, String, String)> = Vec::new(); // (file, caption, svg)

    // Latency and CPU against the offered rate, one line per sweep.
    let per_rate = |f: &dyn Fn(&StepFigures) -> Option<f64>| -> Vec<Series> {
        sweeps
            .iter()
            .map(|s| Series {
                label: s.label.clone(),
                points: s
                    .by_rate()
                    .iter()
                    .filter_map(|st| f(&st.figures).map(|y| (st.rate, y)))
                    .collect(),
                markers: true,
            })
            .collect()
    };
    // SLO bounds at a percentile, as reference lines on that percentile's chart.
    let slo_lines = |p: f64| -> Vec<(f64, String)> {
        let mut v: Vec<(f64, String)> = Vec::new();
        for slo in sweeps.iter().filter_map(|s| s.slo.as_ref()) {
            if slo.percentile == p && !v.iter().any(|(y, _)| *y == slo.below_ms) {
                v.push((slo.below_ms, format!("SLO {}", slo.text)));
            }
        }
        v
    };
    let rate_chart = |title: &str, y: &str, series: Vec<Series>, hlines| LineChart {
        title: title.to_string(),
        x_label: "offered rate (requests/s)".to_string(),
        y_label: y.to_string(),
        x_axis: XAxis::Linear,
        series,
        hlines,
        y_cap: None,
    };
    if !sweeps.is_empty() {
        svgs.push((
            "latency-mean.svg".into(),
            "Average latency (from the intended send time) against the offered rate; each point is \
             the median over the step's runs."
                .into(),
            svg::line_chart(&rate_chart(
                "Average latency vs offered rate",
                "average latency (ms)",
                per_rate(&|f| Some(f.mean_ms)),
                Vec::new(),
            )),
        ));
        svgs.push((
            "latency-p95.svg".into(),
            "95th percentile latency against the offered rate (median over the step's runs)."
                .into(),
            svg::line_chart(&rate_chart(
                "p95 latency vs offered rate",
                "p95 latency (ms)",
                per_rate(&|f| Some(f.p95_ms)),
                slo_lines(95.0),
            )),
        ));
        svgs.push((
            "latency-p99.svg".into(),
            "99th percentile latency against the offered rate (median over the step's runs)."
                .into(),
            svg::line_chart(&rate_chart(
                "p99 latency vs offered rate",
                "p99 latency (ms)",
                per_rate(&|f| Some(f.p99_ms)),
                slo_lines(99.0),
            )),
        ));
        let cpu = per_rate(&|f| f.cpu_percent_of_core);
        if cpu.iter().any(|s| !s.points.is_empty()) {
            svgs.push((
                "cpu-percent.svg".into(),
                "CPU time (user + system) of the --pid process trees during each step, in percent \
                 of one core."
                    .into(),
                svg::line_chart(&rate_chart(
                    "CPU of the system under test vs offered rate",
                    "CPU (% of one core)",
                    cpu,
                    Vec::new(),
                )),
            ));
            svgs.push((
                "cpu-per-request.svg".into(),
                "CPU time of the --pid process trees per completed request.".into(),
                svg::line_chart(&rate_chart(
                    "CPU per request vs offered rate",
                    "CPU per request (µs)",
                    per_rate(&|f| f.cpu_us_per_request),
                    Vec::new(),
                )),
            ));
        }
    }

    // The percentile distribution, one line per input.
    let mut dist_series = Vec::new();
    for (_, input) in &inputs {
        let (label, run) = match input {
            Input::Run(r) => (r.label.clone(), Some(r.as_ref())),
            Input::Sweep(s) => match chosen_step(s, opts.at) {
                Some(st) => (
                    format!("{} @ {} req/s", s.label, rate_text(st.rate)),
                    median_run(st),
                ),
                None => (s.label.clone(), None),
            },
        };
        if let Some(r) = run {
            dist_series.push(Series {
                label,
                points: r.spectrum.clone(),
                markers: false,
            });
        }
    }
    svgs.push((
        "percentiles.svg".into(),
        "Latency by percentile, on the HdrHistogram plotter's axis: x = 1/(1 − percentile) on a log \
         scale, so each tick adds a nine. Sweeps show one step (named in the legend): the knee, \
         else the highest rate without errors, or the rate given with --at."
            .into(),
        svg::line_chart(&LineChart {
            title: "Latency by percentile".into(),
            x_label: "percentile".into(),
            y_label: "latency (ms)".into(),
            x_axis: XAxis::Nines,
            series: dist_series,
            hlines: Vec::new(),
            y_cap: None,
        }),
    ));

    // Summary rows and throughput bars.
    let mut rows = Vec::new();
    for (_, input) in &inputs {
        rows.push(match input {
            Input::Run(r) => Row {
                label: r.label.clone(),
                what: match r.offered_rate {
                    Some(rate) => format!("open loop, {} req/s", rate_text(rate)),
                    None => "closed loop".to_string(),
                },
                achieved: r.achieved_rate,
                fig: figures_of_run(r),
                knee: "–".to_string(),
                warnings: r.warnings.len(),
            },
            Input::Sweep(s) => {
                let best = s
                    .steps
                    .iter()
                    .map(|st| st.figures.achieved_rate)
                    .fold(0.0, f64::max);
                let at = chosen_step(s, opts.at);
                Row {
                    label: s.label.clone(),
                    what: format!(
                        "sweep {}–{} req/s ×{}{}",
                        rate_text(s.rates.first().copied().unwrap_or(0.0)),
                        rate_text(s.rates.last().copied().unwrap_or(0.0)),
                        s.repeat,
                        at.map(|st| format!("; figures at {} req/s", rate_text(st.rate)))
                            .unwrap_or_default()
                    ),
                    achieved: best,
                    fig: at.map(|st| st.figures.clone()).unwrap_or_default(),
                    knee: match (&s.slo, &s.knee) {
                        (Some(slo), Some(k)) => format!(
                            "{} ({})",
                            k.rate
                                .map_or("none".to_string(), |r| format!("{} req/s", rate_text(r))),
                            slo.text
                        ),
                        _ => "no SLO".to_string(),
                    },
                    warnings: s
                        .steps
                        .iter()
                        .flat_map(|st| &st.runs)
                        .map(|r| r.warnings.len())
                        .sum(),
                }
            }
        });
    }
    svgs.push((
        "throughput.svg".into(),
        "Completed requests per second: of the run, or for a sweep the highest of its steps."
            .into(),
        svg::bar_chart(
            "Throughput",
            "completed requests/s",
            &rows
                .iter()
                .map(|r| (r.label.clone(), r.achieved))
                .collect::<Vec<_>>(),
        ),
    ));

    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| "portico bench report".to_string());
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n\
         <style>\nbody {{ font-family: DejaVu Sans, Verdana, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #222; }}\n\
         table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}\n\
         th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}\n\
         th {{ background: #f3f3f3; }} td.l, th.l {{ text-align: left; }}\n\
         figure {{ margin: 1.5em 0; }} figcaption {{ color: #555; font-size: 0.9em; max-width: 50em; }}\n\
         code {{ font-size: 0.9em; word-break: break-all; }} .fail {{ color: #b00; }}\n</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&title),
        escape(&title)
    );
    h.push_str(
        "<p>Latency is measured from each request's intended send time (open loop, coordinated \
         omission corrected); closed-loop runs measure from the actual send. Times in ms.</p>\n",
    );
    // Summary.
    h.push_str("<h2>Summary</h2>\n<table>\n<tr><th class=\"l\">label</th><th class=\"l\">what</th>\
                <th>completed req/s</th><th>mean</th><th>p50</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th>\
                <th>errors</th><th>non-2xx</th><th>CPU % of a core</th><th>CPU µs / req</th><th class=\"l\">knee</th><th>warnings</th></tr>\n");
    for r in &rows {
        let f = &r.fig;
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
             <td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td></tr>",
            escape(&r.label),
            escape(&r.what),
            rate_text((r.achieved * 10.0).round() / 10.0),
            f.mean_ms,
            f.p50_ms,
            f.p95_ms,
            f.p99_ms,
            f.p999_ms,
            f.max_ms,
            f.errors,
            f.non_2xx,
            fmt_opt(f.cpu_percent_of_core, 1),
            fmt_opt(f.cpu_us_per_request, 2),
            escape(&r.knee),
            r.warnings
        );
    }
    h.push_str("</table>\n");
    // Charts.
    h.push_str("<h2>Charts</h2>\n");
    for (file, caption, svg_text) in &svgs {
        let _ = write!(
            h,
            "<figure id=\"{}\">\n{svg_text}<figcaption>{} (<code>{}</code>)</figcaption>\n</figure>\n",
            escape(file.trim_end_matches(".svg")),
            escape(caption),
            escape(file)
        );
    }
    // Sweep steps.
    for s in &sweeps {
        let _ = writeln!(
            h,
            "<h2>Sweep: {}</h2>\n<p>{}</p>\n<table>\n<tr><th>offered req/s</th><th class=\"l\">phase</th><th>runs</th>\
             <th>completed req/s</th><th>mean</th><th>p50</th><th>p95</th><th>p99</th><th>p99.9</th><th>max</th>\
             <th>errors</th><th>generator lag p99</th><th>CPU %</th><th>CPU µs / req</th><th class=\"l\">SLO</th></tr>",
            escape(&s.label),
            escape(&s.conclusion())
        );
        for st in s.by_rate() {
            let f = &st.figures;
            let slo = match st.pass {
                None if st.verdicts.iter().any(|v| v.void) => {
                    "void: the generator fell behind in every try".to_string()
                }
                None => String::new(),
                Some(true) => "pass".to_string(),
                Some(false) => {
                    let why: Vec<&str> = st
                        .verdicts
                        .iter()
                        .flat_map(|v| v.failures.iter().map(String::as_str))
                        .collect();
                    format!(
                        "<span class=\"fail\">FAIL</span>: {}",
                        escape(&why.join("; "))
                    )
                }
            };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{:?}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
                 <td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{slo}</td></tr>",
                rate_text(st.rate),
                st.phase,
                st.runs.len(),
                rate_text((f.achieved_rate * 10.0).round() / 10.0),
                f.mean_ms,
                f.p50_ms,
                f.p95_ms,
                f.p99_ms,
                f.p999_ms,
                f.max_ms,
                f.errors,
                fmt_opt(f.generator_lag_p99_ms, 3),
                fmt_opt(f.cpu_percent_of_core, 1),
                fmt_opt(f.cpu_us_per_request, 2),
            );
        }
        h.push_str("</table>\n");
    }
    // Warnings.
    let mut warnings: Vec<String> = Vec::new();
    for (_, input) in &inputs {
        let runs: Vec<(&Report, String)> = match input {
            Input::Run(r) => vec![(r.as_ref(), r.label.clone())],
            Input::Sweep(s) => s
                .steps
                .iter()
                .flat_map(|st| {
                    st.runs
                        .iter()
                        .map(move |r| (r, format!("{} @ {} req/s", s.label, rate_text(st.rate))))
                })
                .collect(),
        };
        for (r, who) in runs {
            for w in &r.warnings {
                warnings.push(format!("{who}: {w}"));
            }
        }
    }
    if !warnings.is_empty() {
        h.push_str("<h2>Warnings</h2>\n<ul>\n");
        for w in &warnings {
            let _ = writeln!(h, "<li>{}</li>", escape(w));
        }
        h.push_str("</ul>\n");
    }
    // Manifest.
    let me = Host::this();
    let _ = writeln!(
        h,
        "<h2>Manifest</h2>\n<p>Report made {} by portico {} on {} ({} CPUs), Linux {}.</p>\n<table>\n\
         <tr><th class=\"l\">label</th><th class=\"l\">file</th><th class=\"l\">started (UTC)</th><th class=\"l\">portico</th>\
         <th class=\"l\">CPU</th><th class=\"l\">kernel</th><th class=\"l\">command</th></tr>",
        escape(&opts.generated),
        env!("CARGO_PKG_VERSION"),
        escape(&me.cpu),
        me.cpus,
        escape(&me.kernel)
    );
    for (file, input) in &inputs {
        let (started, version, host, command) = match input {
            Input::Run(r) => (&r.started, &r.portico_version, &r.host, &r.command),
            Input::Sweep(s) => (&s.started, &s.portico_version, &s.host, &s.command),
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td class=\"l\">{}</td>\
             <td class=\"l\">{} ({} CPUs)</td><td class=\"l\">{}</td><td class=\"l\"><code>{}</code></td></tr>",
            escape(input.label()),
            escape(file),
            escape(started),
            escape(version),
            escape(&host.cpu),
            host.cpus,
            escape(&host.kernel),
            escape(command.as_deref().unwrap_or("(not recorded)"))
        );
    }
    h.push_str("</table>\n</body>\n</html>\n");
    Page {
        html: h,
        svgs: svgs.into_iter().map(|(f, _, s)| (f, s)).collect(),
    }
}

/// `portico bench report`: read the files, write `DIR/index.html` and the SVGs; returns the
/// path of the page.
pub fn write(flags: &ReportFlags) -> Result<PathBuf, BenchError> {
    if let Some(at) = flags.at {
        if !(at.is_finite() && at > 0.0) {
            return Err(BenchError::Flag(format!(
                "--at {at}: must be > 0 requests/s"
            )));
        }
    }
    let mut inputs = Vec::new();
    for path in &flags.files {
        inputs.push((path.display().to_string(), Input::load(path)?));
    }
    let page = build(
        inputs,
        &PageOptions {
            title: flags.title.clone(),
            at: flags.at,
            generated: rfc3339(std::time::SystemTime::now()),
        },
    );
    let file_err = |path: PathBuf| move |source| BenchError::File { path, source };
    std::fs::create_dir_all(&flags.out).map_err(file_err(flags.out.clone()))?;
    for (name, text) in &page.svgs {
        let p = flags.out.join(name);
        std::fs::write(&p, text).map_err(file_err(p.clone()))?;
    }
    // PNG copies of the charts: a missing one is said, not fatal (the page is complete without).
    for problem in crate::png::write_all(&flags.out, &page.svgs) {
        eprintln!("warning: {problem}");
    }
    let index = flags.out.join("index.html");
    std::fs::write(&index, &page.html).map_err(file_err(index.clone()))?;
    Ok(index)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{test_report, CpuReport};
    use crate::sweep::{KneeSearch, Phase, Slo, Verdict};

    /// A two-step sweep (1000 req/s passes p99<10ms, 2000 fails), for page tests.
    pub(crate) fn sweep(label: &str) -> SweepReport {
        let slo = Slo::parse("p99<10ms").unwrap();
        let mut search = KneeSearch::new(vec![1000.0, 2000.0], true, 0);
        let mut steps = Vec::new();
        for (rate, lat) in [(1000.0, 2u64), (2000.0, 30)] {
            let lats: Vec<u64> = (0..1000).map(|i| lat + i % 3).collect();
            let mut r = test_report(Some(rate), &lats, 0, 0);
            r.label = label.to_string();
            r.achieved_rate = rate - 1.0;
            r.cpu = Some(CpuReport {
                pids: vec![1],
                processes: 1,
                seconds: 1.0,
                percent_of_core: rate / 100.0,
                us_per_request: Some(12.5),
            });
            let v: Verdict = slo.judge(&r);
            search.record(Some(v.pass));
            steps.push(Step {
                rate,
                phase: Phase::Sweep,
                pass: Some(v.pass),
                figures: StepFigures::of(std::slice::from_ref(&r)),
                runs: vec![r],
                verdicts: vec![v],
                voided: 0,
            });
        }
        SweepReport {
            version: 2,
            kind: "sweep".into(),
            label: label.into(),
            command: Some("portico bench --sweep 1000:2000:1000 http://x/".into()),
            portico_version: "0.1.0".into(),
            started: "2026-01-02T03:04:05Z".into(),
            host: Host {
                cpu: "Test CPU".into(),
                cpus: 2,
                kernel: "6.1.0-test".into(),
                load_average: None,
            },
            target: "http://x/".into(),
            method: "GET".into(),
            connections: 10,
            threads: 1,
            keep_alive: true,
            protocol: "HTTP/1.1".into(),
            streams: None,
            duration_s: 1.0,
            warmup_s: 0.0,
            rates: vec![1000.0, 2000.0],
            repeat: 1,
            bisect: 0,
            slo: Some(slo),
            steps,
            knee: search.knee(),
        }
    }

    #[test]
    fn the_page_embeds_every_chart_and_the_inputs_figures() {
        let mut run = test_report(None, &[3; 50], 2, 0);
        run.label = "closed <run>".into();
        run.achieved_rate = 54_321.0;
        let inputs = vec![
            ("a.json".to_string(), Input::Sweep(Box::new(sweep("proxy")))),
            ("b.json".to_string(), Input::Run(Box::new(run))),
            ("c.json".to_string(), Input::Sweep(Box::new(sweep("proxy")))),
        ];
        let page = build(
            inputs,
            &PageOptions {
                title: Some("Test & report".into()),
                at: None,
                generated: "2026-11-22T00:00:00Z".into(),
            },
        );
        let names: Vec<&str> = page.svgs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "latency-mean.svg",
                "latency-p95.svg",
                "latency-p99.svg",
                "cpu-percent.svg",
                "cpu-per-request.svg",
                "percentiles.svg",
                "throughput.svg"
            ]
        );
        for (_, svg) in &page.svgs {
            assert!(page.html.contains(svg.as_str()), "every SVG is inline");
        }
        let h = &page.html;
        assert!(!h.contains("<img") && !h.contains("src=") && !h.contains("href="));
        assert!(h.contains("<h1>Test &amp; report</h1>"));
        // Labels: escaped, and the repeated one made unique.
        assert!(h.contains("closed &lt;run&gt;"));
        assert!(h.contains("proxy (2)"));
        // Table values come from the inputs.
        assert!(h.contains("<td>54,321</td>"), "achieved rate of the run");
        assert!(
            h.contains("<td>999</td>"),
            "achieved rate of the sweep's step"
        );
        assert!(h.contains("1,000 req/s (p99&lt;10ms)"), "the knee");
        assert!(h.contains("<td>12.50</td>"), "CPU µs per request");
        assert!(h.contains("<td>2</td>"), "the run's errors");
        assert!(h.contains("FAIL</span>: p99 32."), "{h}");
        // Manifest.
        assert!(h.contains("Test CPU") && h.contains("6.1.0-test"));
        assert!(h.contains("portico bench --sweep 1000:2000:1000 http://x/"));
        assert!(h.contains("2026-01-02T03:04:05Z"));
        // The distribution of each sweep is at its knee.
        let nines = &page.svgs[5].1;
        assert!(nines.contains("proxy @ 1,000 req/s"), "{nines}");
        assert!(nines.contains(">90%<"));
        assert!(
            page.svgs[2].1.contains(">SLO p99&lt;10ms<"),
            "the SLO on the p99 chart"
        );
    }

    #[test]
    fn a_step_can_be_chosen_for_the_distribution() {
        let s = sweep("p");
        assert_eq!(chosen_step(&s, None).map(|st| st.rate), Some(1000.0));
        assert_eq!(
            chosen_step(&s, Some(1900.0)).map(|st| st.rate),
            Some(2000.0)
        );
        let mut no_knee = s.clone();
        no_knee.knee = None;
        assert_eq!(chosen_step(&no_knee, None).map(|st| st.rate), Some(2000.0));
    }

    #[test]
    fn inputs_parse_or_say_why_not() {
        let run = test_report(Some(5.0), &[1; 5], 0, 0);
        let Ok(Input::Run(r)) = Input::parse(&run.to_json()) else {
            panic!("a run")
        };
        assert_eq!(r.requests, run.requests);
        let s = serde_json::to_string(&sweep("x")).unwrap();
        assert!(matches!(Input::parse(&s), Ok(Input::Sweep(_))));
        let e = Input::parse("{\"version\": 1").unwrap_err();
        assert!(e.contains("EOF"), "{e}");
        let e = Input::parse("{\"kind\": \"sweep\"}").unwrap_err();
        assert!(
            e.contains("not a sweep result") && e.contains("missing field"),
            "{e}"
        );
        let e = Input::parse("[1, 2]").unwrap_err();
        assert!(e.contains("not a portico bench result"), "{e}");
        let e = Input::parse("{\"kind\": \"nope\"}").unwrap_err();
        assert!(e.contains("unknown kind"), "{e}");
        // A label left empty falls back to the target.
        let mut v: serde_json::Value = serde_json::from_str(&run.to_json()).unwrap();
        v["label"] = "".into();
        let i = Input::parse(&v.to_string()).unwrap();
        assert_eq!(i.label(), "http://127.0.0.1:1/");
    }
}
