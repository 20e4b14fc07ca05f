//! Line and bar charts as SVG text, by hand: plotters lays text out with font-kit (fontconfig) or an embedded TTF; here the viewer renders `<text>`.

use std::fmt::Write;

/// Chart width, px.
pub const WIDTH: f64 = 760.0;
/// Plot height (the data area), px.
const PLOT_H: f64 = 300.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
const LEFT: f64 = 72.0;
/// Font size of tick labels and the legend; titles are larger.
const FONT: f64 = 12.0;
const FONT_FAMILY: &str = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif";
/// Longest label drawn, characters (longer ones end with an ellipsis).
const MAX_LABEL: usize = 36;

/// Distinguishable line colours (Tableau 10), by series index.
pub const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// How x values map to the horizontal axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Linear from 0.
    Linear,
    /// Percentiles on the "nines" axis of the HdrHistogram plotter: x = log10(1/(1-p)), ticks
    /// labelled 0%, 90%, 99%, 99.9%, ...; x values are percentiles (0..100).
    Nines,
}

/// One line of a line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// (x, y) in data units, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Dots at the points (for few points, e.g. sweep steps).
    pub markers: bool,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_axis: XAxis,
    pub series: Vec<Series>,
    /// Dashed horizontal reference lines (y, label), e.g. an SLO bound.
    pub hlines: Vec<(f64, String)>,
    /// Clip the y axis here: larger values are drawn on the top edge, and the chart says so (so
    /// that a saturated point of seconds does not flatten the milliseconds that matter).
    pub y_cap: Option<f64>,
}

/// The nines-axis position of percentile `p` (0..100): log10(1/(1-p/100)); None at 100% and
/// outside [0, 100).
pub fn nines_x(p: f64) -> Option<f64> {
    if !(0.0..100.0).contains(&p) {
        return None;
    }
    Some(-(1.0 - p / 100.0).log10())
}

/// The label of nines-axis tick `k` (a whole number of nines): 0%, 90%, 99%, 99.9%, ...
pub fn nines_label(k: u32) -> String {
    match k {
        0 => "0%".to_string(),
        1 => "90%".to_string(),
        2 => "99%".to_string(),
        _ => format!("99.{}%", "9".repeat(k as usize - 2)),
    }
}

/// "Nice" tick values from 0 covering `max` (about `n` intervals, step 1, 2, 2.5 or 5 × 10^k).
pub fn ticks(max: f64, n: usize) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let count = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// A tick value as text: thousands separated, as many decimals as the step needs (at most 3).
pub fn tick_text(v: f64, step: f64) -> String {
    let decimals: usize = (0..=3usize)
        .find(|d| {
            let s = step * 10f64.powi(*d as i32);
            (s - s.round()).abs() < 1e-6
        })
        .unwrap_or(3);
    let s = format!("{v:.decimals$}");
    let (int, frac) = s.split_once('.').map_or((s.as_str(), ""), |(a, b)| (a, b));
    let (sign, digits) = int.strip_prefix('-').map_or(("", int), |d| ("-", d));
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if frac.is_empty() {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{frac}")
    }
}

/// Escape text for SVG and HTML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` cut to `MAX_LABEL` characters.
fn short(s: &str) -> String {
    if s.chars().count() <= MAX_LABEL {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX_LABEL - 1).collect();
        t.push('…');
        t
    }
}

/// Approximate width of `s` at font size `size` (sans-serif averages about 0.6 em per char).
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.6
}

fn open_svg(out: &mut String, w: f64, h: f64, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" \
         viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"{FONT_FAMILY}\" font-size=\"{FONT}\">\n\
         <title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{:.1}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        escape(title),
        w / 2.0,
        escape(title)
    );
}

