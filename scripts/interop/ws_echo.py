"""A minimal HTTP/1.1 WebSocket server for interop checks: answers the opening handshake with
101 and the right Sec-WebSocket-Accept, sends "welcome", echoes every byte upper-cased, and at
the client's EOF sends "bye" and closes. Each request head goes to stderr. Usage: ws_echo.py PORT"""
import socket, threading, base64, hashlib, sys
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = c.recv(4096)
        if not d: return
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    sys.stderr.write(head.decode() + "\n---\n")
    sys.stderr.flush()
    key = [l.split(b":",1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\nwelcome")
    if rest: c.sendall(rest.upper())
    while True:
        d = c.recv(4096)
        if not d:
            c.sendall(b"bye"); c.shutdown(socket.SHUT_WR); return
        c.sendall(d.upper())
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
