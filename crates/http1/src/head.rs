//! Request and response heads: strict parsing on httparse, framing decisions per RFC 9112 6.

use crate::body::Framing;
use crate::error::{ParseError, ParseErrorKind};
use crate::syntax::{find_byte, is_token, list_elements, parse_authority};
use bytes::{Buf, Bytes, BytesMut};
use bytestring::ByteString;
use std::mem::MaybeUninit;
use std::ops::Range;

/// Size limits applied while parsing a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum number of header fields (default 100).
    pub max_headers: usize,
    /// Maximum size of the whole head including the request line and final CRLF (default 64 KiB).
    pub max_head_bytes: usize,
    /// Maximum size of the request line, without its CRLF (default 8 KiB). Not applied to
    /// response status lines (they are bounded by `max_head_bytes`).
    pub max_request_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_headers: 100,
            max_head_bytes: 64 * 1024,
            max_request_line: 8 * 1024,
        }
    }
}

/// HTTP version of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    /// `"HTTP/1.0"` or `"HTTP/1.1"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// Request method. Common ones are variants; anything else valid as a token is `Other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    Connect,
    Trace,
    Other(String),
}

impl Method {
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Patch => "PATCH",
            Method::Connect => "CONNECT",
            Method::Trace => "TRACE",
            Method::Other(s) => s,
        }
    }

    /// GET, HEAD, OPTIONS, TRACE, PUT, DELETE (RFC 9110 9.2.2).
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Options
                | Method::Trace
                | Method::Put
                | Method::Delete
        )
    }

    /// The method for a token (case-sensitive, RFC 9110 9.1); `None` if `s` is not a token.
    /// Allocates only for methods that are not variants.
    pub fn from_token(s: &str) -> Option<Method> {
        Some(match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            "PATCH" => Method::Patch,
            "CONNECT" => Method::Connect,
            "TRACE" => Method::Trace,
            other if is_token(other.as_bytes()) => Method::Other(other.to_owned()),
            _ => return None,
        })
    }
}

/// Byte ranges of one header field inside the head buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldPos {
    pub(crate) name: Range<u32>,
    pub(crate) value: Range<u32>,
}

/// Form of a request target (RFC 9112 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetForm {
    /// `/path?query`
    Origin,
    /// `http://authority/path?query` (scheme http or https, any case).
    Absolute,
    /// `host:port`, CONNECT only.
    Authority,
    /// `*`, OPTIONS only.
    Asterisk,
}

/// Tokens of the Connection fields, as ranges into the head (no allocation for up to 4 tokens).
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnTokens {
    inline: [(u32, u32); 4],
    len: usize,
    spill: Vec<(u32, u32)>,
}

impl ConnTokens {
    fn push(&mut self, r: (u32, u32)) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = r;
                self.len = self.len.saturating_add(1);
            }
            None => self.spill.push(r),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &(u32, u32)> {
        self.inline.iter().take(self.len).chain(self.spill.iter())
    }
}

/// A parsed, validated request head. Owns the raw head bytes; accessors borrow from them.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub(crate) buf: HeadBuf,
    pub(crate) method: Method,
    pub(crate) target: Range<u32>,
    pub(crate) version: Version,
    pub(crate) fields: Vec<FieldPos>,
    pub(crate) form: TargetForm,
    pub(crate) path: Range<u32>,
    pub(crate) query: Option<Range<u32>>,
    pub(crate) host: Option<Range<u32>>,
    pub(crate) conn: ConnTokens,
    /// How the body that follows is framed: `Framing::None`, `Length(n)` or `Chunked` (never `Close`).
    /// `Content-Length: 0` gives `Length(0)` so that it can be forwarded faithfully.
    pub framing: Framing,
    /// Whether the connection may stay open after this exchange (version default, then `Connection`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` was present (always false for HTTP/1.0, RFC 9110 10.1.1).
    pub expect_continue: bool,
    /// `Connection: upgrade` plus an `Upgrade` field were present (always false for HTTP/1.0,
    /// RFC 9110 7.8).
    pub upgrade: bool,
}

/// A parsed, validated response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub(crate) buf: HeadBuf,
    pub(crate) version: Version,
    pub(crate) status: u16,
    pub(crate) reason: Range<u32>,
    pub(crate) fields: Vec<FieldPos>,
    pub(crate) conn: ConnTokens,
    /// How the body is framed, given the request method (RFC 9112 6.3): `None` for HEAD, 1xx, 204,
    /// 304 and a 2xx answer to CONNECT; `Chunked`; `Length(n)`; or `Close` (read until EOF).
    pub framing: Framing,
    /// Whether the server lets the connection be reused after this response.
    pub keep_alive: bool,
}

/// Most leading empty lines skipped before a request line.
const MAX_LEADING_EMPTY_LINES: usize = 4;
/// httparse header slots kept on the stack; larger `max_headers` use a heap array.
const STACK_HEADERS: usize = 128;

