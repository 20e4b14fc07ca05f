#!/usr/bin/env bash
# Memory per idle keep-alive connection: a proxy (one worker) in front of `portico origin`; N
# clients each send one request (GET /bytes/1k), read the answer, then stay connected and
# silent; 2 s later the proxy's resident memory (VmRSS from /proc) is read: before and after,
# divided by N.
# Usage: scripts/idle-memory.sh BINARY [N] [h2|silent]    (N = 10000 by default; 127.0.0.1 only;
# h2: each client speaks HTTP/2 with prior knowledge, one GET on stream 1, then stays idle;
# silent: each client connects and sends nothing, read 2 s later, within the head timeout)
# Prints one line: the binary, N, RSS before and after, KB per idle connection.
set -euo pipefail
bin=$1 n=${2:-10000} proto=${3:-http1}
[ "$proto" = h2 ] && export IDLE_H2=1
[ "$proto" = silent ] && export IDLE_SILENT=1
ulimit -n $((n + 1024))
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
"$bin" origin --listen 127.0.0.1:9380 --workers 1 > /dev/null 2>&1 &
wait_port 9380
ab_config "$d" http
"$bin" run -c "$d/portico.toml" -w 1 > /dev/null 2>&1 &
pid=$!
wait_port 9743
rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
python3 "$(dirname "$0")/interop/idle_clients.py" 127.0.0.1 9743 1 > /dev/null
before=$(rss)
python3 "$(dirname "$0")/interop/idle_clients.py" 127.0.0.1 9743 "$n" "$d/ready" &
client=$!
for _ in $(seq 600); do [ -e "$d/ready" ] && break; sleep 0.1; done
[ -e "$d/ready" ] || { echo "clients never got ready" >&2; exit 1; }
sleep 2 # every connection idle for a while (the proxy may release buffers after a grace)
after=$(rss)
kill "$client" 2>/dev/null || true
echo "$bin: $n idle $proto connections, RSS ${before} KB -> ${after} KB, $(( (after - before) * 1000 / n )) bytes per connection"
