#!/usr/bin/env bash
# A/B of Portico builds by instructions per request in the proxy's own process (user space),
# counted by valgrind's callgrind: deterministic where CPU time on a shared machine is not (and
# this machine's VM exposes no hardware counters to `perf stat`). Each binary serves N1 and then
# N2 requests in two runs under callgrind; the difference divided by N2 - N1 removes start-up
# and shutdown. Closed loop (h2load, 4 connections), the origin a separate `portico origin`.
# cps: a new plain HTTP connection per request (0 KB), the generator `BINARY bench --close`.
# slow: plain HTTP keep-alive at a low fixed rate (AB_RATE, 200 req/s), the generator
# `BINARY bench -R`: every request finds the proxy asleep, so this counts the cost of waking up.
# Usage: scripts/ab-instructions.sh http|https|h2|cps|slow BINARY... (AB_EXTRA_TOML is appended to the configuration,
# as for scripts/ab-cpu.sh; AB_N1 and AB_N2 set the two request counts, AB_CONNECTIONS the
# connections (4); AB_HEADER ("Name: value") is sent with every request; AB_URIS names a file of
# targets, one per line, taken in turn by each connection instead of /bytes/1k; both for the h2load
# modes only: cps and slow request /bytes/0 and /bytes/1k with their own generator)
# Needs valgrind, h2load, openssl. Prints one line per binary.
set -euo pipefail
mode=$1
shift
[ $# -ge 1 ] || { echo "usage: $0 http|https|h2|cps|slow BINARY..." >&2; exit 2; }
n1=${AB_N1:-2000} n2=${AB_N2:-6000}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
make_cert "$d"

"$1" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380

ab_config "$d" "$(case $mode in cps | slow) echo http ;; *) echo "$mode" ;; esac)"

count() { # binary requests -> instructions of the proxy process for that run
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$1" run -c "$d/portico.toml" -w 1 \
    > /dev/null 2> "$d/vg.log" &
  local pid=$! out
  # This runs in a subshell, where the script's EXIT trap does not: a failure stops Portico here.
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  wait_port 9743
  local scheme=https opts=() target
  case $mode in
    http) scheme=http opts=(--h1) ;;
    https) opts=(--h1) ;;
    h2) opts=(-m 10) ;;
    cps | slow) scheme=http ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  [ -z "${AB_HEADER:-}" ] || opts+=(-H "$AB_HEADER")
  if [ -n "${AB_URIS:-}" ]; then
    sed "s|^|$scheme://127.0.0.1:9743|" "$AB_URIS" > "$d/uris"
    opts+=(-i "$d/uris")
  else
    target=$scheme://127.0.0.1:9743/bytes/1k
  fi
  if [ "$mode" = slow ]; then
    out=$("$1" bench -R "${AB_RATE:-200}" -c "${AB_CONNECTIONS:-4}" -n "$2" "$scheme://127.0.0.1:9743/bytes/1k" 2>&1)
    grep -q "= $2 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; }
  elif [ "$mode" = cps ]; then
    out=$("$1" bench --closed --close -c "${AB_CONNECTIONS:-4}" -n "$2" "$scheme://127.0.0.1:9743/bytes/0" 2>&1)
    grep -q "= $2 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; }
  else
    out=$(h2load "${opts[@]}" -c "${AB_CONNECTIONS:-4}" -n "$2" ${target:+"$target"} 2>&1)
    grep -q "$2 succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; }
  fi
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  awk '/Collected/ {print $4}' "$d/vg.log"
}

for bin in "$@"; do
  a=$(count "$bin" "$n1")
  b=$(count "$bin" "$n2")
  echo "$bin $mode: $(((b - a) / (n2 - n1))) instructions/request"
done
