#!/usr/bin/env bash
# Session 67, for the next session (~360 s, one call on an H100):
# 1. Where the levels above the transport floor go: traces (bench/stepkernel.py --trace: each
#    task's enter / ready / exit and its phases' cycles) of xlstm, attention, jamba and mamba on the
#    fewer-phases tactic. Their levels cost 1.3-1.8 us against ~0.84 us of transport alone
#    (level_cost.cu, session 67); attention's o_proj task computes the whole attention on each of its
#    128 blocks.
# 2. The resident step of the 11 zoo archs with the resident tagged twin on (the default since
#    session 67) against without it (resident-untagged), 2 rounds: issue 18's table as it now stands.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g33
echo "== traces $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs , --trace xlstm,attention,jamba,mamba --select stepkernel-fewer-phases \
  --out $OUT/g33/traces 2>&1 | grep "^trace " | tee $OUT/g33/traces.log
echo "== resident, 11 archs, twin / untagged $(date +%T)"
timeout 200 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,resident-untagged --out $OUT/g33/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g33/resident.log
echo "done $(date +%T)"
