#!/usr/bin/env bash
# The GPU checks of mqa-fuzz, on one machine with NVIDIA GPUs. CI has no GPU, so run them
# after changing a CUDA kernel, an adapter or the production profile, and before a release.
#
#   scripts/gpu-check.sh [CHECK...]            (default: quick)
#
# CHECK       takes                      runs
# quick       ~5 min, 1 GPU              `mqa-fuzz kernels`; `gpu-selfcheck` (the CUDA kernels against
#                                        the CPU reference on random cases, every planted bug caught, the
#                                        GPU reference bit-identical to the CPU, the device generator
#                                        byte-identical to the CPU materialiser, block tables expanded from
#                                        their padding rule equal to the generator's, the device judge's verdicts
#                                        equal to the CPU judge's, the production case in time);
#                                        `bench gpu`; the GPU integration tests (tests/cuda.rs);
#                                        a 45 s cuda:tiled vs cpu:chunked campaign and a 60 s campaign on
#                                        a planted bug (found, shrunk, saved)
# production  ~8 min, 1 GPU, ~90 GiB     `--profile production` at full size (engine-sized KV pools):
#                                        cuda:tiled, cuda:bug-offset32-kv (also with OLD_BIN, an older
#                                        binary, for a before/after), the real DeepGEMM 2.8.2
# deepgemm    ~2 min build + ~3 min      DeepGEMM 2.8.2 built from its PyPI sdist; tests/exec_gpu.rs on
#                                        deepgemm and torch (KERNELS to change); replay of DIR/cases/*.json
# campaigns   ~25 min, 1-2 GPUs          with 2 GPUs, 1-vs-2-GPU scaling (60 s each); `bench gpu` (with
#                                        the int8 and f64 tensor-core peaks when nvcc is installed, and
#                                        Nsight Compute on the reference kernel when ncu is installed);
#                                        then in parallel: cuda:tiled 10 min and cuda:naive 5 min on
#                                        --profile all, gpu-selfcheck, `selftest --backend cuda`, DeepGEMM
#                                        and torch campaigns over each profile, replay of DeepGEMM's cases
# properties  ~8 min, 1 GPU              determinism, batch invariance and crash localisation
#                                        (scripts/gpu/properties.sh): `selftest --backend cuda` on the
#                                        property plants and the clean kernels, a production campaign
#                                        with both properties required, a crash localised by memcheck
# findings    ~8 min, 1 GPU              findings are bugs: the CUDA double-bug selftest row (while
#                                        DeepGEMM builds); DeepGEMM over --profile all for BUDGET s
#                                        (200), each bug its own finding with trigger and tier
# speed       ~2 min build + WARMUP      real-kernel speed, the old binary (OLD_BIN, default ./mqa-fuzz-old,
#             (45 s) + 4 x BUDGET (100 s) with its adapters in OLD_ADAPTERS) beside this one on the same
#                                        seeds (DG_ARGS, WARM_UP_AB, STEADY, DG_WORKERS, KNOWN, KNOWN_AB, DG_NEW, JIT_PASS, JIT_CASES, OLD_LAST: see
#                                        check_speed):
#                                        DeepGEMM over PROFILES (all production; none: skip
#                                        DeepGEMM), and cuda:tiled (an isolated worker) over TILED_PROFILES
#                                        (all), DeepGEMM's JIT warmed first (scripts/gpu/deepgemm_jit.py,
#                                        JIT_SCRIPT=0 skips it, then a WARMUP s campaign of seed
#                                        WARMUP_SEED (5); WARMUP=0 skips); cases/s, restarts,
#                                        compile time, tokens per case; then
#                                        `bench judge` (the CPU judge, old and new, on this host) and
#                                        `bench host` (the request path of production cases)
# restarts    ~2 min build + RUNS /      DeepGEMM campaigns that crash and restart their worker all
#             PARALLEL x BUDGET          along: RUNS (5) campaigns of BUDGET s (180) over PROFILE (all),
#             (~10 min)                  seeds SEED+1.. (SEED 20), PARALLEL (2) at a time on the GPU, one
#                                        worker each; fails unless every one ran its whole budget (no
#                                        stopped_early, no exit 3); restarts, their retries, mean and max.
#                                        Keep PARALLEL at 2: five crashing campaigns at once took an
#                                        H100 down (full-chip reset) within three minutes
# hosted      ~2 min (+ DeepGEMM build   adapters served hosted (libmqa_fuzz.so in the adapter's process
#             with KERNELS=deepgemm)     lays cases out and judges them on the device): the torch adapter
#                                        hosted and over the plain protocol on the same CASES (25) cases
#                                        must give the same findings; the adapter's planted store into its
#                                        KV cache reported as input_mutated with the cache handed read-only
#                                        and read back (MQA_FUZZ_CACHE_CHECK); with KERNELS=deepgemm, DeepGEMM's
#                                        saved cases (REPLAY, a directory of corpus files) replayed hosted
#                                        must reproduce
# all         ~60 min                    every check above
#
# Needs: an NVIDIA driver and NVRTC from CUDA 13 (docs/cuda.md); for production, deepgemm and
# campaigns also python3 with torch, numpy and safetensors, nvcc, DeepGEMM's source distribution
# (DG_SDIST, default ../shared/vendor/deepinfer_gemm-2.8.2.tar.gz) and the libdw/libelf headers
# (docs/exec.md). Built binaries: `cargo build --release && cargo test --release --no-run
# --test cuda --test exec_gpu`.
#
# A GPU machine without a Rust toolchain or network: on a build machine,
#   scripts/gpu-check.sh --stage DIR
# copies the binaries, this script, the adapters, every kernel precompiled by NVRTC and the
# DeepGEMM sources into DIR (DG_SAVED=D: also D's dgsite.tgz and jit-cache.tgz, see DG_SAVE);
# copy DIR over and run DIR/gpu-check.sh [CHECK...] there.
#
# Output: every check prints what it finds; logs, reports and saved cases go under $OUT
# (default: a new temporary directory, printed). Knobs: CASES, REFERENCE_CASES, GENERATOR_CASES, JUDGE_CASES, PROFILE,
# RUN_BUDGET, BUG_BUDGET (quick); BUDGET, SEED, OLD_BIN (production); KERNELS (deepgemm);
# BUDGET, SEED, OLD_BIN, OLD_ADAPTERS, PROFILES, TILED_BUDGET (0: none), TILED_PROFILES, TILED_ARGS,
# HOST_BENCH (0: no `bench judge`/`bench host`) (speed; session 11's device-path comparison: PROFILES=none TILED_BUDGET=30 SEED=11
# TILED_PROFILES="production all" TILED_ARGS="--repeat 1 --batch-invariance off");
# TORCH=0 skips the torch campaigns. DG_SAVE=DIR saves DeepGEMM's build (dgsite.tgz) and JIT
# cache (jit-cache.tgz) there; put them in DIR/dg/ of a later staging and that machine (same
# image) skips the ~2 min build and DeepGEMM's nvcc for the kernels already compiled.
set -u
here="$(cd "$(dirname "$0")" && pwd)"

