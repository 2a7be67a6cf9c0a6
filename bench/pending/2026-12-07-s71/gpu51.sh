#!/usr/bin/env bash
# Session 71 (~200 s, one call; what four failed machine starts left of the session's device time):
# gpu50.sh's first part alone, codegen.RESIDENT_POLL_AHEAD against the default on all 11 zoo archs,
# 2 sessions x 2 rounds each, bit for bit the launched step. gpu50.sh's sanitizers and tests with
# the setting on are not in it.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g51
timeout 200 python3 bench/microbench/resident_variants.py \
  --archs min_gru,gated_ssm,gru,lstm,min_lstm,attention,mamba,xlstm,liquid,jamba,delta_net \
  --rounds 2 --sessions 2 --variants default,poll-ahead --out $OUT/g51/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g51/resident.log
echo "done $(date +%T)"
