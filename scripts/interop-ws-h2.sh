#!/usr/bin/env bash
# Interop check with a real HTTP/2 server: an HTTP/1.1 WebSocket client -> Portico (a group with
# protocol = "h2") -> HAProxy (an h2c frontend; RFC 8441 extended CONNECT in, an HTTP/1.1 upgrade
# out) -> scripts/interop/ws_echo.py. Passes when the client gets the 101 with the right accept
# and bytes both ways, half closes included (scripts/interop/ws_client.py).
# Usage: scripts/interop-ws-h2.sh [PORTICO_BINARY]. Needs haproxy (apt-get install -y haproxy).
# Ports 9560-9562 on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
portico=${1:-$here/../target/debug/portico}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$here/bench-lib.sh"
cat > "$d/haproxy.cfg" <<EOF2
global
  log stderr format short local0 info
defaults
  mode http
  log global
  option httplog
  timeout connect 2s
  timeout client 10s
  timeout server 10s
  timeout tunnel 10s
frontend fe
  bind 127.0.0.1:9561 proto h2
  default_backend be
backend be
  server s1 127.0.0.1:9562
EOF2
cat > "$d/portico.toml" <<EOF2
[[listeners]]
name = "p"
address = "127.0.0.1:9560"
[[listeners.routes]]
proxy = "hap"
[upstreams.hap]
servers = ["127.0.0.1:9561"]
protocol = "h2"
EOF2
python3 "$here/interop/ws_echo.py" 9562 2> "$d/echo.log" &
haproxy -f "$d/haproxy.cfg" > "$d/haproxy.log" 2>&1 &
"$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 &
wait_port 9562
wait_port 9561
wait_port 9560
status=0
timeout 20 python3 "$here/interop/ws_client.py" 9560 || status=1
echo "--- haproxy:"
cat "$d/haproxy.log"
echo "--- the request ws_echo.py got:"
cat "$d/echo.log"
exit $status
