//! Fuzz the readers of `portico bench` results: the `.hgrm` text and the JSON report/sweep
//! (`portico bench report` reads both back from disk), then the page built from what was accepted.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portico_bench::{hgrm, page};

fuzz_target!(|text: &str| {
    if let Ok(h) = hgrm::parse(text) {
        // The parser promises nondecreasing columns.
        for w in h.rows.windows(2) {
            assert!(w[0].value <= w[1].value, "values decrease: {:?}", w);
            assert!(
                w[0].percentile <= w[1].percentile,
                "percentiles decrease: {:?}",
                w
            );
            assert!(
                w[0].total_count <= w[1].total_count,
                "counts decrease: {:?}",
                w
            );
        }
    }
    if let Ok(input) = page::Input::parse(text) {
        let _ = page::build(
            vec![("fuzz.json".to_string(), input)],
            &page::PageOptions::default(),
        );
    }
});
