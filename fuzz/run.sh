#!/usr/bin/env bash
# Run fuzz targets for N seconds each (default 30): ./fuzz/run.sh [N] [TARGET...] (all by default).
# Needs a nightly toolchain and cargo-fuzz (installed if missing). Exits non-zero on a crash;
# the crashing input is left in fuzz/artifacts/<target>/. New inputs go to fuzz/corpus/<target>
# (not committed); fuzz/seeds/<target> is the committed seed corpus. The dictionary is
# <target>.dict when there is one, else http.dict for the HTTP targets. FUZZ_JOBS (default 1)
# targets run at once, each printing its output when it ends.
set -euo pipefail
seconds="${1:-30}"
shift || true
cd "$(dirname "$0")"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
targets=("$@")
# Built up front, so that targets running side by side do not build.
if [ ${#targets[@]} -eq 0 ]; then
    cargo +nightly fuzz build
    mapfile -t targets < <(cargo +nightly fuzz list)
else
    for target in "${targets[@]}"; do
        cargo +nightly fuzz build "$target"
    done
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

one() { # target: fuzz it for $seconds, all output to $logs/target
    local target=$1 dict=()
    mkdir -p "corpus/$target" "seeds/$target"
    if [ -f "$target.dict" ]; then
        dict=(-dict="$target.dict")
    elif [[ "$target" == http1_* || "$target" == h2_* ]]; then
        dict=(-dict=http.dict)
    fi
    echo "== $target: ${seconds}s"
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" "${dict[@]}" -max_len=4096 -print_final_stats=1
}

failed=()
pids=()
names=()
wait_one() { # wait for the oldest running target, print its output, note a failure
    local pid=${pids[0]} name=${names[0]}
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
    if wait "$pid"; then
        cat "$logs/$name"
    else
        cat "$logs/$name"
        failed+=("$name")
    fi
}
for target in "${targets[@]}"; do
    while [ ${#pids[@]} -ge "${FUZZ_JOBS:-1}" ]; do
        wait_one
    done
    one "$target" > "$logs/$target" 2>&1 &
    pids+=($!)
    names+=("$target")
done
while [ ${#pids[@]} -gt 0 ]; do
    wait_one
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: crash or failure in ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
