#!/usr/bin/env bash
# Interop check of the PROXY protocol with real peers, both ways, the client on 127.0.0.2 so
# that its address differs from every proxy's (127.0.0.1):
#   in:  curl --haproxy-protocol -> Portico (a listener with proxy_protocol = true), and
#        curl -> HAProxy (send-proxy-v2 and send-proxy) -> Portico: Portico names the client
#        127.0.0.2 (a redirect to http://client.test/{remote_addr} says whom it saw);
#   out: curl -> Portico (a group with proxy_protocol = "v2", then "v1") -> HAProxy (accept-proxy),
#        which answers with the source address it was told of: 127.0.0.2.
# Usage: scripts/interop-proxy-protocol.sh [PORTICO_BINARY]. Needs haproxy and curl.
# Ports 9570-9577 on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
portico=${1:-$here/../target/debug/portico}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$here/bench-lib.sh"
cat > "$d/haproxy.cfg" <<EOF
global
  log stderr format short local0 info
defaults
  mode http
  timeout connect 2s
  timeout client 10s
  timeout server 10s
# in: HAProxy in front of Portico's PROXY-protocol listener
frontend in_v2
  bind 127.0.0.1:9571
  default_backend to_portico_v2
backend to_portico_v2
  server p 127.0.0.1:9570 send-proxy-v2
frontend in_v1
  bind 127.0.0.1:9572
  default_backend to_portico_v1
backend to_portico_v1
  server p 127.0.0.1:9570 send-proxy
# out: HAProxy behind Portico, taking the client from the PROXY header Portico sends
frontend out
  bind 127.0.0.1:9575 accept-proxy
  http-request return status 200 content-type text/plain lf-string "src=%[src]"
EOF
cat > "$d/portico.toml" <<EOF
[[listeners]]
name = "in"
address = "127.0.0.1:9570"
proxy_protocol = true
[[listeners.routes]]
redirect = "http://client.test/{remote_addr}"

[[listeners]]
name = "out"
address = "127.0.0.1:9576"
[[listeners.routes]]
path = "/v1"
proxy = "hap_v1"
[[listeners.routes]]
proxy = "hap_v2"

[upstreams.hap_v2]
servers = ["127.0.0.1:9575"]
proxy_protocol = "v2"
[upstreams.hap_v1]
servers = ["127.0.0.1:9575"]
proxy_protocol = "v1"
EOF
"$portico" check -c "$d/portico.toml" > /dev/null
haproxy -c -q -f "$d/haproxy.cfg"
haproxy -f "$d/haproxy.cfg" > "$d/haproxy.log" 2>&1 &
"$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 &
wait_port 9570
wait_port 9571
wait_port 9575
wait_port 9576

fail() {
  echo "interop-proxy-protocol: $*" >&2
  tail -20 "$d/portico.log" "$d/haproxy.log" >&2
  exit 1
}
client() { # url [curl options]: the client Portico saw, from its redirect's Location
  curl -sS -o /dev/null -D - --interface 127.0.0.2 "$@" | tr -d '\r' |
    awk -F': ' 'tolower($1) == "location" {sub("http://client.test/", "", $2); print $2}'
}

got=$(client http://127.0.0.1:9570/ --haproxy-protocol)
[ "$got" = 127.0.0.2 ] || fail "curl --haproxy-protocol: Portico named the client '$got'"
got=$(client http://127.0.0.1:9571/)
[ "$got" = 127.0.0.2 ] || fail "HAProxy send-proxy-v2: Portico named the client '$got'"
got=$(client http://127.0.0.1:9572/)
[ "$got" = 127.0.0.2 ] || fail "HAProxy send-proxy: Portico named the client '$got'"
# Without a header the listener refuses the connection.
if curl -sS -o /dev/null --max-time 5 http://127.0.0.1:9570/ 2> /dev/null; then
  fail "a connection without a PROXY header was served"
fi

for path in /v2 /v1; do
  got=$(curl -sS --interface 127.0.0.2 "http://127.0.0.1:9576$path")
  [ "$got" = "src=127.0.0.2" ] || fail "Portico's PROXY header (${path#/}) told HAProxy '$got'"
done
echo "interop-proxy-protocol: curl and HAProxy (v1, v2) into Portico, Portico (v1, v2) into HAProxy: the client is 127.0.0.2 everywhere"
