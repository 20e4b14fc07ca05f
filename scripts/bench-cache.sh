#!/usr/bin/env bash
# Response cache hits: proxy CPU per request (user + system of the proxy's process tree, from
# /proc) of Portico (memory only, and with a disk tier: the row portico-disk), nginx (proxy_cache)
# and Varnish answering a stored 1 KB and 100 KB response, in the same run, the rows alternating
# round by round. The row floor is scripts/floor/static-floor.c (one epoll thread answering every
# request with the file, no parsing: 1 KB from memory in one writev, 100 KB by sendfile): what the
# kernel charges any server for the same bytes, so each proxy's own work is its cost above it. Each proxy pinned to core 0 (one nginx
# worker, one Varnish thread pool, one Portico worker); the origin (`portico origin --root` of the
# binary given) and wrk on core 1; wrk -t1 -c16 -d8s, keep-alive, plain HTTP.
# Usage: scripts/bench-cache.sh [ROUNDS] [PORTICO_BINARY]
#   (defaults: 3 rounds, target/release/portico; cargo build --release -p portico first)
# Every row is checked first: the second request of a size must be a hit (Portico's
# Cache-Status, nginx's $upstream_cache_status, Varnish's two transaction ids in X-Varnish) with
# the file's bytes; the script stops with an error when it is not.
# Prints one line per row, size and round (us/req, req/s), the medians, the ratios of Portico's
# median to nginx's and Varnish's (the bar: <= 0.7x nginx, <= 1.0x Varnish), and each proxy's
# cost above the floor row. Installs nginx, varnish, wrk, curl and gcc when missing and run as
# root.
set -euo pipefail
rounds=${1:-3}
portico=${2:-$(dirname "$0")/../target/release/portico}
case $rounds in '' | *[!0-9]* | 0) echo "usage: $0 [ROUNDS] [PORTICO_BINARY]" >&2; exit 2 ;; esac
[ -x "$portico" ] || { echo "$portico: no such binary (cargo build --release -p portico)" >&2; exit 2; }

need_apt=()
command -v nginx > /dev/null 2>&1 || need_apt+=(nginx)
command -v varnishd > /dev/null 2>&1 || [ -x /usr/sbin/varnishd ] || need_apt+=(varnish)
command -v wrk > /dev/null 2>&1 || need_apt+=(wrk)
command -v curl > /dev/null 2>&1 || need_apt+=(curl)
command -v gcc > /dev/null 2>&1 || need_apt+=(gcc)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" > /dev/null
  else
    echo "missing ${need_apt[*]}: run as root or install them" >&2
    exit 1
  fi
fi
varnishd=$(command -v varnishd || echo /usr/sbin/varnishd)

d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
tck=$(getconf CLK_TCK)

gcc -O2 -o "$d/static-floor" "$(dirname "$0")/floor/static-floor.c"
mkdir -p "$d/www"
head -c 1024 /dev/urandom > "$d/www/1k.bin"
head -c 102400 /dev/urandom > "$d/www/100k.bin"
taskset -c 1 "$portico" origin --listen 127.0.0.1:9380 --workers 1 --root "$d/www" > /dev/null 2>&1 &
wait_port 9380

# The origin's files say nothing about caching: each proxy is told to keep 200s for an hour.
cat > "$d/portico.toml" <<EOT
[cache]
memory = "256MiB"
[[listeners]]
name = "bench"
address = "127.0.0.1:9743"
[listeners.limits]
max_connections = 100000
max_requests_per_connection = 0
[[listeners.routes]]
proxy = "origin"
cache = { override_ttl = "1h" }
[upstreams.origin]
servers = ["127.0.0.1:9380"]
keepalive = 1024
EOT
# The same with a disk tier under the run's directory (as nginx's cache files are).
sed -e "s|^memory = .*|&\ndisk_path = \"$d/portico-cache\"|" -e 's/9743/9746/' "$d/portico.toml" > "$d/portico-disk.toml"

# nginx as one process (master_process off: its /proc stat is all of nginx's CPU); the cache's
# files under the run's directory (served from the page cache), access log off.
mkdir -p "$d/nginx/cache"
cat > "$d/nginx.conf" <<EOT
worker_processes 1;
master_process off;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 1000000;
$(nginx_temp_paths "$d")
  proxy_cache_path $d/nginx/cache levels=1:2 keys_zone=c:10m max_size=256m inactive=1h use_temp_path=off;
  upstream origin {
    server 127.0.0.1:9380;
    keepalive 64;
  }
  server {
    listen 127.0.0.1:9744;
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache c;
      proxy_cache_valid 200 1h;
      proxy_cache_lock on;
      add_header X-Cache-Status \$upstream_cache_status;
      proxy_pass http://origin;
    }
  }
}
EOT

rows=(portico portico-disk nginx varnish floor)
port_of() { case $1 in portico) echo 9743 ;; nginx) echo 9744 ;; varnish) echo 9745 ;; portico-disk) echo 9746 ;; floor) echo 9747 ;; esac; }

