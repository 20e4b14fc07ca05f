#!/usr/bin/env bash
# Proxy CPU per request with an HTTP/2 client leg and HTTP/1.1 keep-alive upstreams (see
# docs/benchmarks.md): h2load -m 100 over TLS 1.3 (X25519, ECDSA P-256, ALPN h2)
# for a 1 KB response, against Portico (release build, one worker) and nginx (one worker), both in
# front of the same `portico origin`. Proxy on core 0; origin and h2load on core 1. CPU = utime +
# stime of the proxy's process tree from /proc, divided by the requests h2load completed. The two
# proxies alternate for ROUNDS rounds; a round with any failed or non-2xx request is reported void.
# Usage: scripts/bench-h2.sh [REQUESTS_PER_ROUND] [ROUNDS]   (needs nginx, h2load, openssl;
#        cargo build --release first)
# PORTICO=BINARY runs another build (also as the origin unless ORIGIN=BINARY names another: an A/B of
# two builds should keep one origin); PORTICO_PRELOAD=LIB preloads a library (an allocator) into Portico only.
set -euo pipefail
n=${1:-200000}
rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
portico=${PORTICO:-$root/target/release/portico}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
make_cert "$d"
tck=$(getconf CLK_TCK)

cpu_ticks() { # utime+stime of the given PIDs (threads included)
  local total=0 p
  for p in "$@"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo $total
}

taskset -c 1 "${ORIGIN:-$portico}" origin --listen 127.0.0.1:9180 --workers 1 > "$d/origin.out" 2>&1 &
wait_port 9180

cat > "$d/portico.toml" <<EOF2
[[listeners]]
name = "h2"
address = "127.0.0.1:9543"
[listeners.limits]
max_connections = 100000
max_requests_per_connection = 0
[listeners.tls]
certificates = [{ cert = "$d/cert.pem", key = "$d/key.pem" }]
versions = "1.3"
groups = ["X25519"]
[listeners.http2]
max_concurrent_streams = 128
[[listeners.routes]]
proxy = "origin"
[upstreams.origin]
servers = ["127.0.0.1:9180"]
keepalive = ${KEEPALIVE:-1024}
EOF2
env ${PORTICO_PRELOAD:+LD_PRELOAD=$PORTICO_PRELOAD} taskset -c 0 "$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.out" 2> "$d/portico.err" &
ppid=$!
wait_port 9543

cat > "$d/nginx.conf" <<EOF2
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
  upstream b { server 127.0.0.1:9180; keepalive ${KEEPALIVE:-1024}; }
  server {
    listen 127.0.0.1:9544 ssl http2;
    ssl_certificate $d/cert.pem; ssl_certificate_key $d/key.pem;
    ssl_protocols TLSv1.3; ssl_ecdh_curve X25519;
    http2_max_concurrent_streams 128;
    keepalive_requests 1000000;
    location / {
      proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://b;
    }
  }
}
EOF2
taskset -c 0 nginx -c "$d/nginx.conf" -p "$d" &
npid=$!
wait_port 9544
nworkers=$(pgrep -P "$npid" | tr '\n' ' ')

# Seconds from h2load's "finished in 317.8ms, ..." / "finished in 3.18s, ..." line (h2load
# prints us, ms or s).
finished_secs() {
  awk '/^finished in/ { t = $3; sub(/,$/, "", t); v = t + 0
    if (t ~ /us$/) v /= 1e6; else if (t ~ /ms$/) v /= 1e3
    print v; exit }'
}

measure() { # name port pids...
  local name=$1 port=$2; shift 2
  local before after out ok failed secs
  before=$(cpu_ticks "$@")
  out=$(taskset -c 1 h2load -c 10 -m 100 -n "$n" "https://127.0.0.1:$port/bytes/1k" 2>&1)
  after=$(cpu_ticks "$@")
  ok=$(awk '/^status codes:/ {gsub(",", ""); print $3; exit}' <<<"$out")
  failed=$(awk '/^requests:/ {gsub(",", ""); for (i = 1; i <= NF; i++) if ($(i+1) == "failed") print $i; exit}' <<<"$out")
  secs=$(finished_secs <<<"$out")
  local void=""
  [ "$ok" = "$n" ] && [ "${failed:-0}" = "0" ] || void="  VOID (2xx=$ok failed=$failed)"
  awk -v n="$name" -v c="$ok" -v t=$((after - before)) -v hz="$tck" -v s="$secs" -v v="$void" \
    'BEGIN { printf "%-8s %8d req %9.0f req/s  %6.2f us CPU per request%s\n",
             n, c, c / s, t / hz * 1e6 / c, v }'
}

echo "h2load -c 10 -m 100 -n $n, 1 KB, TLS 1.3 X25519, proxy pinned to core 0 ($(nproc) CPUs)"
for r in $(seq "$rounds"); do
  echo "round $r"
  measure portico 9543 "$ppid"
  # shellcheck disable=SC2086
  measure nginx 9544 "$npid" $nworkers
done
