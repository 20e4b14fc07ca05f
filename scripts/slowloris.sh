#!/usr/bin/env bash
# Slow clients against a real `portico run` (reliability promise 2): slowhttptest in slowloris (-H),
# slow body (-B) and slow read (-X) modes, each bounded in time and connections, 127.0.0.1 only.
# Passes only when slowhttptest's own probe saw the service available at every sample of its CSV
# (-g), a plain curl request during each attack got 200 in time, and for -H and -B the server
# closed the slow connections (head_timeout, body_min_rate) while the attack ran.
# Installs slowhttptest (apt) if missing. PORTICO_BIN=path overrides target/release/portico;
# SLOW_SECONDS (default 20) and SLOW_CONNECTIONS (default 300) bound each attack; SLOW_ONLY=name
# (slowloris, slowbody, slowread) runs one.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
seconds="${SLOW_SECONDS:-20}"
connections="${SLOW_CONNECTIONS:-300}"

if ! command -v slowhttptest >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing slowhttptest"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slowhttptest >/dev/null
  else
    echo "slowloris.sh: slowhttptest is missing: apt-get install slowhttptest" >&2
    exit 1
  fi
fi
command -v curl >/dev/null 2>&1 || { echo "slowloris.sh: curl is needed" >&2; exit 1; }

bin="${PORTICO_BIN:-$root/target/release/portico}"
[ -x "$bin" ] || cargo build --release --locked -p portico

work="$(mktemp -d)"
# slowhttptest's outputs (.out, .csv, .html) and portico's log stay here for a look after a failure.
out="$root/target/slowloris"
rm -rf "$out"
mkdir -p "$out"
pid=""
attack=""
cleanup() {
  if [ -n "$attack" ]; then kill "$attack" 2>/dev/null || true; wait "$attack" 2>/dev/null || true; fi
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
# Small limits, so that the slow connections are cut while the attack runs: the whole head within
# 2 s, bodies at 1 KiB/s (after the fixed 10 s grace); max_connections above the attack size, so
# the probe is never refused for lack of a slot (the limit is per listener, not per client).
cat >"$work/slow.toml" <<EOF
[[listeners]]
name = "slow"
address = "127.0.0.1:$port"
http2.enabled = false
[listeners.limits]
max_connections = $((connections * 4))
head_timeout = "2s"
keepalive_timeout = "5s"
body_min_rate = "1k"
[[listeners.routes]]
origin = true
max_body = "1m"
EOF
"$bin" check --config "$work/slow.toml" >/dev/null
"$bin" run --config "$work/slow.toml" --workers 1 >"$out/portico.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$port/" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "portico exited:" >&2; cat "$out/portico.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$port/" \
  || { echo "portico did not answer in time" >&2; cat "$out/portico.log" >&2; exit 1; }

# attack NAME MUST_CLOSE SLOWHTTPTEST-ARGS...: runs one bounded attack and checks it.
attack() {
  local name="$1" must_close="$2"
  shift 2
  if [ -n "${SLOW_ONLY:-}" ] && [ "$SLOW_ONLY" != "$name" ]; then return 0; fi
  local prefix="$out/$name"
  echo "==> slowhttptest $name: $* (${seconds}s, ${connections} connections)"
  timeout $((seconds + 30)) slowhttptest "$@" -c "$connections" -r 50 -l "$seconds" -p 5 \
    -g -o "$prefix" >"$prefix.out" 2>&1 &
  attack=$!
  # Normal requests every second while the attack runs: each must get 200 within 3 s.
  local codes="" code
  sleep 1
  while kill -0 "$attack" 2>/dev/null; do
    code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$port/bytes/100" 2>/dev/null || true)"
    codes="$codes ${code:-none}"
    sleep 1
  done
  wait "$attack" || true
  attack=""
  local csv="$prefix.csv"
  [ -s "$csv" ] || { echo "no CSV from slowhttptest:" >&2; tail -30 "$prefix.out" >&2; return 1; }
  # Columns: Seconds,Closed,Pending,Connected,Service Available (0 = the probe failed).
  local verdict
  verdict="$(python3 - "$csv" "$must_close" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, rows = rows[0], [r for r in rows[1:] if r and r[0].strip().isdigit()]
col = {h.strip().lower(): i for i, h in enumerate(head)}
avail = col["service available"]
closed = col["closed"]
connected = col["connected"]
down = [r[0] for r in rows if int(r[avail]) == 0]
peak = max((int(r[connected]) for r in rows), default=0)
last_closed = int(rows[-1][closed]) if rows else 0
problems = []
if len(rows) < 3:
    problems.append(f"only {len(rows)} samples")
if down:
    problems.append(f"service unavailable at seconds {','.join(down)}")
if peak < 30:
    problems.append(f"the attack never held many connections (peak {peak})")
if sys.argv[2] == "1" and last_closed == 0:
    problems.append("no slow connection was closed by the server")
print(f"samples={len(rows)} peak_connected={peak} closed={last_closed} down={len(down)}"
      + ("" if not problems else " FAIL: " + "; ".join(problems)))
PY
)"
  echo "$name: $verdict; curl during the attack:${codes:- none}"
  grep -iE "service available|exit status" "$prefix.out" | tail -2 | sed "s/^/$name: slowhttptest: /"
  local not_ok
  not_ok="$(tr ' ' '\n' <<<"$codes" | grep -cv -e '^$' -e '^200$' || true)"
  if [[ "$verdict" == *FAIL* ]] || [ -z "$codes" ] || [ "$not_ok" != 0 ]; then
    tail -30 "$prefix.out" >&2
    return 1
  fi
  kill -0 "$pid" 2>/dev/null || { echo "portico died:" >&2; cat "$out/portico.log" >&2; return 1; }
}

status=0
# Slowloris: a header line every second, the head never ends; head_timeout (2 s) closes them.
attack slowloris 1 -H -i 1 -x 24 -u "http://127.0.0.1:$port/" || status=1
# Slow body: a 64 KiB POST sent a few bytes a second; body_min_rate closes them after the grace.
attack slowbody 1 -B -i 1 -x 8 -s 65536 -u "http://127.0.0.1:$port/" || status=1
# Slow read: a 1 MiB response read 32 bytes a second through a tiny window; served by other tasks,
# the probe and curl must not notice.
attack slowread 0 -X -k 2 -n 1 -w 16 -y 64 -z 32 -u "http://127.0.0.1:$port/bytes/1m" || status=1
exit "$status"
