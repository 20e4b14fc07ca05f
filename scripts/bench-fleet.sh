#!/usr/bin/env bash
# CPU per request of a route with a fleet rate limit (counted through Redis) against the same
# route with a local one, in the same run, the two alternating round by round. One worker
# pinned to core 0; the origin, redis-server and wrk on core 1. The limit is far above the load:
# this measures the cost of counting, not of refusing. Every request counts under one key (the
# client IP), the case where all workers meet on one shard.
# Usage: scripts/bench-fleet.sh ROUNDS [BINARY]   (BINARY defaults to target/release/portico)
# Needs wrk and redis-server. Prints one line per round and scope, then each scope's median and
# the ratio of the medians.
set -euo pipefail
rounds=${1:?usage: $0 ROUNDS [BINARY]}
bin=${2:-target/release/portico}
for tool in wrk redis-server; do
  command -v "$tool" > /dev/null || { echo "$0 needs $tool (apt-get install $tool)" >&2; exit 1; }
done
d=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
tck=$(getconf CLK_TCK)

for port in 9380 9381 9743; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "$0: port $port is in use (a leftover run?)" >&2
    exit 1
  fi
done
taskset -c 1 redis-server --port 9381 --bind 127.0.0.1 --save "" --appendonly no > /dev/null 2>&1 &
taskset -c 1 "$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9381
wait_port 9380

for scope in local fleet; do
  cat > "$d/$scope.toml" <<EOF
[fleet]
redis = "redis://127.0.0.1:9381/0"
prefix = "bench-fleet"

[[listeners]]
name = "ab"
address = "127.0.0.1:9743"
[listeners.limits]
max_connections = 100000
max_requests_per_connection = 0
[[listeners.routes]]
proxy = "origin"
rate_limit = { rate = 1000000000, scope = "$scope" }
[upstreams.origin]
servers = ["127.0.0.1:9380"]
keepalive = 1024
EOF
done

run() { # scope -> "us_per_req user_us_per_req requests" in $d/result
  taskset -c 0 "$bin" run -c "$d/$1.toml" -w 1 > /dev/null 2>&1 &
  local pid=$! out n before after
  wait_port 9743
  before=$(awk '{print $14 + $15, $14}' "/proc/$pid/stat")
  out=$(taskset -c 1 wrk -t1 -c50 -d8s http://127.0.0.1:9743/bytes/1k 2>&1)
  after=$(awk '{print $14 + $15, $14}' "/proc/$pid/stat")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  if grep -q "Non-2xx" <<<"$out"; then
    echo "refused or failed requests: $out" >&2
    exit 1
  fi
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  awk -v b="$before" -v a="$after" -v n="$n" -v hz="$tck" 'BEGIN {
    split(b, x, " "); split(a, y, " ")
    printf "%.2f %.2f %d\n", (y[1] - x[1]) / hz * 1e6 / n, (y[2] - x[2]) / hz * 1e6 / n, n }' > "$d/result"
}

declare -A all
for r in $(seq "$rounds"); do
  for scope in local fleet; do
    run "$scope"
    read -r total user n < "$d/result"
    echo "round $r $scope: $total us/req (user $user), $n requests"
    all[$scope]="${all[$scope]:-} $total"
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# shellcheck disable=SC2086
l=$(median ${all[local]})
# shellcheck disable=SC2086
f=$(median ${all[fleet]})
echo "median local: $l us/req"
echo "median fleet: $f us/req"
awk -v l="$l" -v f="$f" 'BEGIN { printf "fleet / local: %.3f\n", f / l }'
