#!/usr/bin/env bash
# Run fuzz targets for N seconds each (default 30): ./fuzz/run.sh [N] [TARGET...] (all by default).
# Needs a nightly toolchain and cargo-fuzz (installed if missing). Exits non-zero on a crash;
# the crashing input is left in fuzz/artifacts/<target>/. New inputs go to fuzz/corpus/<target>
# (not committed); fuzz/seeds/<target> is the committed seed corpus. The dictionary is
# <target>.dict when there is one, else http.dict for the HTTP targets.
set -euo pipefail
seconds="${1:-30}"
shift || true
cd "$(dirname "$0")"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "seeds/$target"
    dict=()
    if [ -f "$target.dict" ]; then
        dict=(-dict="$target.dict")
    elif [[ "$target" == http1_* || "$target" == h2_* ]]; then
        dict=(-dict=http.dict)
    fi
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" "${dict[@]}" -max_len=4096 -print_final_stats=1
done
