//! The connection tasks: an HTTP/1.1 connection's (`h1`) and an HTTP/2 connection's with one task per stream (`h2`), each handing every request to the flow.

pub mod h1;
pub mod h2;
