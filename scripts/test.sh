#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests, varnishtest scenarios.
# Installs what it needs (Debian packages, rustup components) so it works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage is announced with the seconds since the start.
stage() { echo "==> [${SECONDS}s] $*"; }

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
# the htpasswd watch test writes its user files with Apache's own htpasswd
command -v htpasswd >/dev/null 2>&1 || need_apt+=(apache2-utils)
# the Debian package check verifies the systemd unit and reads the stripped binary
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v readelf >/dev/null 2>&1 || need_apt+=(binutils)
# fleet rate limits are tested against a real Redis server (started by the tests on a free port)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# configuration from etcd is tested against a real etcd server (started by the test on free ports)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
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

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "cargo test"
cargo test --workspace --locked 2>&1 | tee target/cargo-test.log
stage "dashboard in headless chromium"
PORTICO_CHROMIUM="$(command -v chromium)" cargo test --locked -p portico-proxy --test it dashboard:: -- --ignored
# The behaviour checks run the binary the tests built (debug assertions on): a release build
# with fat LTO would cost minutes and check the same behaviour.
cargo build --locked -p portico
export PORTICO_BIN="$PWD/target/debug/portico"
stage "varnishtest scenarios"
scripts/vtc.sh
stage "h2spec (HTTP/2 conformance on a TLS and an h2c listener)"
scripts/h2spec.sh
stage "interop: WebSocket through Portico to HAProxy as an HTTP/2 server (extended CONNECT)"
scripts/interop-ws-h2.sh "$PORTICO_BIN"
stage "interop: PROXY protocol with curl and HAProxy, into Portico and out of it"
scripts/interop-proxy-protocol.sh "$PORTICO_BIN"
stage "interop: compressed responses read by curl --compressed and Python's gzip, brotli, zstandard"
scripts/interop-compression.sh "$PORTICO_BIN"
stage "interop: HTTP/3 with aioquic's client (bodies, trailers, errors, concurrent and reset streams)"
scripts/interop-h3.sh "$PORTICO_BIN"
stage "interop: the response cache's behaviour beside nginx proxy_cache and Varnish"
scripts/interop-cache.sh "$PORTICO_BIN"
stage "ACME: certificates from Pebble by HTTP-01, TLS-ALPN-01 and DNS-01, renewals, restart, failures, a shared storage"
scripts/acme-pebble.sh "$PORTICO_BIN"
stage "Debian package: built from the test binary, read back, systemd unit verified"
scripts/package-test.sh "$PORTICO_BIN"
stage "slow clients: slowhttptest slowloris, slow body, slow read"
scripts/slowloris.sh
stage "fuzz smoke run (every cargo-fuzz target, seed corpora, nightly)"
scripts/fuzz-smoke.sh
echo "test.sh: every check passed in ${SECONDS}s"
