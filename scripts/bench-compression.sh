#!/usr/bin/env bash
# Response compression: proxy CPU per request (user + system, from /proc) of Portico vs nginx
# proxying a compressible 100 KB HTML page with gzip level 6, in the same run, the rows
# alternating round by round. One proxy worker pinned to core 0; the origin (`portico origin
# --root` of the binary given) and wrk on core 1; wrk -t1 -c16 -d8s, keep-alive, plain HTTP.
# Usage: scripts/bench-compression.sh [ROUNDS] [PORTICO_BINARY]
#   (defaults: 3 rounds, target/release/portico; cargo build --release -p portico first)
# Rows: portico-off    Portico without compression, same file (what compression itself costs)
#       portico-gzip6  Portico, [listeners.compression] algorithms = ["gzip"], gzip_level = 6
#       nginx-gzip6    nginx (one process), gzip on, gzip_comp_level 6
#   BENCH_ALL=1 adds portico-br4 (brotli_level = 4) and portico-zstd3 (zstd_level = 3).
#   BENCH_SKIP_PORTICO_COMPRESSED=1 leaves out every compressed Portico row (for a binary without
#   compression: then only portico-off and nginx-gzip6 are measured).
# Each compressed row is first checked with curl (Content-Encoding of the coding, body decoding
# to the file); the script stops with an error when it is not. The page: /usr/share/common-licenses
# texts (in every Debian) in an HTML wrapper, exactly 102400 bytes.
# Prints one line per row per round (us/req, req/s, wrk's transfer/s, response body size on the
# wire), each row's medians, and the ratio portico-gzip6 / nginx-gzip6 of the median us/req
# (the bar: <= 0.8). Installs nginx and wrk when missing and run as root.
set -euo pipefail
rounds=${1:-3}
portico=${2:-$(dirname "$0")/../target/release/portico}
case $rounds in '' | *[!0-9]* | 0) echo "usage: $0 [ROUNDS] [PORTICO_BINARY]" >&2; exit 2 ;; esac
[ -x "$portico" ] || { echo "$portico: no such binary (cargo build --release -p portico)" >&2; exit 2; }

need_apt=()
command -v nginx > /dev/null 2>&1 || need_apt+=(nginx-light)
command -v wrk > /dev/null 2>&1 || need_apt+=(wrk)
command -v curl > /dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing ${need_apt[*]}"
    apt-get update -qq
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" > /dev/null; then
      # nginx-light is not in every Debian release; nginx is
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]/nginx-light/nginx}" > /dev/null
    fi
  else
    echo "missing ${need_apt[*]}: run as root or install them" >&2
    exit 1
  fi
fi

d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
tck=$(getconf CLK_TCK)

# The page: license texts (distinct ones: gzip's 32 KB window must not see a file twice) between
# an HTML head and tail, cut so that the whole is exactly 102400 bytes.
mkdir -p "$d/www"
head_html='<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Licenses</title></head>
<body>
<pre>
'
tail_html='</pre>
</body>
</html>
'
lic=/usr/share/common-licenses
cat "$lic/GPL-3" "$lic/GPL-2" "$lic/LGPL-2.1" "$lic/Apache-2.0" "$lic/MPL-2.0" \
  | sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g' > "$d/text"
{
  printf '%s' "$head_html"
  head -c $((102400 - ${#head_html} - ${#tail_html})) "$d/text"
  printf '%s' "$tail_html"
} > "$d/www/page.html"
size=$(wc -c < "$d/www/page.html")
[ "$size" = 102400 ] || { echo "page.html is $size bytes, not 102400 (missing license files?)" >&2; exit 1; }
gz=$(gzip -6 -c "$d/www/page.html" | wc -c)
awk -v s="$size" -v g="$gz" 'BEGIN { printf "page.html: %d bytes, gzip -6 %d bytes (ratio %.3f, %.2fx)\n", s, g, g / s, s / g }'

taskset -c 1 "$portico" origin --listen 127.0.0.1:9380 --workers 1 --root "$d/www" > /dev/null 2>&1 &
wait_port 9380
curl -sf -o /dev/null http://127.0.0.1:9380/page.html || { echo "the origin does not serve /page.html" >&2; exit 1; }

portico_config() { # row: $d/ROW.toml, one listener on 127.0.0.1:9743 proxying to the origin
  local comp=""
  case $1 in
    portico-off) ;;
    portico-gzip6) comp=$'[listeners.compression]\nalgorithms = ["gzip"]\ngzip_level = 6' ;;
    portico-br4) comp=$'[listeners.compression]\nalgorithms = ["br"]\nbrotli_level = 4' ;;
    portico-zstd3) comp=$'[listeners.compression]\nalgorithms = ["zstd"]\nzstd_level = 3' ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
  cat > "$d/$1.toml" <<EOF
