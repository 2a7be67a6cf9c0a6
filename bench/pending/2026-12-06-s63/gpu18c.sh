#!/usr/bin/env bash
# Session 64: gpu18b.sh cut to ~90 s, for what device time is left after gpu19s.sh on a warm
# machine: the split variants on min_gru only, and its split kernel's trace.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g18
echo "== split variants $(date +%T)"
timeout 70 python3 bench/microbench/stepkernel_variants.py --archs min_gru --base stepkernel-384-threads-split \
  --variants baseline,stage-one-space,384-threads-split+split-sums-kept,384-threads-split+split-slices-8,384-threads-split+split-slices-4,baseline,384-threads-fewer-phases \
  --out $OUT/g18/variants.json 2>&1 | grep -v Warn | tee $OUT/g18/variants.log
timeout 30 python3 bench/stepkernel.py --archs , --trace min_gru --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep -E "trace min_gru" | tee $OUT/g18/traces.log
echo "done $(date +%T)"
