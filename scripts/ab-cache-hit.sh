#!/usr/bin/env bash
# A/B of Portico builds on cache hits: CPU per request (user + system from /proc) of each binary
# answering one stored file again and again, the binaries alternating round by round. One proxy
# worker pinned to core 0; the origin (`portico origin --root` of the first binary) and
# wrk -t1 -c16 -d6s on core 1.
# Usage: scripts/ab-cache-hit.sh SIZE_KIB ROUNDS BINARY...   (e.g. 100 4 base/portico new/portico)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SIZE_KIB ROUNDS BINARY..." >&2; exit 2; }
kib=$1 rounds=$2
shift 2
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
mkdir -p "$d/www"
head -c $((1024 * kib)) /dev/urandom > "$d/www/f.bin"
taskset -c 1 "$1" origin --listen 127.0.0.1:9380 --workers 1 --root "$d/www" > /dev/null 2>&1 &
wait_port 9380
cat > "$d/p.toml" <<EOT
[cache]
memory = "256MiB"
[[listeners]]
address = "127.0.0.1:9743"
[listeners.limits]
max_requests_per_connection = 0
[[listeners.routes]]
proxy = "origin"
cache = { override_ttl = "1h" }
[upstreams.origin]
servers = ["127.0.0.1:9380"]
EOT
tck=$(getconf CLK_TCK)
for r in $(seq "$rounds"); do
  for b in "$@"; do
    taskset -c 0 "$b" run -c "$d/p.toml" -w 1 > /dev/null 2>&1 &
    pid=$!
    wait_port 9743
    # stored, then answered from the store
    curl -sf -o /dev/null http://127.0.0.1:9743/f.bin
    curl -sf -D - -o /dev/null http://127.0.0.1:9743/f.bin | grep -qi '^cache-status: portico; hit' \
      || { echo "$b: the second request was not a hit" >&2; exit 1; }
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$(taskset -c 1 wrk -t1 -c16 -d6s http://127.0.0.1:9743/f.bin)
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2> /dev/null || true
    n=$(awk '/requests in/ {print $1}' <<< "$out")
    awk -v b="$b" -v r="$r" -v x="$before" -v y="$after" -v n="$n" -v hz="$tck" \
      'BEGIN { printf "round %d %-40s %.2f us/req\n", r, b, (y - x) / hz * 1e6 / n }'
  done
done
