#!/usr/bin/env bash
# HTTP/2 conformance: h2spec against a TLS listener (ALPN h2) and a plain one (h2c prior knowledge)
# of target/release/portico. Installs h2spec into target/tools if missing (needs Go), makes a
# throwaway certificate with openssl, and fails unless every h2spec case passes on both listeners.
# PORTICO_BIN=path overrides the binary (e.g. a debug build); H2SPEC_VERSION the h2spec version.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
tools="$root/target/tools"
h2spec="$tools/h2spec"
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

if [ ! -x "$h2spec" ]; then
  [ -x "$go" ] || { echo "h2spec.sh: Go is needed to install h2spec (set GO=/path/to/go)" >&2; exit 1; }
  echo "==> installing h2spec ${H2SPEC_VERSION:-latest} into $tools"
  mkdir -p "$tools"
  GOBIN="$tools" "$go" install "github.com/summerwind/h2spec/cmd/h2spec@${H2SPEC_VERSION:-latest}"
fi
command -v openssl >/dev/null 2>&1 || { echo "h2spec.sh: openssl is needed for the test certificate" >&2; exit 1; }

bin="${PORTICO_BIN:-$root/target/release/portico}"
[ -x "$bin" ] || cargo build --release --locked -p portico

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tls_port="$(free_port)"
h2c_port="$(free_port)"
backend_port="$(free_port)"
# h2spec needs a resource that answers 200 with a body on GET and POST. The TLS listener answers
# itself; the h2c one proxies every stream to an HTTP/1.1 listener of the same process, so the
# HTTP/2 -> HTTP/1.1 translation is under test too.
cat >"$work/h2spec.toml" <<EOF
[[listeners]]
name = "tls"
address = "127.0.0.1:$tls_port"
[listeners.tls]
certificates = [{ cert = "$work/cert.pem", key = "$work/key.pem" }]
[[listeners.routes]]
respond = { status = 200, body = "h2spec says hello\n" }

[[listeners]]
name = "h2c"
address = "127.0.0.1:$h2c_port"
[[listeners.routes]]
proxy = "backend"

[[listeners]]
name = "backend"
address = "127.0.0.1:$backend_port"
http2.enabled = false
[[listeners.routes]]
respond = { status = 200, body = "h2spec says hello through the proxy\n" }

[upstreams.backend]
servers = ["127.0.0.1:$backend_port"]
EOF
"$bin" check --config "$work/h2spec.toml" >/dev/null
"$bin" run --config "$work/h2spec.toml" --workers 1 >"$work/portico.log" 2>&1 &
pid=$!

# Ready when both ports accept connections (bounded: 10 s).
ready() { python3 - "$@" <<'PY'
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=0.2).close()
    except OSError:
        sys.exit(1)
PY
}
for _ in $(seq 1 100); do
  ready "$tls_port" "$h2c_port" "$backend_port" && break
  kill -0 "$pid" 2>/dev/null || { echo "portico exited:" >&2; cat "$work/portico.log" >&2; exit 1; }
  sleep 0.1
done
ready "$tls_port" "$h2c_port" "$backend_port" || { echo "portico did not listen in time" >&2; cat "$work/portico.log" >&2; exit 1; }

# Runs h2spec; prints its summary; succeeds only with 0 failed and 0 skipped.
run_h2spec() {
  local name="$1"; shift
  local out="$work/h2spec-$name.txt"
  "$h2spec" -h 127.0.0.1 -o 5 "$@" >"$out" 2>&1 || true
  local summary
  summary="$(grep -E '^[0-9]+ tests, [0-9]+ passed' "$out" | tail -1 || true)"
  echo "h2spec $name: ${summary:-no summary}"
  if ! [[ "$summary" =~ ^([0-9]+)\ tests,\ ([0-9]+)\ passed,\ ([0-9]+)\ skipped,\ ([0-9]+)\ failed ]] \
     || [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ]; then
    sed -n '/^Failures:/,$p' "$out" | head -80
    [ -n "$summary" ] || tail -40 "$out"
    return 1
  fi
}

status=0
run_h2spec tls -p "$tls_port" -t -k || status=1
run_h2spec h2c -p "$h2c_port" || status=1
exit "$status"
