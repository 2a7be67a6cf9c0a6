#!/usr/bin/env bash
# Session 67, one call (~470 s), after gpu29.sh:
# 1. the resident tagged twin's 8 test_resident.py cases left (gpu25.sh PART=rest): with gpu29's
#    timing below (delta_net's p99), whether it goes on by default.
# 1b. resident Session.step, default / the twin / 8 copies of the flagged words, delta_net, gru, mamba.
# 2. the resident step on 132 / 66 / 33 SMs on today's kernels (a level's transport: 0.98 us on
#    128 blocks, 0.79 on 32 in level_cost.cu; fewer SMs last timed resident in session 31).
# 3. gpu25.sh PART=levels: the fewer-levels tactic at 384 threads against fewer-phases.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g30
echo "== the resident tagged twin: the rest of its tests $(date +%T)"
FRAMEFUSE_RESIDENT_TAGGED_OUTPUTS=1 timeout 150 python3 -m pytest -q -m gpu -rA -p no:cacheprovider tests/gpu/test_resident.py \
  -k "gpu_work_beside or needs_the_step_kernel or on_fewer_sms_matches or created_and_dropped" > $OUT/g30/twin-rest.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "(PASSED|FAILED|ERROR) " $OUT/g30/twin-rest.log | sed 's/.*:://' | cut -c1-150; tail -n 1 $OUT/g30/twin-rest.log
echo "== resident: default / twin / 8 copies, 4 rounds $(date +%T)"
timeout 130 python3 bench/microbench/resident_variants.py --archs delta_net,gru,mamba --rounds 4 \
  --variants default,resident-tagged-outputs,ll-copies-8 --out $OUT/g30/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g30/resident.log
echo "== resident on fewer SMs $(date +%T)"
timeout 100 python3 bench/microbench/resident_variants.py --archs min_gru,mamba,xlstm --rounds 2 \
  --variants default --sms 66,33 --out $OUT/g30/sms.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g30/sms.log
PART=levels bash bench/pending/2026-12-06-s65/gpu25.sh
cp $OUT/g25/levels.* $OUT/g30/ 2>/dev/null
echo "done $(date +%T)"
