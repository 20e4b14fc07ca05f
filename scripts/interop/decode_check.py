"""Fetch a URL with one Accept-Encoding and check the body decodes (brotli, zstandard, gzip from
PyPI and the standard library) to the expected file, with the expected Content-Encoding and Vary.

Usage: decode_check.py URL ACCEPT EXPECTED_CODING EXPECTED_FILE
  EXPECTED_CODING is gzip, br, zstd or none.
"""
import gzip
import sys
import urllib.request

import brotli
import zstandard


def main() -> int:
    url, accept, want, path = sys.argv[1:5]
    with open(path, "rb") as f:
        original = f.read()
    req = urllib.request.Request(url, headers={"Accept-Encoding": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        got = resp.headers.get("Content-Encoding", "none")
        vary = resp.headers.get("Vary", "")
        body = resp.read()
    if got != want:
        print(f"{url} Accept-Encoding {accept!r}: Content-Encoding {got}, expected {want}")
        return 1
    if "accept-encoding" not in vary.lower():
        print(f"{url}: no Vary: Accept-Encoding (Vary: {vary!r})")
        return 1
    decoded = {
        "gzip": gzip.decompress,
        "br": brotli.decompress,
        # a streamed frame has no content size in its header: decompress as a stream
        "zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b),
        "none": lambda b: b,
    }[want](body)
    if decoded != original:
        print(f"{url} ({want}): the decoded body differs from {path} ({len(decoded)} vs {len(original)} bytes)")
        return 1
    print(f"ok {url} Accept-Encoding {accept!r}: {want}, {len(body)} bytes on the wire for {len(original)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
