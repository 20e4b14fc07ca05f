#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests, varnishtest scenarios.
# Installs what it needs (Debian packages, rustup components) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v varnishtest >/dev/null 2>&1 || need_apt+=(varnish)
# the dashboard test loads the admin page in a real headless browser
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# upstream TLS without ca_file verifies against the system roots (a portico-tls unit test loads them)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
# the PNG charts of `portico bench` reports are drawn with a system font (the compare test checks them)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# the WebSocket interop check runs HAProxy as a real HTTP/2 server (RFC 8441)
command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "==> missing ${need_apt[*]}: run as root or install them (varnishtest needs varnish, the dashboard test chromium)" >&2
    exit 1
  fi
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked 2>&1 | tee target/cargo-test.log
echo "==> dashboard in headless chromium"
PORTICO_CHROMIUM="$(command -v chromium)" cargo test --locked -p portico-proxy --test dashboard -- --ignored
echo "==> varnishtest scenarios"
cargo build --release --locked -p portico
scripts/vtc.sh
echo "==> h2spec (HTTP/2 conformance on a TLS and an h2c listener)"
scripts/h2spec.sh
echo "==> interop: WebSocket through Portico to HAProxy as an HTTP/2 server (extended CONNECT)"
scripts/interop-ws-h2.sh target/release/portico
echo "==> slow clients: slowhttptest slowloris, slow body, slow read"
scripts/slowloris.sh
echo "==> fuzz smoke run (every cargo-fuzz target, seed corpora, nightly)"
scripts/fuzz-smoke.sh
