#!/usr/bin/env bash
# Every GPU check and benchmark of the CUDA backend, in one device call.
#
# The device machine has no Rust: build here, stage, and run there:
#   cargo build --release
#   scripts/gpu-check.sh --stage /path/to/checkout   # copies binary + precompiled cubins to .gpu/cuda/
#   (device) bash .gpu/cuda/gpu-check.sh              # with .gpu/cuda carried
# Outputs go to stdout and, when $OUT is set, to $OUT/*.log.
set -u
if [ "${1:-}" = "--stage" ]; then
    dest="${2:?checkout root}/.gpu/cuda"
    root="$(cd "$(dirname "$0")/.." && pwd)"
    mkdir -p "$dest"
    strip -o "$dest/mqa-fuzz" "$root/target/release/mqa-fuzz"
    cp "$0" "$dest/gpu-check.sh"
    cp "$root/scripts/gpu/properties.sh" "$dest/properties.sh"
    # The GPU integration tests (cargo test --release --no-run --test cuda).
    t=$(ls -t "$root"/target/release/deps/cuda-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$t" ] && strip -o "$dest/test-cuda" "$t"
    # NVRTC needs no GPU: compile every variant here (LD_LIBRARY_PATH must reach libnvrtc).
    XDG_CACHE_HOME="$dest/cache" "$dest/mqa-fuzz" gpu-precompile --arch sm_90a
    exit $?
fi
here="$(cd "$(dirname "$0")" && pwd)"
export XDG_CACHE_HOME="$here/cache"
bin="$here/mqa-fuzz"
log="${OUT:-/tmp}"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
"$bin" kernels | grep -A1 '^cuda:naive\|^cuda:tiled '
"$bin" gpu-selfcheck --cases "${CASES:-40}" --oracle-cases "${ORACLE_CASES:-40}" 2>&1 | tee "$log/selfcheck.log"
echo "selfcheck exit ${PIPESTATUS[0]}"
"$bin" bench oracle 2>&1 | tee "$log/bench-oracle.log"
echo "bench exit ${PIPESTATUS[0]}"
if [ -x "$here/test-cuda" ]; then
    MQA_FUZZ_WORKER_EXE="$bin" "$here/test-cuda" 2>&1 | grep -E 'SKIP|test |result' | tee "$log/test-cuda.log"
fi
# Short campaigns through the campaign engine: the clean kernel against the CPU one,
# and a planted bug found, shrunk and saved.
work=$(mktemp -d)
"$bin" run -k cuda:tiled -k cpu:chunked --profile "${PROFILE:-production}" --budget "${RUN_BUDGET:-45s}" --no-replay \
    --corpus "$work/corpus" --report "$work/clean" --seed 1 -q 2>&1 | tail -5
echo "campaign cuda:tiled exit $?"
"$bin" run -k cuda:bug-split-boundary-drop --profile production --budget "${BUG_BUDGET:-60s}" --shrink-budget 20s --no-replay \
    --corpus "$work/corpus" --report "$work/bug" --seed 2 -q 2>&1 | tail -5
echo "campaign cuda:bug-split-boundary-drop exit $?"
ls "$work/corpus" | head
cp "$work/clean/summary.md" "$log/campaign-clean.md" 2>/dev/null
cp "$work/bug/summary.md" "$log/campaign-bug.md" 2>/dev/null

# Determinism, batch invariance and crash localisation (self-contained; see the script).
if [ -f "$here/properties.sh" ]; then
    bash "$here/properties.sh" "$bin"
elif [ -f "$here/gpu/properties.sh" ]; then
    bash "$here/gpu/properties.sh" "$bin"
fi