/// Parse one request head from the front of `buf`.
///
/// - `Ok(None)`: incomplete, read more (but if `buf` already exceeds the limits, that is an error).
///   `buf` is left untouched.
/// - `Ok(Some(head))`: the head bytes (through the final CRLFCRLF) were split off `buf`; the body (if
///   any) and pipelined requests remain in `buf`.
/// - `Err(e)`: the connection must be answered with `e.status()` and closed.
///
/// Leading empty lines before the request line (RFC 9112 2.2, at most 4) are skipped. Rejects
/// everything the reliability guide lists: CL+TE, differing or malformed CL, TE other than a final
/// `chunked`, obs-fold, whitespace before the colon, bare CR/LF, NUL and control bytes, bad request
/// lines, missing/duplicate Host in HTTP/1.1.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<RequestHead>, ParseError> {
    let skip = match leading_empty_lines(buf).map_err(ParseError::new)? {
        Some(skip) => skip,
        None => return Ok(None),
    };
    let avail = buf.get(skip..).unwrap_or_default();
    let (len, mut head) = match scan_request(avail, limits).map_err(ParseError::new)? {
        Some(parsed) => parsed,
        None => return Ok(None),
    };
    if len > avail.len() {
        return Err(ParseError::new(ParseErrorKind::Malformed));
    }
    buf.advance(skip);
    head.buf = HeadBuf::new(buf.split_to(len).freeze());
    Ok(Some(head))
}

/// Parse one response head from the front of `buf`, for a request with method `method`.
/// Same contract as [`parse_request`], except that leading empty lines are refused (they mean the
/// previous message was framed wrongly) and `max_request_line` does not apply.
/// 1xx responses (other than 101) are returned like any other
/// head with `framing == Framing::None`; the caller forwards them and parses again.
pub fn parse_response(
    buf: &mut BytesMut,
    method: &Method,
    limits: &Limits,
) -> Result<Option<ResponseHead>, ParseError> {
    let (len, mut head) = match scan_response(buf, method, limits).map_err(ParseError::new)? {
        Some(parsed) => parsed,
        None => return Ok(None),
    };
    if len > buf.len() {
        return Err(ParseError::new(ParseErrorKind::Malformed));
    }
    head.buf = HeadBuf::new(buf.split_to(len).freeze());
    Ok(Some(head))
}

/// Count leading CRLFs: `Ok(Some(n))` bytes to skip, `Ok(None)` if `buf` holds nothing else yet.
fn leading_empty_lines(buf: &[u8]) -> Result<Option<usize>, ParseErrorKind> {
    let mut i = 0usize;
    let mut lines = 0usize;
    loop {
        match (buf.get(i), buf.get(i.saturating_add(1))) {
            (None, _) | (Some(b'\r'), None) => return Ok(None),
            (Some(b'\r'), Some(b'\n')) => {
                lines = lines.saturating_add(1);
                if lines > MAX_LEADING_EMPTY_LINES {
                    return Err(ParseErrorKind::Malformed);
                }
                i = i.saturating_add(2);
            }
            (Some(b'\r'), Some(_)) | (Some(b'\n'), _) => return Err(ParseErrorKind::Malformed),
            (Some(_), _) => return Ok(Some(i)),
        }
    }
}

/// Offset of `part` inside `base`, if `part` is a sub-slice of it.
fn offset_in(base: &[u8], part: &[u8]) -> Option<usize> {
    let off = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    (off.checked_add(part.len())? <= base.len()).then_some(off)
}

/// `usize` offset inside a head (at most `u32::MAX` bytes, see `head_window`) as `u32`.
#[inline]
fn off32(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

#[inline]
fn range32(start: usize, end: usize) -> Range<u32> {
    off32(start)..off32(end)
}

/// The part of the input httparse may look at: bounded by `max_head_bytes` (and by u32 offsets).
fn head_window<'a>(avail: &'a [u8], limits: &Limits) -> &'a [u8] {
    let cap = limits.max_head_bytes.min(u32::MAX as usize);
    avail.get(..cap).unwrap_or(avail)
}

type Slot<'b> = MaybeUninit<httparse::Header<'b>>;

/// Stack storage for httparse header slots; heap only when `max_headers` exceeds `STACK_HEADERS`.
struct Slots<'b> {
    stack: [Slot<'b>; STACK_HEADERS],
    heap: Vec<Slot<'b>>,
}

impl<'b> Slots<'b> {
    fn new(n: usize) -> Self {
        let mut heap = Vec::new();
        if n > STACK_HEADERS {
            heap.resize_with(n, MaybeUninit::uninit);
        }
        Slots {
            stack: [MaybeUninit::uninit(); STACK_HEADERS],
            heap,
        }
    }

    fn get(&mut self, n: usize) -> &mut [Slot<'b>] {
        if n > STACK_HEADERS {
            &mut self.heap
        } else {
            self.stack.get_mut(..n).unwrap_or_default()
        }
    }
}

/// httparse slots to provide: `max_headers`, but no more than can fit in the bytes at hand (a
/// field line takes at least 3 bytes, `a:` LF, for httparse), so that a huge configured limit
/// cannot make us allocate much; the error reported for a head is the same either way.
fn header_slots(limits: &Limits, window: &[u8]) -> usize {
    limits.max_headers.min(window.len() / 3 + 1)
}

