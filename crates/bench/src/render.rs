//! `portico bench report`: the page of a `bench compare` manifest, or of JSON results.

use crate::error::BenchError;
use crate::manifest::Manifest;
use crate::page::ReportFlags;
use std::path::{Path, PathBuf};

/// Write `flags.out`/index.html: a `bench compare` manifest's own page (from the results beside
/// it), or the page of the JSON results given.
pub fn write(flags: &ReportFlags) -> Result<PathBuf, BenchError> {
    if let [only] = flags.files.as_slice() {
        if let Some(mut m) = read_manifest(only)? {
            if let Some(t) = &flags.title {
                m.title = t.clone();
            }
            let dir = only.parent().unwrap_or(Path::new("."));
            return crate::compare_page::write(&m, dir, &flags.out);
        }
    }
    crate::page::write(flags)
}

/// `path` as a `bench compare` manifest, if it is one (`"kind": "compare"`).
fn read_manifest(path: &Path) -> Result<Option<Manifest>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
        path: path.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    if v.get("kind").and_then(|k| k.as_str()) != Some("compare") {
        return Ok(None);
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| BenchError::Json {
            path: path.to_path_buf(),
            reason: format!("not a bench compare manifest: {e}"),
        })
}
