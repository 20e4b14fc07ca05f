#!/usr/bin/env bash
# CPU per request of proxies at a fixed request rate (open loop, below saturation: where every
# proxy pays for waking up), the proxies alternating round by round. Each proxy runs with
# `bench compare`'s configuration (`BINARY bench peer` writes it; nginx single-process) pinned to
# core 0; the origin (`BINARY origin`) and the generator (`BINARY bench -R RATE -c 50`, 1 KB
# keep-alive) on core 1. A proxy's CPU time is the first field of /proc/PID/task/*/schedstat
# (nanoseconds on a CPU, every thread of the process: exact, where the user and system split of
# /proc/PID/stat is sampled at each tick and means little at these loads), its context switches
# from /proc/PID/task/*/status, both read before and after the run and divided by the requests
# completed (a thread that ends during the run takes its time with it: none of these proxies
# starts or stops threads under a steady load). A run with errors, or one that fell behind the
# rate (requests still in flight at the end or never sent), stops the script.
# Usage: scripts/peer-cpu.sh RATE ROUNDS BINARY PROXY...   (PROXY: portico, nginx, haproxy,
#        relay, caddy, pingora; PEER_CPU_DURATION: each run's length, 6s by default)
# Prints one line per proxy per round, then each proxy's median (min..max; with an even number
# of rounds, the lower of the two middle values: run an odd number).
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 RATE ROUNDS BINARY PROXY..." >&2; exit 2; }
rate=$1 rounds=$2 bin=$3
shift 3
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

taskset -c 1 "$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380

counters() { # pid -> "cpu_ns context_switches", summed over its threads
  local pid=$1 ns=0 cs=0 t v
  for t in /proc/"$pid"/task/*; do
    read -r v _ < "$t/schedstat" && ns=$((ns + v))
    v=$(awk '/ctxt_switches/ {s += $2} END {print s + 0}' "$t/status") && cs=$((cs + v))
  done
  echo "$ns $cs"
}

run() { # proxy -> "cpu_us_per_req on a CPU, switches_per_req context switches/req"
  local proxy=$1 cmd pid before after out n
  mapfile -t cmd < <("$bin" bench peer "$proxy" --port 9743 --origin 127.0.0.1:9380 --dir "$d/$proxy")
  [ ${#cmd[@]} -gt 0 ] || { echo "portico bench peer $proxy printed no command" >&2; exit 1; }
  # The worker alone (a master would fork it, and its CPU would be another process's).
  if [ "$proxy" = nginx ]; then cmd+=(-g "master_process off;"); fi
  taskset -c 0 "${cmd[@]}" > "$d/$proxy.log" 2>&1 &
  pid=$!
  # This runs in a subshell, where the script's EXIT trap does not: a failure stops the proxy here.
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  wait_port 9743
  before=$(counters "$pid")
  out=$(taskset -c 1 "$bin" bench -R "$rate" -c 50 -d "${PEER_CPU_DURATION:-6s}" http://127.0.0.1:9743/bytes/1k 2>&1)
  after=$(counters "$pid")
  n=$(sed -n 's/.*scheduled = \([0-9]*\) completed + 0 errors + 0 in flight at the end + 0 never sent.*/\1/p' <<<"$out")
  [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "$proxy: the run had errors or fell behind: $out" >&2; exit 1; }
  case $proxy in nginx) kill -QUIT "$pid" ;; *) kill -TERM "$pid" ;; esac
  wait "$pid" 2>/dev/null || true
  awk -v b="$before" -v a="$after" -v n="$n" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "%.2f on a CPU, %.2f context switches/req\n", (y[1] - x[1]) / 1e3 / n, (y[2] - x[2]) / n }'
}

alternate_rounds "$rounds" run us/req "$@"
