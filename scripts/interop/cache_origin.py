#!/usr/bin/env python3
"""Origin for scripts/interop-cache.sh: an HTTP/1.1 server whose caching headers are chosen by the
last segment of the path (/portico/s1/fresh answers as "fresh"), counting requests per path.

Usage: cache_origin.py PORT   (listens on 127.0.0.1:PORT)

  GET  /__count?path=/x            requests /x received so far (any method), as a decimal body
  GET  /__count?path=/x&kind=inm   of those, the ones carrying If-None-Match
  GET  /__count?path=/x&kind=304   the 304s sent for /x (If-None-Match matched the ETag)
  POST /__down, POST /__up         every other path answers 503 while down (for stale-if-error)

Other paths: a GET answers 200 with the behaviour's headers and a 10-byte body "0123456789"
(Vary: the request's Accept-Language as the body), after 500 ms for "slow"; a 404 for an unknown
behaviour; a POST answers 200 "posted" (no-store). Every response has a Content-Length.
"""
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

BODY = b"0123456789"
# behaviour: (response fields, seconds before answering)
BEHAVIOURS = {
    "fresh": ({"Cache-Control": "max-age=60", "ETag": '"v1"'}, 0),
    "nostore": ({"Cache-Control": "no-store, max-age=60"}, 0),
    "private": ({"Cache-Control": "private, max-age=60"}, 0),
    "cookie": ({"Cache-Control": "max-age=60", "Set-Cookie": "a=b"}, 0),
    "plain": ({}, 0),
    "public": ({"Cache-Control": "public, max-age=60"}, 0),
    "vary": ({"Cache-Control": "max-age=60", "Vary": "Accept-Language"}, 0),
    "sie": ({"Cache-Control": "max-age=1, stale-if-error=60"}, 0),
    "reval": ({"Cache-Control": "max-age=0", "ETag": '"r1"'}, 0),
    "slow": ({"Cache-Control": "max-age=60"}, 0.5),
}

lock = threading.Lock()
counts = Counter()  # (path, kind) -> n; kind "all", "inm" or "304"
down = False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    def answer(self, status, body=b"", fields=None, length=None):
        self.send_response(status)
        for name, value in (fields or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and status != 304:
            self.wfile.write(body)

    def count(self, path, kind):
        with lock:
            counts[(path, kind)] += 1

    def do_POST(self):
        global down
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        path = urlsplit(self.path).path
        if path in ("/__down", "/__up"):
            down = path == "/__down"
            return self.answer(200, b"ok")
        self.count(path, "all")
        if down:
            return self.answer(503, b"down", {"Cache-Control": "no-store"})
        self.answer(200, b"posted", {"Cache-Control": "no-store"})

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/__count":
            q = parse_qs(url.query)
            kind = q.get("kind", ["all"])[0]
            with lock:
                n = counts[(q.get("path", [""])[0], kind)]
            return self.answer(200, str(n).encode(), {"Cache-Control": "no-store"})
        self.count(url.path, "all")
        inm = self.headers.get("If-None-Match")
        if inm is not None:
            self.count(url.path, "inm")
        if down:
            return self.answer(503, b"down", {"Cache-Control": "no-store"})
        name = url.path.rsplit("/", 1)[-1]
        if name not in BEHAVIOURS:
            return self.answer(404, b"unknown behaviour", {"Cache-Control": "no-store"})
        fields, delay = BEHAVIOURS[name]
        if delay:
            time.sleep(delay)
        body = BODY
        if name == "vary":
            body = (self.headers.get("Accept-Language") or "none").encode()
        etag = fields.get("ETag")
        if etag and inm and etag in [t.strip() for t in inm.split(",")]:
            self.count(url.path, "304")
            # A 304's Content-Length, when sent, is the length of the stored representation.
            return self.answer(304, fields=fields, length=len(body))
        self.answer(200, body, fields)

    do_HEAD = do_GET


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9381
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