/// Strict httparse settings (they are the defaults; spelled out so that they stay that way).
fn parser_config() -> httparse::ParserConfig {
    let mut config = httparse::ParserConfig::default();
    config
        .allow_spaces_after_header_name_in_responses(false)
        .allow_obsolete_multiline_headers_in_responses(false)
        .allow_multiple_spaces_in_request_line_delimiters(false)
        .allow_multiple_spaces_in_response_status_delimiters(false)
        .allow_space_before_first_header_name(false)
        .ignore_invalid_headers_in_requests(false)
        .ignore_invalid_headers_in_responses(false);
    config
}

fn scan_request(
    avail: &[u8],
    limits: &Limits,
) -> Result<Option<(usize, RequestHead)>, ParseErrorKind> {
    let window = head_window(avail, limits);
    let slot_count = header_slots(limits, window);
    let mut slots = Slots::new(slot_count);
    let mut req = httparse::Request::new(&mut []);
    let n = match parser_config().parse_request_with_uninit_headers(
        &mut req,
        window,
        slots.get(slot_count),
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return request_incomplete(avail, limits),
        Err(httparse::Error::TooManyHeaders) => return Err(ParseErrorKind::TooManyHeaders),
        Err(httparse::Error::Version) => return request_version_error(avail, limits),
        Err(_) => return Err(ParseErrorKind::Malformed),
    };
    let head = window.get(..n).ok_or(ParseErrorKind::Malformed)?;
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(ParseErrorKind::Malformed);
    };
    let version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    let headers: &[httparse::Header<'_>] = req.headers;

    // Line terminators: httparse accepts bare LF and rejects every bare CR. Every line but the
    // last two ends right before a field name, and the head ends with the last two, so checking
    // those positions for CRLF covers every line without another pass over the head.
    let line_end = match headers.first() {
        Some(h) => offset_in(head, h.name.as_bytes()).and_then(|o| o.checked_sub(2)),
        None => n.checked_sub(4),
    }
    .ok_or(ParseErrorKind::Malformed)?;
    if line_end > limits.max_request_line {
        return Err(ParseErrorKind::RequestLineTooLong);
    }
    if !head.ends_with(b"\r\n\r\n") {
        return Err(ParseErrorKind::Malformed);
    }

    let method = Method::from_token(method).ok_or(ParseErrorKind::Malformed)?;
    let target_off = offset_in(head, target.as_bytes()).ok_or(ParseErrorKind::Malformed)?;
    let t = parse_target(target.as_bytes(), &method, target_off)?;
    let scan = scan_fields(head, headers)?;
    let target = range32(target_off, target_off.saturating_add(target.len()));
    let head = request_head(method, target, t, version, scan)?;
    Ok(Some((n, head)))
}

/// The request head of a request line and its fields, once each is checked: the Host rule,
/// the framing, the connection decisions (its `buf` is set by the caller).
pub(crate) fn request_head(
    method: Method,
    target: Range<u32>,
    t: Target,
    version: Version,
    scan: FieldScan,
) -> Result<RequestHead, ParseErrorKind> {
    // Host (RFC 9112 3.2): exactly one in HTTP/1.1, at most one in HTTP/1.0.
    if scan.hosts > 1 || (version == Version::Http11 && scan.hosts == 0) {
        return Err(ParseErrorKind::BadHost);
    }
    let host = match t.host {
        Some(h) => Some(h),
        None => scan.host.clone(),
    };

    let framing = match (scan.cl, scan.te) {
        (ContentLength::Absent, None) => Framing::None,
        (ContentLength::Value(_) | ContentLength::Bad, Some(_)) => {
            return Err(ParseErrorKind::ContentLengthAndTransferEncoding)
        }
        (ContentLength::Bad, None) => return Err(ParseErrorKind::BadContentLength),
        (ContentLength::Value(n), None) => Framing::Length(n),
        (ContentLength::Absent, Some(te)) => {
            // RFC 9112 6.1: TE in HTTP/1.0 means faulty framing; 6.3: final coding must be chunked.
            if version == Version::Http10 || te.bad || te.chunked != 1 || !te.last_chunked {
                return Err(ParseErrorKind::BadTransferEncoding);
            }
            if te.others > 0 {
                return Err(ParseErrorKind::UnsupportedTransferEncoding);
            }
            Framing::Chunked
        }
    };

    let keep_alive = match version {
        Version::Http11 => !scan.conn_close,
        Version::Http10 => scan.conn_keep_alive && !scan.conn_close,
    };
    let upgrade = version == Version::Http11 && scan.conn_upgrade && scan.upgrade_field;
    Ok(RequestHead {
        buf: HeadBuf::default(),
        method,
        target,
        version,
        fields: scan.fields,
        form: t.form,
        path: t.path,
        query: t.query,
        host,
        conn: scan.conn,
        framing,
        keep_alive,
        expect_continue: version == Version::Http11 && scan.expect_continue,
        upgrade,
    })
}

