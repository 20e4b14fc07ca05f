#!/usr/bin/env bash
# CI smoke run of every cargo-fuzz target (fuzz/): FUZZ_SECONDS (default 20) each, FUZZ_JOBS
# (default 2) at a time, starting from the committed seed corpora in fuzz/seeds. Installs the nightly toolchain (rustup, minimal profile) and
# cargo-fuzz when missing. Fails on the first crash; the input is left in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "==> installing the nightly toolchain (cargo-fuzz needs it)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
FUZZ_JOBS="${FUZZ_JOBS:-2}" fuzz/run.sh "${FUZZ_SECONDS:-20}" "$@"
