#!/usr/bin/env bash
# Session 63, after gpu16.sh (bench/h100/2026-12-06-s63/g16/): the split kernels' readers were slow
# because of their staging code (stage-nothing 8.46 us against 18.81; Nsight Compute: no_inst
# stalls there, no long_sb), so runtime.cuh's ffk_ll_stage_wide is now range by range, its loads
# one unrolled copy (min_gru's split kernel 6,896 -> 3,592 SASS instructions), and the split
# tactics skew their partial sums' walks (skewed-partials: 18.81 -> 17.90). One call (~400 s):
# 1. stepkernel_variants.py on the new split kernels of min_gru and mamba: unroll 16 / 8 / 4,
#    4 a thread (stage-x4), unskewed, against fewer-phases.
# 2. trace of min_gru's new split kernel (where its time goes now).
# 3. split_products.py, the 5 archs the split saves levels in: launched and resident p50 / p99.
# 4. the split GPU tests, then memcheck and racecheck of the small cases (new device code).
# 5. Nsight Compute's stall samples of the new split kernel.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g17
echo "== variants $(date +%T)"
timeout 200 python3 bench/microbench/stepkernel_variants.py --archs min_gru,mamba --base stepkernel-384-threads-split \
  --variants baseline,stage-wide-8,stage-wide-4,stage-x4,384-threads-split-unskewed,baseline,384-threads-fewer-phases \
  --out $OUT/g17/variants.json 2>&1 | grep -v Warn | tee $OUT/g17/variants.log
timeout 60 python3 bench/stepkernel.py --archs , --trace min_gru --select stepkernel-384-threads-split --out /tmp/trace-split 2>&1 \
  | grep "trace min_gru" | tee $OUT/g17/traces.log
echo "== split_products $(date +%T)"
timeout 200 python3 bench/microbench/split_products.py --archs min_gru,min_lstm,gated_ssm,mamba,jamba --rounds 2 --steps 300 \
  --out $OUT/g17/split.json 2>&1 | grep -v Warn | tee $OUT/g17/split.log
echo "== GPU tests $(date +%T)"
timeout 110 python3 -m pytest -v -m gpu -k "split" tests/gpu/test_stepkernel.py -p no:cacheprovider > $OUT/g17/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g17/tests.log | sed 's/.*:://'; tail -2 $OUT/g17/tests.log
for tool in memcheck racecheck; do
  echo "== $tool: split products' small cases $(date +%T)"
  bash tests/gpu/sanitize.sh $tool /tmp/san -t 50 -k split_products_small tests/gpu/test_stepkernel.py 2>&1 | tail -2
done
echo "== ncu $(date +%T)"
timeout 100 ncu -k regex:ffk_step --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
  --sampling-interval 0 -f -o /tmp/ncu-split python3 bench/microbench/ncu_step.py min_gru stepkernel-384-threads-split 2>&1 | tail -2
ncu -i /tmp/ncu-split.ncu-rep --page source --print-source sass --csv > $OUT/g17/ncu-split-sass.csv 2>&1
echo "done $(date +%T)"