if [ "${1:-}" = "--stage" ]; then
    dest="$(mkdir -p "${2:?usage: $0 --stage DIR}" && cd "$2" && pwd)"
    root="$(cd "$here/.." && pwd)"
    newest() { ls -t "${CARGO_TARGET_DIR:-$root/target}"/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -1; }
    strip -o "$dest/mqa-fuzz" "${CARGO_TARGET_DIR:-$root/target}/release/mqa-fuzz" || exit 1
    # What adapters load to be served hosted (kernels/external/hosted.py).
    strip --strip-unneeded -o "$dest/libmqa_fuzz.so" "${CARGO_TARGET_DIR:-$root/target}/release/libmqa_fuzz.so" || exit 1
    for t in cuda exec_gpu; do
        f=$(newest $t)
        [ -n "$f" ] && strip -o "$dest/test-$t" "$f"
    done
    [ -n "${OLD_BIN:-}" ] && strip -o "$dest/mqa-fuzz-old" "$OLD_BIN"
    cp "$0" "$dest/gpu-check.sh"
    mkdir -p "$dest/gpu" && cp "$here"/gpu/*.sh "$here"/gpu/*.py "$here"/gpu/*.cu "$dest/gpu/"
    rm -rf "$dest/external" && cp -r "$root/kernels/external" "$dest/external"
    mkdir -p "$dest/dg"
    if [ ! -d "$dest/dg/x/usr/include/elfutils" ]; then
        cp "${DG_SDIST:-$root/../shared/vendor/deepinfer_gemm-2.8.2.tar.gz}" "$dest/dg/" &&
            (cd "$dest/dg" && apt-get download libdw-dev libelf-dev && for f in *.deb; do dpkg -x "$f" x; done)
    fi
    # DG_SAVED=DIR: a DeepGEMM build and JIT cache that an earlier DG_SAVE=DIR brought back.
    for f in dgsite.tgz jit-cache.tgz; do
        [ -n "${DG_SAVED:-}" ] && [ -f "$DG_SAVED/$f" ] && cp "$DG_SAVED/$f" "$dest/dg/$f" && echo "staged $f"
    done
    # NVRTC needs no GPU: compile every kernel variant here (LD_LIBRARY_PATH must reach libnvrtc).
    rm -rf "$dest/cache"
    XDG_CACHE_HOME="$dest/cache" "$dest/mqa-fuzz" gpu-precompile --arch sm_90a || exit 1
    du -sh "$dest"
    exit 0
fi

# Where everything is: a staged directory, or a checkout with its release build.
if [ -x "$here/mqa-fuzz" ]; then
    B="$here/mqa-fuzz" adapters="$here/external" dg_dir="$here/dg" gdir="$here/gpu"
    test_bin() { [ -x "$here/test-$1" ] && echo "$here/test-$1"; }
    export XDG_CACHE_HOME="$here/cache"
else
    root="$(cd "$here/.." && pwd)"
    B="${MQA_FUZZ_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/mqa-fuzz}" adapters="$root/kernels/external" dg_dir="$root/.dg"
    gdir="$here/gpu"
    test_bin() { ls -t "${CARGO_TARGET_DIR:-$root/target}"/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -1; }
fi
[ -x "$B" ] || { echo "no mqa-fuzz binary at $B: cargo build --release first" >&2; exit 2; }
W="${OUT:-$(mktemp -d)}"
mkdir -p "$W/logs" "$W/r" "$W/c"
echo "output in $W"
export PYTHONUNBUFFERED=1 MQA_FUZZ_ADAPTERS="$adapters"
export MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300

stamp() { date -u +%H:%M:%S; }

machine() {
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
}

# One campaign: name, then `run` arguments. Report in $W/r/<name>, corpus in $W/c/<name>.
campaign() {
    local name=$1 t0
    shift
    t0=$(date +%s)
    echo "[$(stamp)] campaign $name: mqa-fuzz run $*"
    # CORPUS_OF=NAME: run on campaign NAME's corpus (its signatures known, so not shrunk again).
    "${BIN:-$B}" run "$@" --no-replay --corpus "$W/c/${CORPUS_OF:-$name}" --report "$W/r/$name" -q >"$W/logs/$name.log" 2>&1
    local rc=$? # before anything else runs: "$(stamp)" in the line below would reset $?
    echo "[$(stamp)] campaign $name exit $rc in $(($(date +%s) - t0)) s"
    grep -v '^mqa-fuzz: ' "$W/logs/$name.log" | tail -12
    python3 - "$W/r/$name/report.json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1])); n = r["counts"]["cases_generated"]; w = r["timings"]["wall_secs"]
c, k = r["counts"], next(iter(r["per_kernel"].values()), {})
run = k.get("cases", n)  # the first kernel's cases run (its skips apart)
print(f"   {n} cases in {w:.1f} s = {n / max(w, 1e-9):.2f} cases/s; {run} run by {next(iter(r['per_kernel']), '-')} "
      f"= {run / max(w, 1e-9):.2f}/s, {k.get('skipped', 0)} skipped; drawn, not run: "
      f"{c.get('cases_not_run_known_crash', 0)} predicted crashes, {c.get('cases_below_min_tokens', 0)} under --min-tokens")
ax = r["coverage"]["axes"]
for a in ("kv_offsets", "out_offsets", "batch", "context", "rows", "workspace", "pool", "mtp", "block_size"):
    if a in ax: print(f"   {a}: " + ", ".join(f"{k} {v}" for k, v in ax[a].items()))
PY
}

# DeepGEMM 2.8.2 from its source distribution (about 100-140 s), unless it is built already;
# then PYTHONPATH and LD_PRELOAD as its JIT runtime needs them (docs/exec.md).
# A build saved earlier on a machine of the same image (dg/dgsite.tgz, from DG_SAVE) is
# unpacked instead (seconds), and DeepGEMM's JIT cache starts from dg/jit-cache.tgz where
# one was saved: its kernels then need no nvcc on this machine.
deepgemm_env() {
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    local site=${DG_SITE:-/tmp/dgsite}
    imports() { LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 PYTHONPATH=$site python3 -c 'import deep_gemm' 2>/dev/null; }
    export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dgjit}
    if [ -f "$dg_dir/jit-cache.tgz" ] && [ ! -d "$DG_JIT_CACHE_DIR/cache" ]; then
        mkdir -p "$DG_JIT_CACHE_DIR" && tar xzf "$dg_dir/jit-cache.tgz" -C "$DG_JIT_CACHE_DIR" &&
            echo "[$(stamp)] DeepGEMM JIT cache: $(ls "$DG_JIT_CACHE_DIR/cache" | wc -l) entries from $dg_dir/jit-cache.tgz"
    fi
    if [ -f "$dg_dir/dgsite.tgz" ] && ! imports; then
        mkdir -p "$site" && tar xzf "$dg_dir/dgsite.tgz" -C "$site" &&
            echo "[$(stamp)] DeepGEMM: the build saved in $dg_dir/dgsite.tgz"
        imports || {
            echo "the saved build does not import here: building"
            rm -rf "$site"
        }
    fi
    if ! imports; then
        local sdist t0
        sdist=$(ls "$dg_dir"/deepinfer_gemm-*.tar.gz 2>/dev/null | head -1)
        sdist=${sdist:-${DG_SDIST:-$here/../../shared/vendor/deepinfer_gemm-2.8.2.tar.gz}}
        rm -rf /tmp/dgsrc && mkdir -p /tmp/dgsrc && tar xzf "$sdist" -C /tmp/dgsrc || return 3
        t0=$(date +%s)
        (cd /tmp/dgsrc/* && CPATH="$dg_dir/x/usr/include${CPATH:+:$CPATH}" DG_FORCE_BUILD=1 \
            python3 -m pip install --no-build-isolation --no-deps --no-index --target "$site" . >"$W/logs/dg-build.log" 2>&1) ||
            { echo "DeepGEMM build FAILED"; tail -30 "$W/logs/dg-build.log"; return 3; }
        echo "[$(stamp)] DeepGEMM build: $(($(date +%s) - t0)) s"
        [ -n "${DG_SAVE:-}" ] && mkdir -p "$DG_SAVE" && tar czf "$DG_SAVE/dgsite.tgz" -C "$site" . &&
            echo "DeepGEMM's build saved: $DG_SAVE/dgsite.tgz ($(du -h "$DG_SAVE/dgsite.tgz" | cut -f1))"
    fi
    export PYTHONPATH=$site LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
}

# `bench gpu`, the tensor-core ceilings it is held to (scripts/gpu/mma_peak.cu, where nvcc
# is), and where the reference kernel's time goes (Nsight Compute, one launch).
bench() {
    echo "[$(stamp)] bench gpu"
    CUDA_VISIBLE_DEVICES=0 "$B" bench gpu 2>&1 | tee "$W/logs/bench-gpu.log"
    echo "[$(stamp)] bench gpu exit ${PIPESTATUS[0]}"
    local nvcc
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    if [ -n "$nvcc" ] && "$nvcc" -arch=sm_90a -O3 "$gdir/mma_peak.cu" -o "$W/mma_peak"; then
        CUDA_VISIBLE_DEVICES=0 "$W/mma_peak" 2>&1 | tee "$W/logs/mma-peak.log"
    fi
    local ncu
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$ncu" ] || return 0
    CUDA_VISIBLE_DEVICES=0 timeout 240 "$ncu" --kernel-name reference_f64 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section LaunchStats \
        "$B" bench gpu >"$W/logs/ncu-reference.log" 2>&1
    local rc=$?
    echo "[$(stamp)] ncu exit $rc"
    grep -A400 'reference_f64' "$W/logs/ncu-reference.log" | head -150
}

check_quick() {
    machine
    "$B" kernels | grep -A1 '^cuda:naive\|^cuda:tiled '
    "$B" gpu-selfcheck --cases "${CASES:-40}" --reference-cases "${REFERENCE_CASES:-40}" \
        --generator-cases "${GENERATOR_CASES:-200}" --judge-cases "${JUDGE_CASES:-210}" 2>&1 | tee "$W/logs/selfcheck.log"
    echo "selfcheck exit ${PIPESTATUS[0]}"
    "$B" bench gpu 2>&1 | tee "$W/logs/bench-gpu.log"
    echo "bench exit ${PIPESTATUS[0]}"
    local t
    t=$(test_bin cuda)
    if [ -n "$t" ]; then
        MQA_FUZZ_WORKER_EXE="$B" "$t" 2>&1 | grep -E 'SKIP|test |result' | tee "$W/logs/test-cuda.log"
    fi
    # Through the campaign engine: the clean kernel against the CPU one, and a planted bug
    # found, shrunk and saved.
    campaign quick-clean -k cuda:tiled -k cpu:chunked --profile "${PROFILE:-production}" --budget "${RUN_BUDGET:-45s}" --seed 1
    campaign quick-bug -k cuda:bug-split-boundary-drop --profile production --budget "${BUG_BUDGET:-60s}" --shrink-budget 20s --seed 2
    ls "$W/c/quick-bug" | head
}

check_production() {
    machine
    local budget="${BUDGET:-120}"
    # DeepGEMM builds on the CPU cores while the CUDA campaigns use the GPU.
    (deepgemm_env >"$W/logs/dg-env.txt" 2>&1) &
    local dg=$!
    SEED="${SEED:-1}"
    campaign prod-tiled -k cuda:tiled --profile production --seed "$SEED" --budget "${budget}s"
    local old="${OLD_BIN:-}"
    [ -z "$old" ] && [ -x "$here/mqa-fuzz-old" ] && old="$here/mqa-fuzz-old"
    if [ -n "$old" ]; then
        BIN="$old" campaign prod-bug-old -k cuda:bug-offset32-kv --profile production --seed "$SEED" --budget 60s --max-findings 1 --shrink-budget 20s
    fi
    campaign prod-bug -k cuda:bug-offset32-kv --profile production --seed "$SEED" --budget 60s --max-findings 1 --shrink-budget 20s
    wait $dg
    cat "$W/logs/dg-env.txt"
    deepgemm_env || return 3
    campaign prod-deepgemm -k deepgemm --profile production --seed "$SEED" --budget "${budget}s" --shrink-budget 30s
}

check_deepgemm() {
    machine
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
    deepgemm_env || return 3
    "$B" kernels | grep -A1 '^deepgemm\|^torch'
    local t
    t=$(test_bin exec_gpu)
    if [ -n "$t" ]; then
        MQA_FUZZ_GPU=1 MQA_FUZZ_GPU_KERNELS="${KERNELS:-deepgemm,torch}" "$t" --nocapture --test-threads 1 2>&1 | tee "$W/logs/exec-gpu.log"
        echo "exec_gpu exit ${PIPESTATUS[0]}"
    fi
    # The command users run: replay corpus-style files on the real kernel.
    if [ -n "$(ls "$here"/cases/*.json 2>/dev/null)" ]; then
        "$B" replay --kernel deepgemm "$here"/cases/*.json 2>&1 | tee "$W/logs/replay.log"
        echo "replay exit ${PIPESTATUS[0]}"
    fi
}

# The long campaigns, each chain on its own GPU where there are two.
chain_tiled() { campaign tiled-all-10m --kernel cuda:tiled --profile all --budget 10m --seed 61 --gpus "$G1"; }
chain_naive() {
    campaign naive-all-5m --kernel cuda:naive --profile all --budget 5m --seed 51 --gpus 0
    echo "[$(stamp)] gpu-selfcheck"
    CUDA_VISIBLE_DEVICES=0 "$B" gpu-selfcheck --cases 15 --reference-cases 40 >"$W/logs/gpu-selfcheck.log" 2>&1
    local rc=$?
    echo "[$(stamp)] gpu-selfcheck exit $rc"
    grep -E 'FAIL|GPU reference|selfcheck:' "$W/logs/gpu-selfcheck.log"
}
chain_selftest() {
    echo "[$(stamp)] selftest --backend cuda --budget 40s --seeds 1"
    CUDA_VISIBLE_DEVICES=0 "$B" selftest --backend cuda --budget 40s --seeds 1 >"$W/logs/selftest.log" 2>&1
    local rc=$?
    echo "[$(stamp)] selftest exit $rc"
    cat "$W/logs/selftest.log"
}
chain_exec() {
    export CUDA_VISIBLE_DEVICES=$G1
    deepgemm_env || return 3
    "$B" kernels | grep -A1 '^deepgemm\|^torch'
    for p in production layout hostile; do
        campaign "deepgemm-$p" --kernel deepgemm --profile $p --budget 60s --seed 71 --shrink-budget 60s
    done
    for f in "$W"/c/deepgemm-*/*.json; do
        [ -e "$f" ] || continue
        echo "[$(stamp)] mqa-fuzz replay --kernel deepgemm $f"
        "$B" replay --kernel deepgemm "$f" 2>&1 | tail -4
        echo "replay exit ${PIPESTATUS[0]}"
    done
    [ "${TORCH:-1}" = 1 ] || return 0
    for p in production layout hostile; do
        campaign "torch-$p" --kernel torch --profile $p --budget 45s --seed 81
    done
}