/// Draw a line chart. Points outside the axis (e.g. the 100% row on the nines axis) are left out.
pub fn line_chart(c: &LineChart) -> String {
    let map_x = |x: f64| match c.x_axis {
        XAxis::Linear => Some(x).filter(|x| x.is_finite()),
        XAxis::Nines => nines_x(x),
    };
    // (index for the colour, series, points on the axis)
    type Drawn<'a> = (usize, &'a Series, Vec<(f64, f64)>);
    let series: Vec<Drawn> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pts = s
                .points
                .iter()
                .filter_map(|(x, y)| Some((map_x(*x)?, *y)).filter(|(_, y)| y.is_finite()))
                .collect::<Vec<_>>();
            (i, s, pts)
        })
        .filter(|(_, _, p)| !p.is_empty())
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x))
        .fold(0.0, f64::max);
    let y_data = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
        .chain(c.hlines.iter().map(|(y, _)| *y).filter(|y| y.is_finite()))
        .fold(0.0, f64::max);
    let cap = c
        .y_cap
        .filter(|cap| cap.is_finite() && *cap > 0.0 && y_data > *cap);
    let y_max = cap.unwrap_or(y_data);
    let legend_w = series
        .iter()
        .map(|(_, s, _)| text_width(&short(&s.label), FONT))
        .fold(0.0, f64::max)
        + 44.0;
    let plot_w = (WIDTH - LEFT - 24.0 - legend_w).max(300.0);
    let width = LEFT + plot_w + 24.0 + legend_w;
    let legend_h = 20.0 * series.len() as f64;
    let height = TOP + PLOT_H.max(legend_h) + BOTTOM;
    let (x_ticks, x_text): (Vec<f64>, Vec<String>) = match c.x_axis {
        XAxis::Linear => {
            let t = ticks(x_max, 6);
            let step = t.get(1).copied().unwrap_or(1.0);
            let text = t.iter().map(|v| tick_text(*v, step)).collect();
            (t, text)
        }
        XAxis::Nines => {
            let k = (x_max - 1e-9).ceil().clamp(1.0, 12.0) as u32;
            (
                (0..=k).map(f64::from).collect(),
                (0..=k).map(nines_label).collect(),
            )
        }
    };
    let y_ticks = ticks(y_max, 5);
    let y_step = y_ticks.get(1).copied().unwrap_or(1.0);
    let x_hi = x_ticks.last().copied().unwrap_or(1.0).max(1e-9);
    let y_hi = y_ticks.last().copied().unwrap_or(1.0).max(1e-9);
    let px = |x: f64| LEFT + x / x_hi * plot_w;
    let py = |y: f64| TOP + PLOT_H - y.min(y_hi) / y_hi * PLOT_H;

    let mut out = String::new();
    open_svg(&mut out, width, height, &c.title);
    // Grid and ticks.
    out.push_str("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for y in &y_ticks {
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
            LEFT,
            py(*y),
            LEFT + plot_w,
            py(*y)
        );
    }
    for x in &x_ticks {
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
            px(*x),
            TOP,
            px(*x),
            TOP + PLOT_H
        );
    }
    out.push_str("</g>\n");
    let _ = writeln!(
        out,
        "<rect x=\"{LEFT:.1}\" y=\"{TOP:.1}\" width=\"{plot_w:.1}\" height=\"{PLOT_H:.1}\" fill=\"none\" stroke=\"#444\"/>"
    );
    for y in &y_ticks {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            py(*y) + 4.0,
            tick_text(*y, y_step)
        );
    }
    for (x, t) in x_ticks.iter().zip(&x_text) {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            px(*x),
            TOP + PLOT_H + 18.0,
            escape(t)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        LEFT + plot_w / 2.0,
        TOP + PLOT_H + 42.0,
        escape(&c.x_label)
    );
    let _ = writeln!(
        out,
        "<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        TOP + PLOT_H / 2.0,
        escape(&c.y_label)
    );
    for (y, label) in c.hlines.iter().filter(|(y, _)| y.is_finite()) {
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT:.1}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"#c00\" \
             stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"end\" fill=\"#c00\">{4}</text>",
            py(*y),
            LEFT + plot_w,
            LEFT + plot_w - 6.0,
            py(*y) - 5.0,
            escape(label)
        );
    }
    // Lines, markers, legend.
    for (n, (i, s, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        // A single point is no line (renderers reject one): its dot shows it.
        if pts.len() > 1 {
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                path.join(" ")
            );
        }
        if s.markers || pts.len() == 1 {
            for (x, y) in pts {
                let _ = writeln!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                    px(*x),
                    py(*y)
                );
            }
        }
        let lx = LEFT + plot_w + 24.0;
        let ly = TOP + 10.0 + 20.0 * n as f64;
        let _ = writeln!(
            out,
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            lx + 24.0,
            lx + 32.0,
            ly + 4.0,
            escape(&short(&s.label))
        );
    }
    if cap.is_some() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#555\" font-size=\"11\">axis cut at {}: \
             points above it are drawn on the top edge (up to {})</text>",
            LEFT + 6.0,
            TOP + 14.0,
            tick_text(y_hi, y_step),
            tick_text(y_data, if y_data >= 100.0 { 1.0 } else { 0.1 })
        );
    }
    if series.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no data</text>",
            LEFT + plot_w / 2.0,
            TOP + PLOT_H / 2.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A horizontal bar chart: one bar per (label, value), the value written at the bar's end.