/// httparse wants more bytes: that is fine unless the limits are already exceeded.
fn request_incomplete<T>(avail: &[u8], limits: &Limits) -> Result<Option<T>, ParseErrorKind> {
    // A request line of `max_request_line` bytes plus CRLF has its LF at index max + 1, so
    // looking that far is enough.
    let probe_len = limits.max_request_line.saturating_add(2);
    let probe = avail.get(..probe_len).unwrap_or(avail);
    if find_byte(probe, b'\n').is_none() {
        // No line end yet: what is there (but a final CR) is already part of the line.
        let content = probe.strip_suffix(b"\r").unwrap_or(probe);
        if content.len() > limits.max_request_line {
            return Err(ParseErrorKind::RequestLineTooLong);
        }
    }
    if avail.len() >= limits.max_head_bytes {
        return Err(ParseErrorKind::HeadTooLarge);
    }
    Ok(None)
}

/// `HTTP/` DIGIT `.` DIGIT, or a prefix of it when `partial`.
fn is_http_version(v: &[u8], partial: bool) -> bool {
    const PATTERN: &[u8] = b"HTTP/0.0";
    if v.len() > PATTERN.len() || (!partial && v.len() != PATTERN.len()) {
        return false;
    }
    v.iter().zip(PATTERN).all(|(&b, &p)| {
        if p == b'0' {
            b.is_ascii_digit()
        } else {
            b == p
        }
    })
}

/// The first line of `avail` without its line terminator, and whether it is complete (CRLF seen).
/// `None` if it ends in a bare LF.
fn first_line(avail: &[u8]) -> Option<(&[u8], bool)> {
    match find_byte(avail, b'\n') {
        Some(lf) => {
            let line = avail.get(..lf)?;
            line.strip_suffix(b"\r").map(|l| (l, true))
        }
        None => Some((avail.strip_suffix(b"\r").unwrap_or(avail), false)),
    }
}

/// httparse refused the version of a request line: 505 for a well-formed `HTTP/x.y` other than
/// 1.0/1.1, 400 for anything else, `None` while it may still become one of those.
fn request_version_error<T>(avail: &[u8], limits: &Limits) -> Result<Option<T>, ParseErrorKind> {
    let (line, complete) = first_line(avail).ok_or(ParseErrorKind::Malformed)?;
    let mut parts = line.split(|&b| b == b' ');
    let (Some(_method), Some(_target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseErrorKind::Malformed);
    };
    if complete {
        if line.len() > limits.max_request_line {
            return Err(ParseErrorKind::RequestLineTooLong);
        }
        if is_http_version(version, false) {
            return Err(ParseErrorKind::UnsupportedVersion);
        }
        return Err(ParseErrorKind::Malformed);
    }
    if is_http_version(version, true) {
        return request_incomplete(avail, limits);
    }
    Err(ParseErrorKind::Malformed)
}

/// What the request target told us.
pub(crate) struct Target {
    form: TargetForm,
    path: Range<u32>,
    query: Option<Range<u32>>,
    host: Option<Range<u32>>,
}

/// Validate the request target (visible ASCII, no fragment) and its form against the method.
pub(crate) fn parse_target(
    t: &[u8],
    method: &Method,
    off: usize,
) -> Result<Target, ParseErrorKind> {
    // One pass: httparse refuses CTLs, SP and DEL; we also refuse obs-text and fragments, and
    // note the first '?', which ends the path (and an absolute-form authority).
    let mut q = None;
    for (i, &b) in t.iter().enumerate() {
        match b {
            b'?' if q.is_none() => q = Some(i),
            b'#' | 0x80..=0xFF => return Err(ParseErrorKind::BadTarget),
            _ => {}
        }
    }
    let abs =
        |start: usize, end: usize| range32(off.saturating_add(start), off.saturating_add(end));
    // Path from `start` to the '?' (or the end), query after it.
    let path_query = |start: usize| match q {
        Some(q) if q >= start => (abs(start, q), Some(abs(q.saturating_add(1), t.len()))),
        _ => (abs(start, t.len()), None),
    };
    if *method == Method::Connect {
        let a = parse_authority(t).ok_or(ParseErrorKind::BadTarget)?;
        if !a.has_port {
            return Err(ParseErrorKind::BadTarget);
        }
        return Ok(Target {
            form: TargetForm::Authority,
            path: abs(0, 0),
            query: None,
            host: Some(abs(0, a.host_end)),
        });
    }
    match t.first() {
        Some(b'/') => {
            let (path, query) = path_query(0);
            Ok(Target {
                form: TargetForm::Origin,
                path,
                query,
                host: None,
            })
        }
        Some(b'*') if t.len() == 1 => {
            if *method != Method::Options {
                return Err(ParseErrorKind::BadTarget);
            }
            Ok(Target {
                form: TargetForm::Asterisk,
                path: abs(0, 1),
                query: None,
                host: None,
            })
        }
        _ => {
            let scheme_len = if starts_with_ignore_case(t, b"http://") {
                7
            } else if starts_with_ignore_case(t, b"https://") {
                8
            } else {
                return Err(ParseErrorKind::BadTarget);
            };
            let rest = t.get(scheme_len..).unwrap_or_default();
            let auth_len = rest
                .iter()
                .position(|&b| b == b'/' || b == b'?')
                .unwrap_or(rest.len());
            let authority = rest.get(..auth_len).unwrap_or_default();
            // userinfo ('@') is refused by parse_authority: deprecated for http(s) and a classic
            // way to confuse routing.
            let a = parse_authority(authority).ok_or(ParseErrorKind::BadTarget)?;
            let host = abs(scheme_len, scheme_len.saturating_add(a.host_end));
            let (path, query) = path_query(scheme_len.saturating_add(auth_len));
            Ok(Target {
                form: TargetForm::Absolute,
                path,
                query,
                host: Some(host),
            })
        }
    }
}

