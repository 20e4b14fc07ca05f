//! Content codings (RFC 9110 8.4) and the choice of one from a request's `Accept-Encoding`.

/// A content coding Portico can produce or serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coding {
    Zstd,
    Br,
    Gzip,
}

impl Coding {
    /// Every coding, in the default order of preference (smallest output first).
    pub const ALL: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// The file name suffix of a precompressed sibling (`app.js.br`).
    pub fn extension(self) -> &'static str {
        match self {
            Coding::Zstd => ".zst",
            Coding::Br => ".br",
            Coding::Gzip => ".gz",
        }
    }

    /// The coding named `token` (case-insensitive; `x-gzip` is gzip, RFC 9110 8.4.1.3).
    pub fn from_token(token: &[u8]) -> Option<Coding> {
        Coding::ALL
            .into_iter()
            .find(|c| token.eq_ignore_ascii_case(c.token().as_bytes()))
            .or_else(|| {
                token
                    .eq_ignore_ascii_case(b"x-gzip")
                    .then_some(Coding::Gzip)
            })
    }
}

/// The coding of `offered` (in the server's order of preference) the client accepts with the
/// highest weight, ties going to the earlier one; None when it accepts none of them, or sent no
/// `Accept-Encoding` (`accept` is None: identity only, as browsers and curl without
/// `--compressed` mean it).
///
/// Weights (`;q=`) follow RFC 9110 12.5.3: `q=0` refuses a coding; `*` covers the codings not
/// named; an unparsable weight counts as 0 (refused) rather than guessed.
pub fn negotiate(accept: Option<&[u8]>, offered: &[Coding]) -> Option<Coding> {
    let accept = accept?;
    let mut best: Option<(Coding, u16)> = None;
    for &c in offered {
        let q = weight(accept, c);
        if q > 0 && best.is_none_or(|(_, bq)| q > bq) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

/// The weight in thousandths `accept` gives coding `c` (0 when refused or not covered).
fn weight(accept: &[u8], c: Coding) -> u16 {
    let mut named = None;
    let mut star = None;
    for item in accept.split(|&b| b == b',') {
        let mut parts = item.split(|&b| b == b';');
        let token = parts.next().unwrap_or_default().trim_ascii();
        if token.is_empty() {
            continue;
        }
        let mut q = 1000;
        for p in parts {
            let p = p.trim_ascii();
            if let Some(v) = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q=")) {
                q = qvalue(v.trim_ascii()).unwrap_or(0);
            }
        }
        if token == b"*" {
            star = Some(q);
        } else if Coding::from_token(token) == Some(c) {
            // The highest weight when a coding is named twice (`x-gzip` and `gzip`).
            named = Some(named.map_or(q, |n: u16| n.max(q)));
        }
    }
    named.or(star).unwrap_or(0)
}

/// An RFC 9110 qvalue (`0`, `0.5`, `1.000`) in thousandths.
fn qvalue(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{negotiate, qvalue, Coding, Coding::*};

    fn pick(accept: &str) -> Option<Coding> {
        negotiate(Some(accept.as_bytes()), &Coding::ALL)
    }

    #[test]
    fn the_servers_order_breaks_ties_and_weights_decide_otherwise() {
        assert_eq!(pick("gzip, deflate, br, zstd"), Some(Zstd));
        assert_eq!(pick("gzip, deflate, br"), Some(Br));
        assert_eq!(pick("gzip"), Some(Gzip));
        assert_eq!(pick("GZIP"), Some(Gzip));
        assert_eq!(pick("x-gzip"), Some(Gzip));
        assert_eq!(pick("br;q=0.5, gzip;q=0.8"), Some(Gzip));
        assert_eq!(pick("br;q=1.0, gzip;q=1"), Some(Br));
        assert_eq!(negotiate(Some(b"gzip, br"), &[Gzip, Br]), Some(Gzip));
    }

    #[test]
    fn refused_and_unknown_codings_are_never_chosen() {
        assert_eq!(pick("identity"), None);
        assert_eq!(pick(""), None);
        assert_eq!(pick("deflate, compress"), None);
        assert_eq!(pick("gzip;q=0, br;q=0.000"), None);
        assert_eq!(pick("gzip;q=0, *"), Some(Zstd));
        assert_eq!(pick("*;q=0, gzip"), Some(Gzip));
        assert_eq!(pick("*;q=0"), None);
        // A weight that does not parse refuses rather than guesses.
        assert_eq!(pick("gzip;q=high"), None);
        assert_eq!(pick("gzip;q=1.5"), None);
        assert_eq!(negotiate(None, &Coding::ALL), None);
        assert_eq!(negotiate(Some(b"gzip"), &[]), None);
    }

    #[test]
    fn qvalues_follow_the_grammar() {
        assert_eq!(qvalue(b"1"), Some(1000));
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"0.5"), Some(500));
        assert_eq!(qvalue(b"0.125"), Some(125));
        assert_eq!(qvalue(b"0"), Some(0));
        assert_eq!(qvalue(b"1.001"), None);
        assert_eq!(qvalue(b"0.1234"), None);
        assert_eq!(qvalue(b"2"), None);
        assert_eq!(qvalue(b""), None);
    }
}
