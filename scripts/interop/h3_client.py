"""HTTP/3 interop check with aioquic's client (an independent QUIC and HTTP/3 stack) through
Portico: GET and POST with bodies of 0 B, 1 KB and 1 MB, concurrent streams, trailers, a 404,
an upstream failure (502), a stream the client resets, then a request on the same connection.

Usage: h3_client.py HOST PORT. Exits 1 on the first failed check, printing what it saw."""

import asyncio
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset

TIMEOUT = 10


class Response:
    def __init__(self):
        self.headers = None
        self.trailers = None
        self.body = bytearray()
        self.done = asyncio.get_running_loop().create_future()

    @property
    def status(self):
        return int(dict(self.headers)[b":status"])

    def header(self, name):
        return dict(self.headers).get(name)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            r = self.streams[event.stream_id]
            if not r.done.done():
                r.done.set_exception(RuntimeError(f"stream reset {event.error_code}"))
        for e in self.h3.handle_event(event):
            r = self.streams.get(getattr(e, "stream_id", None))
            if r is None:
                continue
            if isinstance(e, HeadersReceived):
                if r.headers is None:
                    r.headers = e.headers
                else:
                    r.trailers = e.headers
            elif isinstance(e, DataReceived):
                r.body += e.data
            if getattr(e, "stream_ended", False) and not r.done.done():
                r.done.set_result(r)

    def start(self, method, path, body=None, end=True):
        sid = self._quic.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", b"localhost"),
            (b":path", path.encode()),
        ]
        if body is not None:
            fields.append((b"content-length", str(len(body)).encode()))
        self.streams[sid] = Response()
        self.h3.send_headers(sid, fields, end_stream=end and not body)
        if body and end:
            self.h3.send_data(sid, body, end_stream=True)
        self.transmit()
        return sid

    async def request(self, method, path, body=None):
        sid = self.start(method, path, body)
        return await asyncio.wait_for(self.streams[sid].done, TIMEOUT)


def check(ok, what, seen=""):
    if not ok:
        print(f"FAIL {what} {seen}")
        sys.exit(1)
    print(f"ok {what}")


async def main(host, port):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.verify_mode = ssl.CERT_NONE
    config.server_name = "localhost"
    async with connect(host, port, configuration=config, create_protocol=Client) as c:
        r = await c.request("GET", "/hello?x=1")
        check(r.status == 200 and bytes(r.body) == b"GET /hello?x=1", "GET", (r.headers, r.body[:80]))
        for size in (0, 1024, 1 << 20):
            body = bytes(i % 251 for i in range(size))
            r = await c.request("POST", "/echo", body)
            check(
                r.status == 200 and bytes(r.body) == body and r.header(b"x-got") == str(size).encode(),
                f"POST {size} bytes echoed",
                (r.headers, len(r.body)),
            )
        rs = await asyncio.gather(*(c.request("GET", f"/n/{i}") for i in range(20)))
        check(
            all(bytes(r.body) == f"GET /n/{i}".encode() for i, r in enumerate(rs)),
            "20 concurrent streams",
        )
        r = await c.request("GET", "/trailers")
        check(
            bytes(r.body) == b"abc" and r.trailers is not None and dict(r.trailers).get(b"x-checksum") == b"42",
            "trailers",
            (r.body, r.trailers),
        )
        r = await c.request("GET", "/missing")
        check(r.status == 404, "404 from the upstream", r.headers)
        r = await c.request("GET", "/dead/x")
        check(r.status == 502, "502 for an upstream that refuses", r.headers)
        # A POST whose body never comes: the client resets it, the connection goes on.
        sid = c.start("POST", "/echo", b"x" * 100, end=False)
        c._quic.reset_stream(sid, 0x10C)  # H3_REQUEST_CANCELLED
        c.transmit()
        r = await c.request("GET", "/after-reset")
        check(r.status == 200 and bytes(r.body) == b"GET /after-reset", "a request after a reset stream")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
