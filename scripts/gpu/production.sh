#!/usr/bin/env bash
# The production profile (an engine's pools, strides, batches and workspaces at full
# size) on one NVIDIA GPU: the clean CUDA kernel, the CUDA kernel with the 32-bit KV
# offset bug (before/after binaries side by side when an older one is staged), and the
# real DeepGEMM 2.8.2 through its adapter. About 8 minutes on an H200; needs ~90 GiB of
# device memory (the KV pools are engine-sized).
#
# On a machine with Rust (no GPU needed):
#   cargo build --release && scripts/gpu/production.sh --stage <checkout> [OLD_BINARY]
# On the GPU machine, from the checkout root, with <checkout>/.bin/prod copied along:
#   bash .bin/prod/production.sh            # BUDGET=120 SEED=1 to change
# Reports and logs go to $OUT (or /tmp/prod-out).
set -u
if [ "${1:-}" = "--stage" ]; then
    dest="${2:?checkout root}/.bin/prod"
    root="$(cd "$(dirname "$0")/../.." && pwd)"
    mkdir -p "$dest/dg"
    strip -o "$dest/mqa-fuzz" "$root/target/release/mqa-fuzz" || exit 1
    [ -n "${3:-}" ] && strip -o "$dest/mqa-fuzz-old" "$3"
    rm -rf "$dest/external" && cp -r "$root/kernels/external" "$dest/external"
    cp "$0" "$(dirname "$0")/build-deepgemm.sh" "$dest/"
    "$root/scripts/gpu/build-deepgemm.sh" --stage "$dest" || exit 1
    du -sh "$dest"
    exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/prod-out}"; mkdir -p "$out"
budget="${BUDGET:-120}"; seed="${SEED:-1}"
export XDG_CACHE_HOME=/tmp/mq-cache PYTHONUNBUFFERED=1 MQA_FUZZ_ADAPTERS="$here/external"
export MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# DeepGEMM builds on the CPU cores while the CUDA campaigns use the GPU.
( DG_DIR="$here/dg" . "$here/build-deepgemm.sh" > "$out/dg-build.txt" 2>&1 ) &
dg=$!
campaign() { # name binary args...
    local name=$1 bin=$2; shift 2
    local t0=$(date +%s)
    "$bin" run "$@" --profile production --seed "$seed" --no-replay -q \
        --corpus "/tmp/prod/$name/corpus" --report "/tmp/prod/$name/report" > "$out/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $(( $(date +%s) - t0 )) s"; cat "$out/$name.txt"
    python3 - "/tmp/prod/$name/report/report.json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1])); n = r["counts"]["cases_generated"]; w = r["timings"]["wall_secs"]
ax = r["coverage"]["axes"]
print(f"   {n} cases in {w:.1f} s = {n / max(w, 1e-9):.2f} cases/s")
for a in ("kv_offsets", "out_offsets", "batch", "context", "rows", "workspace", "pool", "mtp", "block_size"):
    if a in ax: print(f"   {a}: " + ", ".join(f"{k} {v}" for k, v in ax[a].items()))
PY
}
campaign tiled "$here/mqa-fuzz" -k cuda:tiled --budget "${budget}s"
if [ -x "$here/mqa-fuzz-old" ]; then
    campaign bug-old "$here/mqa-fuzz-old" -k cuda:bug-offset32-kv --budget 60s --max-findings 1 --shrink-budget 20s
fi
campaign bug "$here/mqa-fuzz" -k cuda:bug-offset32-kv --budget 60s --max-findings 1 --shrink-budget 20s
wait $dg; cat "$out/dg-build.txt"
export PYTHONPATH=/tmp/dgsite LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
campaign deepgemm "$here/mqa-fuzz" -k deepgemm --budget "${budget}s" --shrink-budget 30s
ls /tmp/prod/*/corpus 2>/dev/null | head -20
