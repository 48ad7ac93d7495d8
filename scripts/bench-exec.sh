#!/usr/bin/env bash
# The worker protocol's cost on the CPU: the same campaign (--profile all, CASES cases,
# seed SEED, no shrinking) on the numpy adapter through an older binary and its adapters
# (OLD_BIN, OLD_ADAPTERS: e.g. a checkout of the previous release), through this build,
# and on the built-in cpu:chunked; prints cases/s and the ratios. Takes a few minutes on
# 2 cores (the old adapter is the slow part).
#
#   OLD_BIN=../old/target/release/mqa-fuzz OLD_ADAPTERS=../old/kernels/external scripts/bench-exec.sh
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
B="${MQA_FUZZ_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/mqa-fuzz}"
CASES=${CASES:-80} SEED=${SEED:-9}
W=$(mktemp -d)
one() { # name, binary, adapters dir, kernel
    local t0 t1
    t0=$(date +%s.%N)
    MQA_FUZZ_ADAPTERS="$3" "$2" run --kernel "$4" --profile all --cases "$CASES" --seed "$SEED" --no-replay \
        --no-shrink --corpus "$W/c-$1" --report "$W/r-$1" -q >"$W/$1.log" 2>&1
    t1=$(date +%s.%N)
    python3 - "$1" "$W/r-$1/report.json" "$t0" "$t1" <<'PY'
import json, sys
name, path, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(path))
n = r["counts"]["cases_generated"]
k = next(iter(r["per_kernel"].values()))
print(f"{name}: {n} cases in {t1 - t0:.1f} s = {n / (t1 - t0):.2f} cases/s; kernel clock {k['kernel_secs']:.1f} s, "
      f"runs {k['run_wall_secs']:.1f} s, generate {r['timings']['generate_secs']:.1f} s, findings {len(r['findings'])}")
open(sys.argv[2] + ".rate", "w").write(str(n / (t1 - t0)))
PY
}
date -u +"date: %Y-%m-%dT%H:%M:%SZ; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${OLD_BIN:-}" ] && one old "$OLD_BIN" "${OLD_ADAPTERS:?OLD_ADAPTERS}" numpy
one new "$B" "$root/kernels/external" numpy
one cpu "$B" "$root/kernels/external" cpu:chunked
rate() { cat "$W/r-$1/report.json.rate" 2>/dev/null || echo 0; }
python3 -c "
old, new, cpu = $(rate old), $(rate new), $(rate cpu)
if old: print(f'numpy adapter, this build / old: {new / old:.1f}x')
print(f'cpu:chunked / numpy adapter (this build): {cpu / new:.2f}x')
"
rm -rf "$W"
