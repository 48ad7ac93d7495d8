#!/usr/bin/env bash
# DeepGEMM 2.8.2 from its PyPI source distribution, for an NVIDIA GPU machine without
# network. Used by the GPU scripts beside it, in two halves:
#   (here, with network)  scripts/gpu/build-deepgemm.sh --stage DEST
#       copies the sdist and libdw/libelf headers into DEST/dg
#   (there)               DG_DIR=DEST/dg . build-deepgemm.sh
#       builds into /tmp/dgsite (about 100-140 s) unless it is there already, then sets
#       PYTHONPATH and LD_PRELOAD as DeepGEMM's JIT runtime needs them (docs/exec.md).
if [ "${1:-}" = "--stage" ]; then
    dest="${2:?destination}/dg"
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    mkdir -p "$dest"
    if [ ! -d "$dest/x/usr/include/elfutils" ]; then
        cp "${DG_SDIST:-$root/../shared/vendor/deepinfer_gemm-2.8.2.tar.gz}" "$dest/" &&
        (cd "$dest" && apt-get download libdw-dev libelf-dev && for f in *.deb; do dpkg -x "$f" x; done)
    fi
    return 0 2>/dev/null || exit 0
fi
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
