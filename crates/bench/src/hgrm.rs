//! The `.hgrm` percentile-distribution text that HdrHistogram prints and its plotter reads.

use crate::error::BenchError;
use hdrhistogram::Histogram;
use std::fmt::Write;

/// The header line, as HdrHistogram's `outputPercentileDistribution` writes it.
pub const HEADER: &str = "       Value     Percentile TotalCount 1/(1-Percentile)";

/// Percentile ticks per half distance to 100%, as wrk2 and HdrHistogram's default.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Write `h` (values in µs) as a percentile distribution with values in milliseconds, 3 decimals.
///
/// Rows are `value percentile total_count 1/(1-percentile)`; the last row (percentile 1.0) has
/// `inf` in the 4th column, as HdrHistogram_c and wrk2 print it (the plotter skips it, as it
/// skips the Java version's 3-column last row). The footer gives mean, standard deviation, max,
/// total count and the histogram's bucket layout.
pub fn write(h: &Histogram<u64>) -> String {
    const SCALE: f64 = 1000.0;
    let mut out = String::with_capacity(8 * 1024);
    out.push_str(HEADER);
    out.push_str("\n\n");
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total = total.saturating_add(v.count_since_last_iteration());
            let value = v.value_iterated_to() as f64 / SCALE;
            let q = v.quantile_iterated_to();
            if q < 1.0 {
                let _ = writeln!(
                    out,
                    "{value:12.3} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                );
            } else {
                let _ = writeln!(out, "{value:12.3} {q:2.12} {total:10} {:>14}", "inf");
            }
        }
    }
    let _ = writeln!(
        out,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / SCALE,
        h.stdev() / SCALE
    );
    let _ = writeln!(
        out,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        if h.is_empty() {
            0.0
        } else {
            h.max() as f64 / SCALE
        },
        h.len()
    );
    let _ = writeln!(
        out,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_buckets(h.sigfig())
    );
    out
}

/// HdrHistogram's sub-bucket count for a precision: the power of two covering `2 * 10^sigfig`.
fn sub_buckets(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

/// One data row of a `.hgrm` text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub value: f64,
    pub percentile: f64,
    pub total_count: u64,
    /// `1/(1-percentile)`; infinite on the 100% row.
    pub inverse: f64,
}

/// A parsed `.hgrm` text.
#[derive(Debug, Clone, PartialEq)]
pub struct Hgrm {
    pub rows: Vec<Row>,
    pub mean: f64,
    pub stdev: f64,
    pub max: f64,
    pub total_count: u64,
    pub buckets: u64,
    pub sub_buckets: u64,
}

