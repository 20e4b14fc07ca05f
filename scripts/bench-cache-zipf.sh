#!/usr/bin/env bash
# Cache hit ratio under a Zipf workload, Portico against nginx proxy_cache with the same memory
# bound: KEYS distinct URLs (1 KB responses that say nothing about caching; both proxies keep
# them for an hour), REQUESTS requests drawn with
# P(rank) ~ 1/rank^EXPONENT (1.15 over 1M keys: an unbounded cache would hit 89%), the same
# sequence for both, sent in order on one HTTP/1.1 connection with 16 requests in flight
# (h2load --h1 -c1 -m16 -i). The hit ratio is read at the origin (a `portico run` answering
# synthetic 1 KB bodies, its admin /metrics counting requests): 1 - fetches / requests.
# Usage: scripts/bench-cache-zipf.sh [KEYS] [REQUESTS] [MEMORY_MIB] [PORTICO_BINARY]
#   (defaults: 1000000 1000000 64 target/release/portico). Portico gets [cache] memory =
#   MEMORY_MIB; nginx proxy_cache_path max_size = MEMORY_MIB (on disk, enforced by its cache
#   manager process, each 1 KB response taking a 4 KiB block) with a 16 MiB keys zone (its own
#   index, about 128,000 keys, on top). Installs nginx and nghttp2-client (h2load) when missing and
#   run as root.
set -euo pipefail
keys=${1:-1000000} requests=${2:-1000000} mib=${3:-64}
portico=${4:-$(dirname "$0")/../target/release/portico}
exponent=${ZIPF_EXPONENT:-1.15}
[ -x "$portico" ] || { echo "$portico: no such binary (cargo build --release -p portico)" >&2; exit 2; }
need_apt=()
command -v nginx > /dev/null 2>&1 || need_apt+=(nginx)
command -v h2load > /dev/null 2>&1 || need_apt+=(nghttp2-client)
command -v curl > /dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "missing ${need_apt[*]}: run as root or install them" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" > /dev/null
fi

d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

cat > "$d/origin.toml" <<EOT
[admin]
address = "127.0.0.1:9391"
[[listeners]]
address = "127.0.0.1:9390"
[listeners.limits]
max_requests_per_connection = 0
[[listeners.routes]]
origin = true
EOT
taskset -c 1 "$portico" run -c "$d/origin.toml" -w 1 > "$d/origin.log" 2>&1 &
wait_port 9390
fetched() { curl -sf http://127.0.0.1:9391/metrics | awk '$1 == "portico_requests_total" {print $2}'; }

cat > "$d/portico.toml" <<EOT
[cache]
memory = "${mib}MiB"
max_object = "64KiB"
[[listeners]]
address = "127.0.0.1:9743"
[listeners.limits]
max_requests_per_connection = 0
[[listeners.routes]]
proxy = "origin"
cache = { override_ttl = "1h" }
[upstreams.origin]
servers = ["127.0.0.1:9390"]
EOT
mkdir -p "$d/nginx/cache"
# nginx with its master process: its cache manager is what enforces max_size (without it the
# cache grows without bound); as root, its worker runs as root too (the run's directory is 0700).
cat > "$d/nginx.conf" <<EOT
$( [ "$(id -u)" = 0 ] && echo "user root;" )
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000000;
$(nginx_temp_paths "$d")
  proxy_cache_path $d/nginx/cache levels=1:2 keys_zone=c:16m max_size=${mib}m inactive=1h use_temp_path=off;
  upstream origin {
    server 127.0.0.1:9390;
    keepalive 16;
  }
  server {
    listen 127.0.0.1:9744;
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache c;
      proxy_cache_valid 200 1h;
      proxy_pass http://origin;
    }
  }
}
EOT

echo "generating $requests requests over $keys keys (Zipf exponent $exponent)"
ideal=$(python3 "$(dirname "$0")/interop/zipf_urls.py" "$keys" "$requests" "$exponent" 1 http://127.0.0.1:9743 2>&1 > "$d/portico.urls")
sed 's/:9743/:9744/' "$d/portico.urls" > "$d/nginx.urls"
echo "an unbounded cache would hit $ideal"

for p in portico nginx; do
  case $p in
    portico) port=9743; taskset -c 0 "$portico" run -c "$d/portico.toml" -w 1 > "$d/p.log" 2>&1 & ;;
    nginx) port=9744; taskset -c 0 nginx -c "$d/nginx.conf" -p "$d" -e "$d/nginx-error.log" > "$d/p.log" 2>&1 & ;;
  esac
  pid=$!
  wait_port "$port"
  before=$(fetched)
  out=$(taskset -c 1 h2load --h1 -c 1 -m 16 -n "$requests" -i "$d/$p.urls" 2>&1)
  after=$(fetched)
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  done_n=$(awk '/^requests:/ {print $8}' <<< "$out")
  ok=$(awk '/^status codes:/ {print $3}' <<< "$out")
  if [ "$done_n" != "$requests" ] || [ "$ok" != "$requests" ]; then
    echo "$p: h2load did not get $requests 2xx answers:" >&2
    echo "$out" >&2
    exit 1
  fi
  rps=$(awk '/^finished in/ {print $4}' <<< "$out" | tr -d ',')
  awk -v p="$p" -v f=$((after - before)) -v n="$requests" -v r="$rps" -v m="$mib" \
    'BEGIN { printf "%-8s hit ratio %.4f (%d fetches of %d requests) with %d MiB, %s req/s\n", p, 1 - f / n, f, n, m, r }'
done
