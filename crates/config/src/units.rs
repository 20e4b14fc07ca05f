//! Durations ("10s", "500ms") and byte sizes (4096, "64k", "1MiB"): parsing and display.

use std::time::Duration;

/// Largest duration accepted anywhere: 365 days (keeps `Instant + duration` far from overflow).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The accepted duration units, for messages.
pub const DURATION_UNITS: &str = "us, ms, s, m, h";

/// Parses `<digits><unit>` with unit one of `us`, `ms`, `s`, `m`, `h` ("250us", "10s", "2h").
/// No spaces, no fractions, no compound forms; at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {text:?}: expected a whole number and a unit ({DURATION_UNITS}), e.g. \"10s\" or \"500ms\""
        )
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let per_unit: u128 = match unit {
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => {
            return Err(format!(
            "invalid duration {text:?}: a unit is required ({DURATION_UNITS}), e.g. \"{digits}s\""
        ))
        }
        _ => return Err(bad()),
    };
    let too_long = || format!("duration {text:?} is too long (at most 8760h)");
    // More than 30 digits cannot fit whatever the unit; avoids u128 overflow below.
    if digits.len() > 30 {
        return Err(too_long());
    }
    let count: u128 = digits.parse().map_err(|_| bad())?;
    let nanos = count.checked_mul(per_unit).ok_or_else(too_long)?;
    if nanos > MAX_DURATION.as_nanos() {
        return Err(too_long());
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    let sub = u32::try_from(nanos % 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, sub))
}

/// Formats a duration with the largest unit that divides it exactly ("90s", "2h", "1500ms").
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    for (unit, per) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos.is_multiple_of(per) {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{nanos}ns")
}

/// Parses a size string: digits with an optional binary suffix, case-insensitive:
/// none (bytes), `k`/`KiB` (1024), `m`/`MiB` (1024²), `g`/`GiB` (1024³).
/// `KB`, `MB`, `GB` are refused as ambiguous (1000 or 1024?).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || {
        format!(
            "invalid size {text:?}: expected bytes as an integer or a string with a suffix k, m, g, KiB, MiB, GiB (all powers of 1024), e.g. \"64k\""
        )
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" | "mb" | "gb" => {
            return Err(format!(
                "invalid size {text:?}: {unit:?} is ambiguous; write \"{digits}{}\" or \"{digits}{}iB\" (both mean powers of 1024)",
                &unit[..1].to_ascii_lowercase(),
                &unit[..1].to_ascii_uppercase(),
            ))
        }
        _ => return Err(bad()),
    };
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("size {text:?} is too large"))?;
    count
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Formats a byte count with the largest binary unit that divides it exactly ("64KiB", "1MiB", "1000").
pub fn format_size(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_string();
    }
    for (unit, per) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes.is_multiple_of(per) {
            return format!("{}{unit}", bytes / per);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("250us", Duration::from_micros(250)),
            ("500ms", Duration::from_millis(500)),
            ("0s", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("1m", Duration::from_secs(60)),
            ("90m", Duration::from_secs(5400)),
            ("2h", Duration::from_secs(7200)),
            ("8760h", MAX_DURATION),
            ("007s", Duration::from_secs(7)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        let bad = [
            "",
            "s",
            "10",
            "10 s",
            " 10s",
            "10S",
            "1.5s",
            "-1s",
            "1h30m",
            "10sec",
            "10d",
            "µs",
            "5ns",
            "+1s",
            "8761h",
            "99999999999999999999999999999999999h",
        ];
        for text in bad {
            assert!(parse_duration(text).is_err(), "{text} should be rejected");
        }
        assert_eq!(
            parse_duration("10").unwrap_err(),
            "invalid duration \"10\": a unit is required (us, ms, s, m, h), e.g. \"10s\""
        );
        assert_eq!(
            parse_duration("1.5s").unwrap_err(),
            "invalid duration \"1.5s\": expected a whole number and a unit (us, ms, s, m, h), e.g. \"10s\" or \"500ms\""
        );
        assert_eq!(
            parse_duration("8761h").unwrap_err(),
            "duration \"8761h\" is too long (at most 8760h)"
        );
    }

    #[test]
    fn duration_display_round_trips() {
        for text in ["250us", "500ms", "1500ms", "10s", "90s", "1m", "2h", "0s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_nanos(5)), "5ns");
    }

    #[test]
    fn sizes() {
        let ok = [
            ("0", 0),
            ("512", 512),
            ("64k", 65_536),
            ("64K", 65_536),
            ("8KiB", 8_192),
            ("8kib", 8_192),
            ("1m", 1_048_576),
            ("1M", 1_048_576),
            ("1MiB", 1_048_576),
            ("10m", 10_485_760),
            ("2g", 2_147_483_648),
            ("1GiB", 1_073_741_824),
        ];
        for (text, want) in ok {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for text in [
            "",
            "k",
            "1.5k",
            "-1",
            "64 k",
            "64kb",
            "1MB",
            "1t",
            "1b",
            "99999999999999999999",
            "17179869184g",
        ] {
            assert!(parse_size(text).is_err(), "{text} should be rejected");
        }
        assert_eq!(
            parse_size("64KB").unwrap_err(),
            "invalid size \"64KB\": \"KB\" is ambiguous; write \"64k\" or \"64KiB\" (both mean powers of 1024)"
        );
    }

    #[test]
    fn size_display() {
        assert_eq!(format_size(65_536), "64KiB");
        assert_eq!(format_size(1_048_576), "1MiB");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(0), "0");
    }
}
