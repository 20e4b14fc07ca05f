#!/usr/bin/env bash
# What a proxy asks of the kernel per request: its system calls (counted by `strace -c -f`, which
# slows the proxy down, so the counts show its pattern, not its speed) and, in a second run
# without strace, the TCP segments the machine sent (`/proc/net/snmp` OutSegs and the TcpExt
# counters of `/proc/net/netstat`: every socket of the machine, so keep it otherwise quiet).
# The proxy runs with `bench compare`'s configuration (`BINARY bench peer`; nginx single-process)
# pinned to core 0, the origin (`BINARY origin`) and the generator on core 1.
#   keepalive: h2load --h1 -c 50, 1 KB, N requests (60,000) over kept-alive connections
#   cps:       BINARY bench --closed --close -c 4, 0 KB, N requests (2,000), one connection each
# Usage: scripts/peer-kernel.sh keepalive|cps PROXY BINARY [N]   (PROXY: portico, nginx, haproxy,
#        relay, caddy, pingora). Needs strace and h2load.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 keepalive|cps PROXY BINARY [N]" >&2; exit 2; }
mode=$1 proxy=$2 bin=$3
case $mode in
  keepalive) n=${4:-60000} ;;
  cps) n=${4:-2000} ;;
  *) echo "usage: $0 keepalive|cps PROXY BINARY [N]" >&2; exit 2 ;;
esac
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

taskset -c 1 "$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380
mapfile -t cmd < <("$bin" bench peer "$proxy" --port 9743 --origin 127.0.0.1:9380 --dir "$d/peer")
[ ${#cmd[@]} -gt 0 ] || { echo "portico bench peer $proxy printed no command" >&2; exit 1; }
if [ "$proxy" = nginx ]; then cmd+=(-g "master_process off;"); fi
taskset -c 0 "${cmd[@]}" > "$d/proxy.log" 2>&1 &
pid=$!
wait_port 9743

load() { # requests: the load of this mode; fails unless every request succeeded
  local out
  case $mode in
    keepalive)
      out=$(taskset -c 1 h2load --h1 -c 50 -n "$1" http://127.0.0.1:9743/bytes/1k 2>&1)
      grep -q "$1 succeeded" <<<"$out" || { echo "h2load failed: $out" >&2; exit 1; } ;;
    cps)
      out=$(taskset -c 1 "$bin" bench --closed --close -c 4 -n "$1" http://127.0.0.1:9743/bytes/0 2>&1)
      grep -q "= $1 completed + 0 errors" <<<"$out" || { echo "bench failed: $out" >&2; exit 1; } ;;
  esac
}
tcp() { # the machine's TCP counters, "name value" per line
  awk '/^Tcp: [0-9]/ {print "OutSegs", $12}' /proc/net/snmp
  awk '/^TcpExt:/ {if (!h) {split($0, names); h = 1} else for (i = 2; i <= NF; i++) print names[i], $i}' /proc/net/netstat
}

load 2000 # warm: upstream connections open, pages touched
strace -c -f -p "$pid" -o "$d/strace.txt" 2> /dev/null &
tracer=$!
# The load starts once strace has attached to every thread of the proxy.
attached() { ! grep -q '^TracerPid:[[:space:]]*0$' /proc/"$pid"/task/*/status; }
for _ in $(seq 100); do attached && break; sleep 0.05; done
attached || { echo "strace did not attach to $proxy (pid $pid)" >&2; exit 1; }
load "$n"
kill -INT "$tracer"
wait "$tracer" 2>/dev/null || true
echo "$proxy $mode: system calls per request (strace -c -f, $n requests)"
# strace -c's rows: % time, seconds, usecs/call, calls, [errors,] syscall.
awk -v n="$n" '$1 ~ /^[0-9.]+$/ && NF >= 5 {printf "  %-16s %7.3f\n", $NF, $4 / n}' "$d/strace.txt" |
  sort -k2 -nr | awk '$2 >= 0.001'

tcp | sort > "$d/before"
load "$n"
tcp | sort > "$d/after"
echo "$proxy $mode: TCP counters per request (the whole machine, $n requests, no strace)"
join "$d/before" "$d/after" | awk -v n="$n" '($3 - $2) / n >= 0.005 {printf "  %-24s %7.3f\n", $1, ($3 - $2) / n}'
