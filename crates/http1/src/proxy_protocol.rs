//! Sans-io PROXY protocol (HAProxy, versions 1 and 2): the header a load balancer sends before a connection's first byte, naming the client it accepted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The version 2 signature.
const V2: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The longest version 1 line, CRLF included (the specification's bound).
const V1_MAX: usize = 107;
/// The longest version 2 header taken (16 bytes and the addresses with their TLVs).
pub const MAX_HEADER: usize = 1024;

/// What a PROXY header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A proxied TCP (or UDP) connection from `source` to `destination`.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// The balancer's own connection (a health check: `LOCAL`), or one it could not describe
    /// (`UNKNOWN`, a Unix socket, an unspecified family): the socket's addresses stand.
    Local,
}

/// Why bytes are not a PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("the connection does not start with a PROXY protocol header")]
    Missing,
    #[error("malformed PROXY protocol v1 line: {0}")]
    V1(&'static str),
    #[error("malformed PROXY protocol v2 header: {0}")]
    V2(&'static str),
}

/// Parse the PROXY header at the start of `buf`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((header, n)))` with the `n` bytes it took (the connection's own bytes follow).
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyHeaderError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let n = buf.len().min(V2.len());
    if buf[..n] == V2[..n] {
        return if buf.len() < 16 { Ok(None) } else { v2(buf) };
    }
    let n = buf.len().min(6);
    if buf[..n] == b"PROXY "[..n] {
        return v1(buf);
    }
    Err(ProxyHeaderError::Missing)
}

/// The header to send before a connection's own bytes: `version` 1 (text) or 2 (binary).
/// A source and destination of different families (an IPv4 client on an IPv6 listener) are
/// both written as IPv6 (IPv4-mapped); `Header::Local` is `PROXY UNKNOWN` in version 1 and the
/// `LOCAL` command in version 2.
pub fn encode(version: u8, header: &Header) -> Vec<u8> {
    let addrs = match *header {
        Header::Proxied {
            source,
            destination,
        } => Some(match (canonical(source), canonical(destination)) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => {
                (IpAddr::V4(*s.ip()), IpAddr::V4(*d.ip()), s.port(), d.port())
            }
            (s, d) => (
                IpAddr::V6(mapped(s.ip())),
                IpAddr::V6(mapped(d.ip())),
                s.port(),
                d.port(),
            ),
        }),
        Header::Local => None,
    };
    if version == 1 {
        return match addrs {
            Some((s, d, sp, dp)) => {
                let family = if s.is_ipv4() { "TCP4" } else { "TCP6" };
                format!("PROXY {family} {s} {d} {sp} {dp}\r\n").into_bytes()
            }
            None => b"PROXY UNKNOWN\r\n".to_vec(),
        };
    }
    let mut out = V2.to_vec();
    match addrs {
        None => {
            // version 2, LOCAL; family unspecified, no address
            out.extend_from_slice(&[0x20, 0x00, 0, 0]);
        }
        Some((s, d, sp, dp)) => {
            let (family, mut body) = match (s, d) {
                (IpAddr::V4(s), IpAddr::V4(d)) => (0x11, [s.octets(), d.octets()].concat()),
                (IpAddr::V6(s), IpAddr::V6(d)) => (0x21, [s.octets(), d.octets()].concat()),
                _ => unreachable!("both addresses have one family"),
            };
            body.extend_from_slice(&sp.to_be_bytes());
            body.extend_from_slice(&dp.to_be_bytes());
            // version 2, PROXY; TCP over the family
            out.extend_from_slice(&[0x21, family]);
            out.extend_from_slice(&(body.len() as u16).to_be_bytes());
            out.extend_from_slice(&body);
        }
    }
    out
}