fn starts_with_ignore_case(s: &[u8], prefix: &[u8]) -> bool {
    s.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContentLength {
    Absent,
    Value(u64),
    Bad,
}

#[derive(Debug, Clone, Copy, Default)]
struct TransferEncoding {
    chunked: u32,
    others: u32,
    last_chunked: bool,
    bad: bool,
}

/// Everything the framing and connection decisions need, gathered in one pass over the fields.
pub(crate) struct FieldScan {
    fields: Vec<FieldPos>,
    conn: ConnTokens,
    conn_close: bool,
    conn_keep_alive: bool,
    conn_upgrade: bool,
    upgrade_field: bool,
    expect_continue: bool,
    hosts: u32,
    host: Option<Range<u32>>,
    cl: ContentLength,
    te: Option<TransferEncoding>,
}

/// Fields whose value the parser interprets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Host,
    Expect,
    Upgrade,
    Connection,
    ContentLength,
    TransferEncoding,
}

/// Classify a field name: length and first letter first, so most names cost two compares.
#[inline]
fn known_field(name: &[u8]) -> Option<Known> {
    let (known, lower): (Known, &[u8]) = match (name.len(), name.first()? | 0x20) {
        (4, b'h') => (Known::Host, b"host"),
        (6, b'e') => (Known::Expect, b"expect"),
        (7, b'u') => (Known::Upgrade, b"upgrade"),
        (10, b'c') => (Known::Connection, b"connection"),
        (14, b'c') => (Known::ContentLength, b"content-length"),
        (17, b't') => (Known::TransferEncoding, b"transfer-encoding"),
        _ => return None,
    };
    name.eq_ignore_ascii_case(lower).then_some(known)
}

