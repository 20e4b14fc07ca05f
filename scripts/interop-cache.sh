#!/usr/bin/env bash
# Behaviour comparison of HTTP response caches: the same 15 scenarios run against Portico's cache,
# nginx (proxy_cache with proxy_cache_lock, proxy_cache_use_stale and proxy_cache_revalidate, and
# no proxy_cache_valid, so it follows the origin's headers) and Varnish (builtin VCL, default TTL),
# then one table of what each did: a row per scenario, a column per proxy. It fails when Portico's
# column differs from what its documentation says (the list at the end).
# The origin (scripts/interop/cache_origin.py) picks its caching headers by path and counts the
# requests it gets per path; "stored" means a second identical request did not reach it. Each
# proxy uses its own paths (/portico/s1/..., /nginx/s1/...), so no scenario sees another's cache.
# Usage: scripts/interop-cache.sh [PORTICO_BINARY]   (default target/release/portico; cargo build
#   --release -p portico first). Installs nginx, varnish and curl when missing and run as root.
#   Ports 9381 (origin), 9753 (Portico), 9754 (nginx), 9755 (Varnish) on 127.0.0.1; about 15 s.
set -euo pipefail
here=$(dirname "$0")
portico=${1:-$here/../target/release/portico}
[ -x "$portico" ] || { echo "$portico: no such binary (cargo build --release -p portico)" >&2; exit 2; }

need_apt=()
command -v nginx > /dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v varnishd > /dev/null 2>&1 || [ -x /usr/sbin/varnishd ] || need_apt+=(varnish)
command -v curl > /dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" > /dev/null
  else
    echo "missing ${need_apt[*]}: run as root or install them" >&2
    exit 1
  fi
fi
nginx=$(command -v nginx || echo /usr/sbin/nginx)
varnishd=$(command -v varnishd || echo /usr/sbin/varnishd)

d=$(mktemp -d)
cleanup() { # stop every background job (SIGTERM, then SIGKILL after 5 s), remove the run's files
  local pids
  pids=$(jobs -p)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill $pids 2> /dev/null || true
    for _ in $(seq 50); do
      # shellcheck disable=SC2086
      kill -0 $pids 2> /dev/null || break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -9 $pids 2> /dev/null || true
    wait 2> /dev/null || true
  fi
  rm -rf "$d"
}
trap cleanup EXIT
# shellcheck source=scripts/bench-lib.sh
. "$here/bench-lib.sh"

origin=127.0.0.1:9381
declare -A port=([portico]=9753 [nginx]=9754 [varnish]=9755)
proxies=(portico nginx varnish)

python3 "$here/interop/cache_origin.py" 9381 > "$d/origin.log" 2>&1 &
wait_port 9381
# Another program holding the port would answer in the origin's place: its own path tells.
curl -sf -m 5 -o /dev/null "http://$origin/__count?path=/&kind=all" || {
  echo "interop-cache: 127.0.0.1:9381 does not answer as the test origin (another program holds the port?)" >&2
  cat "$d/origin.log" >&2
  exit 1
}

cat > "$d/portico.toml" <<EOT
[cache]
memory = "64MiB"
[[listeners]]
name = "p"
address = "127.0.0.1:${port[portico]}"
[[listeners.routes]]
proxy = "origin"
[listeners.routes.cache]
[upstreams.origin]
servers = ["$origin"]
EOT

# nginx as one process in the foreground, its cache and temporary files under the run's directory.
mkdir -p "$d/nginx/cache"
cat > "$d/nginx.conf" <<EOT
worker_processes 1;
master_process off;
daemon off;
pid $d/nginx.pid;
error_log $d/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
$(nginx_temp_paths "$d")
  proxy_cache_path $d/nginx/cache levels=1:2 keys_zone=c:10m max_size=64m inactive=1h use_temp_path=off;
  upstream origin {
    server $origin;
    keepalive 16;
  }
  server {
    listen 127.0.0.1:${port[nginx]};
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache c;
      proxy_cache_lock on;
      proxy_cache_use_stale error timeout http_500 http_502 http_503 http_504;
      proxy_cache_revalidate on;
      add_header X-Cache-Status \$upstream_cache_status always;
      proxy_pass http://origin;
    }
  }
}
EOT