/// An IPv4-mapped IPv6 address (an IPv4 client on a dual-stack socket) as the IPv4 one.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// An address as IPv6 (IPv4 addresses mapped).
fn mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn v1(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyHeaderError> {
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        return match buf.len() >= V1_MAX {
            true => Err(ProxyHeaderError::V1("no CRLF within 107 bytes")),
            false => Ok(None),
        };
    };
    let line = std::str::from_utf8(&buf[..end]).map_err(|_| ProxyHeaderError::V1("not text"))?;
    let mut parts = line.split(' ');
    let _proxy = parts.next();
    let family = parts.next().ok_or(ProxyHeaderError::V1("no protocol"))?;
    if family == "UNKNOWN" {
        return Ok(Some((Header::Local, end + 2)));
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(ProxyHeaderError::V1(
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    let mut next = || parts.next().ok_or(ProxyHeaderError::V1("too few fields"));
    let (src, dst, sport, dport) = (next()?, next()?, next()?, next()?);
    if parts.next().is_some() {
        return Err(ProxyHeaderError::V1("too many fields"));
    }
    let addr = |text: &str| -> Result<IpAddr, ProxyHeaderError> {
        let ip: IpAddr = text
            .parse()
            .map_err(|_| ProxyHeaderError::V1("bad address"))?;
        match ip.is_ipv6() == v6 {
            true => Ok(ip),
            false => Err(ProxyHeaderError::V1("address of the other family")),
        }
    };
    let port = |text: &str| -> Result<u16, ProxyHeaderError> {
        // Decimal without a sign or leading zeros (the specification's form).
        let ok = !text.is_empty()
            && text.len() <= 5
            && text.bytes().all(|b| b.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        let n: u32 = match ok {
            true => text.parse().unwrap_or(u32::MAX),
            false => u32::MAX,
        };
        u16::try_from(n).map_err(|_| ProxyHeaderError::V1("bad port"))
    };
    let header = Header::Proxied {
        source: SocketAddr::new(addr(src)?, port(sport)?),
        destination: SocketAddr::new(addr(dst)?, port(dport)?),
    };
    Ok(Some((header, end + 2)))
}

fn v2(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyHeaderError> {
    let (ver_cmd, family) = (buf[12], buf[13]);
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Err(ProxyHeaderError::V2("version is not 2"));
    }
    if 16 + len > MAX_HEADER {
        return Err(ProxyHeaderError::V2("longer than 1024 bytes"));
    }
    if buf.len() < 16 + len {
        return Ok(None);
    }
    let total = 16 + len;
    let body = &buf[16..total];
    match ver_cmd & 0x0f {
        0 => return Ok(Some((Header::Local, total))),
        1 => {}
        _ => return Err(ProxyHeaderError::V2("command is not LOCAL or PROXY")),
    }
    // The transport (STREAM or DGRAM) is not checked: the addresses are what matter here.
    let header = match family >> 4 {
        1 => {
            let a = body
                .get(..12)
                .ok_or(ProxyHeaderError::V2("IPv4 addresses cut short"))?;
            let ip = |i: usize| Ipv4Addr::new(a[i], a[i + 1], a[i + 2], a[i + 3]);
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            Header::Proxied {
                source: SocketAddr::new(ip(0).into(), port(8)),
                destination: SocketAddr::new(ip(4).into(), port(10)),
            }
        }
        2 => {
            let a = body
                .get(..36)
                .ok_or(ProxyHeaderError::V2("IPv6 addresses cut short"))?;
            let ip = |i: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&a[i..i + 16]);
                Ipv6Addr::from(o)
            };
            let port = |i: usize| u16::from_be_bytes([a[i], a[i + 1]]);
            Header::Proxied {
                source: SocketAddr::new(ip(0).into(), port(32)),
                destination: SocketAddr::new(ip(16).into(), port(34)),
            }
        }
        // AF_UNSPEC, AF_UNIX: nothing that replaces the socket's address.
        0 | 3 => Header::Local,
        _ => return Err(ProxyHeaderError::V2("unknown address family")),
    };
    Ok(Some((header, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxied(src: &str, dst: &str) -> Header {
        Header::Proxied {
            source: src.parse().unwrap(),
            destination: dst.parse().unwrap(),
        }
    }

    #[test]
    fn v1_lines_name_the_client_and_leave_the_rest_to_the_connection() {
        let wire = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\nGET / HTTP/1.1\r\n";
        let (h, n) = parse(wire).unwrap().unwrap();
        assert_eq!(h, proxied("192.0.2.7:56324", "198.51.100.1:443"));
        assert_eq!(&wire[n..n + 3], b"GET");
        let wire = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n";
        let (h, _) = parse(wire).unwrap().unwrap();
        assert_eq!(h, proxied("[2001:db8::1]:1", "[2001:db8::2]:65535"));
        assert_eq!(
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n").unwrap(),
            Some((Header::Local, 35))
        );
    }

    #[test]
    fn v1_prefixes_wait_and_bad_lines_are_refused() {
        for cut in [1, 5, 6, 20, 43] {
            let wire = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n";
            assert_eq!(parse(&wire[..cut]).unwrap(), None, "{cut}");
        }
        for bad in [
            &b"PROXY TCP4 192.0.2.7 198.51.100.1 56324\r\n"[..],
            b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443 x\r\n",
            b"PROXY TCP4 2001:db8::1 198.51.100.1 1 2\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 65536 443\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 01 443\r\n",
            b"PROXY UDP4 192.0.2.7 198.51.100.1 1 443\r\n",
            b"PROXY TCP4 192.0.2.7\n198.51.100.1 1 443\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(parse(&[b'P'; 200]).is_err());
        let mut long = b"PROXY ".to_vec();
        long.extend([b'1'; 120]);
        assert_eq!(
            parse(&long).unwrap_err(),
            ProxyHeaderError::V1("no CRLF within 107 bytes")
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n").unwrap_err(),
            ProxyHeaderError::Missing
        );
        assert_eq!(
            parse(b"\x16\x03\x01").unwrap_err(),
            ProxyHeaderError::Missing
        );
    }

    #[test]
    fn headers_sent_are_the_specifications_bytes() {
        let h = proxied("192.0.2.7:51000", "10.0.0.1:443");
        assert_eq!(
            encode(1, &h),
            b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\n"
        );
        assert_eq!(encode(1, &Header::Local), b"PROXY UNKNOWN\r\n");
        let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
        v2.extend_from_slice(&[192, 0, 2, 7, 10, 0, 0, 1, 0xc7, 0x38, 0x01, 0xbb]);
        assert_eq!(encode(2, &h), v2);
        assert_eq!(
            encode(2, &Header::Local),
            b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00"
        );
        // IPv4 clients of a dual-stack socket are IPv4
        let dual = proxied("[::ffff:192.0.2.7]:51000", "[::ffff:10.0.0.1]:443");
        assert_eq!(encode(1, &dual), encode(1, &h));
        // mixed families: both as IPv6
        let mixed = proxied("192.0.2.7:51000", "[2001:db8::1]:443");
        assert_eq!(
            encode(1, &mixed),
            b"PROXY TCP6 ::ffff:192.0.2.7 2001:db8::1 51000 443\r\n"
        );
        let v6 = encode(2, &mixed);
        assert_eq!(&v6[12..16], &[0x21, 0x21, 0x00, 0x24]);
        assert_eq!(v6.len(), 16 + 36);
        // and what is sent reads back
        for version in [1, 2] {
            for header in [h, mixed, Header::Local] {
                let bytes = encode(version, &header);
                let (back, used) = parse(&bytes).unwrap().unwrap();
                assert_eq!(used, bytes.len());
                let expect = match header {
                    Header::Proxied {
                        source,
                        destination,
                    } if source.is_ipv4() != destination.is_ipv4() => Header::Proxied {
                        source: SocketAddr::new(IpAddr::V6(mapped(source.ip())), source.port()),
                        destination,
                    },
                    other => other,
                };
                assert_eq!(back, expect, "version {version}");
            }
        }
    }

    fn v2_header(cmd: u8, family: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2.to_vec();
        h.push(0x20 | cmd);
        h.push(family);
        h.extend(((addrs.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend(addrs);
        h.extend(tlvs);
        h
    }

    #[test]
    fn v2_headers_name_the_client_skip_their_tlvs_and_wait_for_their_length() {
        let addrs = [192, 0, 2, 7, 198, 51, 100, 1, 0xdc, 0x04, 0x01, 0xbb];
        let tlv = [0x04, 0x00, 0x02, b'o', b'k'];
        let mut wire = v2_header(1, 0x11, &addrs, &tlv);
        let len = wire.len();
        wire.extend_from_slice(b"\x16\x03\x01");
        let (h, n) = parse(&wire).unwrap().unwrap();
        assert_eq!(h, proxied("192.0.2.7:56324", "198.51.100.1:443"));
        assert_eq!(n, len);
        for cut in [1, 11, 12, 15, 16, len - 1] {
            assert_eq!(parse(&wire[..cut]).unwrap(), None, "{cut}");
        }
        let mut v6 = vec![0u8; 36];
        v6[15] = 1;
        v6[31] = 2;
        v6[32..34].copy_from_slice(&80u16.to_be_bytes());
        let (h, _) = parse(&v2_header(1, 0x21, &v6, &[])).unwrap().unwrap();
        assert_eq!(h, proxied("[::1]:80", "[::2]:0"));
        // LOCAL (a health check) and AF_UNSPEC keep the socket's address.
        assert_eq!(
            parse(&v2_header(0, 0x00, &[], &[])).unwrap().unwrap().0,
            Header::Local
        );
        assert_eq!(
            parse(&v2_header(1, 0x00, &[], &[])).unwrap().unwrap().0,
            Header::Local
        );
    }

    #[test]
    fn bad_v2_headers_are_refused() {
        let addrs = [0u8; 12];
        let mut wrong_version = v2_header(1, 0x11, &addrs, &[]);
        wrong_version[12] = 0x11;
        assert!(parse(&wrong_version).is_err());
        assert!(parse(&v2_header(2, 0x11, &addrs, &[])).is_err());
        assert!(parse(&v2_header(1, 0x11, &addrs[..8], &[])).is_err());
        assert!(parse(&v2_header(1, 0x41, &addrs, &[])).is_err());
        let mut huge = v2_header(1, 0x11, &addrs, &[]);
        huge[14..16].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(
            parse(&huge).unwrap_err(),
            ProxyHeaderError::V2("longer than 1024 bytes")
        );
        assert_eq!(parse(b"\r\n\r\nX").unwrap_err(), ProxyHeaderError::Missing);
    }
}
