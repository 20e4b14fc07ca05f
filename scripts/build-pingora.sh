#!/usr/bin/env bash
# Builds the Pingora peer of `portico bench compare` (scripts/peers/pingora: a minimal Pingora
# reverse proxy, pingora pinned to one version from crates.io, its Cargo.lock committed) into the
# same directory as the portico binary it is told about, where `bench compare` looks for it.
#
#   scripts/build-pingora.sh [PORTICO_BINARY]      (default target/release/portico)
#
# On failure it says why and exits non-zero; `bench compare` then skips the pingora row and says
# it is not built.
set -euo pipefail
cd "$(dirname "$0")/.."
portico=${1:-target/release/portico}
dir=$(dirname "$portico")
case "$dir" in
  */release) profile=release ;;
  */debug) profile=debug ;;
  *) echo "build-pingora: $portico is not in a cargo target directory (…/release or …/debug)" >&2; exit 2 ;;
esac
target=$(dirname "$dir")
flags=(--locked --manifest-path scripts/peers/pingora/Cargo.toml --target-dir "$target")
[ "$profile" = release ] && flags+=(--release)
if ! cargo build "${flags[@]}"; then
  echo "build-pingora: the build failed (above); bench compare will skip pingora" >&2
  exit 1
fi
"$dir/portico-bench-pingora" --version
echo "build-pingora: $dir/portico-bench-pingora"
