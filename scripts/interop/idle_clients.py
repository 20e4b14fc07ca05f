"""Open N keep-alive connections to HOST:PORT, send one request on each and read its answer,
then keep them open and silent; touch READY_FILE (if given) and wait to be killed.
Used by scripts/idle-memory.sh."""
import os
import selectors
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ready = sys.argv[4] if len(sys.argv) > 4 else None
REQ = b"GET /bytes/1k HTTP/1.1\r\nHost: a\r\n\r\n"
sel = selectors.DefaultSelector()
socks = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.setblocking(False)
    s.sendall(REQ)
    socks.append(s)
    sel.register(s, selectors.EVENT_READ, bytearray())
left = n
deadline = time.time() + 60
while left and time.time() < deadline:
    for key, _ in sel.select(timeout=1):
        buf = key.data
        chunk = key.fileobj.recv(65536)
        if not chunk:
            sys.exit("a connection closed before its answer")
        buf += chunk
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            continue
        length = 0
        for line in buf[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buf) >= end + 4 + length:
            sel.unregister(key.fileobj)
            left -= 1
if left:
    sys.exit(f"{left} answers missing")
if ready:
    open(ready, "w").close()
    while True:
        time.sleep(3600)
