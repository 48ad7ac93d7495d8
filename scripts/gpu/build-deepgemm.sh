#!/usr/bin/env bash
# Builds DeepGEMM 2.8.2 from its PyPI source distribution into /tmp/dgsite on an NVIDIA
# GPU machine without network (about 100 s). Sourced by the GPU scripts beside it:
#   DG_DIR=<folder with deepinfer_gemm-*.tar.gz and x/usr/include/elfutils> . build-deepgemm.sh
# Afterwards PYTHONPATH and LD_PRELOAD are set as DeepGEMM's JIT runtime needs them
# (docs/exec.md says why).
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if ! PYTHONPATH=/tmp/dgsite python3 -c 'import deep_gemm' 2>/dev/null; then
    rm -rf /tmp/dgsrc && mkdir -p /tmp/dgsrc && tar xzf "$DG_DIR"/deepinfer_gemm-*.tar.gz -C /tmp/dgsrc
    dg_t0=$(date +%s)
    (cd /tmp/dgsrc/* && CPATH="$DG_DIR/x/usr/include" DG_FORCE_BUILD=1 \
        python3 -m pip install --no-build-isolation --no-deps --no-index --target /tmp/dgsite . >"${OUT:-/tmp}/dg-build.log" 2>&1) ||
        { tail -30 "${OUT:-/tmp}/dg-build.log"; exit 3; }
    echo "DeepGEMM build: $(( $(date +%s) - dg_t0 )) s"
fi
export PYTHONPATH=/tmp/dgsite LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
