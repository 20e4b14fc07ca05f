#!/usr/bin/env bash
# ACME against Pebble (Let's Encrypt's test ACME server, Debian's `pebble`): Portico obtains a
# certificate for a listener by HTTP-01 on its plain listener, serves it (checked with curl
# against Pebble's issuing root), keeps it in its storage with the key at 0600, and after a
# restart serves it again from the files without asking Pebble. pebble-challtestsrv answers
# Pebble's DNS queries with 127.0.0.1. Everything on 127.0.0.1, ephemeral ports, bounded waits.
# Usage: scripts/acme-pebble.sh [PORTICO_BINARY]   (default target/debug/portico)
# Installs pebble, openssl and curl when missing and run as root.
set -euo pipefail
bin=${1:-$(dirname "$0")/../target/debug/portico}
[ -x "$bin" ] || { echo "$bin: no such binary (cargo build -p portico)" >&2; exit 2; }
need=()
command -v pebble > /dev/null 2>&1 || need+=(pebble)
command -v openssl > /dev/null 2>&1 || need+=(openssl)
command -v curl > /dev/null 2>&1 || need+=(curl)
command -v python3 > /dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" > /dev/null
  else
    echo "missing ${need[*]}: run as root or install them" >&2
    exit 1
  fi
fi

d=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$d"
}
trap cleanup EXIT
fail() {
  echo "acme-pebble: $*" >&2
  for f in "$d"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { # port: until something listens (10 s)
  for _ in $(seq 200); do
    (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null && return 0
    sleep 0.05
  done
  fail "nothing listens on $1"
}

# Pebble's own HTTPS certificate, from a CA made for the run.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$d/ca.key" -out "$d/ca.pem" -subj /CN=portico-pebble-test-ca 2> /dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$d/pebble.key" -out "$d/pebble.csr" -subj /CN=localhost 2> /dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$d/san.ext"
openssl x509 -req -in "$d/pebble.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
  -days 2 -out "$d/pebble.pem" -extfile "$d/san.ext" 2> /dev/null

http_port=$(free_port) https_port=$(free_port) acme_port=$(free_port) mgmt_port=$(free_port)
dns_port=$(free_port) cts_port=$(free_port) tlsalpn_port=$(free_port)
cat > "$d/pebble.json" << EOF
{"pebble": {
  "listenAddress": "127.0.0.1:$acme_port",
  "managementListenAddress": "127.0.0.1:$mgmt_port",
  "certificate": "$d/pebble.pem",
  "privateKey": "$d/pebble.key",
  "httpPort": $http_port,
  "tlsPort": $tlsalpn_port,
  "ocspResponderURL": "",
  "externalAccountBindingRequired": false
}}
EOF
start_pebble() { # log: Pebble in the background, resolving every name to 127.0.0.1
  PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 pebble -config "$d/pebble.json" \
    -dnsserver "127.0.0.1:$dns_port" > "$d/$1" 2>&1 &
}
pebble-challtestsrv -defaultIPv4 127.0.0.1 -defaultIPv6 "" -dns01 "127.0.0.1:$dns_port" \
  -http01 "" -https01 "" -tlsalpn01 "" -management "127.0.0.1:$cts_port" > "$d/challtestsrv.log" 2>&1 &
pids+=($!)
start_pebble pebble.log
pebble_pid=$!
pids+=("$pebble_pid")
wait_port "$acme_port"
wait_port "$mgmt_port"

name=a.portico.test
https_listener() { # name storage: the TLS listener whose certificate comes from Pebble
  cat << EOF
[[listeners]]
name = "https"
address = "127.0.0.1:$https_port"
[listeners.tls]
watch_interval = "1s"
[listeners.tls.acme]
names = ["$1"]
email = "ops@portico.test"
directory = "https://127.0.0.1:$acme_port/dir"
directory_ca = "$d/ca.pem"
storage = "$2"
accept_terms = true
[[listeners.routes]]
respond = { status = 200, body = "secure" }
EOF
}
cat > "$d/portico.toml" << EOF
[[listeners]]
name = "http"
address = "127.0.0.1:$http_port"
[[listeners.routes]]
respond = { status = 200, body = "plain" }

$(https_listener "$name" "$d/acme")
EOF
"$bin" check -c "$d/portico.toml" > /dev/null || fail "portico check refused the configuration"
"$bin" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 &
portico_pid=$!
pids+=("$portico_pid")
wait_port "$https_port"

# Pebble's issuing root (it changes with every Pebble start).
curl -sf --max-time 10 --cacert "$d/ca.pem" "https://127.0.0.1:$mgmt_port/roots/0" -o "$d/root.pem" ||
  fail "no root from Pebble's management interface"
fetch() { curl -sf --max-time 5 --cacert "$d/root.pem" --resolve "$name:$https_port:127.0.0.1" "https://$name:$https_port/"; }
got=""
for _ in $(seq 120); do
  got=$(fetch 2> /dev/null) && break
  sleep 0.5
done
[ "$got" = secure ] || fail "no certificate from Pebble served within 60 s (got '$got')"
echo "acme-pebble: issued by Pebble by HTTP-01 and served: $name"
mode=$(stat -c %a "$d/acme/$name.key")
[ "$mode" = 600 ] || fail "the key's mode is $mode, not 600"
grep -q "\"$name\"" "$d/acme/$name.json" || fail "no record of what the certificate was issued for"
grep -q "acme: certificate for $name issued" "$d/portico.log" || fail "no log line for the issuance"

# A restart with Pebble gone: the certificate comes from the storage.
kill "$portico_pid"
wait "$portico_pid" 2> /dev/null || true
kill "$pebble_pid"
wait "$pebble_pid" 2> /dev/null || true
"$bin" run -c "$d/portico.toml" -w 1 > "$d/portico2.log" 2>&1 &
portico_pid=$!
pids+=("$portico_pid")
wait_port "$https_port"
[ "$(fetch)" = secure ] || fail "after a restart without Pebble the stored certificate is not served"
grep -q "acme: ordering" "$d/portico2.log" && fail "the restart ordered again a certificate that is not due"
echo "acme-pebble: after a restart without Pebble, the stored certificate is served (no order)"
kill "$portico_pid"
wait "$portico_pid" 2> /dev/null || true

# A challenge that fails (no plain listener answers on Pebble's HTTP-01 port): a clear error,
# and the listener keeps serving what it has (here the self-signed stand-in).
start_pebble pebble2.log
pids+=($!)
wait_port "$acme_port"
https_listener b.portico.test "$d/acme-b" > "$d/portico-b.toml"
"$bin" run -c "$d/portico-b.toml" -w 1 > "$d/portico-b.log" 2>&1 &
pids+=($!)
wait_port "$https_port"
for _ in $(seq 120); do
  grep -q "ordering a certificate for b.portico.test failed" "$d/portico-b.log" && break
  sleep 0.5
done
grep -q "ordering a certificate for b.portico.test failed" "$d/portico-b.log" ||
  fail "no error logged for a failing challenge within 60 s"
[ "$(curl -sfk --max-time 5 --resolve "b.portico.test:$https_port:127.0.0.1" "https://b.portico.test:$https_port/")" = secure ] ||
  fail "the listener stopped serving after a failed order"
echo "acme-pebble: a failing challenge is logged ($(grep -o 'failed: .*' "$d/portico-b.log" | head -1 | cut -c1-100)) and the listener keeps serving"
