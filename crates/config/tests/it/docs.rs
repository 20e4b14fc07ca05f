//! Every ```toml block of docs/configuration.md is a complete, valid configuration.

use std::path::Path;

/// The ```toml blocks of a markdown text, with the line each starts on.
fn toml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```toml") => current = Some((i + 2, String::new())),
            Some(_) if fence.starts_with("```") => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "unterminated ```toml block");
    blocks
}

#[test]
fn every_toml_block_in_the_configuration_reference_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let markdown = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let blocks = toml_blocks(&markdown);
    assert!(
        blocks.len() >= 15,
        "expected many examples, found {}",
        blocks.len()
    );
    let mut failures = Vec::new();
    for (line, text) in &blocks {
        let source = format!("docs/configuration.md (block at line {line})");
        if let Err(errors) = portico_config::parse_all(text, &source) {
            failures.push(errors.to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "invalid examples:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_documented_default_is_the_embedded_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let markdown = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let last = toml_blocks(&markdown).pop().expect("a toml block").1;
    assert_eq!(last, portico_config::DEFAULT_CONFIG);
}

#[test]
fn default_config_parses() {
    let config = portico_config::parse(portico_config::DEFAULT_CONFIG, "<embedded>").unwrap();
    assert_eq!(config.listeners.len(), 2);
    assert_eq!(config.upstreams.len(), 1);
}
