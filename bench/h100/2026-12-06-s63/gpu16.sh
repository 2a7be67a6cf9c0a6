#!/usr/bin/env bash
# Session 63, after gpu15.sh (bench/h100/2026-12-06-s63/g15/): the split products' readers spend
# 2-7 us staging partial sums that level_cost.cu's splitk rows stage in ~0.25 us more than a plain
# level (min_gru's head: phase 0 14,199 cycles, task 3's 6,837). Where that time goes:
# 1. stepkernel_variants.py on the split kernel (--base stepkernel-384-threads-split): staging 4 a
#    thread (stage-x4), without waiting (stage-no-wait), not at all (stage-nothing), no task waiting
#    for its copies (no-copy-wait), the partial sums' bank conflicts gone (skewed-partials); the
#    fewer-phases kernel beside them. The timing-only rows' outputs differ (their diff is printed).
# 2. Nsight Compute's per-instruction stall samples of the split kernel and the fewer-phases one.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g16
echo "== variants $(date +%T)"
timeout 200 python3 bench/microbench/stepkernel_variants.py --archs min_gru --base stepkernel-384-threads-split \
  --variants baseline,stage-x4,stage-no-wait,stage-nothing,no-copy-wait,skewed-partials,baseline,384-threads-fewer-phases \
  --out $OUT/g16/variants.json 2>&1 | grep -v Warn | tee $OUT/g16/variants.log
for tactic in stepkernel-384-threads-split stepkernel-384-threads-fewer-phases; do
  echo "== ncu $tactic $(date +%T)"
  timeout 150 ncu -k regex:ffk_step --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
    --section SchedulerStats -f -o /tmp/ncu-$tactic python3 bench/microbench/ncu_step.py min_gru $tactic 2>&1 | tail -3
  ncu -i /tmp/ncu-$tactic.ncu-rep --page source --print-source sass --csv > $OUT/g16/ncu-$tactic-sass.csv 2>&1
  ncu -i /tmp/ncu-$tactic.ncu-rep --page details > $OUT/g16/ncu-$tactic-details.txt 2>&1
  wc -c $OUT/g16/ncu-$tactic-*
done
