#!/usr/bin/env bash
# The load generator's own CPU per request against wrk (HTTP/1.1, closed loop) and h2load (HTTP/2,
# h2c, closed loop), same box, same target (the bar: the generator's CPU per request at most wrk's).
# Targets on core 1: `portico origin` (HTTP/1.1) and, for HTTP/2, a Portico proxy with a plain
# listener (h2c prior knowledge) in front of it. Generators on core 0, one thread each, alternating
# for ROUNDS rounds. CPU = user + system of the generator process (/usr/bin/time), divided by the
# requests it completed.
# Usage: scripts/bench-generator.sh [SECONDS] [ROUNDS]   (needs wrk, h2load; cargo build --release)
set -euo pipefail
secs=${1:-10}
rounds=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
portico=${PORTICO:-$root/target/release/portico}
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

op=$(free_port)
taskset -c 1 "$portico" origin --listen "127.0.0.1:$op" --workers 1 > "$d/origin.out" 2>&1 &
wait_port "$op"
pp=$(free_port)
cat > "$d/p.toml" <<EOF2
[[listeners]]
name = "h2c"
address = "127.0.0.1:$pp"
[listeners.limits]
max_connections = 100000
[[listeners.routes]]
proxy = "o"
[upstreams.o]
servers = ["127.0.0.1:$op"]
keepalive = 256
EOF2
taskset -c 1 "$portico" run -c "$d/p.toml" -w 1 > "$d/proxy.out" 2>&1 &
wait_port "$pp"

# name, then the command; prints generator CPU us per request
measure() {
  local name=$1; shift
  /usr/bin/time -o "$d/time" -f "%U %S" taskset -c 0 "$@" > "$d/out" 2>&1
  local t
  t=$(tail -1 "$d/time")
  local n
  case $name in
    wrk*) n=$(awk '/requests in/ {print $1; exit}' "$d/out") ;;
    h2load*) n=$(awk '/^status codes:/ {gsub(",", ""); print $3; exit}' "$d/out") ;;
    *) n=$(awk '/ requests in / {print $1; exit}' "$d/out") ;;
  esac
  awk -v name="$name" -v t="$t" -v n="$n" 'BEGIN { split(t, a, " ");
    printf "%-22s %10d req  user %.2f s  sys %.2f s  %6.2f us CPU per request\n",
      name, n, a[1], a[2], (a[1] + a[2]) * 1e6 / n }'
}

echo "generator on core 0, targets on core 1, ${secs} s per run, $rounds rounds"
for r in $(seq "$rounds"); do
  echo "round $r"
  measure "wrk http/1.1" wrk -t1 -c50 -d"${secs}s" "http://127.0.0.1:$op/bytes/1k"
  measure "portico http/1.1" "$portico" bench --closed -c 50 -t 1 -d "${secs}s" "http://127.0.0.1:$op/bytes/1k"
  measure "h2load h2c" h2load -t1 -c10 -m100 -D "$secs" "http://127.0.0.1:$pp/bytes/1k"
  measure "portico h2c" "$portico" bench --h2 --streams 100 --closed -c 10 -t 1 -d "${secs}s" "http://127.0.0.1:$pp/bytes/1k"
done