check_campaigns() {
    machine
    local ngpu
    ngpu=$(nvidia-smi -L | wc -l)
    echo "GPUs: $ngpu, CPUs: $(nproc), memory: $(free -g | awk '/Mem:/{print $2}') GiB"
    "$B" kernels | grep -E '^cuda:(naive|tiled) '
    G1=0
    if [ "$ngpu" -ge 2 ]; then
        G1=1
        # Both GPUs used: cases/s roughly double. Same seed, same cases.
        for g in 0 all; do
            campaign "scaling-gpus-$g" --kernel cuda:tiled --profile production --budget 60s --seed 41 --gpus $g
        done
    fi
    bench # on an idle GPU, before the chains start
    local c pids=()
    for c in chain_tiled chain_naive chain_selftest chain_exec; do
        $c >"$W/logs/$c.log" 2>&1 &
        pids+=($!)
        echo "[$(stamp)] started $c"
    done
    wait "${pids[@]}"
    for c in chain_tiled chain_naive chain_selftest chain_exec; do
        echo "===== $c"
        cat "$W/logs/$c.log"
    done
}

check_properties() {
    machine
    OUT="$W/logs" bash "$gdir/properties.sh" "$B"
}

check_findings() {
    machine
    # The CUDA double-bug row (two planted bugs of one class, each found by its own
    # signature) while DeepGEMM builds on the CPU cores.
    "$B" selftest --backend cuda --only "${DOUBLE:-offset32-kv+scale-before-relu}" --seeds 1 \
        >"$W/logs/selftest-double.log" 2>&1 &
    local st=$! rc
    deepgemm_env || return 3
    wait $st
    rc=$?
    echo "[$(stamp)] selftest (CUDA double-bug row) exit $rc"
    cat "$W/logs/selftest-double.log"
    # DeepGEMM over --profile all: each bug a finding of its own, with trigger and tier.
    campaign findings-deepgemm --kernel deepgemm --profile all --budget "${BUDGET:-200}" \
        --seed "${SEED:-71}" --scale "${SCALE:-1/16}" --shrink-budget 30s
    python3 - "$W/r/findings-deepgemm/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"   {len(r['findings'])} distinct bugs")
for f in r["findings"]:
    print(f"   - {f['signature']}  tier {f['tier']}  {f['needs']}  x{f['occurrences']}  "
          f"{f['rows']} rows x {f['tokens']} tokens  picture={'yes' if f.get('picture') else 'no'}")
PY
    return $rc
}

