#!/usr/bin/env bash
# A/B of Portico builds by instructions per request in the proxy's own process (user space),
# counted by valgrind's callgrind: deterministic where CPU time on a shared machine is not (and
# this machine's VM exposes no hardware counters to `perf stat`). Each binary serves N1 and then
# N2 requests in two runs under callgrind; the difference divided by N2 - N1 removes start-up
# and shutdown. Closed loop (h2load, 4 connections), the origin a separate `portico origin`.
# Usage: scripts/ab-instructions.sh http|https|h2 BINARY... (AB_EXTRA_TOML is appended to the configuration,
# as for scripts/ab-cpu.sh; AB_N1 and AB_N2 set the two request counts)
# Needs valgrind, h2load, openssl. Prints one line per binary.
set -euo pipefail
mode=$1
shift
[ $# -ge 1 ] || { echo "usage: $0 http|https|h2 BINARY..." >&2; exit 2; }
n1=${AB_N1:-2000} n2=${AB_N2:-6000}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
make_cert "$d"

"$1" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380

ab_config "$d" "$mode"

count() { # binary requests -> instructions of the proxy process for that run
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$1" run -c "$d/portico.toml" -w 1 \
    > /dev/null 2> "$d/vg.log" &
  local pid=$! out
  wait_port 9743
  case $mode in
    http) out=$(h2load --h1 -c 4 -n "$2" http://127.0.0.1:9743/bytes/1k 2>&1) ;;
    https) out=$(h2load --h1 -c 4 -n "$2" https://127.0.0.1:9743/bytes/1k 2>&1) ;;
    h2) out=$(h2load -c 4 -m 10 -n "$2" https://127.0.0.1:9743/bytes/1k 2>&1) ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  grep -q "$2 succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; }
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  awk '/Collected/ {print $4}' "$d/vg.log"
}

for bin in "$@"; do
  a=$(count "$bin" "$n1")
  b=$(count "$bin" "$n2")
  echo "$bin $mode: $(((b - a) / (n2 - n1))) instructions/request"
done
