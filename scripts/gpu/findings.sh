#!/usr/bin/env bash
# Findings are bugs, on one NVIDIA GPU: the real DeepGEMM 2.8.2 over `--profile all`
# (each bug a finding of its own, with its trigger and tier) and the CUDA double-bug
# selftest row (two planted bugs of one class in `cuda:tiled`, each found by its own
# signature). About 9 minutes on an H200: DeepGEMM's build (~2.5 min, CPU) overlaps
# the selftest row; then a BUDGET-second campaign plus its shrinking.
#
# On a machine with Rust (no GPU needed):
#   cargo build --release && scripts/gpu/findings.sh --stage <checkout>
# On the GPU machine, from the checkout root, with <checkout>/.bin/findings copied along:
#   bash .bin/findings/findings.sh          # BUDGET=300 SEED=71 SCALE=1/16 to change
# Reports, corpora and logs go to $OUT (or /tmp/findings-out).
set -u
if [ "${1:-}" = "--stage" ]; then
    dest="${2:?checkout root}/.bin/findings"
    root="$(cd "$(dirname "$0")/../.." && pwd)"
    mkdir -p "$dest/dg"
    strip -o "$dest/mqa-fuzz" "${CARGO_TARGET_DIR:-$root/target}/release/mqa-fuzz" || exit 1
    cp "$0" "$(dirname "$0")/build-deepgemm.sh" "$dest/"
    "$root/scripts/gpu/build-deepgemm.sh" --stage "$dest" || exit 1
    du -sh "$dest"
    exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$here/mqa-fuzz"
out="${OUT:-/tmp/findings-out}"; mkdir -p "$out"
export XDG_CACHE_HOME=/tmp/mq-cache PYTHONUNBUFFERED=1 MQA_FUZZ_ADAPTERS="$root/kernels/external"
export MQA_FUZZ_EXEC_TIMEOUT=300 MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT=300
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# The CUDA double-bug row while DeepGEMM builds on the CPU cores.
( cd "$out" && "$bin" selftest --backend cuda --only "${DOUBLE:-offset32-kv+scale-before-relu}" \
    --seeds 1 > selftest-double.txt 2>&1; echo "selftest exit $?" >> selftest-double.txt ) &
st=$!
t0=$(date +%s)
DG_DIR="$here/dg" . "$here/build-deepgemm.sh"
echo "DeepGEMM ready after $(( $(date +%s) - t0 )) s"
wait $st; echo "== selftest, CUDA double-bug row"; cat "$out/selftest-double.txt"
t0=$(date +%s)
( cd "$out" && "$bin" run --kernel deepgemm --profile all --budget "${BUDGET:-300}" --seed "${SEED:-71}" \
    --scale "${SCALE:-1/16}" --no-replay --corpus corpus --report report > run.txt 2>&1 )
echo "== deepgemm --profile all: exit $? in $(( $(date +%s) - t0 )) s"; tail -40 "$out/run.txt"
python3 - "$out/report/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['counts']['cases_generated']} cases in {r['timings']['wall_secs']:.0f} s; {len(r['findings'])} distinct bugs")
for f in r["findings"]:
    print(f"- {f['signature']}  tier {f['tier']}  {f['needs']}  x{f['occurrences']}  "
          f"{f['rows']} rows x {f['tokens']} tokens  complete={f['trigger_complete']}  picture={'yes' if f.get('picture') else 'no'}")
PY
