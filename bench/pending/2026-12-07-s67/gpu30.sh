#!/usr/bin/env bash
# Session 67, one call (~480 s), after gpu29.sh:
# 1. resident Session.step, default / the resident tagged twin / 8 copies of the flagged words
#    (codegen.LL_COPIES), delta_net, gru and mamba over 6 rounds (delta_net's p99 with the twin was
#    higher in g21 and g26, lower in g23: the twin goes on by default if it is not higher here and
#    gpu29's rest of its tests passed).
# 2. the resident step on 132 / 66 / 33 SMs on today's kernels (a level's transport: 0.98 us on
#    128 blocks, 0.79 on 32 in level_cost.cu; fewer SMs last timed resident in session 31).
# 3. gpu25.sh PART=levels: the fewer-levels tactic at 384 threads against fewer-phases.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g30
echo "== resident: default / twin / 8 copies, 6 rounds $(date +%T)"
timeout 170 python3 bench/microbench/resident_variants.py --archs delta_net,gru,mamba --rounds 6 \
  --variants default,resident-tagged-outputs,ll-copies-8 --out $OUT/g30/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g30/resident.log
echo "== resident on fewer SMs $(date +%T)"
timeout 100 python3 bench/microbench/resident_variants.py --archs min_gru,mamba,xlstm --rounds 2 \
  --variants default --sms 66,33 --out $OUT/g30/sms.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g30/sms.log
PART=levels bash bench/pending/2026-12-06-s65/gpu25.sh
cp $OUT/g25/levels.* $OUT/g30/ 2>/dev/null
echo "done $(date +%T)"