pub fn bar_chart(title: &str, x_label: &str, bars: &[(String, f64)]) -> String {
    const BAR: f64 = 22.0;
    const GAP: f64 = 12.0;
    let label_w = bars
        .iter()
        .map(|(l, _)| text_width(&short(l), FONT))
        .fold(0.0, f64::max)
        + 16.0;
    let left = label_w.max(LEFT);
    let plot_w = (WIDTH - left - 90.0).max(200.0);
    let plot_h = (BAR + GAP) * bars.len().max(1) as f64 + GAP;
    let width = left + plot_w + 90.0;
    let height = TOP + plot_h + BOTTOM;
    let max = bars
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let mut out = String::new();
    open_svg(&mut out, width, height, title);
    let px = value_axis(&mut out, max, left, plot_w, plot_h, x_label);
    for (i, (label, v)) in bars.iter().enumerate() {
        let y = TOP + GAP + i as f64 * (BAR + GAP);
        let v = if v.is_finite() { *v } else { 0.0 };
        let color = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR:.1}\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            left - 8.0,
            y + BAR / 2.0 + 4.0,
            escape(&short(label)),
            px(v) - left,
            px(v) + 6.0,
            y + BAR / 2.0 + 4.0,
            tick_text(v, if v >= 100.0 { 1.0 } else { 0.1 })
        );
    }
    let _ = writeln!(
        out,
        "<line x1=\"{left:.1}\" y1=\"{TOP:.1}\" x2=\"{left:.1}\" y2=\"{:.1}\" stroke=\"#444\"/>",
        TOP + plot_h
    );
    out.push_str("</svg>\n");
    out
}

/// One group of a grouped bar chart: its label and one value per series (None: no figure).
#[derive(Debug, Clone, PartialEq)]
pub struct BarGroup {
    pub label: String,
    pub values: Vec<Option<f64>>,
    /// Per bar, a range drawn as a whisker across its end (min..max over rounds); empty or None
    /// for none.
    pub spreads: Vec<Option<(f64, f64)>>,
}

