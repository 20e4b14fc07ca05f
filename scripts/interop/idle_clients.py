"""Open N keep-alive connections to HOST:PORT, send one request on each and read its answer,
then keep them open and silent; touch READY_FILE (if given) and wait to be killed. With
IDLE_H2=1 each connection speaks HTTP/2 with prior knowledge (h2c): preface, SETTINGS, one GET
on stream 1 (its SETTINGS acknowledged), then silence. With IDLE_SILENT=1 the connections send
nothing at all (clients that connect and have not spoken yet).
Used by scripts/idle-memory.sh."""
import os
import selectors
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ready = sys.argv[4] if len(sys.argv) > 4 else None
H2 = os.environ.get("IDLE_H2") == "1"
SILENT = os.environ.get("IDLE_SILENT") == "1"


def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


# HPACK by hand: :method GET (static 2), :scheme http (static 6), :path and :authority as
# literals with indexed names (static 4 and 1).
H2_HEADERS = b"\x82\x86\x44\x09/bytes/1k\x41\x01a"
REQ = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(1, 0x5, 1, H2_HEADERS)
    if H2
    else b"GET /bytes/1k HTTP/1.1\r\nHost: a\r\n\r\n"
)


def h2_done(sock, buf):
    """Consume whole frames from buf; acknowledge SETTINGS; true once stream 1 ended."""
    done = False
    while len(buf) >= 9:
        length = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + length:
            break
        kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
        if kind == 4 and not flags & 1:
            sock.sendall(frame(4, 1, 0))
        if kind == 7:
            sys.exit("the server sent GOAWAY")
        if stream == 1 and kind in (0, 1) and flags & 1:
            done = True
        del buf[: 9 + length]
    return done


sel = selectors.DefaultSelector()
socks = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.setblocking(False)
    socks.append(s)
    if SILENT:
        continue
    s.sendall(REQ)
    sel.register(s, selectors.EVENT_READ, bytearray())
left = 0 if SILENT else n
deadline = time.time() + 60
while left and time.time() < deadline:
    for key, _ in sel.select(timeout=1):
        buf = key.data
        chunk = key.fileobj.recv(65536)
        if not chunk:
            sys.exit("a connection closed before its answer")
        buf += chunk
        if H2:
            if h2_done(key.fileobj, buf):
                sel.unregister(key.fileobj)
                left -= 1
            continue
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
