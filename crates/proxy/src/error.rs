//! Why a request failed, and the one function that maps a failure to an HTTP status.

use crate::telemetry::stats::{Cause, Phase, Side, Termination};
use portico_http1::{BodyError, ParseError};
use std::io;

/// A failed exchange: which side, in which phase, why.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("bad request head: {0}")]
    BadHead(ParseError),
    #[error("bad request body: {0}")]
    BadBody(BodyError),
    #[error("request head not received in time")]
    HeadTimeout,
    #[error("request body too slow")]
    BodyTooSlow,
    #[error("request body larger than the route allows")]
    BodyTooLarge,
    #[error("a request in 0-RTT early data whose method is not safe")]
    TooEarly,
    #[error("client closed the connection")]
    ClientClosed,
    #[error("client I/O error: {0}")]
    ClientIo(io::Error),
    #[error("no route matches")]
    NoRoute,
    #[error("the route's rate limit is exceeded for this client")]
    RateLimited,
    #[error("CORS preflight refused: {0}")]
    CorsRefused(&'static str),
    #[error("the client's address is denied by the route's ip_rules")]
    IpDenied,
    #[error("the client certificate (or its absence) is denied by the route's client_cert rules")]
    CertDenied,
    #[error("no valid credentials for the route's basic_auth")]
    Unauthorized,
    #[error("the route's forward auth service could not be asked")]
    AuthUnavailable,
    #[error("no valid bearer token for the route's jwt check")]
    TokenRefused,
    #[error("the bearer token's claims do not satisfy the route's jwt check")]
    ClaimsRefused,
    #[error("the route's jwt check has no keys (its JWK set was never loaded)")]
    NoKeys,
    #[error("every upstream server is at its connection limit")]
    NoServer,
    #[error("no upstream server available: every server of the group is down, ejected, draining or disabled")]
    Unavailable,
    #[error("upstream connect failed: {0}")]
    ConnectFailed(io::Error),
    #[error("upstream connect timed out")]
    ConnectTimeout,
    #[error("TLS handshake with the upstream failed: {0}")]
    TlsHandshake(io::Error),
    #[error("upstream response head timed out")]
    ResponseTimeout,
    #[error("upstream idle timeout while streaming")]
    UpstreamIdle,
    #[error("upstream sent an invalid response: {0}")]
    BadResponse(ParseError),
    #[error("upstream sent an invalid body: {0}")]
    BadResponseBody(BodyError),
    #[error("upstream sent too many interim (1xx) responses")]
    TooManyInterim,
    #[error("upstream switched protocols without an upgrade request")]
    UnexpectedUpgrade,
    #[error("upstream closed the connection before a response")]
    UpstreamClosed,
    #[error("upstream I/O error: {0}")]
    UpstreamIo(io::Error),
    #[error("every upstream server is at its connection limit and the group's queue is full")]
    QueueFull,
    #[error("no upstream server slot freed within the group's queue_timeout")]
    QueueTimeout,
    #[error("shed: the worker is saturated")]
    Shed,
    #[error("malformed HTTP/2 request: {0}")]
    Http2Malformed(&'static str),
    #[error("CONNECT is not served over HTTP/2")]
    Http2Connect,
    #[error("internal error: {0}")]
    Internal(&'static str),
    #[error("extended CONNECT not served: {0}")]
    ExtendedConnect(&'static str),
    #[error("upstream did not switch protocols: {0}")]
    NotSwitched(&'static str),
}

impl ProxyError {
    /// The status to answer with, if a response can still be sent. The only error -> status map.
    pub fn status(&self) -> u16 {
        match self {
            ProxyError::BadHead(e) => e.status(),
            ProxyError::BadBody(_) => 400,
            ProxyError::HeadTimeout | ProxyError::BodyTooSlow => 408,
            ProxyError::BodyTooLarge => 413,
            ProxyError::NoRoute => 404,
            ProxyError::RateLimited => 429,
            ProxyError::CorsRefused(_) | ProxyError::IpDenied | ProxyError::CertDenied => 403,
            ProxyError::Unauthorized => 401,
            ProxyError::AuthUnavailable | ProxyError::NoKeys => 503,
            ProxyError::TokenRefused => 401,
            ProxyError::ClaimsRefused => 403,
            ProxyError::NoServer | ProxyError::Unavailable => 503,
            ProxyError::QueueFull | ProxyError::QueueTimeout | ProxyError::Shed => 503,
            ProxyError::ConnectFailed(_)
            | ProxyError::BadResponse(_)
            | ProxyError::UpstreamClosed => 502,
            ProxyError::UpstreamIo(_) | ProxyError::BadResponseBody(_) => 502,
            ProxyError::TooManyInterim | ProxyError::UnexpectedUpgrade => 502,
            ProxyError::TlsHandshake(_) => 502,
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout | ProxyError::UpstreamIdle => {
                504
            }
            ProxyError::ClientClosed | ProxyError::ClientIo(_) => 400,
            ProxyError::Http2Malformed(_) => 400,
            ProxyError::Http2Connect => 501,
            ProxyError::TooEarly => 425,
            ProxyError::Internal(_) => 500,
            ProxyError::ExtendedConnect(_) => 501,
            ProxyError::NotSwitched(_) => 502,
        }
    }

    /// Whether the failing side is the client, so no response is worth writing.
    pub fn client_gone(&self) -> bool {
        matches!(self, ProxyError::ClientClosed | ProxyError::ClientIo(_))
    }

    /// The termination record for this failure, given the phase it happened in.
    pub fn termination(&self, phase: Phase) -> Termination {
        let (side, cause) = match self {
            ProxyError::BadHead(e) if e.status() != 400 => (Side::Client, Cause::Limit),
            ProxyError::BadHead(_) | ProxyError::BadBody(_) => (Side::Client, Cause::BadRequest),
            ProxyError::HeadTimeout | ProxyError::BodyTooSlow => (Side::Client, Cause::Timeout),
            ProxyError::BodyTooLarge => (Side::Client, Cause::Limit),
            ProxyError::ClientClosed => (Side::Client, Cause::Closed),
            // A client that accepted no response byte within the listener's `send_timeout`.
            ProxyError::ClientIo(e) if e.kind() == io::ErrorKind::TimedOut => {
                (Side::Client, Cause::Timeout)
            }
            ProxyError::ClientIo(_) => (Side::Client, Cause::Io),
            ProxyError::NoRoute => (Side::Proxy, Cause::NoServer),
            ProxyError::RateLimited => (Side::Client, Cause::Limit),
            ProxyError::CorsRefused(_)
            | ProxyError::IpDenied
            | ProxyError::CertDenied
            | ProxyError::Unauthorized
            | ProxyError::TokenRefused
            | ProxyError::ClaimsRefused => (Side::Client, Cause::Denied),
            ProxyError::NoServer => (Side::Proxy, Cause::NoServer),
            ProxyError::Unavailable => (Side::Proxy, Cause::Unavailable),
            ProxyError::ConnectFailed(_) => (Side::Upstream, Cause::Refused),
            ProxyError::TlsHandshake(_) => (Side::Upstream, Cause::Tls),
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout | ProxyError::UpstreamIdle => {
                (Side::Upstream, Cause::Timeout)
            }
            ProxyError::AuthUnavailable | ProxyError::NoKeys => (Side::Proxy, Cause::Unavailable),
            ProxyError::BadResponse(_)
            | ProxyError::BadResponseBody(_)
            | ProxyError::TooManyInterim
            | ProxyError::UnexpectedUpgrade => (Side::Upstream, Cause::BadResponse),
            ProxyError::UpstreamClosed => (Side::Upstream, Cause::Closed),
            ProxyError::UpstreamIo(_) => (Side::Upstream, Cause::Io),
            ProxyError::QueueFull => (Side::Proxy, Cause::QueueFull),
            ProxyError::QueueTimeout => (Side::Proxy, Cause::QueueTimeout),
            ProxyError::Shed => (Side::Proxy, Cause::Shed),
            ProxyError::Http2Malformed(_) => (Side::Client, Cause::BadRequest),
            ProxyError::Internal(_) => (Side::Proxy, Cause::BadResponse),
            // 501: a WebSocket (or another protocol), or a plain CONNECT over HTTP/2, that the
            // proxy does not forward: a valid request it refuses, not a client fault.
            ProxyError::ExtendedConnect(_) | ProxyError::Http2Connect => {
                (Side::Proxy, Cause::Refused)
            }
            ProxyError::NotSwitched(_) => (Side::Upstream, Cause::BadResponse),
            // A request that could be replayed, refused until the handshake completes.
            ProxyError::TooEarly => (Side::Proxy, Cause::Refused),
        };
        Termination::new(side, phase, cause)
    }
}

/// Short body for an error status.
pub fn error_body(status: u16) -> &'static [u8] {
    match status {
        400 => b"400 Bad Request\n",
        401 => b"401 Unauthorized\n",
        403 => b"403 Forbidden\n",
        404 => b"404 Not Found: no route matches this request\n",
        408 => b"408 Request Timeout\n",
        413 => b"413 Content Too Large\n",
        414 => b"414 URI Too Long\n",
        425 => b"425 Too Early: send the request again once the handshake is complete\n",
        429 => b"429 Too Many Requests: retry after the time in Retry-After\n",
        431 => b"431 Request Header Fields Too Large\n",
        501 => b"501 Not Implemented\n",
        502 => b"502 Bad Gateway: the upstream server could not be reached or answered badly\n",
        503 => b"503 Service Unavailable: no upstream server available\n",
        504 => b"504 Gateway Timeout: the upstream server did not answer in time\n",
        505 => b"505 HTTP Version Not Supported\n",
        _ => b"error\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_documented_map() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(ProxyError::ConnectFailed(refused()).status(), 502);
        assert_eq!(ProxyError::ConnectTimeout.status(), 504);
        assert_eq!(ProxyError::ResponseTimeout.status(), 504);
        assert_eq!(ProxyError::NoServer.status(), 503);
        assert_eq!(ProxyError::CorsRefused("origin").status(), 403);
        assert_eq!(ProxyError::Unavailable.status(), 503);
        assert_eq!(ProxyError::QueueFull.status(), 503);
        assert_eq!(ProxyError::QueueTimeout.status(), 503);
        assert_ne!(
            ProxyError::QueueFull.termination(Phase::Connect),
            ProxyError::QueueTimeout.termination(Phase::Connect)
        );
        assert_ne!(
            ProxyError::Unavailable.termination(Phase::Connect),
            ProxyError::NoServer.termination(Phase::Connect)
        );
        assert_eq!(ProxyError::BodyTooLarge.status(), 413);
        assert_eq!(ProxyError::HeadTimeout.status(), 408);
        assert_eq!(ProxyError::NoRoute.status(), 404);
        assert_eq!(ProxyError::RateLimited.status(), 429);
    }

    #[test]
    fn termination_names_side_phase_and_cause() {
        let t = ProxyError::ConnectTimeout.termination(Phase::Connect);
        assert_eq!(
            t,
            Termination::new(Side::Upstream, Phase::Connect, Cause::Timeout)
        );
        assert_eq!(t.code(), "SC");
    }

    #[test]
    fn a_refused_http2_connect_is_the_proxys_501_not_a_bad_request() {
        for e in [
            ProxyError::Http2Connect,
            ProxyError::ExtendedConnect("the upstream group speaks HTTP/2"),
        ] {
            assert_eq!(e.status(), 501);
            assert_eq!(
                e.termination(Phase::RequestHead),
                Termination::new(Side::Proxy, Phase::RequestHead, Cause::Refused)
            );
        }
        assert_eq!(
            ProxyError::Http2Malformed("x").termination(Phase::RequestHead),
            Termination::new(Side::Client, Phase::RequestHead, Cause::BadRequest)
        );
    }

    #[test]
    fn a_client_send_timeout_is_a_client_timeout() {
        let stalled = ProxyError::ClientIo(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(
            stalled.termination(Phase::ResponseBody),
            Termination::new(Side::Client, Phase::ResponseBody, Cause::Timeout)
        );
        let reset = ProxyError::ClientIo(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(
            reset.termination(Phase::ResponseBody),
            Termination::new(Side::Client, Phase::ResponseBody, Cause::Io)
        );
    }
}
