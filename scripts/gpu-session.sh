#!/usr/bin/env bash
# Every GPU campaign of issues 5, 6 and 10 in one device session of two or three calls.
#
# A device call lasts at most 10 minutes, and the 10-minute cuda:tiled campaign alone
# fills one; so `start` measures what needs an idle machine (2-GPU scaling, the oracle
# benchmark), then launches the long campaigns as background chains (setsid: they
# outlive the call while the machine stays warm), and `wait` — the next call, made at
# once — waits for them and returns every report, log and saved case in $OUT.
#
# Here (CPU machine, repo root):
#   cargo build --release && scripts/gpu-session.sh --stage .
# There (device calls, `.gpu/run` carried; `start` on nvidia-h200-x2 for the scaling):
#   bash .gpu/run/gpu-session.sh start
#   bash /tmp/mq/gpu-session.sh wait 560       # again if it reports chains still running
#   bash .gpu/run/gpu-session.sh exec          # DeepGEMM campaigns + oracle tunings/ncu only
#
# Chains (GPU 1 when there are two, else everything on GPU 0):
#   tiled:   run cuda:tiled --profile all --budget 10m              (issue 6)
#   naive:   run cuda:naive --profile all --budget 5m; gpu-selfcheck (issue 5)
#   selftest: selftest --backend cuda                                (issue 5)
#   exec:    DeepGEMM 2.8.2 build; deepgemm and torch campaigns over the profiles their
#            capabilities allow; replay of every saved DeepGEMM case (issue 10)
set -u
if [ "${1:-}" = "--stage" ]; then
    root="$(cd "${2:?checkout root}" && pwd)"
    dest="$root/.gpu/run"
    src="$(cd "$(dirname "$0")/.." && pwd)"
    mkdir -p "$dest"
    strip -o "$dest/mqa-fuzz" "$src/target/release/mqa-fuzz" || exit 1
    cp "$0" "$dest/gpu-session.sh"
    rm -rf "$dest/external" && cp -r "$src/kernels/external" "$dest/external"
    if [ ! -d "$dest/dg/x/usr/include/elfutils" ]; then
        mkdir -p "$dest/dg"
        cp "${DG_SDIST:-$src/../shared/vendor/deepinfer_gemm-2.8.2.tar.gz}" "$dest/dg/" &&
            (cd "$dest/dg" && apt-get download libdw-dev libelf-dev && for f in *.deb; do dpkg -x "$f" x; done)
    fi
    # NVRTC needs no GPU: compile every kernel variant here (LD_LIBRARY_PATH must reach libnvrtc).
    rm -rf "$dest/cache"
    XDG_CACHE_HOME="$dest/cache" "$dest/mqa-fuzz" gpu-precompile --arch sm_90a || exit 1
    du -sh "$dest"
    exit 0
fi

W=/tmp/mq
B=$W/mqa-fuzz
export XDG_CACHE_HOME=$W/cache PYTHONUNBUFFERED=1 MQA_FUZZ_ADAPTERS=$W/external
export MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300

stamp() { date -u +%H:%M:%S; }

# Cases/s of a finished campaign report.
rate() {
    python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
n = r["counts"]["cases_generated"]; w = r["timings"]["wall_secs"]
print(f"{n} cases in {w:.1f} s = {n / w:.2f} cases/s")
EOF
}

# One campaign: name, then `run` arguments. Report in $W/r/<name>, corpus $W/c/<name>.
campaign() {
    local name=$1
    shift
    echo "[$(stamp)] campaign $name: mqa-fuzz run $*"
    "$B" run "$@" --no-replay --corpus "$W/c/$name" --report "$W/r/$name" -q >"$W/logs/$name.log" 2>&1
    local rc=$?
    echo "[$(stamp)] campaign $name exit $rc"
    grep -v '^mqa-fuzz: ' "$W/logs/$name.log" | tail -12
}

chain_tiled() {
    campaign tiled-all-10m --kernel cuda:tiled --profile all --budget 10m --seed 61 --gpus "$G1"
}