fn scan_fields(head: &[u8], headers: &[httparse::Header<'_>]) -> Result<FieldScan, ParseErrorKind> {
    let mut s = FieldScan::with_capacity(headers.len());
    let base = head.as_ptr() as usize;
    for h in headers {
        let name = h.name.as_bytes();
        let value = h.value;
        // Offsets of httparse's slices inside `head` (where they always are; checked anyway).
        let name_off = (name.as_ptr() as usize)
            .checked_sub(base)
            .ok_or(ParseErrorKind::Malformed)?;
        let name_end = name_off
            .checked_add(name.len())
            .ok_or(ParseErrorKind::Malformed)?;
        let value_off = if value.is_empty() {
            name_end
        } else {
            (value.as_ptr() as usize)
                .checked_sub(base)
                .ok_or(ParseErrorKind::Malformed)?
        };
        let value_end = value_off
            .checked_add(value.len())
            .ok_or(ParseErrorKind::Malformed)?;
        if value_end > head.len() || value_off < name_end {
            return Err(ParseErrorKind::Malformed);
        }
        // The previous line must end in CRLF (see scan_request).
        let cr = name_off.checked_sub(2).and_then(|i| head.get(i));
        let lf = name_off.checked_sub(1).and_then(|i| head.get(i));
        if cr != Some(&b'\r') || lf != Some(&b'\n') {
            return Err(ParseErrorKind::Malformed);
        }
        s.field(name, value, name_off, value_off)?;
    }
    Ok(s)
}

impl FieldScan {
    pub(crate) fn with_capacity(n: usize) -> FieldScan {
        FieldScan {
            fields: Vec::with_capacity(n),
            conn: ConnTokens::default(),
            conn_close: false,
            conn_keep_alive: false,
            conn_upgrade: false,
            upgrade_field: false,
            expect_continue: false,
            hosts: 0,
            host: None,
            cl: ContentLength::Absent,
            te: None,
        }
    }

    /// The number of fields seen.
    pub(crate) fn len(&self) -> usize {
        self.fields.len()
    }

    /// One field, `name` at `name_off` and `value` at `value_off` in the head: its position, and
    /// what it says of the host, the framing and the connection.
    pub(crate) fn field(
        &mut self,
        name: &[u8],
        value: &[u8],
        name_off: usize,
        value_off: usize,
    ) -> Result<(), ParseErrorKind> {
        let s = self;
        s.fields.push(FieldPos {
            name: range32(name_off, name_off.saturating_add(name.len())),
            value: range32(value_off, value_off.saturating_add(value.len())),
        });
        match known_field(name) {
            Some(Known::Host) => {
                s.hosts = s.hosts.saturating_add(1);
                if !value.is_empty() {
                    let a = parse_authority(value).ok_or(ParseErrorKind::BadHost)?;
                    s.host = Some(range32(value_off, value_off.saturating_add(a.host_end)));
                }
            }
            Some(Known::Expect) => {
                s.expect_continue |= value.eq_ignore_ascii_case(b"100-continue");
            }
            Some(Known::Upgrade) => s.upgrade_field = true,
            Some(Known::Connection) => {
                for (at, token) in list_elements(value) {
                    // Empty elements are allowed (RFC 9110 5.6.1); non-tokens cannot name a field.
                    if !is_token(token) {
                        continue;
                    }
                    if token.eq_ignore_ascii_case(b"close") {
                        s.conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        s.conn_keep_alive = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        s.conn_upgrade = true;
                    }
                    let start = value_off.saturating_add(at);
                    s.conn
                        .push((off32(start), off32(start.saturating_add(token.len()))));
                }
            }
            Some(Known::ContentLength) => s.cl = content_length(s.cl, value),
            Some(Known::TransferEncoding) => {
                let te = s.te.get_or_insert_with(TransferEncoding::default);
                for (_, coding) in list_elements(value) {
                    if !is_token(coding) {
                        // Empty elements, parameters, spaces, quotes: refuse.
                        te.bad = true;
                    } else if coding.eq_ignore_ascii_case(b"chunked") {
                        te.chunked = te.chunked.saturating_add(1);
                        te.last_chunked = true;
                    } else {
                        te.others = te.others.saturating_add(1);
                        te.last_chunked = false;
                    }
                }
            }
            None => {}
        }
        Ok(())
    }
}

/// Fold one Content-Length field into the state: every list element must be `1*DIGIT`, fit in a
/// u64 and equal every other element (RFC 9112 6.3 item 5).
fn content_length(prev: ContentLength, value: &[u8]) -> ContentLength {
    let mut cur = prev;
    for (_, elem) in list_elements(value) {
        let Some(n) = parse_decimal(elem) else {
            return ContentLength::Bad;
        };
        cur = match cur {
            ContentLength::Absent => ContentLength::Value(n),
            ContentLength::Value(m) if m == n => cur,
            _ => return ContentLength::Bad,
        };
    }
    cur
}

/// `1*DIGIT` as u64, None on anything else or overflow.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

fn scan_response(
    buf: &[u8],
    method: &Method,
    limits: &Limits,
) -> Result<Option<(usize, ResponseHead)>, ParseErrorKind> {
    if matches!(buf.first(), Some(b'\r' | b'\n')) {
        return Err(ParseErrorKind::Malformed);
    }
    let window = head_window(buf, limits);
    let slot_count = header_slots(limits, window);
    let mut slots = Slots::new(slot_count);
    let mut resp = httparse::Response::new(&mut []);
    let n = match parser_config().parse_response_with_uninit_headers(
        &mut resp,
        window,
        slots.get(slot_count),
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= limits.max_head_bytes {
                return Err(ParseErrorKind::HeadTooLarge);
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ParseErrorKind::TooManyHeaders),
        Err(httparse::Error::Version) => return response_version_error(buf, limits),
        Err(_) => return Err(ParseErrorKind::Malformed),
    };
    let head = window.get(..n).ok_or(ParseErrorKind::Malformed)?;
    let (Some(minor), Some(status)) = (resp.version, resp.code) else {
        return Err(ParseErrorKind::Malformed);
    };
    if !(100..=999).contains(&status) {
        return Err(ParseErrorKind::Malformed);
    }
    let version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    let headers: &[httparse::Header<'_>] = resp.headers;
    let line_end = match headers.first() {
        Some(h) => offset_in(head, h.name.as_bytes()).and_then(|o| o.checked_sub(2)),
        None => n.checked_sub(4),
    }
    .ok_or(ParseErrorKind::Malformed)?;
    if !head.ends_with(b"\r\n\r\n") {
        return Err(ParseErrorKind::Malformed);
    }
    // "HTTP/1.1 200 " is 13 bytes; httparse returns "" for reasons with obs-text, so take the
    // bytes themselves.
    const REASON_AT: usize = 13;
    let reason = if line_end >= REASON_AT {
        range32(REASON_AT, line_end)
    } else {
        range32(0, 0)
    };
    let scan = scan_fields(head, headers)?;
    let head = response_head(status, reason, version, scan, method)?;
    Ok(Some((n, head)))
}

/// The response head of a status line and its fields, once each is checked: the framing for a
/// request of `method` (RFC 9112 6.3), the connection decision (its `buf` is set by the caller).
pub(crate) fn response_head(
    status: u16,
    reason: Range<u32>,
    version: Version,
    scan: FieldScan,
    method: &Method,
) -> Result<ResponseHead, ParseErrorKind> {
    let framing = match (scan.cl, scan.te) {
        (ContentLength::Absent, None) => Framing::Close,
        (ContentLength::Value(_) | ContentLength::Bad, Some(_)) => {
            return Err(ParseErrorKind::ContentLengthAndTransferEncoding)
        }
        (ContentLength::Bad, None) => return Err(ParseErrorKind::BadContentLength),
        (ContentLength::Value(n), None) => Framing::Length(n),
        (ContentLength::Absent, Some(te)) => {
            if version == Version::Http10 || te.bad || te.chunked > 1 {
                return Err(ParseErrorKind::BadTransferEncoding);
            }
            if te.last_chunked {
                Framing::Chunked
            } else {
                Framing::Close
            }
        }
    };
    let no_body = *method == Method::Head
        || (100..200).contains(&status)
        || status == 204
        || status == 304
        || (*method == Method::Connect && (200..300).contains(&status));
    let framing = if no_body { Framing::None } else { framing };
    let keep_alive = framing != Framing::Close
        && match version {
            Version::Http11 => !scan.conn_close,
            Version::Http10 => scan.conn_keep_alive && !scan.conn_close,
        };
    Ok(ResponseHead {
        buf: HeadBuf::default(),
        version,
        status,
        reason,
        fields: scan.fields,
        conn: scan.conn,
        framing,
        keep_alive,
    })
}

/// httparse refused the version of a status line: see [`request_version_error`].
fn response_version_error<T>(buf: &[u8], limits: &Limits) -> Result<Option<T>, ParseErrorKind> {
    let (line, complete) = first_line(buf).ok_or(ParseErrorKind::Malformed)?;
    let version_len = find_byte(line, b' ');
    let version = line
        .get(..version_len.unwrap_or(line.len()))
        .unwrap_or_default();
    if complete || version_len.is_some() {
        if is_http_version(version, false) {
            return Err(ParseErrorKind::UnsupportedVersion);
        }
        return Err(ParseErrorKind::Malformed);
    }
    if is_http_version(version, true) {
        if buf.len() >= limits.max_head_bytes {
            return Err(ParseErrorKind::HeadTooLarge);
        }
        return Ok(None);
    }
    Err(ParseErrorKind::Malformed)
}

/// A head's bytes, its text validated once when it is UTF-8 (every head but one with obs-text
/// in a value): reading a name, the target or the host is then a slice, not a validation each.
#[derive(Debug, Clone)]
pub(crate) enum HeadBuf {
    Text(ByteString),
    Raw(Bytes),
}

impl Default for HeadBuf {
    fn default() -> HeadBuf {
        HeadBuf::Text(ByteString::new())
    }
}

impl HeadBuf {
    pub(crate) fn new(b: Bytes) -> HeadBuf {
        match ByteString::try_from(b.clone()) {
            Ok(t) => HeadBuf::Text(t),
            Err(_) => HeadBuf::Raw(b),
        }
    }

    fn bytes(&self) -> &Bytes {
        match self {
            HeadBuf::Text(t) => t.as_bytes(),
            HeadBuf::Raw(b) => b,
        }
    }
}

#[inline]
fn slice_of<'a>(buf: &'a HeadBuf, r: &Range<u32>) -> &'a [u8] {
    buf.bytes()
        .get(r.start as usize..r.end as usize)
        .unwrap_or_default()
}

