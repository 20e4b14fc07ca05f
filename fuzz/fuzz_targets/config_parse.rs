//! Fuzz the configuration parser: any UTF-8 text gives a config or errors (never a panic), and
//! every error carries a real `file:line:col` position.

#![no_main]

use libfuzzer_sys::fuzz_target;

const SOURCE: &str = "fuzz.toml";

fuzz_target!(|text: &str| {
    match portico_config::parse_all(text, SOURCE) {
        Ok(config) => {
            // `portico check` prints this for every accepted config.
            let _ = portico_config::explain(&config);
        }
        Err(errors) => {
            assert!(!errors.errors.is_empty(), "Err without any error");
            let lines = text.split('\n').count();
            for e in &errors.errors {
                let shown = e.to_string();
                assert!(
                    e.line >= 1 && e.col >= 1,
                    "error without a position: {shown}"
                );
                assert!(e.line <= lines, "line {} past the end: {shown}", e.line);
                let line_text = text.split('\n').nth(e.line - 1).unwrap_or("");
                assert!(
                    e.col <= line_text.chars().count() + 1,
                    "col {} past the end of line {}: {shown}",
                    e.col,
                    e.line
                );
                let prefix = format!("{SOURCE}:{}:{}: ", e.line, e.col);
                assert!(shown.starts_with(&prefix), "not file:line:col: {shown}");
                assert!(!shown.contains('\n'), "multi-line error: {shown:?}");
            }
        }
    }
});
