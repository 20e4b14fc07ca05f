#!/usr/bin/env bash
# ACME against Pebble (Let's Encrypt's test ACME server, built from its pinned release with Go
# into target/tools; Debian's 2.4 has no renewal information): Portico obtains certificates by
# HTTP-01, TLS-ALPN-01 and DNS-01 (a wildcard, through a hook that writes to
# pebble-challtestsrv, which answers Pebble's DNS queries), serves them (checked with curl against
# Pebble's issuing root), renews a 40-second certificate when Pebble's renewal information says,
# renews one when the admin API asks, orders a name a reload added, shows them in the admin API,
# /metrics and `portico check`, keeps serving from its storage after a restart without Pebble
# (and when a renewal then fails), logs a failing challenge while serving the stand-in (or
# refusing handshakes, as configured); two processes sharing one storage order a certificate
# once, and one answers the other's HTTP-01 challenge from it. Everything on 127.0.0.1,
# ephemeral ports, bounded waits.
# Usage: scripts/acme-pebble.sh [PORTICO_BINARY]   (default target/debug/portico)
# Installs openssl, curl and python3 when missing and run as root; Pebble needs Go.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/target/debug/portico}
[ -x "$bin" ] || { echo "$bin: no such binary (cargo build -p portico)" >&2; exit 2; }
need=()
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
pebble_version=${PEBBLE_VERSION:-v2.10.3}
tools="$root/target/tools/pebble-$pebble_version"
if [ ! -x "$tools/pebble" ] || [ ! -x "$tools/pebble-challtestsrv" ]; then
  go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  [ -x "$go" ] || { echo "acme-pebble: Go is needed to build Pebble (set GO=/path/to/go)" >&2; exit 1; }
  echo "==> building Pebble $pebble_version into $tools"
  mkdir -p "$tools"
  GOBIN="$tools" "$go" install "github.com/letsencrypt/pebble/v2/cmd/pebble@$pebble_version" \
    "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$pebble_version"
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
  for f in "$d"/*.log; do echo "--- $f" >&2; tail -25 "$f" >&2; done
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
wait_log() { # file pattern seconds: until the pattern is in the file
  for _ in $(seq $(($3 * 4))); do
    grep -q -- "$2" "$1" 2> /dev/null && return 0
    sleep 0.25
  done
  fail "no '$2' in $(basename "$1") within $3 s"
}
count() { grep -c -- "$2" "$1" 2> /dev/null || true; }

# Pebble's own HTTPS certificate, from a CA made for the run.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$d/ca.key" -out "$d/ca.pem" -subj /CN=portico-pebble-test-ca 2> /dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$d/pebble.key" -out "$d/pebble.csr" -subj /CN=localhost 2> /dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$d/san.ext"
openssl x509 -req -in "$d/pebble.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
  -days 2 -out "$d/pebble.pem" -extfile "$d/san.ext" 2> /dev/null

http_port=$(free_port) alpn_port=$(free_port) acme_port=$(free_port) mgmt_port=$(free_port)
dns_port=$(free_port) cts_port=$(free_port) admin_port=$(free_port)
a_port=$(free_port) d_port=$(free_port) s_port=$(free_port)
# A "short" profile: 40-second certificates, renewed within their lifetime. (Pebble picks a
# profile at random for orders that name none: every listener names one.)
cat > "$d/pebble.json" << EOF
{"pebble": {
  "listenAddress": "127.0.0.1:$acme_port",
  "managementListenAddress": "127.0.0.1:$mgmt_port",
  "certificate": "$d/pebble.pem",
  "privateKey": "$d/pebble.key",
  "httpPort": $http_port,
  "tlsPort": $alpn_port,
  "ocspResponderURL": "",
  "externalAccountBindingRequired": false,
  "profiles": {
    "default": {"description": "90 days", "validityPeriod": 7776000},
    "short": {"description": "40 seconds", "validityPeriod": 40}
  }
}}
EOF
start_pebble() { # log: Pebble in the background, resolving every name to 127.0.0.1
  PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 "$tools/pebble" -config "$d/pebble.json" \
    -dnsserver "127.0.0.1:$dns_port" > "$d/$1" 2>&1 &
}
"$tools/pebble-challtestsrv" -defaultIPv4 127.0.0.1 -defaultIPv6 "" -dnsserver "127.0.0.1:$dns_port" \
  -http01 "" -https01 "" -doh "" -tlsalpn01 "" -management "127.0.0.1:$cts_port" > "$d/challtestsrv.log" 2>&1 &
pids+=($!)
start_pebble pebble.log
pebble_pid=$!
pids+=("$pebble_pid")
wait_port "$acme_port"
wait_port "$mgmt_port"
wait_port "$cts_port"

# The DNS-01 hook: present/cleanup NAME VALUE, written to pebble-challtestsrv's TXT records.
cat > "$d/dns-hook" << EOF
#!/bin/sh
case "\$1" in
  present) path=set-txt ;;
  cleanup) path=clear-txt ;;
  *) echo "unknown action \$1" >&2; exit 2 ;;
esac
echo "\$1 \$2 \$3" >> "$d/dns-hook.calls"
exec curl -sf --max-time 5 -X POST -d "{\"host\":\"\$2\",\"value\":\"\$3\"}" "http://127.0.0.1:$cts_port/\$path"
EOF
chmod +x "$d/dns-hook"

acme_listener() { # name port storage names extra-acme-lines: a TLS listener whose certificate comes from Pebble
  cat << EOF
[[listeners]]
name = "$1"
address = "127.0.0.1:$2"
[listeners.tls]
watch_interval = "1s"
[listeners.tls.acme]
names = $4
email = "ops@portico.test"
directory = "https://127.0.0.1:$acme_port/dir"
directory_ca = "$d/ca.pem"
storage = "$3"
accept_terms = true
$(case "$5" in *'profile ='*) ;; *) echo 'profile = "default"' ;; esac)
$5
[[listeners.routes]]
respond = { status = 200, body = "secure" }

EOF
}
plain_listener() {
  cat << EOF
[[listeners]]
name = "http"
address = "127.0.0.1:$http_port"
[[listeners.routes]]
respond = { status = 200, body = "plain" }

EOF
}
{
  printf '[admin]\naddress = "127.0.0.1:%s"\n\n' "$admin_port"
  plain_listener
  acme_listener a "$a_port" "$d/acme" '["a.portico.test"]' ''
  acme_listener c "$alpn_port" "$d/acme" '["c.portico.test"]' 'challenge = "tls-alpn-01"'
  acme_listener d "$d_port" "$d/acme" '["d.portico.test", "*.d.portico.test"]' \
    "$(printf 'challenge = "dns-01"\ndns_hook = "%s"\nkey_type = "ecdsa-p384"' "$d/dns-hook")"
  acme_listener s "$s_port" "$d/acme" '["s.portico.test"]' 'profile = "short"'
} > "$d/portico.toml"
"$bin" check -c "$d/portico.toml" > "$d/check.out" || fail "portico check refused the configuration"
grep -q "certificate for d.portico.test, \*.d.portico.test from ACME .*DNS-01, TXT records published by $d/dns-hook; ecdsa-p384 key" "$d/check.out" ||
  fail "portico check does not explain the DNS-01 certificate: $(cat "$d/check.out")"
grep -q "listener a: ACME certificate for a.portico.test: not issued yet" "$d/check.out" ||
  fail "portico check does not say the certificate is not issued yet"
"$bin" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 &
portico_pid=$!
pids+=("$portico_pid")
wait_port "$a_port"
wait_port "$admin_port"

# Pebble's issuing root (it changes with every Pebble start).
pebble_root() {
  curl -sf --max-time 10 --cacert "$d/ca.pem" "https://127.0.0.1:$mgmt_port/roots/0" -o "$d/root.pem" ||
    fail "no root from Pebble's management interface"
}
pebble_root
fetch() { # name port: the body over HTTPS verified against Pebble's root
  curl -sf --max-time 5 --cacert "$d/root.pem" --resolve "$1:$2:127.0.0.1" "https://$1:$2/"
}
wait_served() { # name port what
  local got=""
  for _ in $(seq 120); do
    got=$(fetch "$1" "$2" 2> /dev/null) && break
    sleep 0.5
  done
  [ "$got" = secure ] || fail "no certificate from Pebble served for $1 within 60 s ($3): $(curl -sv --max-time 5 --cacert "$d/root.pem" --resolve "$1:$2:127.0.0.1" "https://$1:$2/" 2>&1 | tail -5)"
  echo "acme-pebble: issued by Pebble by $3 and served: $1"
}
wait_served a.portico.test "$a_port" HTTP-01
wait_served c.portico.test "$alpn_port" TLS-ALPN-01
grep -q "TLS-ALPN-01 challenge answered" "$d/portico.log" || fail "no TLS-ALPN-01 handshake logged"
wait_served d.portico.test "$d_port" "DNS-01 through the hook"
[ "$(fetch www.d.portico.test "$d_port")" = secure ] || fail "the wildcard name is not covered"
grep -q "present _acme-challenge.d.portico.test. " "$d/dns-hook.calls" || fail "the hook was not called with the record's name"
grep -q "cleanup _acme-challenge.d.portico.test. " "$d/dns-hook.calls" || fail "the hook's records were not cleaned up"
key_text=$(openssl x509 -in "$d/acme/d.portico.test.crt" -noout -text 2> /dev/null) || fail "unreadable certificate"
grep -q "ASN1 OID: secp384r1" <<< "$key_text" || fail "the DNS-01 certificate's key is not ECDSA P-384"
echo "acme-pebble: the wildcard *.d.portico.test is served; the hook published and removed the TXT records; key P-384"
mode=$(stat -c %a "$d/acme/a.portico.test.key")
[ "$mode" = 600 ] || fail "the key's mode is $mode, not 600"
grep -q '"a.portico.test"' "$d/acme/a.portico.test.json" || fail "no record of what the certificate was issued for"

# The 40-second certificate is renewed within its lifetime, when the renewal window says.
wait_log "$d/portico.log" "renewal window of the certificate for s.portico.test" 60
for _ in $(seq 240); do
  [ "$(count "$d/portico.log" "certificate for s.portico.test issued")" -ge 2 ] && break
  sleep 0.25
done
[ "$(count "$d/portico.log" "certificate for s.portico.test issued")" -ge 2 ] ||
  fail "the 40-second certificate was not renewed within 60 s"
[ "$(fetch s.portico.test "$s_port")" = secure ] || fail "the renewed short-lived certificate is not served"
echo "acme-pebble: a 40-second certificate was renewed in Pebble's renewal window and served"

# Visibility: the admin API, /metrics, `portico check`.
api() { curl -sf --max-time 5 "$@"; }
api "http://127.0.0.1:$admin_port/api/acme" > "$d/acme.json" || fail "GET /api/acme failed"
python3 - "$d/acme.json" << 'PY' || fail "GET /api/acme: $(cat "$d/acme.json")"
import json, sys
certs = {c["names"][0]: c for c in json.load(open(sys.argv[1]))["certificates"]}
assert set(certs) == {"a.portico.test", "c.portico.test", "d.portico.test", "s.portico.test"}, certs
a = certs["a.portico.test"]
assert a["issued"] and "Pebble" in a["issuer"] and a["not_after"] and a["next_renewal"], a
assert a["renewal_basis"] == "the server's renewal information", a
assert a["challenge"] == "http-01" and certs["c.portico.test"]["challenge"] == "tls-alpn-01", certs
assert a["issued_total"] == 1 and a["last_error"] is None, a
PY
api "http://127.0.0.1:$admin_port/metrics" > "$d/metrics.txt" || fail "GET /metrics failed"
grep -q "^portico_acme_certificate_issued{certificate=\"a.portico.test\",storage=\"$d/acme\"} 1\$" "$d/metrics.txt" ||
  fail "no portico_acme_certificate_issued for a.portico.test"
grep -q '^portico_acme_certificate_expiry_timestamp_seconds{certificate="d.portico.test",storage=".*"} [0-9]' "$d/metrics.txt" ||
  fail "no expiry metric for d.portico.test"
"$bin" check -c "$d/portico.toml" > "$d/check.out" 2>&1 || fail "portico check failed: $(cat "$d/check.out")"
grep -q "listener a: ACME certificate for a.portico.test: issued by .*Pebble.*, valid until 20" "$d/check.out" ||
  fail "portico check does not show the issued certificate: $(cat "$d/check.out")"
# A renewal asked through the admin API.
serial() { openssl s_client -connect "127.0.0.1:$1" -servername "$2" < /dev/null 2> /dev/null | openssl x509 -noout -serial; }
before=$(serial "$a_port" a.portico.test)
code=$(curl -s -o "$d/renew.json" -w '%{http_code}' --max-time 5 -X POST "http://127.0.0.1:$admin_port/api/acme/renew?name=a.portico.test")
[ "$code" = 202 ] || fail "POST /api/acme/renew answered $code: $(cat "$d/renew.json")"
for _ in $(seq 120); do
  [ "$(count "$d/portico.log" "certificate for a.portico.test issued")" -ge 2 ] && break
  sleep 0.25
done
[ "$(count "$d/portico.log" "certificate for a.portico.test issued")" -ge 2 ] || fail "no renewal within 30 s of the admin API's request"
after=""
for _ in $(seq 20); do
  after=$(serial "$a_port" a.portico.test)
  [ "$after" != "$before" ] && break
  sleep 0.25
done
[ "$after" != "$before" ] || fail "the renewed certificate is not served (still $before)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST "http://127.0.0.1:$admin_port/api/acme/renew?name=z.portico.test")
[ "$code" = 404 ] || fail "renewing an unknown name answered $code, not 404"
echo "acme-pebble: the admin API, /metrics and portico check show the certificates; a renewal asked through the API is served ($before -> $after)"

# A reload that adds a name orders a certificate covering it.
sed -i 's/names = \["a.portico.test"\]/names = ["a.portico.test", "a2.portico.test"]/' "$d/portico.toml"
kill -HUP "$portico_pid"
wait_log "$d/portico.log" "certificate for a.portico.test, a2.portico.test issued" 60
wait_served a2.portico.test "$a_port" "HTTP-01 once a reload added the name"

# A restart with Pebble gone: the certificate comes from the storage.
kill "$portico_pid"
wait "$portico_pid" 2> /dev/null || true
kill "$pebble_pid"
wait "$pebble_pid" 2> /dev/null || true
{
  printf '[admin]\naddress = "127.0.0.1:%s"\n\n' "$admin_port"
  plain_listener
  acme_listener a "$a_port" "$d/acme" '["a.portico.test", "a2.portico.test"]' ''
} > "$d/portico-restart.toml"
"$bin" run -c "$d/portico-restart.toml" -w 1 > "$d/portico2.log" 2>&1 &
portico_pid=$!
pids+=("$portico_pid")
wait_port "$a_port"
[ "$(fetch a.portico.test "$a_port")" = secure ] || fail "after a restart without Pebble the stored certificate is not served"
grep -q "acme: ordering" "$d/portico2.log" && fail "the restart ordered again a certificate that is not due"
echo "acme-pebble: after a restart without Pebble, the stored certificate is served (no order)"
# A renewal that fails (Pebble is gone): logged, and the current certificate stays.
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST "http://127.0.0.1:$admin_port/api/acme/renew")
[ "$code" = 202 ] || fail "POST /api/acme/renew answered $code"
wait_log "$d/portico2.log" "ordering a certificate for a.portico.test, a2.portico.test failed" 60
[ "$(fetch a.portico.test "$a_port")" = secure ] || fail "a failed renewal replaced the current certificate"
echo "acme-pebble: a renewal that fails is logged and the current certificate is still served"
kill "$portico_pid"
wait "$portico_pid" 2> /dev/null || true

# A challenge that fails (no plain listener answers on Pebble's HTTP-01 port): a clear error,
# and the listener keeps serving what it has: the self-signed stand-in, or nothing when
# configured to refuse handshakes until a certificate is issued.
start_pebble pebble2.log
pids+=($!)
wait_port "$acme_port"
wait_port "$mgmt_port"
pebble_root
b_port=$(free_port) b2_port=$(free_port)
{
  acme_listener b "$b_port" "$d/acme-b" '["b.portico.test"]' ''
  acme_listener b2 "$b2_port" "$d/acme-b" '["b2.portico.test"]' 'unissued = "refuse"'
} > "$d/portico-b.toml"
"$bin" run -c "$d/portico-b.toml" -w 1 > "$d/portico-b.log" 2>&1 &
pids+=($!)
wait_port "$b_port"
wait_log "$d/portico-b.log" "ordering a certificate for b.portico.test failed" 60
[ "$(curl -sfk --max-time 5 --resolve "b.portico.test:$b_port:127.0.0.1" "https://b.portico.test:$b_port/")" = secure ] ||
  fail "the listener stopped serving after a failed order"
curl -sk --max-time 5 --resolve "b2.portico.test:$b2_port:127.0.0.1" "https://b2.portico.test:$b2_port/" > /dev/null 2>&1 &&
  fail "a listener that refuses handshakes until issuance served its stand-in"
echo "acme-pebble: a failing challenge is logged ($(grep -o 'failed: .*' "$d/portico-b.log" | head -1 | cut -c1-100)); the stand-in is served, or handshakes refused as configured"

# Two processes sharing one storage: the certificate is ordered once (the other waits on the
# storage's lock and loads what the first wrote); the second also orders one of its own at the
# same time, and both need the storage's account at once: one is created.
e1_port=$(free_port) e2_port=$(free_port) g_port=$(free_port)
dns01=$(printf 'challenge = "dns-01"\ndns_hook = "%s"' "$d/dns-hook")
for i in 1 2; do
  port_var="e${i}_port"
  acme_listener "e$i" "${!port_var}" "$d/acme-e" '["e.portico.test"]' "$dns01" > "$d/portico-e$i.toml"
done
acme_listener g "$g_port" "$d/acme-e" '["g.portico.test"]' "$dns01" >> "$d/portico-e2.toml"
"$bin" run -c "$d/portico-e1.toml" -w 1 > "$d/portico-e1.log" 2>&1 &
pids+=($!)
"$bin" run -c "$d/portico-e2.toml" -w 1 > "$d/portico-e2.log" 2>&1 &
pids+=($!)
wait_served e.portico.test "$e1_port" "DNS-01 (first process)"
wait_served e.portico.test "$e2_port" "DNS-01 (second process, same storage)"
wait_served g.portico.test "$g_port" "DNS-01 (the second process's own)"
orders=$(($(count "$d/portico-e1.log" "acme: ordering a certificate for e.portico.test") + $(count "$d/portico-e2.log" "acme: ordering a certificate for e.portico.test")))
[ "$orders" = 1 ] || fail "two processes sharing a storage ordered $orders times"
accounts=$(($(count "$d/portico-e1.log" "acme: created an account") + $(count "$d/portico-e2.log" "acme: created an account")))
[ "$accounts" = 1 ] || fail "two processes starting together created $accounts accounts"
echo "acme-pebble: two processes sharing one storage ordered once and both serve the certificate"

# HTTP-01 answered by another process sharing the storage (as during an upgrade, or behind one
# port): the one listening on Pebble's HTTP port orders nothing (its certificate was issued
# above); the one ordering h.portico.test has no plain listener.
x_port=$(free_port) y_port=$(free_port)
{
  plain_listener
  acme_listener x "$x_port" "$d/acme" '["a.portico.test", "a2.portico.test"]' ''
} > "$d/portico-x.toml"
acme_listener y "$y_port" "$d/acme" '["h.portico.test"]' '' > "$d/portico-y.toml"
"$bin" run -c "$d/portico-x.toml" -w 1 > "$d/portico-x.log" 2>&1 &
pids+=($!)
wait_port "$x_port"
"$bin" run -c "$d/portico-y.toml" -w 1 > "$d/portico-y.log" 2>&1 &
pids+=($!)
wait_served h.portico.test "$y_port" "HTTP-01 answered by the other process from the shared storage"
grep -q "acme: ordering" "$d/portico-x.log" && fail "the answering process ordered a certificate"
grep -q "does not know the account" "$d/portico-y.log" || fail "the account unknown to the restarted Pebble was not replaced"
forgotten=$(find "$d/acme" -name 'account-*.json.forgotten-*' | wc -l)
[ "$forgotten" = 1 ] || fail "the forgotten account's file was not kept aside ($forgotten found)"
echo "acme-pebble: an HTTP-01 challenge of one process was answered by another sharing its storage (which made a new account: the restarted Pebble forgot the old one)"
