"""An HTTP/1.1 WebSocket client for interop checks against ws_echo.py behind proxies: the RFC 6455
1.3 opening handshake, then "ping", then a half close. Exits 1 unless it got a 101 with the
right accept, "welcome", "PING" and, after its half close, "bye" and EOF. Usage: ws_client.py PORT"""
import socket
import sys

s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(5)
s.sendall(b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
buf = b""
while b"\r\n\r\n" not in buf:
    d = s.recv(4096)
    if not d:
        break
    buf += d
head, _, rest = buf.partition(b"\r\n\r\n")
print(head.decode(errors="replace"))
ok = head.startswith(b"HTTP/1.1 101 ") and b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
while ok and len(rest) < 7:
    d = s.recv(4096)
    if not d:
        break
    rest += d
s.sendall(b"ping")
got = b""
while ok and len(got) < 4:
    d = s.recv(4096)
    if not d:
        break
    got += d
s.shutdown(socket.SHUT_WR)
tail = b""
while ok:
    d = s.recv(4096)
    if not d:
        break
    tail += d
print("first:", rest, "echo:", got, "after the half close:", tail)
ok = ok and rest == b"welcome" and got == b"PING" and tail == b"bye"
print("OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