[[listeners]]
name = "bench"
address = "127.0.0.1:9743"
[listeners.limits]
max_connections = 100000
max_requests_per_connection = 0
$comp
[[listeners.routes]]
proxy = "origin"
[upstreams.origin]
servers = ["127.0.0.1:9380"]
keepalive = 1024
EOF
}

# nginx as one process (master_process off: the process that serves is the one started, so its
# /proc stat is all of nginx's CPU). Upstream buffers hold the whole 100 KB response, so nothing
# goes through a temporary file; keep-alive on both sides without a request limit (as Portico).
mkdir -p "$d/nginx"
cat > "$d/nginx.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
$(nginx_temp_paths "$d")
  upstream origin {
    server 127.0.0.1:9380;
    keepalive 64;
    keepalive_requests 1000000;
  }
  gzip on;
  gzip_comp_level 6;
  gzip_types text/html;
  gzip_proxied any;
  gzip_min_length 256;
  gzip_vary on;
  server {
    listen 127.0.0.1:9744;
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffer_size 16k;
      proxy_buffers 8 16k;
      proxy_busy_buffers_size 32k;
      proxy_max_temp_file_size 0;
      proxy_pass http://origin;
    }
  }
}
EOF

rows=(portico-off portico-gzip6 nginx-gzip6)
[ "${BENCH_ALL:-0}" = 1 ] && rows+=(portico-br4 portico-zstd3)
if [ "${BENCH_SKIP_PORTICO_COMPRESSED:-0}" = 1 ]; then
  rows=(portico-off nginx-gzip6)
fi

port_of() { case $1 in nginx-*) echo 9744 ;; *) echo 9743 ;; esac; }
coding_of() { # row -> the Content-Encoding expected ("" for none)
  case $1 in *-gzip6) echo gzip ;; *-br4) echo br ;; *-zstd3) echo zstd ;; *) echo "" ;; esac
}
accept_of() { case $1 in *-br4) echo br ;; *-zstd3) echo zstd ;; *) echo gzip ;; esac; }

pid=""
start() { # row: start its proxy pinned to core 0, set pid, return once it accepts connections
  local port
  port=$(port_of "$1")
  case $1 in
    nginx-*) taskset -c 0 nginx -c "$d/nginx.conf" -p "$d" -e "$d/nginx-error.log" > "$d/proxy.log" 2>&1 & ;;
    *)
      portico_config "$1"
      taskset -c 0 "$portico" run -c "$d/$1.toml" -w 1 > "$d/proxy.log" 2>&1 &
      ;;
  esac
  pid=$!
  for _ in $(seq 200); do
    (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null && return 0
    if ! kill -0 "$pid" 2> /dev/null; then
      echo "$1: the proxy exited before listening on $port; its output:" >&2
      sed 's/^/  /' "$d/proxy.log" >&2
      [ -e "$d/nginx-error.log" ] && sed 's/^/  /' "$d/nginx-error.log" >&2
      case $1 in
        portico-off | nginx-*) ;;
        *) echo "$1: this Portico binary rejects the [listeners.compression] table: it has no response" \
          "compression yet (BENCH_SKIP_PORTICO_COMPRESSED=1 measures the other rows)" >&2 ;;
      esac
      exit 1
    fi
    sleep 0.05
  done
  echo "$1: port $port never opened" >&2
  exit 1
}

stop() {
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  pid=""
}

