#!/usr/bin/env bash
# Session 63, after gpu17.sh (bench/h100/2026-12-06-s63/g17/): with the compact staging the split
# kernels are correct and nearly as fast as fewer-phases (device us: min_gru 10.04 / 9.57, jamba
# 16.80 / 15.78, mamba 27.0 / 17.8), but their readers stage range by range (min_gru's head: three
# round trips, 1.5 us after its last partial sums). runtime.cuh's ffk_ll_stage_wide now takes the K
# ranges as one index space (all of a thread's words in flight at once; 4,776 SASS instructions
# against 3,816). One call (~300 s):
# 1. stepkernel_variants.py --base stepkernel-384-threads-split: one index space (baseline) against
#    range by range (stage-by-range), the partial sums read four at a time (vector-reduce), and
#    fewer-phases; min_gru, gated_ssm, jamba, mamba.
# 2. trace of min_gru's split kernel.
# 3. split_products.py, the 5 archs: launched and resident p50 / p99.
# 4. the split GPU tests; memcheck and racecheck of the small cases (new device code).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g18
echo "== variants $(date +%T)"
timeout 220 python3 bench/microbench/stepkernel_variants.py --archs min_gru,gated_ssm,jamba,mamba --base stepkernel-384-threads-split \
  --variants baseline,stage-by-range,384-threads-split+vector-reduce,baseline,384-threads-fewer-phases \
  --out $OUT/g18/variants.json 2>&1 | grep -v Warn | tee $OUT/g18/variants.log
timeout 60 python3 bench/stepkernel.py --archs , --trace min_gru --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep "trace min_gru" | tee $OUT/g18/traces.log
echo "== split_products $(date +%T)"
timeout 200 python3 bench/microbench/split_products.py --archs min_gru,min_lstm,gated_ssm,jamba,mamba --rounds 2 --steps 300 \
  --out $OUT/g18/split.json 2>&1 | grep -v Warn | tee $OUT/g18/split.log
echo "== GPU tests $(date +%T)"
timeout 110 python3 -m pytest -v -m gpu -k "split" tests/gpu/test_stepkernel.py -p no:cacheprovider > $OUT/g18/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g18/tests.log | sed 's/.*:://'; tail -2 $OUT/g18/tests.log
for tool in memcheck racecheck; do
  echo "== $tool: split products' small cases $(date +%T)"
  bash tests/gpu/sanitize.sh $tool /tmp/san -t 50 -k split_products_small tests/gpu/test_stepkernel.py 2>&1 | tail -2
done
echo "done $(date +%T)"
