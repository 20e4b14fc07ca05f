#!/usr/bin/env bash
# Interop check of response compression with independent decoders: Portico compresses what its
# own origin serves (a text page), and curl --compressed (libcurl's zlib, brotli and zstd, over
# HTTP/1.1 and HTTP/2) and Python's gzip, brotli and zstandard modules read it back byte for byte.
# Also checks precompressed siblings of a static route (a .br made by Python's brotli module).
# Usage: scripts/interop-compression.sh [PORTICO_BINARY]. Installs the Python modules (pip) when
# missing. Ports 9570-9571 on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
portico=${1:-$here/../target/debug/portico}
python3 -c "import brotli, zstandard" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check brotli zstandard
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
# shellcheck source=scripts/bench-lib.sh
. "$here/bench-lib.sh"
mkdir -p "$d/www" "$d/static"
# A text page of about 60 KB from the licence texts every Debian has.
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 > "$d/www/page.txt"
cp "$d/www/page.txt" "$d/static/app.txt"
python3 -c "import brotli, sys; open(sys.argv[2], 'wb').write(brotli.compress(open(sys.argv[1], 'rb').read()))" \
  "$d/static/app.txt" "$d/static/app.txt.br"
cat > "$d/portico.toml" <<EOF2
[[listeners]]
name = "edge"
address = "127.0.0.1:9570"
[listeners.compression]
[[listeners.routes]]
path = "/static/**"
static = "$d"
precompressed = ["br", "gzip"]
[[listeners.routes]]
proxy = "origin"
[[listeners]]
name = "origin"
address = "127.0.0.1:9571"
[[listeners.routes]]
origin = "$d/www"
[upstreams.origin]
servers = ["127.0.0.1:9571"]
EOF2
"$portico" check -c "$d/portico.toml" > /dev/null
"$portico" run -c "$d/portico.toml" -w 1 > "$d/portico.log" 2>&1 &
wait_port 9570
url=http://127.0.0.1:9570/page.txt
fail=0
for accept in gzip br zstd; do
  for proto in --http1.1 --http2-prior-knowledge; do
    got=$(curl -sS "$proto" --compressed -H "Accept-Encoding: $accept" -D "$d/head" "$url" | cmp - "$d/www/page.txt" && echo same)
    ce=$(tr -d '\r' < "$d/head" | awk 'tolower($1) == "content-encoding:" {print $2}')
    if [ "$got" != same ] || [ "$ce" != "$accept" ]; then
      echo "FAIL curl $proto Accept-Encoding $accept: Content-Encoding '$ce', body ${got:-differs}"
      fail=1
    else
      echo "ok curl $proto --compressed, $accept"
    fi
  done
  python3 "$here/interop/decode_check.py" "$url" "$accept" "$accept" "$d/www/page.txt" || fail=1
done
python3 "$here/interop/decode_check.py" "$url" "identity" none "$d/www/page.txt" || fail=1
python3 "$here/interop/decode_check.py" "$url" "br;q=0.1, gzip;q=0.9" gzip "$d/www/page.txt" || fail=1
# The static route: the precompressed .br is served as it is on disk, the original otherwise.
python3 "$here/interop/decode_check.py" http://127.0.0.1:9570/static/app.txt "gzip, br" br "$d/static/app.txt" || fail=1
cmp -s <(curl -sS -H "Accept-Encoding: br" http://127.0.0.1:9570/static/app.txt) "$d/static/app.txt.br" \
  || { echo "FAIL the static route did not send app.txt.br as it is"; fail=1; }
python3 "$here/interop/decode_check.py" http://127.0.0.1:9570/static/app.txt "gzip" none "$d/static/app.txt" || fail=1
if [ "$fail" != 0 ]; then
  echo "interop-compression: FAILED; Portico's log:"
  cat "$d/portico.log"
  exit 1
fi
echo "interop-compression: every decoder read what Portico compressed"
