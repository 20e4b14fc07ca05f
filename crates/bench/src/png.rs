//! The report's charts as PNG files: each SVG rasterized with resvg at twice its size, text in the system's fonts.

use resvg::{tiny_skia, usvg};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// Pixels per SVG unit: the 760-unit-wide charts become 1520-pixel-wide images, sharp on
/// high-density screens and in documents.
pub const SCALE: f32 = 2.0;

/// The system's fonts, loaded once per process (a few ms to scan /usr/share/fonts).
fn fonts() -> Arc<usvg::fontdb::Database> {
    static DB: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_system_fonts();
        // The charts ask for DejaVu Sans first, then the generic sans-serif: make that a font
        // Debian has (fontdb's default generic is Arial).
        for family in ["DejaVu Sans", "Liberation Sans", "Noto Sans"] {
            if db
                .faces()
                .any(|f| f.families.iter().any(|(n, _)| n == family))
            {
                db.set_sans_serif_family(family);
                break;
            }
        }
        Arc::new(db)
    })
    .clone()
}

/// Rasterize one SVG document to PNG bytes. Err when it does not parse, or when the system has no
/// font at all (the text would be missing: a chart without labels is not written).
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, String> {
    let db = fonts();
    if db.is_empty() {
        return Err(
            "no fonts found on this system (Debian: apt-get install fonts-dejavu-core)".into(),
        );
    }
    let opt = usvg::Options {
        fontdb: db,
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| format!("SVG: {e}"))?;
    let size = tree
        .size()
        .to_int_size()
        .scale_by(SCALE)
        .ok_or("SVG: empty size")?;
    let mut pixmap =
        tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("PNG: size out of range")?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(SCALE, SCALE),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(|e| format!("PNG: {e}"))
}

/// Write `NAME.png` beside each `NAME.svg` of `svgs` into `out`; returns one line per chart that
/// could not be written (the page and the SVGs do not depend on it).
pub fn write_all(out: &Path, svgs: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, text) in svgs {
        let png = out.join(Path::new(name).with_extension("png"));
        match svg_to_png(text).and_then(|bytes| {
            std::fs::write(&png, bytes).map_err(|e| format!("{}: {e}", png.display()))
        }) {
            Ok(()) => {}
            Err(e) => problems.push(format!("{}: PNG not written: {e}", png.display())),
        }
    }
    problems
}

/// Whether `bytes` start as a PNG file does (the 8-byte signature, then the IHDR chunk).
pub fn is_png(bytes: &[u8]) -> bool {
    bytes.len() > 16 && bytes.starts_with(b"\x89PNG\r\n\x1a\n") && &bytes[12..16] == b"IHDR"
}

/// Width and height of a PNG, from its IHDR chunk.
pub fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if !is_png(bytes) || bytes.len() < 24 {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&bytes[16..20]), be(&bytes[20..24])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_becomes_a_png_twice_its_size() {
        let svg = crate::svg::bar_chart("Throughput", "requests/s", &[("a".into(), 12_345.6)]);
        let png = svg_to_png(&svg).unwrap();
        assert!(is_png(&png), "PNG signature and IHDR");
        let (w, h) = png_size(&png).unwrap();
        let width: f64 = svg
            .split("viewBox=\"0 0 ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .unwrap();
        assert_eq!(w as f64, (width * SCALE as f64).round());
        assert!(h > 100, "{w}x{h}");
        assert!(svg_to_png("<svg").is_err());
        assert!(!is_png(b"GIF89a....................."));
    }
}