/// The text at `r` ("" when it is not UTF-8).
#[inline]
fn str_of<'a>(buf: &'a HeadBuf, r: &Range<u32>) -> &'a str {
    match buf {
        HeadBuf::Text(t) => t.get(r.start as usize..r.end as usize).unwrap_or_default(),
        HeadBuf::Raw(_) => std::str::from_utf8(slice_of(buf, r)).unwrap_or_default(),
    }
}

fn find_field<'a>(buf: &'a HeadBuf, fields: &[FieldPos], name: &str) -> Option<&'a [u8]> {
    let name = name.as_bytes();
    fields
        .iter()
        .find(|f| f.name.len() == name.len() && slice_of(buf, &f.name).eq_ignore_ascii_case(name))
        .map(|f| slice_of(buf, &f.value))
}

fn iter_fields<'a>(
    buf: &'a HeadBuf,
    fields: &'a [FieldPos],
) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
    fields
        .iter()
        .map(move |f| (str_of(buf, &f.name), slice_of(buf, &f.value)))
}

fn iter_field_lines<'a>(
    buf: &'a HeadBuf,
    fields: &'a [FieldPos],
) -> impl Iterator<Item = FieldLine<'a>> + 'a {
    fields.iter().map(move |f| FieldLine {
        name: str_of(buf, &f.name),
        value: slice_of(buf, &f.value),
        raw: buf.bytes(),
        pos: f,
    })
}

/// One field of a parsed head, with access to its line as received.
#[derive(Debug, Clone, Copy)]
pub struct FieldLine<'a> {
    /// The name as received.
    pub name: &'a str,
    /// The value, surrounding whitespace trimmed.
    pub value: &'a [u8],
    raw: &'a [u8],
    pos: &'a FieldPos,
}

