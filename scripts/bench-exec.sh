#!/usr/bin/env bash
# The worker protocol's cost on the CPU: the same campaign (PROFILE, default all; CASES
# cases, seed SEED, no shrinking) on the numpy adapter and on the built-in cpu:chunked
# served by a worker process (`exec:mqa-fuzz worker --kernel cpu:chunked`, the path every
# cuda: kernel's worker takes), through an older binary and its adapters (OLD_BIN,
# OLD_ADAPTERS: e.g. a checkout of the previous release) and through this build, then
# cpu:chunked in this process; prints cases/s, where the calls' time went, and the
# ratios. Takes a few minutes on 2 cores.
#
#   OLD_BIN=../old/target/release/mqa-fuzz OLD_ADAPTERS=../old/kernels/external scripts/bench-exec.sh
#   PROFILE=production CASES=30 scripts/bench-exec.sh
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
B="${MQA_FUZZ_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/mqa-fuzz}"
CASES=${CASES:-80} SEED=${SEED:-9} PROFILE=${PROFILE:-all}
W=$(mktemp -d)
one() { # name, binary, adapters dir, kernel
    local t0 t1
    t0=$(date +%s.%N)
    MQA_FUZZ_ADAPTERS="$3" "$2" run --kernel "$4" --profile "$PROFILE" --cases "$CASES" --seed "$SEED" --no-replay \
        --no-shrink --corpus "$W/c-$1" --report "$W/r-$1" -q >"$W/$1.log" 2>&1
    t1=$(date +%s.%N)
    python3 - "$1" "$W/r-$1/report.json" "$t0" "$t1" <<'PY'
import json, sys
name, path, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(path))
n = r["counts"]["cases_generated"]
k = next(iter(r["per_kernel"].values()))
rest = k["run_wall_secs"] - k.get("output_setup_secs", 0) - k["kernel_secs"]
print(f"{name}: {n} cases in {t1 - t0:.1f} s = {n / (t1 - t0):.2f} cases/s; runs {k['run_wall_secs']:.1f} s = "
      f"output buffer {k.get('output_setup_secs', 0):.1f} s + kernel clock {k['kernel_secs']:.1f} s + "
      f"protocol {max(rest, 0):.1f} s; generate {r['timings']['generate_secs']:.1f} s, findings {len(r['findings'])}")
ph = k.get("call_phases") or {}
if ph:
    print("    by phase: " + ", ".join(f"{p} {t:.2f} s" for p, t in sorted(ph.items(), key=lambda x: -x[1])))
open(sys.argv[2] + ".rate", "w").write(str(n / (t1 - t0)))
PY
}
worker() { echo "exec:$1 worker --kernel cpu:chunked"; }
date -u +"date: %Y-%m-%dT%H:%M:%SZ; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); --profile $PROFILE --cases $CASES --seed $SEED"
if [ -n "${OLD_BIN:-}" ]; then
    one old-numpy "$OLD_BIN" "${OLD_ADAPTERS:?OLD_ADAPTERS}" numpy
    one old-worker "$OLD_BIN" "$OLD_ADAPTERS" "$(worker "$OLD_BIN")"
fi
one new-numpy "$B" "$root/kernels/external" numpy
one new-worker "$B" "$root/kernels/external" "$(worker "$B")"
one cpu "$B" "$root/kernels/external" cpu:chunked
rate() { cat "$W/r-$1/report.json.rate" 2>/dev/null || echo 0; }
python3 -c "
r = {k: float(v) for k, v in [('on', '$(rate old-numpy)'), ('ow', '$(rate old-worker)'), ('nn', '$(rate new-numpy)'), ('nw', '$(rate new-worker)'), ('cpu', '$(rate cpu)')]}
if r['on']: print(f\"numpy adapter, this build / old: {r['nn'] / r['on']:.2f}x\")
if r['ow']: print(f\"built-in worker, this build / old: {r['nw'] / r['ow']:.2f}x\")
print(f\"cpu:chunked in process / numpy adapter (this build): {r['cpu'] / r['nn']:.2f}x\")
print(f\"cpu:chunked in process / through a worker (this build): {r['cpu'] / r['nw']:.2f}x\")
"
rm -rf "$W"
