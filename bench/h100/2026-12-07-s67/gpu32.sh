#!/usr/bin/env bash
# Session 67 (~210 s): the resident step on 132 / 66 / 33 SMs on today's kernels (g29's
# level_cost: 0.84 us a level on 128 blocks, 0.77 on 64 and 32), then the fewer-levels tactic at
# 384 threads against fewer-phases on mamba (gpu25.sh PART=levels, one arch).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g32
echo "== resident on fewer SMs $(date +%T)"
timeout 100 python3 bench/microbench/resident_variants.py --archs min_gru,mamba,xlstm --rounds 2 \
  --variants default --sms 66,33 --out $OUT/g32/sms.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g32/sms.log
echo "== fewer levels at 384 threads, mamba $(date +%T)"
timeout 90 python3 bench/microbench/stepkernel_variants.py --archs mamba \
  --variants 384-threads-fewer-phases,fewer-levels-tactic,384-threads-fewer-levels,384-threads-fewer-phases \
  --out $OUT/g32/levels.json 2>&1 | grep -v Warn | tee $OUT/g32/levels.log
echo "done $(date +%T)"
