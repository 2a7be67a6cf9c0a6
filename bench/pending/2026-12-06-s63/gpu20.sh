#!/usr/bin/env bash
# Session 64: gpu19.sh and gpu18.sh in one call (machine starts were scarce: five refused before
# this), the resident rows first. Each part under its own timeout, the whole under ~560 s.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g19 $OUT/g18
echo "== resident variants $(date +%T)"
timeout 280 python3 bench/microbench/resident_variants.py --archs min_gru,mamba,gated_ssm,min_lstm --rounds 3 \
  --variants default,tagged-outputs,tagged-outputs-16,tagged-outputs-32 --sms 66,33 --out $OUT/g19/resident.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/resident.log
echo "== split variants $(date +%T)"
timeout 150 python3 bench/microbench/stepkernel_variants.py --archs min_gru,gated_ssm,mamba --base stepkernel-384-threads-split \
  --variants baseline,stage-one-space,384-threads-split+split-sums-kept,384-threads-split+split-slices-8,384-threads-split+split-slices-4,384-threads-split+split-slices-8+split-sums-kept,baseline,384-threads-fewer-phases \
  --out $OUT/g18/variants.json 2>&1 | grep -v Warn | tee $OUT/g18/variants.log
timeout 50 python3 bench/stepkernel.py --archs , --trace min_gru,mamba --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep -E "trace (min_gru|mamba)" | tee $OUT/g18/traces.log
echo "== split GPU tests (jamba's split program changed in session 63) $(date +%T)"
timeout 75 python3 -m pytest -v -m gpu -k "split" tests/gpu/test_stepkernel.py -p no:cacheprovider > $OUT/g18/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g18/tests.log | sed "s/.*:://"; tail -2 $OUT/g18/tests.log
echo "done $(date +%T)"
