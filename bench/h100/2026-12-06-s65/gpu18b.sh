#!/usr/bin/env bash
# Session 64: session 63's gpu18.sh trimmed (its stage-one-space-32 and vector-reduce rows dropped), to run
# right after gpu19s.sh on the warm machine.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g18
echo "== split variants $(date +%T)"
ARCHS=${ARCHS:-min_gru,gated_ssm,mamba}  # ARCHS=min_gru: ~90 s with the rest
timeout 200 python3 bench/microbench/stepkernel_variants.py --archs $ARCHS --base stepkernel-384-threads-split \
  --variants baseline,stage-one-space,384-threads-split+split-sums-kept,384-threads-split+split-slices-8,384-threads-split+split-slices-4,384-threads-split+split-slices-8+split-sums-kept,baseline,384-threads-fewer-phases \
  --out $OUT/g18/variants.json 2>&1 | grep -v Warn | tee $OUT/g18/variants.log
timeout 60 python3 bench/stepkernel.py --archs , --trace min_gru,mamba --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep -E "trace (min_gru|mamba)" | tee $OUT/g18/traces.log
echo "== split GPU tests (jamba's split program changed in session 63) $(date +%T)"
timeout 90 python3 -m pytest -v -m gpu -k "split" tests/gpu/test_stepkernel.py -p no:cacheprovider > $OUT/g18/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g18/tests.log | sed "s/.*:://"; tail -2 $OUT/g18/tests.log
echo "done $(date +%T)"
