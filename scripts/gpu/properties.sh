#!/usr/bin/env bash
# GPU checks of the properties beyond the reference (README "Determinism, batch
# invariance, --require") and of crash localisation, on an NVIDIA GPU:
#   1. selftest --backend cuda on the property plants (cuda:bug-nondeterministic,
#      cuda:bug-batch-variant: FOUND) and the clean CUDA kernels (0 findings with both
#      properties required);
#   2. a production-profile campaign with repeat 2 and batch invariance on, both
#      required, against $KERNEL (cuda:tiled; `KERNEL=deepgemm` for the real library);
#   3. a crash of a planted CUDA bug, shrunk and localised by compute-sanitizer memcheck.
#
# Usage: scripts/gpu/properties.sh [path/to/mqa-fuzz]
#   default binary: mqa-fuzz beside this script (a staged .gpu/cuda/), else
#   target/release/mqa-fuzz of the checkout.
# Env: OUT (logs; default /tmp), KERNEL (cuda:tiled), SELFTEST_BUDGET (30s per row),
#   PROD_BUDGET (120s), CRASH_KERNEL (cuda:bug-table-padding-read), FULL_SELFTEST=1 (every
#   CUDA planted bug, not only the property rows: about 30 minutes).
# Takes about 8 minutes with the defaults. Each step prints "properties step N exit C".
set -u
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-}"
if [ -z "$bin" ]; then
    if [ -x "$here/mqa-fuzz" ]; then bin="$here/mqa-fuzz"; else bin="$here/../../target/release/mqa-fuzz"; fi
fi
log="${OUT:-/tmp}"
work=$(mktemp -d)
kernel="${KERNEL:-cuda:tiled}"
# compute-sanitizer ships with the CUDA toolkit; find it where the toolkit usually lives.
if ! command -v compute-sanitizer >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/nvidia/*/compute-sanitizer; do
        if [ -x "$d/compute-sanitizer" ]; then PATH="$d:$PATH"; break; fi
    done
fi
echo "compute-sanitizer: $(command -v compute-sanitizer || echo 'not found (step 3 will say: not localised)')"

echo "== properties step 1: selftest --backend cuda (property plants, clean kernels)"
if [ "${FULL_SELFTEST:-0}" = 1 ]; then only=(); else
    only=(--only bug-nondeterministic --only bug-batch-variant --only cuda:tiled --only cuda:naive)
fi
"$bin" selftest --backend cuda --seeds 1 --budget "${SELFTEST_BUDGET:-30s}" "${only[@]}" 2>&1 | tee "$log/properties-selftest.log"
echo "properties step 1 exit ${PIPESTATUS[0]}"
# Expected: cuda:bug-nondeterministic ... FOUND nondeterministic, cuda:bug-batch-variant
# ... FOUND batch_variant, both "replay ok"; production rows REACHED; "clean cuda:tiled
# ... 0 finding(s)", "clean cuda:naive ... 0 finding(s)"; selftest PASSED (exit 0).

echo "== properties step 2: production campaign on $kernel, repeat 2, batch invariance, both required"
"$bin" run -k "$kernel" --profile production --repeat 2 --batch-invariance on \
    --require deterministic,batch-invariant --budget "${PROD_BUDGET:-120s}" --no-replay \
    --corpus "$work/corpus" --report "$work/prod" --seed 1 -q 2>&1 | tail -12 | tee "$log/properties-production.log"
echo "properties step 2 exit ${PIPESTATUS[0]}"
# Expected (a deterministic, batch-invariant kernel): exit 0 and the lines
#   <kernel>: bitwise deterministic on n/n cases (2 runs each)
#   <kernel>: batch-invariant on m/m cases (a sequence alone and the batch reversed, ...)
# A violation is exit 1 with a nondeterministic / batch_variant finding saved in
# $work/corpus (its first differing element and ulp spread in the finding).
cp "$work/prod/summary.md" "$log/properties-production.md" 2>/dev/null

crash="${CRASH_KERNEL:-cuda:bug-table-padding-read}"
echo "== properties step 3: a crash of $crash, shrunk, localised by memcheck"
"$bin" run -k "$crash" --profile layout --budget 180s --max-findings 1 --shrink-budget 30s \
    --no-replay --corpus "$work/crash-corpus" --report "$work/crash" --seed 1 2>&1 \
    | grep -E 'finding:|localised|FINDING|replay:' | tee "$log/properties-crash.log"
echo "properties step 3 exit ${PIPESTATUS[0]}"
# Expected: exit 1, "FINDING cuda:bug-table-padding-read [crash: ...]" and
#   localised: memcheck: Invalid __global__ read of size N bytes in tiled_logits+0x...
#   by thread (...) in block (...): address 0x... is out of bounds, ... bytes after|before
#   the nearest allocation (...)
# report.json: findings[0].localisation (kernel, access, size, address, thread, block,
# nearest_allocation, record). Without the tool: "not localised: <reason>".
python3 - "$work/crash/report.json" <<'EOF' 2>/dev/null | tee -a "$log/properties-crash.log"
import json, sys
r = json.load(open(sys.argv[1]))
for f in r["findings"]:
    print("localisation:", json.dumps(f.get("localisation"), indent=1) if f.get("localisation") else None,
          "| skipped:", f.get("localisation_skipped"))
EOF
cp "$work/crash/summary.md" "$log/properties-crash.md" 2>/dev/null
rm -rf "$work"