/// A horizontal grouped bar chart: per group (e.g. a scenario) one bar per series (e.g. a proxy),
/// coloured by `colors` (palette indexes, one per series, so a proxy keeps its colour across
/// charts), the value at each bar's end ("n/a" where there is none), a legend on the right.
pub fn grouped_bar_chart(
    title: &str,
    x_label: &str,
    series: &[String],
    colors: &[usize],
    groups: &[BarGroup],
) -> String {
    const BAR: f64 = 16.0;
    const INNER: f64 = 3.0;
    const GAP: f64 = 16.0;
    let n = series.len().max(1) as f64;
    let group_h = n * BAR + (n - 1.0) * INNER;
    // Group labels are bold: about 15% wider.
    let label_w = groups
        .iter()
        .map(|g| text_width(&short(&g.label), FONT) * 1.15)
        .fold(0.0, f64::max)
        + 16.0;
    let left = label_w.max(LEFT);
    let legend_w = series
        .iter()
        .map(|s| text_width(&short(s), FONT))
        .fold(0.0, f64::max)
        + 44.0;
    let value_w = 80.0;
    let plot_w = (WIDTH - left - value_w - legend_w).max(240.0);
    let plot_h = (group_h + GAP) * groups.len().max(1) as f64 + GAP;
    let legend_h = 20.0 * series.len() as f64 + 10.0;
    let width = left + plot_w + value_w + legend_w;
    let height = TOP + plot_h.max(legend_h) + BOTTOM;
    let max = groups
        .iter()
        .flat_map(|g| {
            g.values
                .iter()
                .flatten()
                .copied()
                .chain(g.spreads.iter().flatten().map(|(_, hi)| *hi))
        })
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let mut out = String::new();
    open_svg(&mut out, width, height, title);
    let px = value_axis(&mut out, max, left, plot_w, plot_h, x_label);
    for (gi, g) in groups.iter().enumerate() {
        let y0 = TOP + GAP + gi as f64 * (group_h + GAP);
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-weight=\"bold\">{}</text>",
            left - 8.0,
            y0 + group_h / 2.0 + 4.0,
            escape(&short(&g.label))
        );
        for (si, v) in g.values.iter().enumerate().take(series.len()) {
            let y = y0 + si as f64 * (BAR + INNER);
            let color = PALETTE[colors.get(si).copied().unwrap_or(si) % PALETTE.len()];
            match v.filter(|v| v.is_finite()) {
                Some(v) => {
                    let digits = if v >= 100.0 {
                        1.0
                    } else if v >= 1.0 {
                        0.1
                    } else {
                        0.01
                    };
                    let spread = g
                        .spreads
                        .get(si)
                        .copied()
                        .flatten()
                        .filter(|(a, b)| a.is_finite() && b.is_finite());
                    let _ = writeln!(
                        out,
                        "<rect x=\"{left:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR:.1}\" fill=\"{color}\"/>",
                        (px(v) - left).max(1.0),
                    );
                    let mut text_x = px(v) + 5.0;
                    if let Some((lo, hi)) = spread {
                        let (a, b, m) = (px(lo), px(hi), y + BAR / 2.0);
                        let _ = writeln!(
                            out,
                            "<path d=\"M{a:.1} {m:.1}H{b:.1}M{a:.1} {:.1}V{:.1}M{b:.1} {:.1}V{:.1}\" \
                             stroke=\"#222\" stroke-width=\"1.5\" fill=\"none\"/>",
                            y + 3.0,
                            y + BAR - 3.0,
                            y + 3.0,
                            y + BAR - 3.0
                        );
                        text_x = text_x.max(b + 5.0);
                    }
                    let _ = writeln!(
                        out,
                        "<text x=\"{text_x:.1}\" y=\"{:.1}\">{}</text>",
                        y + BAR / 2.0 + 4.0,
                        tick_text(v, digits)
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#888\">n/a</text>",
                        left + 5.0,
                        y + BAR / 2.0 + 4.0
                    );
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "<line x1=\"{left:.1}\" y1=\"{TOP:.1}\" x2=\"{left:.1}\" y2=\"{:.1}\" stroke=\"#444\"/>",
        TOP + plot_h
    );
    for (si, name) in series.iter().enumerate() {
        let color = PALETTE[colors.get(si).copied().unwrap_or(si) % PALETTE.len()];
        let lx = left + plot_w + value_w;
        let ly = TOP + 10.0 + 20.0 * si as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"18\" height=\"12\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            ly - 6.0,
            lx + 26.0,
            ly + 4.0,
            escape(&short(name))
        );
    }
    if groups.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no data</text>",
            left + plot_w / 2.0,
            TOP + plot_h / 2.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The value axis of a horizontal bar chart, from 0 to the tick above `max`: grid lines, tick
/// labels under the plot area (`left`, `plot_w` wide, `plot_h` high) and the axis title. Returns
/// the x position of a value.
fn value_axis(
    out: &mut String,
    max: f64,
    left: f64,
    plot_w: f64,
    plot_h: f64,
    x_label: &str,
) -> impl Fn(f64) -> f64 {
    let t = ticks(max, 5);
    let step = t.get(1).copied().unwrap_or(1.0);
    let hi = t.last().copied().unwrap_or(1.0).max(1e-9);
    let px = move |v: f64| left + v.max(0.0) / hi * plot_w;
    out.push_str("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n");
    for v in &t {
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{TOP:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
            px(*v),
            px(*v),
            TOP + plot_h
        );
    }
    out.push_str("</g>\n");
    for v in &t {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            px(*v),
            TOP + plot_h + 18.0,
            tick_text(*v, step)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        left + plot_w / 2.0,
        TOP + plot_h + 42.0,
        escape(x_label)
    );
    px
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_axis() {
        assert_eq!(nines_x(0.0), Some(0.0));
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        assert!(close(nines_x(90.0), 1.0));
        assert!(close(nines_x(99.0), 2.0));
        assert!(close(nines_x(99.9), 3.0));
        assert!(close(nines_x(99.9999), 6.0));
        // 1/(1-p): 50% is x = log10(2).
        assert!(close(nines_x(50.0), 2f64.log10()));
        assert_eq!(nines_x(100.0), None);
        assert_eq!(nines_x(-1.0), None);
        assert_eq!(
            (0..=6).map(nines_label).collect::<Vec<_>>(),
            ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"]
        );
    }

    #[test]
    fn nice_ticks_and_their_text() {
        assert_eq!(
            ticks(10_000.0, 6),
            [0.0, 2000.0, 4000.0, 6000.0, 8000.0, 10_000.0]
        );
        assert_eq!(ticks(7.3, 5), [0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(0.9, 5), [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        assert_eq!(ticks(0.0, 5), [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        assert_eq!(ticks(11.0, 5), [0.0, 2.5, 5.0, 7.5, 10.0, 12.5]);
        assert_eq!(tick_text(10_000.0, 2000.0), "10,000");
        assert_eq!(tick_text(1_234_567.0, 1.0), "1,234,567");
        assert_eq!(tick_text(0.6000000000000001, 0.2), "0.6");
        assert_eq!(tick_text(7.5, 2.5), "7.5");
        assert_eq!(tick_text(0.05, 0.05), "0.05");
    }

    #[test]
    fn charts_hold_their_text_and_points() {
        let c = LineChart {
            title: "Latency <by> rate".into(),
            x_label: "offered rate (requests/s)".into(),
            y_label: "latency (ms)".into(),
            x_axis: XAxis::Linear,
            series: vec![
                Series {
                    label: "portico & co".into(),
                    points: vec![(1000.0, 0.5), (2000.0, 0.7)],
                    markers: true,
                },
                Series {
                    label: "empty".into(),
                    points: vec![],
                    markers: true,
                },
            ],
            hlines: vec![(1.5, "SLO p99 < 1.5 ms".into())],
            y_cap: None,
        };
        let svg = line_chart(&c);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("Latency &lt;by&gt; rate"));
        assert!(svg.contains("portico &amp; co"));
        assert!(
            !svg.contains(">empty<"),
            "series without points are left out"
        );
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(">2,000<"));
        assert!(svg.contains(">SLO p99 &lt; 1.5 ms<") && svg.contains("stroke-dasharray"));
        assert!(
            svg.contains(">1.5<"),
            "the y axis reaches the reference line"
        );
        let nines = line_chart(&LineChart {
            x_axis: XAxis::Nines,
            series: vec![Series {
                label: "a".into(),
                points: vec![(0.0, 0.1), (90.0, 0.2), (99.9, 1.0), (100.0, 9.0)],
                markers: false,
            }],
            hlines: vec![],
            ..c.clone()
        });
        assert!(nines.contains(">99.9%<"));
        // One point (a sweep of one rate): a dot, no line.
        let one = line_chart(&LineChart {
            series: vec![Series {
                label: "a".into(),
                points: vec![(15_000.0, 0.4)],
                markers: false,
            }],
            ..c.clone()
        });
        assert!(!one.contains("<polyline") && one.matches("<circle").count() == 1);
        assert!(!nines.contains(">99.99%<"));
        // The 100% point (infinite on this axis) is left out: y stops at 1 ms.
        assert!(nines.contains(">1.0<") && !nines.contains(">9<"));
        let capped = line_chart(&LineChart {
            series: vec![Series {
                label: "a".into(),
                points: vec![(1.0, 2.0), (2.0, 3000.0)],
                markers: true,
            }],
            hlines: vec![],
            y_cap: Some(50.0),
            ..c.clone()
        });
        assert!(capped
            .contains("axis cut at 50: points above it are drawn on the top edge (up to 3,000)"));
        assert!(capped.contains(">50<") && !capped.contains(">3,000<"));
        let g = grouped_bar_chart(
            "RPS",
            "requests/s",
            &["direct".into(), "portico".into()],
            &[0, 3],
            &[
                BarGroup {
                    label: "1 KB".into(),
                    values: vec![Some(50_000.0), Some(40_000.4)],
                    spreads: vec![None, Some((39_000.0, 60_000.0))],
                },
                BarGroup {
                    label: "10 KB".into(),
                    values: vec![Some(0.5), None],
                    spreads: Vec::new(),
                },
            ],
        );
        // One whisker (min..max over rounds), and the axis reaches its top.
        assert_eq!(g.matches("<path").count(), 1, "{g}");
        assert!(g.contains(">60,000<"), "{g}");
        // 3 bars and 2 legend swatches (plus the background), values written, the missing one n/a.
        assert_eq!(g.matches("<rect").count(), 1 + 3 + 2);
        assert!(g.contains(">50,000<") && g.contains(">40,000<") && g.contains(">0.50<"));
        assert!(g.contains(">n/a<") && g.contains(PALETTE[3]));
        let bars = bar_chart("Throughput", "requests/s", &[("a".into(), 12_345.6)]);
        assert!(bars.contains(">12,346<"));
        assert_eq!(bars.matches("<rect").count(), 2);
    }
}
