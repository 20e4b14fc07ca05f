#!/usr/bin/env bash
# nginx's instructions per request under callgrind, counted as scripts/ab-instructions.sh counts
# Portico's (user space of the proxy's process, two runs of N1 and N2 requests, the difference
# divided by N2 - N1): nginx single-process (master_process off), one worker's configuration of
# `bench compare` (upstream keep-alive, no access log), the origin `BINARY origin`.
# http: closed loop, h2load --h1 with 4 connections; slow: BINARY bench at AB_RATE (200) req/s.
# Usage: scripts/nginx-instructions.sh http|slow PORTICO_BINARY (AB_N1, AB_N2 as in ab-instructions.sh)
# Needs valgrind, nginx, h2load.
set -euo pipefail
mode=$1 bin=$2
n1=${AB_N1:-2000} n2=${AB_N2:-6000}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

"$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380
cat > "$d/nginx.conf" <<EOT
worker_processes 1; daemon off; master_process off; pid $d/nginx.pid; error_log $d/error.log warn;
events { worker_connections 10000; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $d; proxy_temp_path $d; fastcgi_temp_path $d; uwsgi_temp_path $d; scgi_temp_path $d;
  upstream b { server 127.0.0.1:9380; keepalive 1024; }
  server { listen 127.0.0.1:9743;
    location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOT

count() { # requests -> instructions of the nginx process for that run
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" nginx -c "$d/nginx.conf" -p "$d" \
    > /dev/null 2> "$d/vg.log" &
  local pid=$! out
  wait_port 9743
  case $mode in
    http) out=$(h2load --h1 -c 4 -n "$1" http://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "$1 succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; } ;;
    slow) out=$("$bin" bench -R "${AB_RATE:-200}" -c 4 -n "$1" http://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "= $1 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; } ;;
    *) echo "usage: $0 http|slow PORTICO_BINARY" >&2; exit 2 ;;
  esac
  kill -QUIT "$pid"
  wait "$pid" 2>/dev/null || true
  awk '/Collected/ {print $4}' "$d/vg.log"
}

a=$(count "$n1")
b=$(count "$n2")
echo "nginx $mode: $(((b - a) / (n2 - n1))) instructions/request"
