#!/bin/bash
# Queues a sharded campaign (a job array of SHARDS tasks) and its merge-and-gate job.
#   SHARDS=8 KERNEL=cuda:production BUDGET=20m ./submit.sh
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p logs
SHARDS=${SHARDS:-8}
array=$(sbatch --parsable --array=0-$((SHARDS - 1)) shard.sbatch)
array=${array%%;*}
export RUN_DIR=reports/slurm-$array
sbatch --dependency=afterany:"$array" --export=ALL,RUN_DIR="$RUN_DIR" merge.sbatch
echo "campaign $array: reports in $RUN_DIR, merged into $RUN_DIR/merged"