/// Parse and check a `.hgrm` text: the header, a blank line, data rows of exactly 4 numeric
/// columns with nondecreasing values, percentiles and counts, then the 3-line footer.
pub fn parse(text: &str) -> Result<Hgrm, BenchError> {
    let err = |line: usize, reason: &str| BenchError::Hgrm {
        line,
        reason: reason.to_string(),
    };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    match lines.next() {
        Some((_, l)) if l == HEADER => {}
        _ => return Err(err(1, "expected the header line")),
    }
    match lines.next() {
        Some((_, "")) => {}
        _ => return Err(err(2, "expected a blank line after the header")),
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut footer: Vec<(usize, &str)> = Vec::new();
    for (n, line) in lines {
        if line.starts_with('#') {
            footer.push((n, line));
            continue;
        }
        if !footer.is_empty() {
            return Err(err(n, "data after the footer"));
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() != 4 {
            return Err(err(n, "a data row needs exactly 4 columns"));
        }
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| err(n, "a column is not a number"))
        };
        let row = Row {
            value: num(cols[0])?,
            percentile: num(cols[1])?,
            total_count: cols[2]
                .parse()
                .map_err(|_| err(n, "TotalCount is not an integer"))?,
            inverse: num(cols[3])?,
        };
        if !(0.0..=1.0).contains(&row.percentile) {
            return Err(err(n, "percentile outside 0..1"));
        }
        // NaN compares false both ways: it would slip past the order check below.
        if !row.value.is_finite() {
            return Err(err(n, "a value is not a finite number"));
        }
        if let Some(prev) = rows.last() {
            if row.percentile < prev.percentile
                || row.value < prev.value
                || row.total_count < prev.total_count
            {
                return Err(err(n, "values, percentiles and counts must not decrease"));
            }
        }
        let expect = 1.0 / (1.0 - row.percentile);
        let close = if expect.is_finite() {
            (row.inverse - expect).abs() <= 0.006 + expect * 1e-9
        } else {
            row.inverse.is_infinite()
        };
        if !close {
            return Err(err(n, "the 4th column is not 1/(1-percentile)"));
        }
        rows.push(row);
    }
    let [(n1, l1), (n2, l2), (n3, l3)] = footer[..] else {
        return Err(err(0, "expected a 3-line #[...] footer"));
    };
    let pair = |n: usize, l: &str, a: &str, b: &str| -> Result<(f64, f64), BenchError> {
        let inner = l
            .strip_prefix("#[")
            .and_then(|s| s.strip_suffix(']'))
            .ok_or_else(|| err(n, "footer lines are #[...]"))?;
        let (x, y) = inner
            .split_once(',')
            .ok_or_else(|| err(n, "footer line needs two fields"))?;
        let field = |s: &str, name: &str| -> Result<f64, BenchError> {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| err(n, "footer field needs ="))?;
            if k.trim() != name {
                return Err(err(n, "unexpected footer field"));
            }
            v.trim()
                .parse()
                .map_err(|_| err(n, "footer value is not a number"))
        };
        Ok((field(x, a)?, field(y, b)?))
    };
    let (mean, stdev) = pair(n1, l1, "Mean", "StdDeviation")?;
    let (max, total) = pair(n2, l2, "Max", "Total count")?;
    let (buckets, sub) = pair(n3, l3, "Buckets", "SubBuckets")?;
    let total_count = total as u64;
    if let Some(last) = rows.last() {
        if last.total_count != total_count {
            return Err(err(
                n2,
                "Total count differs from the last row's TotalCount",
            ));
        }
    }
    Ok(Hgrm {
        rows,
        mean,
        stdev,
        max,
        total_count,
        buckets: buckets as u64,
        sub_buckets: sub as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::new_histogram;

    #[test]
    fn roundtrip_of_a_skewed_distribution() {
        let mut h = new_histogram();
        for i in 0..10_000u64 {
            h.record(100 + i % 900).unwrap();
        }
        for _ in 0..10 {
            h.record(250_000).unwrap();
        }
        let text = write(&h);
        assert!(text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"));
        let p = parse(&text).unwrap();
        assert!(p.rows.len() > 50);
        let first = p.rows[0];
        // 100 µs was recorded for i = 0, 900, ..., 9900.
        assert_eq!(
            (first.value, first.percentile, first.total_count),
            (0.1, 0.0, 12)
        );
        let last = *p.rows.last().unwrap();
        assert_eq!(last.percentile, 1.0);
        assert!(last.inverse.is_infinite());
        assert_eq!(last.total_count, 10_010);
        assert!((last.value - 250.0).abs() < 0.5, "{}", last.value);
        assert_eq!(p.total_count, 10_010);
        assert_eq!(p.sub_buckets, 2048);
        assert!((p.max - 250.0).abs() < 0.5);
        assert!(p.mean > 0.5 && p.mean < 1.0, "{}", p.mean);
        // Rows other than the last have 4 finite numbers, in HdrHistogram's column widths.
        let row = text.lines().nth(2).unwrap();
        assert_eq!(row, "       0.100 0.000000000000         12           1.00");
        assert!(text.ends_with("#[Buckets =           22, SubBuckets     =         2048]\n"));
    }

    #[test]
    fn empty_histogram_has_header_and_footer() {
        let p = parse(&write(&new_histogram())).unwrap();
        assert!(p.rows.is_empty());
        assert_eq!(p.total_count, 0);
    }

    #[test]
    fn parser_rejects_broken_files() {
        let mut h = new_histogram();
        h.record(1000).unwrap();
        h.record(2000).unwrap();
        let good = write(&h);
        assert!(parse(&good).is_ok());
        let three_columns = good.replacen("inf\n", "\n", 1);
        assert!(parse(&three_columns).is_err());
        assert!(parse(&good.replace("#[Buckets", "#[Bukets")).is_err());
        assert!(parse(&good.replacen(HEADER, "Value Percentile", 1)).is_err());
        let lines: Vec<&str> = good.lines().collect();
        let no_footer = lines[..lines.len() - 3].join("\n");
        assert!(parse(&no_footer).is_err());
    }

    /// Found by the `bench_report` fuzz target: a NaN value was accepted, and with it values
    /// that decrease (1, NaN, 0.5), since every comparison with NaN is false.
    #[test]
    fn fuzz_bench_report_nan_value_refused() {
        let text = format!(
            "{HEADER}\n\n\
             \x20      1.000 0.000000000000          1           1.00\n\
             \x20        NaN 0.500000000000          2           2.00\n\
             \x20      0.500 0.750000000000          3           4.00\n\
             #[Mean    =        2.000, StdDeviation   =        0.900]\n\
             #[Max     =        4.095, Total count    =            3]\n\
             #[Buckets =           22, SubBuckets     =         2048]\n"
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("finite"), "{e}");
        assert!(parse(&text.replace("NaN", "inf")).is_err());
        assert!(parse(
            &text
                .replace("  NaN", "1.500")
                .replace("0.500 0.75", "2.000 0.75")
        )
        .is_ok());
    }
}
