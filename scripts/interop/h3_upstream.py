"""The HTTP/1.1 upstream of the HTTP/3 interop check: `GET /trailers` answers chunked "abc" with
an `x-checksum: 42` trailer, `GET /missing` 404, `POST /echo` echoes the body with `x-got`, any
other request "METHOD TARGET". Usage: h3_upstream.py PORT."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, fields=()):
        self.send_response(status)
        for n, v in fields:
            self.send_header(n, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/trailers":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "x-checksum")
            self.end_headers()
            self.wfile.write(b"3\r\nabc\r\n0\r\nx-checksum: 42\r\n\r\n")
        elif self.path == "/missing":
            self.answer(404, b"nope")
        else:
            self.answer(200, f"GET {self.path}".encode())

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        self.answer(200, body, [("x-got", str(len(body)))])


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
