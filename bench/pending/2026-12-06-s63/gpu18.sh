#!/usr/bin/env bash
# Session 63, after gpu17.sh (bench/h100/2026-12-06-s63/g17/): with the compact staging
# (runtime.cuh's ffk_ll_stage_wide range by range) the split kernels are correct and nearly as
# fast as fewer-phases (device us: min_gru 10.04 / 9.57, jamba 16.80 / 15.78, mamba 27.0 / 17.8),
# but their readers pay a round trip a range (min_gru's head: three, 1.5 us after its last
# partial sums). The variant stage-one-space (stepkernel_variants.STAGE_ONE_SPACE) takes the K
# ranges as one index space: every word of a thread's batch in flight together (4,776 SASS
# instructions in min_gru's split kernel against 3,816). Not run yet (the session's device time
# ran out on failed starts). One call (~120 s):
# 1. stepkernel_variants.py --base stepkernel-384-threads-split: range by range (baseline) against
#    one index space (16 and 32 words a thread in flight), the partial sums read four at a time
#    (vector-reduce), the residual stream kept and side-stored by the blocks that sum the partial
#    sums (split-sums-kept: min_gru's head stages 4,352 words, not 8,448), and fewer-phases;
#    min_gru, gated_ssm, jamba, mamba.
# 2. trace of min_gru's split kernel (range by range), for the phases the next change targets.
# If stage-one-space or split-sums-kept is faster: make it the default (runtime.cuh's
# ffk_ll_stage_wide, or SPLIT_SUMS_KEPT in the split tactics), then run the split GPU
# tests, memcheck and racecheck of the small cases and split_products.py (as gpu17.sh did).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g18
echo "== variants $(date +%T)"
timeout 300 python3 bench/microbench/stepkernel_variants.py --archs min_gru,gated_ssm,jamba,mamba --base stepkernel-384-threads-split \
  --variants baseline,stage-one-space,stage-one-space-32,384-threads-split+split-sums-kept,384-threads-split+vector-reduce,384-threads-split+split-slices-8,384-threads-split+split-slices-4,384-threads-split+split-slices-8+split-sums-kept,baseline,384-threads-fewer-phases \
  --out $OUT/g18/variants.json 2>&1 | grep -v Warn | tee $OUT/g18/variants.log
timeout 70 python3 bench/stepkernel.py --archs , --trace min_gru,mamba --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep -E "trace (min_gru|mamba)" | tee $OUT/g18/traces.log
echo "== split GPU tests (jamba's split program changed in session 63) $(date +%T)"
timeout 90 python3 -m pytest -v -m gpu -k "split" tests/gpu/test_stepkernel.py -p no:cacheprovider > $OUT/g18/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g18/tests.log | sed "s/.*:://"; tail -2 $OUT/g18/tests.log
echo "done $(date +%T)"