chain_naive() {
    campaign naive-all-5m --kernel cuda:naive --profile all --budget 5m --seed 51 --gpus 0
    echo "[$(stamp)] gpu-selfcheck"
    CUDA_VISIBLE_DEVICES=0 "$B" gpu-selfcheck --cases 15 --oracle-cases 40 >"$W/logs/gpu-selfcheck.log" 2>&1
    echo "[$(stamp)] gpu-selfcheck exit $?"
    grep -E 'FAIL|GPU oracle|selfcheck:' "$W/logs/gpu-selfcheck.log"
}

chain_selftest() {
    echo "[$(stamp)] selftest --backend cuda --budget 40s --seeds 1"
    CUDA_VISIBLE_DEVICES=0 "$B" selftest --backend cuda --budget 40s --seeds 1 >"$W/logs/selftest.log" 2>&1
    echo "[$(stamp)] selftest exit $?"
    cat "$W/logs/selftest.log"
}

chain_exec() {
    export CUDA_HOME=/usr/local/cuda CUDA_VISIBLE_DEVICES=$G1
    if ! PYTHONPATH=/tmp/dgsite python3 -c 'import deep_gemm' 2>/dev/null; then
        rm -rf /tmp/dgsrc && mkdir -p /tmp/dgsrc && tar xzf "$W"/dg/deepinfer_gemm-*.tar.gz -C /tmp/dgsrc
        local t0
        t0=$(date +%s)
        (cd /tmp/dgsrc/* && CPATH="$W/dg/x/usr/include" DG_FORCE_BUILD=1 \
            python3 -m pip install --no-build-isolation --no-deps --no-index --target /tmp/dgsite . >"$W/logs/dg-build.log" 2>&1) ||
            { echo "DeepGEMM build FAILED"; tail -30 "$W/logs/dg-build.log"; }
        echo "[$(stamp)] DeepGEMM build: $(($(date +%s) - t0)) s"
    fi
    export PYTHONPATH=/tmp/dgsite LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
    "$B" kernels | grep -A1 '^deepgemm\|^torch'
    for p in production layout hostile; do
        campaign "deepgemm-$p" --kernel deepgemm --profile $p --budget 60s --seed 71 --shrink-budget 60s
    done
    for f in "$W"/c/deepgemm-*/*.json; do
        [ -e "$f" ] || continue
        echo "[$(stamp)] mqa-fuzz replay --kernel deepgemm $f"
        "$B" replay --kernel deepgemm "$f" 2>&1 | tail -4
        echo "replay exit $?"
    done
    [ "${TORCH:-1}" = 1 ] || return 0
    for p in production layout hostile; do
        campaign "torch-$p" --kernel torch --profile $p --budget 45s --seed 81
    done
}

# Where the oracle kernel's time goes (Nsight Compute, one launch), when ncu is there.
profile_oracle() {
    local ncu
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$ncu" ] || { echo "ncu not found"; return 0; }
    echo "[$(stamp)] ncu on oracle_f64"
    CUDA_VISIBLE_DEVICES=0 timeout 240 "$ncu" --kernel-name oracle_f64 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section LaunchStats \
        "$B" bench oracle >"$W/logs/ncu-oracle.log" 2>&1
    echo "[$(stamp)] ncu exit $?"
    grep -v '^  \(cuda:tiled\|GPU oracle\)' "$W/logs/ncu-oracle.log" | grep -A400 'oracle_f64' | head -150
}

launch() {
    local name=$1
    setsid bash -c "source '$W/env.sh'; $name > '$W/logs/chain-$name.log' 2>&1; touch '$W/done/$name'" </dev/null >/dev/null 2>&1 &
    echo "[$(stamp)] launched chain $name"
}

pack() {
    mkdir -p "$OUT"
    (cd $W && find r c logs selftest -type f \( -size -3M -o -name '*.json' \) 2>/dev/null |
        grep -v '/pictures/' | tar czf "$OUT/results.tgz" -T -) 2>/dev/null
    for f in "$W"/logs/chain-*.log; do
        echo "===== $(basename "$f")"
        cat "$f"
    done >"$OUT/chains.txt"
    cp "$W/logs/start.log" "$OUT/start.log" 2>/dev/null
    ls -la "$OUT"
}

case "${1:-}" in
exec)
    # Second round for issue 10 (one GPU is enough): DeepGEMM campaigns, oracle tunings.
    rm -rf $W && mkdir -p $W/logs $W/done $W/r $W/c
    here="$(cd "$(dirname "$0")" && pwd)"
    cp -r "$here/mqa-fuzz" "$here/cache" "$here/external" "$here/dg" "$here/gpu-session.sh" $W/
    G1=0 TORCH=0
    {
        date -u +"date: %Y-%m-%dT%H:%M:%SZ"
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
        chain_exec >"$W/logs/chain-chain_exec.log" 2>&1 &
        exec_pid=$!
        echo "[$(stamp)] bench oracle"
        CUDA_VISIBLE_DEVICES=0 "$B" bench oracle 2>&1 | tee "$W/logs/bench-oracle.log"
        profile_oracle
        wait $exec_pid
        cat "$W/logs/chain-chain_exec.log"
    } 2>&1 | tee $W/logs/start.log
    pack
    ;;
