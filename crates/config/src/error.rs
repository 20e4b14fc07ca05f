//! Configuration errors with `file:line:col: key: message` positions.

use std::fmt;
use std::ops::Range;

/// One configuration error. Displays as `{file}:{line}:{col}: {key}: {message}`, or as
/// `{file}: {message}` when there is no position (`line == 0`, e.g. the file cannot be read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The file path as given, or `<embedded>`.
    pub file: String,
    /// 1-based line of the offending value (or of its table when a key is missing); 0 = no position.
    pub line: usize,
    /// 1-based column, counted in characters; 0 = no position.
    pub col: usize,
    /// Dotted key path such as `upstreams.api.servers[1].weight`; empty when there is no position.
    pub key: String,
    /// What is wrong, in one line.
    pub message: String,
}

impl ConfigError {
    /// An error at byte offset `at` of `text`.
    pub(crate) fn at(
        file: &str,
        text: &str,
        at: usize,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        let (line, col) = line_col(text, at);
        ConfigError {
            file: file.to_string(),
            line,
            col,
            key: key.into(),
            message: message.into(),
        }
    }

    /// An error without a position (I/O).
    pub(crate) fn io(file: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_string(),
            line: 0,
            col: 0,
            key: String::new(),
            message: message.into(),
        }
    }

    fn render(&self) -> String {
        if self.line == 0 {
            format!("{}: {}", self.file, self.message)
        } else {
            format!(
                "{}:{}:{}: {}: {}",
                self.file, self.line, self.col, self.key, self.message
            )
        }
    }
}

/// Every error found in one configuration, in file order; never empty. Displays one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// The first error (in file order).
    pub fn first(&self) -> Option<&ConfigError> {
        self.errors.first()
    }

    /// The first error, by value.
    pub fn into_first(self) -> ConfigError {
        let fallback = || ConfigError::io("<unknown>", "invalid configuration");
        self.errors.into_iter().next().unwrap_or_else(fallback)
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> Self {
        ConfigErrors {
            errors: vec![error],
        }
    }
}

/// 1-based line and column (in characters) of byte offset `at`, clamped to the text.
pub(crate) fn line_col(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// Errors from the `toml` deserializer (syntax, unknown keys, wrong types), with the dotted key
/// path recovered from the document.
pub(crate) fn from_toml(file: &str, text: &str, error: &toml::de::Error) -> ConfigError {
    let span = error.span().unwrap_or(0..0);
    let key = key_path_at(text, &span).unwrap_or_else(|| "syntax".to_string());
    let message = error
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let message = with_suggestion(message);
    ConfigError::at(file, text, span.start, key, message)
}

/// "unknown field `adress`, expected one of `name`, `address`" -> adds "; did you mean `address`?".
fn with_suggestion(message: String) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message;
    };
    let Some((unknown, expected)) = rest.split_once('`') else {
        return message;
    };
    let best = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|candidate| (edit_distance(unknown, candidate), candidate))
        .min();
    match best {
        Some((distance, candidate)) if distance <= 2 && distance < unknown.len() => {
            format!("{message}; did you mean `{candidate}`?")
        }
        _ => message,
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// The dotted key path of the deepest key, table or array element starting at or before the
/// error span (what the error is about). None when the document does not even parse.
fn key_path_at(text: &str, span: &Range<usize>) -> Option<String> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut best = Best {
        at: span.start,
        found: None,
    };
    walk_table(doc.as_table(), &mut Vec::new(), &mut best);
    best.found.map(|(_, _, path)| path)
}

struct Best {
    at: usize,
    /// (start, depth, path) of the best candidate so far.
    found: Option<(usize, usize, String)>,
}

impl Best {
    fn consider(&mut self, span: Option<Range<usize>>, path: &[String]) {
        let Some(span) = span else { return };
        if span.start > self.at || path.is_empty() {
            return;
        }
        let better = match &self.found {
            None => true,
            Some((start, depth, _)) => (span.start, path.len()) > (*start, *depth),
        };
        if better {
            self.found = Some((span.start, path.len(), join_path(path)));
        }
    }
}

