#!/usr/bin/env bash
# Session 62, after gpu14.sh short (bench/h100/2026-12-06-s62/g14/: split products correct but
# 1.6-2.1x slower in device time, min_gru 9.52 -> 15.66 us, mamba 18.14 -> 38.18). Session 62 then
# made the readers stage the P x N partial sums 16 words a thread in flight (runtime.cuh's
# ffk_ll_stage_wide, codegen.stage_unroll: one L2 round trip instead of four). One call on an H100,
# from the repository root, after the wheel install (~500 s):
#   bash bench/pending/2026-12-06-s62/gpu15.sh
# 1. Traces (bench/stepkernel.py --trace: each task's enter / ready / exit, its phases' cycles) of
#    min_gru's kernel without and with the split: where the split's time goes.
# 2. split_products.py, every arch the split saves levels in: fewer-phases against split (with the
#    wide staging), launched and resident, device time; then min_gru with at most 8 and 4 slices.
# 3. The split GPU tests (7 at embed 256, 2 small: the small ones stage through ffk_ll_stage_wide)
#    and test_driver_replay_matches_torch_replay (fixed in session 62).
# 4. compute-sanitizer memcheck and racecheck of the small cases (ffk_ll_stage_wide is new device
#    code that the CPU's emulation does not run: emu.h stages word by word).
# Keep the split tactics out of the timed build (fusion.UNTIMED_TACTICS) unless 2 shows them faster
# launched and resident at p50 and p99 with parity, 3 passes and 4 is clean.
# 0. level_cost.cu's splitk rows (session 62): what a level costs whose readers stage P x 256
#    partial sums (P = 16 / 8 / 4, 4 loads a thread at a time or all at once), against block mode's
#    level (stages 256): a split pays only below two block levels.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g15
(cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/level_cost level_cost.cu) && \
  timeout 100 /tmp/level_cost 1000 2>&1 | tee $OUT/g15/level_cost.log
for select in stepkernel-384-threads-fewer-phases stepkernel-384-threads-split; do
  timeout 60 python3 bench/stepkernel.py --archs , --trace min_gru --select $select --out $OUT/g15/trace-$select 2>&1 \
    | grep "trace min_gru" | tee -a $OUT/g15/traces.log
done
echo "== split_products $(date +%T)"
timeout 150 python3 bench/microbench/split_products.py --archs min_gru,mamba,jamba,gated_ssm,min_lstm --rounds 2 --steps 300 \
  --out $OUT/g15/split.json 2>&1 | grep -v Warn | tee $OUT/g15/split.log
for m in 8 4; do
  timeout 40 python3 bench/microbench/split_products.py --archs min_gru --max-slices $m --rounds 1 --steps 100 --no-resident \
    --tactics stepkernel-384-threads-split 2>&1 | grep -v Warn | tee -a $OUT/g15/slices.log
done
echo "== GPU tests $(date +%T)"
timeout 100 python3 -m pytest -v -m gpu -k "split or driver_replay" tests/gpu/test_stepkernel.py \
  tests/gpu/test_session.py::test_driver_replay_matches_torch_replay -p no:cacheprovider > $OUT/g15/tests.log 2>&1
echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g15/tests.log | sed 's/.*:://'; tail -2 $OUT/g15/tests.log
for tool in memcheck racecheck; do
  echo "== $tool: split products' small cases $(date +%T)"
  bash tests/gpu/sanitize.sh $tool $OUT/g15/san -t 50 -k split_products_small tests/gpu/test_stepkernel.py 2>&1 | tail -2
done
