#!/usr/bin/env bash
# Run the varnishtest scenarios in tests/vtc/ against target/release/portico (PORTICO_BIN overrides).
# Each scenario gets a free loopback port for the proxy as ${proxy_port} and the binary as ${portico}.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${PORTICO_BIN:-$PWD/target/release/portico}"
[ -x "$bin" ] || cargo build --release --locked -p portico
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pass=0; fail=0
for t in tests/vtc/*.vtc; do
  if varnishtest -q -t 30 -Dportico="$bin" -Dproxy_port="$(free_port)" "$t"; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAILED: $t"
    varnishtest -v -t 30 -Dportico="$bin" -Dproxy_port="$(free_port)" "$t" 2>&1 | tail -40 || true
  fi
done
echo "varnishtest: $pass passed, $fail failed"
[ "$fail" = 0 ]
