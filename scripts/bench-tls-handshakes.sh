#!/usr/bin/env bash
# Server CPU per new and per resumed TLS 1.3 handshake (X25519, ECDSA P-256, Connection: close,
# 0-byte local response): Portico (release build, one worker) vs nginx (one worker), each pinned to
# core 0 with taskset; the client (`openssl s_time`, HTTP/1.0 GET so every request is one
# connection) on core 1. CPU = utime + stime of the server's process tree from /proc, divided by
# the connections s_time completed.
# Usage: scripts/bench-tls-handshakes.sh [SECONDS]   (needs nginx and openssl; cargo build --release)
set -euo pipefail
secs=${1:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
portico=${PORTICO:-$root/target/release/portico}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
make_cert "$d"
tck=$(getconf CLK_TCK)

cpu_ticks() { # utime+stime of a PID and its children (threads are included in the PID)
  local total=0 p
  for p in "$@"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo $total
}

run_client() { # port mode -> connections
  taskset -c 1 openssl s_time -connect "127.0.0.1:$1" "-$2" -tls1_3 -time "$secs" -www / 2>/dev/null \
    | awk '/connections in .* real seconds/ {print $1; exit}'
}

measure() { # name port mode pids...
  local name=$1 port=$2 mode=$3; shift 3
  local before after conns
  before=$(cpu_ticks "$@")
  conns=$(run_client "$port" "$mode")
  after=$(cpu_ticks "$@")
  awk -v n="$name" -v m="$mode" -v c="$conns" -v t=$((after - before)) -v hz="$tck" -v s="$secs" \
    'BEGIN { printf "%-8s %-6s %7d conns %8.1f conn/s  %6.1f us CPU per connection  (%.0f%% of a core)\n",
             n, m, c, c / s, t / hz * 1e6 / c, t / hz / s * 100 }'
}

cat > "$d/portico.toml" <<EOF
[[listeners]]
name = "tls"
address = "127.0.0.1:9443"
[listeners.limits]
max_connections = 100000
[listeners.tls]
certificates = [{ cert = "$d/cert.pem", key = "$d/key.pem" }]
versions = "1.3"
groups = ["X25519"]
[[listeners.routes]]
respond = { status = 200 }
EOF
taskset -c 0 "$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.out" 2> "$d/portico.err" &
ppid=$!
until grep -q listener "$d/portico.out" 2>/dev/null; do sleep 0.05; done

cat > "$d/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx.err;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:9444 ssl;
    ssl_certificate $d/cert.pem; ssl_certificate_key $d/key.pem;
    ssl_protocols TLSv1.3; ssl_ecdh_curve X25519;
    ssl_session_tickets on; ssl_session_cache shared:S:10m;
    location / { return 200 ""; }
  }
}
EOF
taskset -c 0 nginx -c "$d/nginx.conf" -p "$d" &
npid=$!
until [ -s "$d/nginx.pid" ] && pgrep -P "$npid" > /dev/null; do sleep 0.05; done
nworkers=$(pgrep -P "$npid" | tr '\n' ' ')

for mode in new reuse; do
  measure portico 9443 $mode $ppid
  # shellcheck disable=SC2086
  measure nginx 9444 $mode $npid $nworkers
done