pid=""
file=""
start() { # row: its proxy pinned to core 0, pid set, back once it accepts connections
  case $1 in
    floor)
      # Small files from memory in one writev, large ones by sendfile: the cheaper of the two.
      mode=(); [ "$file" = 1k.bin ] && mode=(-m)
      taskset -c 0 "$d/static-floor" 9747 "$d/www/$file" "${mode[@]}" > "$d/proxy.log" 2>&1 &
      ;;
    portico) taskset -c 0 "$portico" run -c "$d/portico.toml" -w 1 > "$d/proxy.log" 2>&1 & ;;
    portico-disk)
      rm -rf "$d/portico-cache"
      taskset -c 0 "$portico" run -c "$d/portico-disk.toml" -w 1 > "$d/proxy.log" 2>&1 &
      ;;
    nginx) taskset -c 0 nginx -c "$d/nginx.conf" -p "$d" -e "$d/nginx-error.log" > "$d/proxy.log" 2>&1 & ;;
    varnish)
      rm -rf "$d/varnish"
      # One thread pool; -t: the TTL of responses that state none; -j none: no privilege
      # separation (the run's own directory); in the foreground.
      taskset -c 0 "$varnishd" -F -j none -n "$d/varnish" -a 127.0.0.1:9745 -b 127.0.0.1:9380 \
        -s malloc,256m -t 3600 -p thread_pools=1 -p thread_pool_min=32 > "$d/proxy.log" 2>&1 &
      ;;
  esac
  pid=$!
  for _ in $(seq 200); do
    (exec 3<> "/dev/tcp/127.0.0.1/$(port_of "$1")") 2> /dev/null && return 0
    if ! kill -0 "$pid" 2> /dev/null; then
      echo "$1: the proxy exited before listening; its output:" >&2
      sed 's/^/  /' "$d/proxy.log" >&2
      exit 1
    fi
    sleep 0.05
  done
  echo "$1: port never opened" >&2
  exit 1
}

stop() {
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  pid=""
}

ticks() { # the CPU ticks of a process and its children
  local total=0 p
  for p in "$1" $(cat "/proc/$1/task/"*/children 2> /dev/null); do
    [ -r "/proc/$p/stat" ] && total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}

check() { # row file: stores the file, then the second request is a hit with the file's bytes
  local port url h
  port=$(port_of "$1") url="http://127.0.0.1:$(port_of "$1")/$2"
  curl -sf -o /dev/null "$url"
  curl -sf -D "$d/head" -o "$d/body" "$url"
  cmp -s "$d/body" "$d/www/$2" || { echo "$1: /$2 is not the file" >&2; exit 1; }
  h=$(tr -d '\r' < "$d/head")
  case $1 in
    portico*) grep -qi '^cache-status: portico; hit' <<< "$h" ;;
    nginx) grep -qi '^x-cache-status: HIT' <<< "$h" ;;
    varnish) grep -qiE '^x-varnish: [0-9]+ [0-9]+' <<< "$h" ;;
    floor) true ;;
  esac || { echo "$1: the second request for /$2 was not a hit:" >&2; sed 's/^/  /' <<< "$h" >&2; exit 1; }
}

us="" rps=""
measure() { # row file: us (CPU us per request) and rps of one wrk run against a warm cache
  local out n before after
  file=$2
  start "$1"
  check "$1" "$2"
  before=$(ticks "$pid")
  out=$(taskset -c 1 wrk -t1 -c16 -d8s "http://127.0.0.1:$(port_of "$1")/$2" 2>&1)
  after=$(ticks "$pid")
  stop
  if grep -q 'Non-2xx\|Socket errors' <<< "$out"; then
    echo "$1: wrk saw errors:" >&2
    echo "$out" >&2
    exit 1
  fi
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<< "$out")
  [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "$1: no request count from wrk: $out" >&2; exit 1; }
  us=$(awk -v b="$before" -v a="$after" -v n="$n" -v hz="$tck" 'BEGIN { printf "%.2f", (a - b) / hz * 1e6 / n }')
}

median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

echo "rows: ${rows[*]}; files 1k.bin, 100k.bin; $rounds round(s) of wrk -t1 -c16 -d8s"
declare -A cpu rate
for r in $(seq "$rounds"); do
  for file in 1k.bin 100k.bin; do
    for row in "${rows[@]}"; do
      measure "$row" "$file"
      printf 'round %d %-8s %-9s %8s us/req %7s req/s\n' "$r" "$row" "$file" "$us" "$rps"
      cpu[$row.$file]="${cpu[$row.$file]:-} $us"
      rate[$row.$file]="${rate[$row.$file]:-} $rps"
    done
  done
done
for file in 1k.bin 100k.bin; do
  declare -A med=()
  for row in "${rows[@]}"; do
    # shellcheck disable=SC2086
    med[$row]=$(printf '%s\n' ${cpu[$row.$file]} | median)
    # shellcheck disable=SC2086
    printf 'median %-8s %-9s %8s us/req %7s req/s\n' "$row" "$file" "${med[$row]}" \
      "$(printf '%s\n' ${rate[$row.$file]} | median)"
  done
  awk -v p="${med[portico]}" -v n="${med[nginx]}" -v v="${med[varnish]}" -v f="$file" \
    'BEGIN { printf "ratio %s: portico / nginx %.3f (bar <= 0.7: %s), portico / varnish %.3f (bar <= 1.0: %s)\n", f, p / n, p / n <= 0.7 ? "met" : "NOT met", p / v, p / v <= 1.0 ? "met" : "NOT met" }'
  awk -v p="${med[portico-disk]}" -v n="${med[nginx]}" -v f="$file" \
    'BEGIN { printf "ratio %s: portico-disk / nginx %.3f\n", f, p / n }'
  awk -v p="${med[portico]}" -v n="${med[nginx]}" -v v="${med[varnish]}" -v z="${med[floor]}" -v f="$file" \
    'BEGIN { printf "above the floor %s: portico %.2f, nginx %.2f, varnish %.2f us/req; portico / nginx %.3f\n", f, p - z, n - z, v - z, (p - z) / (n - z) }'
done
