#!/usr/bin/env bash
# Run every fuzz target for N seconds each (default 30): ./fuzz/run.sh [N]
# Needs a nightly toolchain and cargo-fuzz (installed if missing). Exits non-zero on a crash;
# the crashing input is left in fuzz/artifacts/<target>/.
set -euo pipefail
seconds="${1:-30}"
cd "$(dirname "$0")"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
for target in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$target"
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -dict=http.dict -max_len=4096 -print_final_stats=1
done