impl<'a> FieldLine<'a> {
    /// The line as received when it reads exactly `name: value\r\n`, what
    /// [`crate::encode::field`] writes (so a copy can take it whole); None otherwise.
    pub fn line(&self) -> Option<&'a [u8]> {
        let (name_end, value_start) = (self.pos.name.end as usize, self.pos.value.start as usize);
        let line_end = (self.pos.value.end as usize).saturating_add(2);
        let canonical = value_start == name_end.saturating_add(2)
            && self.raw.get(name_end..value_start) == Some(b": ")
            && self.raw.get(line_end - 2..line_end) == Some(b"\r\n");
        canonical
            .then(|| self.raw.get(self.pos.name.start as usize..line_end))
            .flatten()
    }
}

/// True for the RFC 9110 7.6.1 hop-by-hop fields (plus the legacy Keep-Alive and
/// Proxy-Connection), whatever the message's Connection field says.
pub fn is_fixed_hop_by_hop(name: &str) -> bool {
    let n = name.as_bytes();
    match n.len() {
        2 => n.eq_ignore_ascii_case(b"te"),
        7 => n.eq_ignore_ascii_case(b"trailer") || n.eq_ignore_ascii_case(b"upgrade"),
        10 => n.eq_ignore_ascii_case(b"connection") || n.eq_ignore_ascii_case(b"keep-alive"),
        16 => n.eq_ignore_ascii_case(b"proxy-connection"),
        17 => n.eq_ignore_ascii_case(b"transfer-encoding"),
        _ => false,
    }
}

fn hop_by_hop(buf: &HeadBuf, conn: &ConnTokens, name: &str) -> bool {
    if is_fixed_hop_by_hop(name) {
        return true;
    }
    let n = name.as_bytes();
    conn.iter()
        .any(|&(s, e)| slice_of(buf, &(s..e)).eq_ignore_ascii_case(n))
}

impl RequestHead {
    pub fn method(&self) -> &Method {
        &self.method
    }
    /// The request target exactly as received (validated: visible ASCII only).
    pub fn target(&self) -> &str {
        str_of(&self.buf, &self.target)
    }
    /// Form of the request target.
    pub fn target_form(&self) -> TargetForm {
        self.form
    }
    /// Path part of an origin-form target (before `?`); for absolute-form, the path after the
    /// authority (`/` if empty); `*` for asterisk-form; empty for authority-form (CONNECT).
    pub fn path(&self) -> &str {
        let p = str_of(&self.buf, &self.path);
        if p.is_empty() && self.form == TargetForm::Absolute {
            "/"
        } else {
            p
        }
    }
    /// Query part without the `?`, if any.
    pub fn query(&self) -> Option<&str> {
        self.query.as_ref().map(|q| str_of(&self.buf, q))
    }
    pub fn version(&self) -> Version {
        self.version
    }
    /// Host without the port: from the target for absolute-form (RFC 9112 3.2.2) and
    /// authority-form, else from the Host field; `None` if the Host field is empty (HTTP/1.1) or
    /// absent (HTTP/1.0). IPv6 literals keep their brackets. Not lowercased (compare
    /// case-insensitively).
    pub fn host(&self) -> Option<&str> {
        self.host.as_ref().map(|h| str_of(&self.buf, h))
    }
    /// All fields in order: (name as received, value with surrounding whitespace trimmed).
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        iter_fields(&self.buf, &self.fields)
    }
    /// As [`RequestHead::fields`], each field with its line as received ([`FieldLine::line`]).
    pub fn field_lines(&self) -> impl Iterator<Item = FieldLine<'_>> + '_ {
        iter_field_lines(&self.buf, &self.fields)
    }
    /// First field with this name (ASCII case-insensitive).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        find_field(&self.buf, &self.fields, name)
    }
    /// True if `name` is hop-by-hop for this message: the fixed set (Connection, Keep-Alive,
    /// Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade: the RFC 9110 7.6.1 set plus the
    /// legacy two) or listed in this message's Connection field. Content-Length is NOT
    /// hop-by-hop here (the caller decides framing).
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        hop_by_hop(&self.buf, &self.conn, name)
    }
    /// The raw head bytes (request line through the final CRLF CRLF).
    pub fn raw(&self) -> &Bytes {
        self.buf.bytes()
    }
    /// The head announces body bytes (its framing is chunked or a non-zero length).
    pub fn has_body(&self) -> bool {
        !matches!(self.framing, Framing::None | Framing::Length(0))
    }
}

impl ResponseHead {
    pub fn status(&self) -> u16 {
        self.status
    }
    /// The reason phrase as received ("" if absent or not UTF-8).
    pub fn reason(&self) -> &str {
        str_of(&self.buf, &self.reason)
    }
    pub fn version(&self) -> Version {
        self.version
    }
    pub fn fields(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        iter_fields(&self.buf, &self.fields)
    }
    /// Same as [`RequestHead::field_lines`].
    pub fn field_lines(&self) -> impl Iterator<Item = FieldLine<'_>> + '_ {
        iter_field_lines(&self.buf, &self.fields)
    }
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        find_field(&self.buf, &self.fields, name)
    }
    /// Same rule as [`RequestHead::is_hop_by_hop`], with this response's Connection field.
    pub fn is_hop_by_hop(&self, name: &str) -> bool {
        hop_by_hop(&self.buf, &self.conn, name)
    }
    pub fn raw(&self) -> &Bytes {
        self.buf.bytes()
    }
}
