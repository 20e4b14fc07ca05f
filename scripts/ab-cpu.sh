#!/usr/bin/env bash
# A/B of Portico builds: CPU per request (user + system, and user alone, from /proc) of each
# binary under the same load, the binaries alternating round by round. One worker pinned to
# core 0; the origin (`portico origin` of the first binary) and the load generator on core 1.
# Usage: scripts/ab-cpu.sh MODE ROUNDS BINARY...
#   MODE https: wrk -t1 -c50 -d8s, TLS 1.3 X25519, 1 KB (the HTTPS keep-alive load of docs/benchmarks.md)
#        http:  the same over plain HTTP (the HTTP/1.1 keep-alive load)
#        h2:    h2load -c 10 -m 100 -n 300000 over TLS, 1 KB (the HTTP/2 load)
# A wrapper script works as a BINARY (to set an environment variable, for example).
# AB_EXTRA_TOML is appended to the proxy's configuration (an [access_log] table, for example);
# AB_HEADER ("Name: value") is sent with every request.
# Needs wrk, h2load, openssl. Prints one line per binary per round, then each binary's median
# (min..max).
set -euo pipefail
mode=$1 rounds=$2
shift 2
[ $# -ge 1 ] || { echo "usage: $0 https|http|h2 ROUNDS BINARY..." >&2; exit 2; }
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
make_cert "$d"
tck=$(getconf CLK_TCK)

taskset -c 1 "$1" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380

ab_config "$d" "$mode"

run() { # binary -> "us_per_req (user us_per_req)"
  taskset -c 0 "$1" run -c "$d/portico.toml" -w 1 > /dev/null 2>&1 &
  local pid=$! out n before after
  wait_port 9743
  before=$(awk '{print $14 + $15, $14}' "/proc/$pid/stat")
  case $mode in
    h2)
      n=300000
      out=$(taskset -c 1 h2load -c 10 -m 100 -n $n ${AB_HEADER:+-H "$AB_HEADER"} https://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "$n succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; }
      ;;
    https | http)
      out=$(taskset -c 1 wrk -t1 -c50 -d8s ${AB_HEADER:+-H "$AB_HEADER"} "$mode://127.0.0.1:9743/bytes/1k" 2>&1)
      n=$(awk '/requests in/ {print $1}' <<<"$out")
      ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  after=$(awk '{print $14 + $15, $14}' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  awk -v b="$before" -v a="$after" -v n="$n" -v hz="$tck" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "%.2f (user %.2f)\n", (y[1] - x[1]) / hz * 1e6 / n, (y[2] - x[2]) / hz * 1e6 / n }'
}

alternate_rounds "$rounds" run us/req "$@"