start() { # proxy: start it in the background, back once it accepts connections
  case $1 in
    portico) "$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 & ;;
    nginx) "$nginx" -c "$d/nginx.conf" -p "$d" -e "$d/nginx-error.log" > "$d/nginx.log" 2>&1 & ;;
    # The builtin VCL, the default TTL (120 s for responses that state none); -j none: no
    # privilege separation (the run's own directory); in the foreground.
    varnish) "$varnishd" -F -j none -n "$d/varnish" -a "127.0.0.1:${port[varnish]}" -b "$origin" \
      -s malloc,64m > "$d/varnish.log" 2>&1 & ;;
  esac
  local pid=$!
  for _ in $(seq 200); do
    (exec 3<> "/dev/tcp/127.0.0.1/${port[$1]}") 2> /dev/null && return 0
    if ! kill -0 "$pid" 2> /dev/null; then
      echo "$1: exited before listening; its output:" >&2
      sed 's/^/  /' "$d/$1.log" >&2
      exit 1
    fi
    sleep 0.05
  done
  echo "$1: port ${port[$1]} never opened" >&2
  exit 1
}

# --- helpers: p is the proxy under test, paths are given without its /p prefix ---

status="" body=""
req() { # p path [curl options...]: one request through p; sets status ("000": no answer) and body
  local p=$1 path=$2
  shift 2
  status=$(curl -s -m 5 -o "$d/body" -w '%{http_code}' "$@" "http://127.0.0.1:${port[$p]}/$p$path") || true
  body=$(cat "$d/body" 2> /dev/null || true)
  rm -f "$d/body"
}

count() { # p path [kind]: requests for the path the origin has seen (kind: all, inm or 304)
  curl -sf -m 5 "http://$origin/__count?path=/$1$2&kind=${3:-all}"
}

origin_ctl() { curl -sf -m 5 -o /dev/null -X POST "http://$origin/__$1"; } # down | up

cell=""
stored() { # p path [curl options...]: the same GET twice; was the second answered by the cache?
  req "$@"
  req "$@"
  if [ "$(count "$1" "$2")" = 1 ]; then cell="stored"; else cell="not stored"; fi
}

# --- the scenarios: each takes the proxy and sets cell ---

s1() { stored "$1" /s1/fresh; }
s2() { stored "$1" /s2/nostore; }
s3() { stored "$1" /s3/private; }
s4() { stored "$1" /s4/cookie; }
s5() { stored "$1" /s5/plain; }
s6() { stored "$1" /s6/fresh -H 'Authorization: Bearer x'; }
s7() { stored "$1" /s7/public -H 'Authorization: Bearer x'; }

s8() { # Vary: Accept-Language; en, fr, en: 2 requests at the origin when both variants are kept
  local lang
  for lang in en fr en; do req "$1" /s8/vary -H "Accept-Language: $lang"; done
  cell="origin $(count "$1" /s8/vary)"
}

s9() { # the client's If-None-Match matches the stored ETag
  req "$1" /s9/fresh
  req "$1" /s9/fresh -H 'If-None-Match: "v1"'
  cell=$status
  [ "$(count "$1" /s9/fresh)" = 1 ] || cell+=" (origin)"
}

s10() { # a byte range of a stored 10-byte body
  req "$1" /s10/fresh
  req "$1" /s10/fresh -H 'Range: bytes=2-4'
  cell="$status \"$body\""
}

s11() { # a POST to a stored URL, then a GET: did the GET go to the origin?
  local before
  req "$1" /s11/fresh
  req "$1" /s11/fresh -X POST -d x
  before=$(count "$1" /s11/fresh)
  req "$1" /s11/fresh
  if [ "$(count "$1" /s11/fresh)" -gt "$before" ]; then cell="invalidated"; else cell="not invalidated"; fi
}

