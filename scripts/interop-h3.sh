#!/usr/bin/env bash
# HTTP/3 interop check with an independent client: aioquic's QUIC and HTTP/3 stack (from PyPI)
# fetches through Portico's HTTP/3 listener from a Python HTTP/1.1 upstream (see
# scripts/interop/h3_client.py for the checks). Usage: scripts/interop-h3.sh [PORTICO_BINARY].
# Installs aioquic (pip) when missing. Ports 9590 (TCP and UDP) and 9591-9592 on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
portico=${1:-$here/../target/debug/portico}
python3 -c "import aioquic" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check aioquic
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$here/bench-lib.sh"
make_cert "$d"
cat > "$d/portico.toml" <<EOF2
[[listeners]]
name = "edge"
address = "127.0.0.1:9590"
[listeners.tls]
certificates = [{ cert = "$d/cert.pem", key = "$d/key.pem" }]
[listeners.http3]
[[listeners.routes]]
path = "/dead/**"
proxy = "dead"
[[listeners.routes]]
proxy = "app"
[upstreams.app]
servers = ["127.0.0.1:9591"]
[upstreams.dead]
servers = ["127.0.0.1:9592"]
EOF2
python3 "$here/interop/h3_upstream.py" 9591 &
"$portico" check -c "$d/portico.toml" > /dev/null
"$portico" run -c "$d/portico.toml" -w 2 > "$d/portico.log" 2>&1 &
wait_port 9590
wait_port 9591
if ! timeout 60 python3 "$here/interop/h3_client.py" 127.0.0.1 9590; then
  echo "--- portico log"
  cat "$d/portico.log"
  exit 1
fi
