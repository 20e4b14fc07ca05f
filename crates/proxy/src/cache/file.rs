//! The disk tier's file format, sans-io: a magic line, the head's length, the head as JSON (everything of a stored response but its body), then the body.

/// The first bytes of every file; a file without them is not the cache's and goes.
pub const MAGIC: &[u8; 16] = b"portico-cache-1\n";
/// The magic and the head's length (u32, little endian).
pub const PREAMBLE: u64 = 20;
/// The longest head read back (a stored head is bounded by the response head limits).
const MAX_HEAD: u64 = 4 << 20;

/// A file's head. Field values are kept as Latin-1 text (one char per byte), so that any
/// field bytes survive.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub url: String,
    pub route: u64,
    pub tls: bool,
    pub group: usize,
    pub select: Vec<(String, Option<String>)>,
    pub status: u16,
    pub reason: String,
    pub fields: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch when it was received.
    pub stored_ms: u64,
    pub initial_age_ms: u64,
    pub fresh_for_ms: u64,
    pub stale_if_error_ms: u64,
    pub stale_while_revalidate_ms: u64,
    pub revalidate: bool,
    pub tags: Vec<String>,
    /// The body's length.
    pub body: u64,
}

/// Bytes as Latin-1 text.
pub fn latin1(v: &[u8]) -> String {
    v.iter().map(|&b| b as char).collect()
}

/// Latin-1 text back to its bytes (a char past U+00FF, which [`latin1`] never writes, keeps
/// its low byte).
pub fn bytes(s: &str) -> Vec<u8> {
    s.chars().map(|c| c as u32 as u8).collect()
}

/// The head's length from the file's first [`PREAMBLE`] bytes.
pub fn head_len(pre: &[u8; PREAMBLE as usize]) -> Result<u64, &'static str> {
    if &pre[..16] != MAGIC {
        return Err("not a cache file");
    }
    let n = u64::from(u32::from_le_bytes([pre[16], pre[17], pre[18], pre[19]]));
    match n <= MAX_HEAD {
        true => Ok(n),
        false => Err("head too long"),
    }
}

/// The head from its JSON.
pub fn meta(raw: &[u8]) -> Result<Meta, &'static str> {
    serde_json::from_slice(raw).map_err(|_| "the head is not valid")
}

/// Whether a file of `size` bytes with a head of `head_len` bytes holds all of `meta`'s body.
pub fn whole(size: u64, head_len: u64, meta: &Meta) -> bool {
    PREAMBLE
        .checked_add(head_len)
        .and_then(|n| n.checked_add(meta.body))
        == Some(size)
}

/// The file's first bytes before the body: the preamble and the head.
pub fn encode(meta: &Meta) -> Vec<u8> {
    let head = serde_json::to_vec(meta).unwrap_or_default();
    let mut out = Vec::with_capacity(PREAMBLE as usize + head.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&head);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_reads_back_and_a_cut_or_foreign_file_is_refused() {
        let m = Meta {
            url: "h/a".into(),
            route: 7,
            tls: true,
            group: 1,
            select: vec![("accept-encoding".into(), Some(latin1(b"gzip\xff")))],
            status: 200,
            reason: "OK".into(),
            fields: vec![("X-Bytes".into(), latin1(&[0x80, b'a', 0xfe]))],
            stored_ms: 1,
            initial_age_ms: 2,
            fresh_for_ms: 3,
            stale_if_error_ms: 4,
            stale_while_revalidate_ms: 5,
            revalidate: false,
            tags: vec!["t".into()],
            body: 10,
        };
        let file = encode(&m);
        let pre: [u8; 20] = file[..20].try_into().unwrap();
        let n = head_len(&pre).unwrap();
        let back = meta(&file[20..20 + n as usize]).unwrap();
        assert_eq!(bytes(&back.fields[0].1), [0x80, b'a', 0xfe]);
        assert_eq!(bytes(back.select[0].1.as_deref().unwrap()), b"gzip\xff");
        assert!(whole(file.len() as u64 + 10, n, &back));
        assert!(!whole(file.len() as u64 + 9, n, &back));
        let mut foreign = pre;
        foreign[0] = b'P';
        assert_eq!(head_len(&foreign), Err("not a cache file"));
        let mut long = pre;
        long[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(head_len(&long), Err("head too long"));
    }
}