check() { # row: the response carries the row's Content-Encoding (or none) and decodes to the file
  local port coding accept got
  port=$(port_of "$1") coding=$(coding_of "$1") accept=$(accept_of "$1")
  curl -sS -D "$d/head" -o /dev/null -H "Accept-Encoding: $accept" "http://127.0.0.1:$port/page.html"
  got=$(tr -d '\r' < "$d/head" | awk 'tolower($1) == "content-encoding:" {print $2}')
  if [ "$got" != "$coding" ]; then
    echo "$1: expected Content-Encoding '${coding:-none}' for Accept-Encoding: $accept, got '${got:-none}'." >&2
    case $1 in
      portico-*) [ -n "$coding" ] && echo "$1: this Portico binary does not compress responses (yet)." \
        "BENCH_SKIP_PORTICO_COMPRESSED=1 measures the other rows." >&2 ;;
      nginx-*) echo "$1: nginx did not compress: see $d/nginx.conf (gzip_types, gzip_proxied)." >&2 ;;
    esac
    echo "response head:" >&2
    sed 's/^/  /' "$d/head" >&2
    exit 1
  fi
  # curl --compressed decodes any of the three (Debian's curl has zlib, brotli and zstd)
  if ! curl -s --compressed -H "Accept-Encoding: $accept" "http://127.0.0.1:$port/page.html" \
    | cmp -s - "$d/www/page.html"; then
    echo "$1: the response body does not decode to page.html" >&2
    exit 1
  fi
}

us="" rps="" tps="" wire=""
measure() { # row: set us (CPU us per request), rps and tps (wrk's requests/s and transfer/s) and
  # wire (bytes of one response body as sent). Not in a subshell: an exit here runs the trap.
  local port accept out n before after
  port=$(port_of "$1") accept=$(accept_of "$1")
  start "$1"
  check "$1"
  wire=$(curl -so /dev/null -w '%{size_download}' -H "Accept-Encoding: $accept" "http://127.0.0.1:$port/page.html")
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  out=$(taskset -c 1 wrk -t1 -c16 -d8s -H "Accept-Encoding: $accept" "http://127.0.0.1:$port/page.html" 2>&1)
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  stop
  if grep -q 'Non-2xx\|Socket errors' <<< "$out"; then
    echo "$1: wrk saw errors:" >&2
    echo "$out" >&2
    exit 1
  fi
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<< "$out")
  tps=$(awk '/^Transfer\/sec:/ {print $2}' <<< "$out")
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "$1: no request count from wrk: $out" >&2
    exit 1
  fi
  us=$(awk -v b="$before" -v a="$after" -v n="$n" -v hz="$tck" 'BEGIN { printf "%.2f", (a - b) / hz * 1e6 / n }')
  rps=$(awk -v r="$rps" 'BEGIN { printf "%.0f", r }')
}

median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# Every row's proxy started and checked once before any measurement, so that a row that cannot be
# measured (a Portico without compression) stops the script at once, not rounds later.
for row in "${rows[@]}"; do
  start "$row"
  check "$row"
  stop
done
echo "rows: ${rows[*]}; $rounds round(s) of wrk -t1 -c16 -d8s"
declare -A cpu rate wires
for r in $(seq "$rounds"); do
  for row in "${rows[@]}"; do
    measure "$row"
    printf 'round %d %-13s %8s us/req %7s req/s %9s/s %6s bytes/response\n' "$r" "$row" "$us" "$rps" "$tps" "$wire"
    cpu[$row]="${cpu[$row]:-} $us"
    rate[$row]="${rate[$row]:-} $rps"
    wires[$row]=$wire
  done
done
declare -A med
for row in "${rows[@]}"; do
  # shellcheck disable=SC2086
  med[$row]=$(printf '%s\n' ${cpu[$row]} | median)
  # shellcheck disable=SC2086
  printf 'median %-13s %8s us/req %7s req/s %6s bytes/response\n' "$row" "${med[$row]}" \
    "$(printf '%s\n' ${rate[$row]} | median)" "${wires[$row]}"
done
if [ -n "${med[portico-gzip6]:-}" ] && [ -n "${med[nginx-gzip6]:-}" ]; then
  awk -v p="${med[portico-gzip6]}" -v n="${med[nginx-gzip6]}" \
    'BEGIN { printf "ratio portico-gzip6 / nginx-gzip6: %.3f (bar: <= 0.8: %s)\n", p / n, p / n <= 0.8 ? "met" : "NOT met" }'
else
  echo "ratio portico-gzip6 / nginx-gzip6: n/a (portico-gzip6 not measured)"
fi