/// Joins path segments: keys with '.', array indexes as `[i]`, keys quoted when not bare.
pub(crate) fn join_path(segments: &[String]) -> String {
    let mut out = String::new();
    for segment in segments {
        if segment.starts_with('[') {
            out.push_str(segment);
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&quote_key(segment));
        }
    }
    out
}

/// A TOML key as it would be written: bare when possible, else a quoted string.
pub(crate) fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

fn walk_table(table: &toml_edit::Table, path: &mut Vec<String>, best: &mut Best) {
    best.consider(table.span(), path);
    for (name, item) in table.iter() {
        path.push(name.to_string());
        best.consider(table.key(name).and_then(toml_edit::Key::span), path);
        walk_item(item, path, best);
        path.pop();
    }
}

fn walk_item(item: &toml_edit::Item, path: &mut Vec<String>, best: &mut Best) {
    match item {
        toml_edit::Item::None => {}
        toml_edit::Item::Value(value) => walk_value(value, path, best),
        toml_edit::Item::Table(table) => walk_table(table, path, best),
        toml_edit::Item::ArrayOfTables(array) => {
            for (i, table) in array.iter().enumerate() {
                path.push(format!("[{i}]"));
                walk_table(table, path, best);
                path.pop();
            }
        }
    }
}

fn walk_value(value: &toml_edit::Value, path: &mut Vec<String>, best: &mut Best) {
    best.consider(value.span(), path);
    match value {
        toml_edit::Value::Array(array) => {
            for (i, element) in array.iter().enumerate() {
                path.push(format!("[{i}]"));
                walk_value(element, path, best);
                path.pop();
            }
        }
        toml_edit::Value::InlineTable(table) => {
            for (name, element) in table.iter() {
                path.push(name.to_string());
                best.consider(table.key(name).and_then(toml_edit::Key::span), path);
                walk_value(element, path, best);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters_and_clamps() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 4), (1, 5));
        assert_eq!(line_col(text, 6), (2, 1));
        // 'é' is two bytes; the value starts at byte 12 = character 6 of line 2.
        assert_eq!(line_col(text, 12), (2, 6));
        // Inside the 'é' (not a char boundary) and past the end do not panic.
        assert_eq!(line_col(text, 8), (2, 2));
        assert_eq!(line_col(text, 1000), (3, 1));
    }

    #[test]
    fn display_forms() {
        let e = ConfigError::at("p.toml", "x = 1", 4, "x", "bad");
        assert_eq!(e.to_string(), "p.toml:1:5: x: bad");
        let e = ConfigError::io("missing.toml", "cannot read: not found");
        assert_eq!(e.to_string(), "missing.toml: cannot read: not found");
    }

    #[test]
    fn suggestions() {
        assert_eq!(
            with_suggestion("unknown field `adress`, expected one of `name`, `address`".into()),
            "unknown field `adress`, expected one of `name`, `address`; did you mean `address`?"
        );
        assert_eq!(
            with_suggestion("unknown field `zzz`, expected `name` or `address`".into()),
            "unknown field `zzz`, expected `name` or `address`"
        );
    }

    #[test]
    fn key_paths() {
        let text = "[[l]]\na = 1\n[[l]]\nb = { c = [1, 2] }\n[t.u]\nv = 1\n";
        let at = |needle: &str| {
            let start = text.find(needle).unwrap();
            key_path_at(text, &(start..start + needle.len())).unwrap()
        };
        assert_eq!(at("a ="), "l[0].a");
        assert_eq!(at("b ="), "l[1].b");
        assert_eq!(at("c ="), "l[1].b.c");
        assert_eq!(at("2]"), "l[1].b.c[1]");
        assert_eq!(at("v ="), "t.u.v");
        assert_eq!(key_path_at(text, &(12..12)).unwrap(), "l[1]");
    }
}
