#!/usr/bin/env bash
# A peer's instructions per request under callgrind, counted as scripts/ab-instructions.sh counts
# Portico's (user space of the proxy's process, two runs of N1 and N2 requests, the difference
# divided by N2 - N1), with `bench compare`'s configuration (one worker, upstream keep-alive, no
# access log; `BINARY bench peer` writes it), the origin `BINARY origin`:
#   nginx    single-process (master_process off)
#   haproxy  nbthread 1, in the foreground
#   relay    `BINARY bench relay`, the blind TCP relay `bench compare` calls the floor: what any
#            proxy's own work is counted above
# http: closed loop, h2load --h1 with 4 connections; slow: BINARY bench at AB_RATE (200) req/s;
# cps: a new connection per request, 0 KB, BINARY bench --closed --close with 4 connections (as
# ab-instructions.sh cps counts Portico's).
# Usage: scripts/peer-instructions.sh nginx|haproxy|relay http|slow|cps PORTICO_BINARY
# (AB_N1, AB_N2 as in ab-instructions.sh). Needs valgrind, h2load and the peer.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 nginx|haproxy|relay http|slow|cps PORTICO_BINARY" >&2; exit 2; }
peer=$1 mode=$2 bin=$3
case $mode in http | slow | cps) ;; *) echo "usage: $0 nginx|haproxy|relay http|slow|cps PORTICO_BINARY" >&2; exit 2 ;; esac
case $peer in nginx | haproxy | relay) ;; *) echo "usage: $0 nginx|haproxy|relay http|slow|cps PORTICO_BINARY" >&2; exit 2 ;; esac
n1=${AB_N1:-2000} n2=${AB_N2:-6000}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

"$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380
# bench compare's configuration and command line, written and printed by the binary itself.
mapfile -t cmd < <("$bin" bench peer "$peer" --port 9743 --origin 127.0.0.1:9380 --dir "$d/peer")
[ ${#cmd[@]} -gt 0 ] || { echo "portico bench peer $peer printed no command" >&2; exit 1; }
# nginx's master process would fork the worker callgrind is to count: run the worker alone.
if [ "$peer" = nginx ]; then cmd+=(-g "master_process off;"); fi

count() { # requests -> instructions of the peer's process for that run
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "${cmd[@]}" > /dev/null 2> "$d/vg.log" &
  local pid=$! out
  # This runs in a subshell, where the script's EXIT trap does not: a failure stops the peer here.
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  wait_port 9743
  case $mode in
    http) out=$(h2load --h1 -c 4 -n "$1" http://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "$1 succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; } ;;
    slow) out=$("$bin" bench -R "${AB_RATE:-200}" -c 4 -n "$1" http://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "= $1 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; } ;;
    cps) out=$("$bin" bench --closed --close -c 4 -n "$1" http://127.0.0.1:9743/bytes/0 2>&1)
      grep -q "= $1 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; } ;;
  esac
  # nginx's graceful shutdown is QUIT (TERM would do too); HAProxy and the relay stop on TERM.
  # Callgrind writes its counts as the process exits either way.
  case $peer in nginx) kill -QUIT "$pid" ;; *) kill -TERM "$pid" ;; esac
  wait "$pid" 2>/dev/null || true
  awk '/Collected/ {print $4}' "$d/vg.log"
}

a=$(count "$n1")
b=$(count "$n2")
[ -n "$a" ] && [ -n "$b" ] || { echo "callgrind counted nothing (see valgrind's output)" >&2; exit 1; }
echo "$peer $mode: $(((b - a) / (n2 - n1))) instructions/request"