s12() { # max-age=1, stale-if-error=60; 2 s later the origin answers 503
  req "$1" /s12/sie
  sleep 2
  origin_ctl down
  req "$1" /s12/sie
  origin_ctl up
  cell=$status
  if [ "$status" = 200 ] && [ "$body" = 0123456789 ]; then cell+=" stale"; fi
}

s13() { # max-age=0 with an ETag: is the second GET revalidated (If-None-Match, a 304)?
  req "$1" /s13/reval
  req "$1" /s13/reval
  if [ "$(count "$1" /s13/reval)" = 1 ]; then
    cell="no origin, $status"
  elif [ "$(count "$1" /s13/reval 304)" -ge 1 ]; then
    cell="reval 304, $status"
  elif [ "$(count "$1" /s13/reval inm)" -ge 1 ]; then
    cell="INM no 304, $status"
  else
    cell="refetch, $status"
  fi
}

s14() { # 5 concurrent GETs of an uncached URL that takes the origin 500 ms
  local pids=() _
  for _ in 1 2 3 4 5; do
    curl -s -m 10 -o /dev/null "http://127.0.0.1:${port[$1]}/$1/s14/slow" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  cell="origin $(count "$1" /s14/slow)"
}

s15() { # the client's Cache-Control: no-cache on a hit: did the request reach the origin?
  req "$1" /s15/fresh
  req "$1" /s15/fresh -H 'Cache-Control: no-cache'
  if [ "$(count "$1" /s15/fresh)" = 1 ]; then cell="from cache"; else cell="to origin"; fi
}

labels=(
  ""
  "1 max-age=60"
  "2 no-store, max-age=60"
  "3 private, max-age=60"
  "4 max-age=60 + Set-Cookie"
  "5 no caching headers (heuristic)"
  "6 max-age=60, req Authorization"
  "7 public, max-age=60, req Authorization"
  "8 Vary: Accept-Language; en, fr, en"
  "9 If-None-Match = ETag on a hit"
  "10 Range: bytes=2-4 on a hit"
  "11 POST, then GET"
  "12 stale-if-error=60, origin 503"
  "13 max-age=0 + ETag, second GET"
  "14 5 concurrent GETs, origin 500 ms"
  "15 req Cache-Control: no-cache on a hit"
)

for p in "${proxies[@]}"; do start "$p"; done

declare -A result
for i in $(seq 15); do
  for p in "${proxies[@]}"; do
    "s$i" "$p"
    result[$i.$p]=$cell
  done
done

fmt='%-40s %-20s %-20s %s\n'
# shellcheck disable=SC2059
printf "$fmt" scenario "${proxies[@]}"
# shellcheck disable=SC2059
printf "$fmt" "$(printf '%.0s-' {1..40})" "$(printf '%.0s-' {1..20})" "$(printf '%.0s-' {1..20})" \
  "$(printf '%.0s-' {1..20})"
for i in $(seq 15); do
  # shellcheck disable=SC2059
  printf "$fmt" "${labels[$i]}" "${result[$i.portico]}" "${result[$i.nginx]}" "${result[$i.varnish]}"
done

# What Portico's cache must do (docs/configuration.md, Caching): any other cell fails the run.
expected=(
  ""
  "stored" "not stored" "not stored" "not stored" "not stored" "not stored" "stored"
  "origin 2" "304" '206 "234"' "invalidated" "200 stale" "reval 304, 200" "origin 1" "from cache"
)
failed=0
for i in $(seq 15); do
  if [ "${result[$i.portico]}" != "${expected[$i]}" ]; then
    echo "scenario ${labels[$i]}: Portico did '${result[$i.portico]}', expected '${expected[$i]}'" >&2
    failed=1
  fi
done
exit $failed