start)
    rm -rf $W && mkdir -p $W/logs $W/done $W/r $W/c
    here="$(cd "$(dirname "$0")" && pwd)"
    cp -r "$here/mqa-fuzz" "$here/cache" "$here/external" "$here/dg" "$here/gpu-session.sh" $W/
    {
        date -u +"date: %Y-%m-%dT%H:%M:%SZ"
        nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
        ngpu=$(nvidia-smi -L | wc -l)
        echo "GPUs: $ngpu, CPUs: $(nproc), memory: $(free -g | awk '/Mem:/{print $2}') GiB"
        "$B" kernels | grep -E '^cuda:(naive|tiled) '
        G1=0
        if [ "$ngpu" -ge 2 ]; then
            G1=1
            # Issue 5: both GPUs used, cases/s roughly double. Same seed, same cases.
            for g in 0 all; do
                campaign "scaling-gpus-$g" --kernel cuda:tiled --profile production --budget 60s --seed 41 --gpus $g
                rate "$W/r/scaling-gpus-$g/report.json"
            done
        fi
        # Issue 6: the oracle tunings and the kernel, on an idle GPU.
        echo "[$(stamp)] bench oracle"
        CUDA_VISIBLE_DEVICES=0 "$B" bench oracle 2>&1 | tee "$W/logs/bench-oracle.log"
        echo "[$(stamp)] bench oracle exit ${PIPESTATUS[0]}"
        declare -f stamp rate campaign chain_tiled chain_naive chain_selftest chain_exec >$W/env.sh
        echo "W=$W B=$B G1=$G1; export XDG_CACHE_HOME MQA_FUZZ_ADAPTERS MQA_FUZZ_EXEC_TIMEOUT MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT PYTHONUNBUFFERED" >>$W/env.sh
        echo "export XDG_CACHE_HOME=$XDG_CACHE_HOME MQA_FUZZ_ADAPTERS=$MQA_FUZZ_ADAPTERS MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300 PYTHONUNBUFFERED=1" >>$W/env.sh
        for c in chain_tiled chain_naive chain_selftest chain_exec; do launch $c; done
    } 2>&1 | tee $W/logs/start.log
    pack
    ;;
wait)
    deadline=$(($(date +%s) + ${2:-560}))
    while [ "$(ls $W/done | wc -l)" -lt 4 ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    echo "[$(stamp)] chains done: $(ls $W/done | tr '\n' ' ')"
    for c in chain_tiled chain_naive chain_selftest chain_exec; do
        [ -e "$W/done/$c" ] || echo "STILL RUNNING: $c (call wait again)"
    done
    pack
    ;;
*)
    echo "usage: $0 --stage ROOT | start | wait [SECONDS] | exec" >&2
    exit 2
    ;;
esac
