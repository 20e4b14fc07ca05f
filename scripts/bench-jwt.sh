#!/usr/bin/env bash
# A route with a JWT check (ES256, its key from a JWK set file) against the same route without,
# one binary, HTTP/1.1 keep-alive, 1 KB:
#   1. CPU per request of one pinned worker (scripts/ab-cpu.sh, ROUNDS alternating rounds), every
#      request with the same token, as a client sends its token until it expires;
#   2. instructions per request under callgrind (scripts/ab-instructions.sh): the same token, and
#      a token of its own per request (each one verified: the cost of a token's first request).
# Usage: scripts/bench-jwt.sh ROUNDS BINARY. Needs what those scripts need, and python3 with the
# `cryptography` package (installed with pip when missing) to sign the tokens.
set -euo pipefail
rounds=$1 bin=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
python3 -c 'import cryptography' 2>/dev/null || pip install -q cryptography
n2=${AB_N2:-14000}
python3 "$here/interop/jwt_tokens.py" "$d" "$((n2 + 1))"
token=$(cat "$d/token")
check="jwt = { jwks = \"$d/jwks.json\", algorithms = [\"ES256\"], issuer = \"https://id.bench\", audience = \"api\", query = \"access_token\", forward_claims = { sub = \"X-User\" } }"
# The two arms as binaries: the second adds the check to the listener the scripts configure.
printf '#!/bin/sh\nexec %s "$@"\n' "$bin" > "$d/none"
cat > "$d/jwt" <<WRAP
#!/bin/sh
# run -c CONFIG -w N: the same configuration with the check in its listener
cfg=\$3
awk -v check='$check' '{ print } /^address = / { print check }' "\$cfg" > "\$cfg.jwt"
shift 3
exec "$bin" run -c "\$cfg.jwt" "\$@"
WRAP
chmod +x "$d/none" "$d/jwt"
echo "== CPU per request, the same token on every request ($rounds rounds)"
AB_HEADER="Authorization: Bearer $token" "$here/ab-cpu.sh" http "$rounds" "$d/none" "$d/jwt"
# callgrind counts are deterministic: the arms run one after the other, configured directly.
echo "== instructions per request, the same token (without the check, then with it)"
export AB_N1=2000 AB_N2=$n2
AB_HEADER="Authorization: Bearer $token" "$here/ab-instructions.sh" http "$bin"
AB_HEADER="Authorization: Bearer $token" AB_LISTENER_TOML="$check" "$here/ab-instructions.sh" http "$bin"
echo "== instructions per request, a token of its own per request, one connection (without, with)"
AB_CONNECTIONS=1 AB_URIS="$d/uris" "$here/ab-instructions.sh" http "$bin"
AB_CONNECTIONS=1 AB_URIS="$d/uris" AB_LISTENER_TOML="$check" "$here/ab-instructions.sh" http "$bin"
