//! Response compression tables and precompressed-sibling lists: codings, levels, types.

use super::*;
use crate::model::{Coding, Compression};
use crate::raw::RawCompression;

/// A `compression` table: starts from `inherited` (the listener's settings for a route's table)
/// or the defaults, and overrides the keys it sets; None when `enabled = false`.
pub(super) fn compression(
    ctx: &mut Ctx<'_>,
    key: &str,
    raw: &RawCompression,
    inherited: Option<&Compression>,
) -> Option<Compression> {
    let base = inherited.cloned().unwrap_or_else(Compression::defaults);
    let algorithms = match &raw.algorithms {
        Some(list) => {
            let codings = codings(ctx, &sub(key, "algorithms"), list);
            if codings.is_empty() {
                base.algorithms.clone()
            } else {
                codings
            }
        }
        None => base.algorithms.clone(),
    };
    let min_length = size(
        ctx,
        raw.min_length.as_ref(),
        &sub(key, "min_length"),
        base.min_length,
        0,
        u64::MAX,
    );
    let types = match &raw.types {
        Some(list) => media_types(ctx, &sub(key, "types"), list),
        None => base.types.clone(),
    };
    let level = |ctx: &mut Ctx<'_>, v: &Option<Spanned<Int>>, name, default, min, max| {
        int(ctx, v.as_ref(), &sub(key, name), default, min, max)
    };
    let gzip_level = level(
        ctx,
        &raw.gzip_level,
        "gzip_level",
        base.gzip_level.into(),
        1,
        9,
    );
    let brotli_level = level(
        ctx,
        &raw.brotli_level,
        "brotli_level",
        base.brotli_level.into(),
        0,
        11,
    );
    let zstd_level = level(
        ctx,
        &raw.zstd_level,
        "zstd_level",
        base.zstd_level.into(),
        1,
        19,
    );
    if raw.enabled.as_ref().is_some_and(|e| !*e.get_ref()) {
        return None;
    }
    Some(Compression {
        algorithms,
        min_length,
        types,
        gzip_level: gzip_level as u32,
        brotli_level: brotli_level as u32,
        zstd_level: zstd_level as i32,
    })
}

/// A list of content codings (`zstd`, `br`, `gzip`), each at most once, in order; never empty
/// without an error.
pub(super) fn codings(ctx: &mut Ctx<'_>, key: &str, list: &Spanned<StrList>) -> Vec<Coding> {
    let items = list.get_ref().items(start(list));
    if items.is_empty() {
        ctx.error(start(list), key, "must name at least one of zstd, br, gzip");
    }
    let mut out = Vec::new();
    for (i, (text, at)) in items.iter().enumerate() {
        let ikey = item_key(list, key, i);
        match Coding::from_token(text.as_bytes()).filter(|_| text != "x-gzip") {
            Some(c) if out.contains(&c) => {
                ctx.error(*at, &ikey, format!("{text:?} is listed twice"));
            }
            Some(c) => out.push(c),
            None => ctx.error(
                *at,
                &ikey,
                format!("unknown coding {text:?}: expected zstd, br or gzip"),
            ),
        }
    }
    out
}

/// Media types `type/subtype` or `type/*`, lowercased.
fn media_types(ctx: &mut Ctx<'_>, key: &str, list: &Spanned<StrList>) -> Vec<String> {
    let items = list.get_ref().items(start(list));
    if items.is_empty() {
        ctx.error(
            start(list),
            key,
            "must list at least one media type (use enabled = false to turn compression off)",
        );
    }
    let mut out = Vec::new();
    for (i, (text, at)) in items.iter().enumerate() {
        let valid = text
            .split_once('/')
            .is_some_and(|(t, s)| is_token(t) && t != "*" && (s == "*" || is_token(s)));
        if valid {
            out.push(text.to_ascii_lowercase());
        } else {
            ctx.error(
                *at,
                &item_key(list, key, i),
                format!("invalid media type {text:?}: expected type/subtype or type/*, such as \"text/html\" or \"text/*\""),
            );
        }
    }
    out
}

/// Where a compression table starts (its first key), for messages about the table itself.
pub(super) fn compression_at(c: &RawCompression) -> Option<usize> {
    [
        c.enabled.as_ref().map(start),
        c.algorithms.as_ref().map(start),
        c.min_length.as_ref().map(start),
        c.types.as_ref().map(start),
        c.gzip_level.as_ref().map(start),
        c.brotli_level.as_ref().map(start),
        c.zstd_level.as_ref().map(start),
    ]
    .into_iter()
    .flatten()
    .min()
}
