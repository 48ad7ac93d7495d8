#!/usr/bin/env bash
# The real DeepGEMM (and the torch adapter) on an H200, through the worker protocol.
#
# Here (CPU machine, repo root of the checkout the device tool sends):
#   scripts/gpu/deepgemm.sh --stage <checkout>     # binary, test driver, adapters, DeepGEMM sdist + libdw headers
# There (device call with `.gpu/exec` carried):
#   bash .gpu/exec/deepgemm.sh                     # builds DeepGEMM 2.8.2 (~100 s), runs tests/exec_gpu.rs
# See /work/shared/DEEPGEMM.md (or docs/exec.md) for why each step is needed.
set -u
if [ "${1:-}" = "--stage" ]; then
    dest="${2:?checkout root}/.gpu/exec"
    root="$(cd "$(dirname "$0")/../.." && pwd)"
    mkdir -p "$dest/dg"
    (cd "$root" && cargo build --release -q && cargo test --release -q --test exec_gpu --no-run) || exit 1
    strip -o "$dest/mqa-fuzz" "$root/target/release/mqa-fuzz"
    t=$(ls -t "$root"/target/release/deps/exec_gpu-* | grep -v '\.d$' | head -1)
    strip -o "$dest/exec_gpu" "$t"
    rm -rf "$dest/external" && cp -r "$root/kernels/external" "$dest/external"
    cp "$0" "$(dirname "$0")/build-deepgemm.sh" "$dest/"
    "$root/scripts/gpu/build-deepgemm.sh" --stage "$dest" || exit 1
    du -sh "$dest"
    exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
log="${OUT:-/tmp}"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
DG_DIR="$here/dg" . "$here/build-deepgemm.sh"
export MQA_FUZZ_ADAPTERS="$here/external" MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300
export MQA_FUZZ_GPU=1 MQA_FUZZ_GPU_KERNELS="${KERNELS:-deepgemm,torch}" PYTHONUNBUFFERED=1
"$here/mqa-fuzz" kernels | grep -A1 '^deepgemm\|^torch'
"$here/exec_gpu" --nocapture --test-threads 1 2>&1 | tee "$log/exec-gpu.log"
echo "exec_gpu exit ${PIPESTATUS[0]}"
# The command users run: replay a corpus-style file on the real kernel.
if [ -n "$(ls "$here"/cases/*.json 2>/dev/null)" ]; then
    "$here/mqa-fuzz" replay --kernel deepgemm "$here"/cases/*.json 2>&1 | tee "$log/replay.log"
    echo "replay exit ${PIPESTATUS[0]}"
fi
