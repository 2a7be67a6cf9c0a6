#!/usr/bin/env bash
# Session 67, one call (~400 s):
# 1. bench/microbench/l2_sides.cu: whether an L2 hit's latency depends on which SM reads which line.
# 2. level_cost.cu with the level's words in R copies (block b polls copy b % R: R times fewer
#    blocks poll each line).
# 3. codegen.EARLY_FRAME_WORDS as it is now (the build's tactic stepkernel-fewer-phases-early-frame):
#    its GPU tests (10) and compute-sanitizer memcheck and racecheck of its 4 small cases (never
#    run: session 66's -k selected nothing).
# 4. codegen.LL_COPIES in the generated kernels: its GPU tests (10, beside 3's) and device time of
#    fewer-phases with 4 / 8 / 16 copies.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g29
echo "== l2_sides $(date +%T)"
(cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/l2_sides l2_sides.cu) && timeout 60 /tmp/l2_sides $OUT/g29/l2_sides.bin | tee $OUT/g29/l2_sides.log
echo "== level_cost (with the level's words in R copies) $(date +%T)"
(cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/level_cost level_cost.cu) && timeout 90 /tmp/level_cost | tee $OUT/g29/level_cost.log
echo "== early-frame tests and sanitizers $(date +%T)"
bash tests/gpu/sanitize.sh memcheck $OUT/g29 -t 200 -k "early_frame and small" tests/gpu/test_stepkernel.py > $OUT/g29/memcheck.txt 2>&1 &
m=$!
bash tests/gpu/sanitize.sh racecheck $OUT/g29 -t 200 -k "early_frame and small" tests/gpu/test_stepkernel.py > $OUT/g29/racecheck.txt 2>&1 &
r=$!
timeout 170 python3 -m pytest -q -m gpu -rA -p no:cacheprovider -k "early_frame or ll_copies" tests/gpu/test_stepkernel.py > $OUT/g29/early-tests.log 2>&1
echo "tests rc=$? $(date +%T)"; tail -n 1 $OUT/g29/early-tests.log
wait $m $r
cat $OUT/g29/memcheck.txt $OUT/g29/racecheck.txt
echo "== flagged-word copies, device time $(date +%T)"
timeout 130 python3 bench/microbench/stepkernel_variants.py --archs min_gru,mamba,attention \
  --variants fewer-phases-tactic,fewer-phases-tactic+ll-copies-4,fewer-phases-tactic+ll-copies-8,fewer-phases-tactic+ll-copies-16,fewer-phases-tactic \
  --out $OUT/g29/copies.json 2>&1 | grep -v Warn | tee $OUT/g29/copies.log
echo "done $(date +%T)"