# Worker restarts under a real library's crashes: no campaign may end early on one.
check_restarts() {
    machine
    deepgemm_env || return 3
    local runs=${RUNS:-5} par=${PARALLEL:-2} t=${BUDGET:-180} seed=${SEED:-20} i pids=()
    for i in $(seq 1 "$runs"); do
        MQA_FUZZ_EXEC_WORKERS=1 campaign "restarts-$i" --kernel deepgemm --profile "${PROFILE:-all}" \
            --budget "$t" --seed "$((seed + i))" --repeat 1 --batch-invariance off >"$W/logs/restarts-$i.out" 2>&1 &
        pids+=($!)
        if [ ${#pids[@]} -ge "$par" ]; then
            wait "${pids[0]}"
            pids=("${pids[@]:1}")
        fi
    done
    wait
    cat "$W"/logs/restarts-*.out
    python3 - "$W/r" "$runs" "$t" <<'PY'
import json, os, sys
root, runs, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
bad = 0
for i in range(1, runs + 1):
    p = os.path.join(root, f"restarts-{i}", "report.json")
    if not os.path.exists(p):
        print(f"restarts-{i}: NO REPORT"); bad += 1; continue
    r = json.load(open(p))
    w = (r["kernels"][0].get("worker") or {})
    k = next(iter(r["per_kernel"].values()))
    early = r.get("stopped_early") or r.get("interrupted")
    bad += bool(early)
    print(f"restarts-{i}: {r['timings']['wall_secs']:.0f} s of {budget:.0f}, {k['cases']} cases run, "
          f"{len(r['findings'])} findings; restarts {w.get('restarts')} (retries {w.get('restart_retries')}, "
          f"mean {w.get('restart_mean_secs', 0):.3f} s, max {w.get('restart_max_secs', 0):.3f} s); "
          f"stopped early: {early or 'no'}")
print(f"{runs - bad} of {runs} campaigns ran their whole budget")
sys.exit(1 if bad else 0)
PY
}

# Real-kernel speed: the same campaigns on the old binary and this one, side by side.
check_speed() {
    machine
    local old=${OLD_BIN:-$here/mqa-fuzz-old} olda=${OLD_ADAPTERS:-$here/external-old}
    [ "${PROFILES:-}" = none ] || deepgemm_env || return 3
    local t=${BUDGET:-100} seed=${SEED:-9} p
    [ -x "$old" ] || echo "no old binary at $old: this binary alone"
    if [ "${PROFILES:-}" != none ] && [ "${WARMUP:-45}" != 0 ]; then
        # DeepGEMM compiles with nvcc per shape (about 2 s each, once per machine): warm
        # its JIT first, or whichever binary runs first pays for both.
        # JIT_SCRIPT=0 skips the per-batch-size script; WARMUP_SEED=$SEED warms the keys
        # the timed campaigns visit (their shape epochs follow the seed), not seed 5's.
        if [ "${JIT_SCRIPT:-1}" != 0 ]; then
            python3 "$gdir/deepgemm_jit.py" warm-up 2>&1 | tee "$W/logs/deepgemm-jit.log" | tail -2
            python3 "$gdir/deepgemm_jit.py" fresh-process 2>&1 | tee -a "$W/logs/deepgemm-jit.log" | tail -2
        fi
        MQA_FUZZ_EXEC_WORKERS=${WARMUP_WORKERS:-1} \
            campaign speed-warmup-dg --kernel deepgemm --profile all --budget "${WARMUP:-45}" --seed "${WARMUP_SEED:-5}" >/dev/null
    fi
    # DG_ARGS: more `run` arguments for the DeepGEMM campaigns ("--repeat 1 --batch-invariance
    # off": the case path without the property re-runs). WARM_UP_AB=1: this binary also with
    # its workers' warm-up off (MQA_FUZZ_WARM_UP=off), a same-binary before/after. STEADY=1:
    # this binary once more on its own corpus (signatures known: a nightly's steady state).
    # DG_NEW=0: not this binary's run with the default pool (DG_WORKERS below times pools).
    # KNOWN=1: each DeepGEMM run below starts from a copy of the warm-up campaign's corpus
    # (the bugs it found known, as in a nightly); with WARMUP=0, of the JIT pass's.
    known_copy() {
        [ "${KNOWN:-0}" = 1 ] || return 0
        local src="$W/c/speed-warmup-dg"
        [ -d "$src" ] || src="$W/c/speed-jitpass-dg-$p"
        if [ ! -d "$src" ] || [ "$src" = "$W/c/$1" ]; then
            echo "KNOWN=1: no warm-up or JIT-pass corpus yet: $1 starts without one"
            return 0
        fi
        rm -rf "$W/c/$1" && cp -r "$src" "$W/c/$1"
    }
    for p in ${PROFILES:-all production}; do
        [ "$p" = none ] && continue
        # JIT_PASS=1: this binary once, untimed, on the timed runs' seed: DeepGEMM compiles
        # its scheduler per batch size rounded up to 32 as well as per compile key, so a
        # warm-up of another seed leaves the first timed run to pay nvcc for the batch sizes
        # only the runs' seed visits. The pass stops at JIT_CASES cases (default 80 a second
        # of the timed budget: more than a warm run generates) or 4 budgets: it compiles as it
        # goes, so a pass of twice the budget reached fewer cases than the timed run did.
        if [ "${JIT_PASS:-0}" = 1 ]; then
            known_copy "speed-jitpass-dg-$p"
            # shellcheck disable=SC2086
            campaign "speed-jitpass-dg-$p" --kernel deepgemm --profile "$p" --budget "$((t * 4))" \
                --cases "${JIT_CASES:-$((t * 80))}" --seed "$seed" ${DG_ARGS:-}
        fi
        # OLD_LAST=1: the old binary after this binary's runs, not before (a machine whose
        # GPU stops answering mid-check then still has this binary's figures).
        old_run() {
            known_copy "speed-old-dg-$p"
            # shellcheck disable=SC2086
            [ -x "$old" ] && MQA_FUZZ_ADAPTERS="$olda" BIN="$old" \
                campaign "speed-old-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$seed" ${DG_ARGS:-}
        }
        [ "${OLD_LAST:-0}" = 1 ] || old_run
        # shellcheck disable=SC2086
        [ "${WARM_UP_AB:-0}" = 1 ] && MQA_FUZZ_WARM_UP=off \
            campaign "speed-nowarm-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$seed" ${DG_ARGS:-}
        known_copy "speed-new-dg-$p"
        # shellcheck disable=SC2086
        [ "${DG_NEW:-1}" = 1 ] && campaign "speed-new-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$seed" ${DG_ARGS:-}
        # KNOWN_AB=1: this binary again running every case predicted to hit a known crash
        # (`--known-crashes 1`), a same-binary before/after.
        if [ "${KNOWN_AB:-0}" = 1 ]; then
            known_copy "speed-allcrashes-dg-$p"
            # shellcheck disable=SC2086
            campaign "speed-allcrashes-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$seed" ${DG_ARGS:-} --known-crashes 1
        fi
        # DG_WORKERS="1 2": this binary again with that many DeepGEMM workers sharing the GPU
        # (MQA_FUZZ_EXEC_WORKERS), each serving its own cases; KNOWN=1: each starts from a
        # copy of the warm-up campaign's corpus (the bugs it found known, as in a nightly).
        for w in ${DG_WORKERS:-}; do
            known_copy "speed-w$w-dg-$p"
            # shellcheck disable=SC2086
            MQA_FUZZ_EXEC_WORKERS=$w campaign "speed-w$w-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$seed" ${DG_ARGS:-}
        done
        [ "${OLD_LAST:-0}" = 1 ] && old_run
        # shellcheck disable=SC2086
        [ "${STEADY:-0}" = 1 ] && CORPUS_OF="speed-new-dg-$p" \
            campaign "speed-steady-dg-$p" --kernel deepgemm --profile "$p" --budget "$t" --seed "$((seed + 1))" ${DG_ARGS:-}
    done
    local tt=${TILED_BUDGET:-45}
    if [ "$tt" != 0 ]; then
        # TILED_ARGS: more `run` arguments, e.g. "--repeat 1 --batch-invariance off" to
        # time the case path without the property re-runs.
        for p in ${TILED_PROFILES:-all}; do
            # shellcheck disable=SC2086
            [ -x "$old" ] && BIN="$old" campaign "speed-old-tiled-$p" --kernel cuda:tiled --profile "$p" --budget "$tt" --seed "$seed" ${TILED_ARGS:-}
            # shellcheck disable=SC2086
            campaign "speed-new-tiled-$p" --kernel cuda:tiled --profile "$p" --budget "$tt" --seed "$seed" ${TILED_ARGS:-}
        done
    fi
    # HOST_BENCH=0: skip the host benches (a call short of time).
    if [ "${HOST_BENCH:-1}" != 0 ]; then
        "$B" bench judge 2>&1 | tee "$W/logs/bench-judge.log"
        "$B" bench host 2>&1 | tee "$W/logs/bench-host.log"
    fi
    python3 - "$W"/r/speed-* <<'PY'
import json, os, statistics, sys
for d in sys.argv[1:]:
    try:
        r = json.load(open(os.path.join(d, "report.json")))
    except OSError:
        continue
    n, w = r["counts"]["cases_generated"], r["timings"]["wall_secs"]
    tok = []
    for line in open(os.path.join(d, "cases.jsonl")):
        lens = json.loads(line)["recipe"]["lens"]
        v = next(iter(lens.values()))
        tok.append(sum(max(x) if isinstance(x, list) else x for x in v))
    k = next(iter(r["per_kernel"].values()))
    extra = {key: val for key, val in k.items() if "compile" in key or "first" in key or "steady" in key}
    workers = [x.get("worker") for x in r["kernels"] if x.get("worker")]
    first, firsts = {}, 0  # the phases of each worker life's first case, summed
    try:
        for line in open(os.path.join(d, "timings.jsonl")):
            for run in json.loads(line)["runs"]:
                ph = {p: v for p, v in run["phases_ms"].items() if p.endswith("[first case of a worker]")}
                firsts += bool(ph)
                for p, v in ph.items():
                    first[p.replace(" [first case of a worker]", "")] = first.get(p.replace(" [first case of a worker]", ""), 0) + v
    except OSError:
        pass
    # Where the campaign's time went, summed over its cases: top-level steps and the
    # phases each run reports (harness and worker), largest first.
    steps, phases, runs = {}, {}, 0
    try:
        for line in open(os.path.join(d, "timings.jsonl")):
            rec = json.loads(line)
            for key, val in rec.items():
                if key.endswith("_ms") and isinstance(val, (int, float)):
                    steps[key] = steps.get(key, 0) + val
            for run in rec.get("runs", []):
                runs += 1
                steps["run_ms"] = steps.get("run_ms", 0) + run.get("run_ms", 0)
                for p, v in run["phases_ms"].items():
                    p = p.replace(" [first case of a worker]", "")
                    phases[p] = phases.get(p, 0) + v
    except OSError:
        pass
    print(f"   {os.path.basename(d)} summed over {runs} runs (s): " + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in sorted(steps.items(), key=lambda x: -x[1])))
    print("   phases (s): " + ", ".join(f"{p} {v / 1e3:.1f}" for p, v in sorted(phases.items(), key=lambda x: -x[1])[:12]))
    top = ", ".join(f"{p} {v / max(firsts, 1):.1f}" for p, v in sorted(first.items(), key=lambda x: -x[1])[:6])
    print(f"{os.path.basename(d)}: {n} cases in {w:.0f} s = {n / max(w, 1e-9):.2f} cases/s "
          f"({k.get('cases', n)} run by the kernel = {k.get('cases', n) / max(w, 1e-9):.2f}/s); "
          f"kernel clock {k.get('kernel_secs', 0) - k.get('unclocked_secs', 0):.1f} s "
          f"(+ {k.get('unclocked_secs', 0):.1f} s over {k.get('unclocked_runs', 0)} runs without one), runs {k.get('run_wall_secs', 0):.1f} s, "
          f"shrink {r['timings'].get('shrink_secs', 0):.1f} s; tokens/case min {min(tok, default=0)} "
          f"median {int(statistics.median(tok)) if tok else 0}; findings {len(r['findings'])}; "
          f"stopped_early {r.get('stopped_early')}; {extra}; workers {workers}")
    print(f"   first cases of a life: {firsts}, ms each by phase: {top}")
    c = r["counts"]
    print(f"   known crashes: {c.get('cases_not_run_known_crash', 0)} cases not run; {c.get('known_crashes', {})}")
PY
}

check_hosted() {
    machine
    [ -f "$(dirname "$B")/libmqa_fuzz.so" ] || { echo "no libmqa_fuzz.so beside $B"; return 2; }
    local seed=${SEED:-3} n=${CASES:-25} k
    MQA_FUZZ_HOSTED=on campaign hosted-torch-on --kernel torch --profile all --cases "$n" --seed "$seed" --budget 300s --shrink-budget 10s
    MQA_FUZZ_HOSTED=off campaign hosted-torch-off --kernel torch --profile all --cases "$n" --seed "$seed" --budget 300s --shrink-budget 10s
    python3 - "$W/r/hosted-torch-on" "$W/r/hosted-torch-off" <<'PY' || return 1
import json, sys
def load(d):
    r = json.load(open(d + "/report.json"))
    k = next(iter(r["per_kernel"].values()))
    return r, sorted(f["signature"] for f in r["findings"]), k
(on, fon, kon), (off, foff, koff) = load(sys.argv[1]), load(sys.argv[2])
for name, r, f, k in (("hosted", on, fon, kon), ("plain", off, foff, koff)):
    print(f"{name}: {r['counts']} findings {f}; runs {k.get('run_wall_secs', 0):.1f} s, kernel {k.get('kernel_secs', 0):.1f} s")
print("same findings hosted and plain" if fon == foff else "DIFFERENT findings hosted and plain")
sys.exit(0 if fon == foff and on["counts"]["cases_generated"] == off["counts"]["cases_generated"] else 1)
PY
    # A library that stores into its KV cache (the torch adapter's planted bug), hosted:
    # handed the cache read-only (the default: its store faults, the case runs again
    # writable) and read back after the run, both must report input_mutated.
    local planted="exec:python3 $adapters/torch_adapter.py --plant-store-into-cache" cc
    for cc in read-only read-back; do
        MQA_FUZZ_HOSTED=on MQA_FUZZ_CACHE_CHECK=$cc campaign "store-into-cache-$cc" --kernel "$planted" \
            --profile production --cases 3 --seed "$seed" --no-shrink --repeat 1 --batch-invariance off
        python3 - "$W/r/store-into-cache-$cc" "$cc" <<'PY' || return 1
import json, sys
r = json.load(open(sys.argv[1] + "/report.json"))
k = next(iter(r["per_kernel"].values()))
classes = sorted({f["signature"].split("|")[1] for f in r["findings"]})
print(f"{sys.argv[2]}: finding classes {classes}; runs {k.get('run_wall_secs', 0):.1f} s")
sys.exit(0 if classes == ["input_mutated"] else 1)
PY
    done
    for k in ${KERNELS:-}; do
        [ "$k" = deepgemm ] && { deepgemm_env || return 3; }
        for f in "${REPLAY:-$here/cases}"/*.json; do
            [ -f "$f" ] || continue
            echo "[$(stamp)] replay hosted --kernel $k $(basename "$f")"
            MQA_FUZZ_HOSTED=on "$B" replay --kernel "$k" "$f" 2>&1 | tail -4
            echo "replay exit ${PIPESTATUS[0]}"
        done
    done
}

checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(quick)
[ "${checks[*]}" = all ] && checks=(quick production deepgemm campaigns properties findings speed)
status=0
for c in "${checks[@]}"; do
    case "$c" in
    quick | production | deepgemm | campaigns | properties | findings | speed | hosted | restarts)
        echo "===== check $c"
        "check_$c" 2>&1 | tee "$W/logs/check-$c.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        ;;
    *)
        echo "unknown check $c (quick, production, deepgemm, campaigns, properties, findings, speed, hosted, restarts, all)" >&2
        exit 2
        ;;
    esac
done
# DG_SAVE=DIR: DeepGEMM's JIT cache as the checks left it, for dg/jit-cache.tgz next time.
if [ -n "${DG_SAVE:-}" ] && [ -d "${DG_JIT_CACHE_DIR:-/tmp/dgjit}/cache" ]; then
    mkdir -p "$DG_SAVE" && tar czf "$DG_SAVE/jit-cache.tgz" -C "${DG_JIT_CACHE_DIR:-/tmp/dgjit}" cache &&
        echo "DeepGEMM's JIT cache saved: $DG_SAVE/jit-cache.tgz ($(du -h "$DG_SAVE/jit-cache.tgz" | cut -f1))"
fi
echo "logs, reports and saved cases: $W"
exit $status
