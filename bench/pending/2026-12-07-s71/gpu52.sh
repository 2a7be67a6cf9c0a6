#!/usr/bin/env bash
# Session 71 (~130 s, one call; what six failed machine starts left of the session's device time):
# gpu50.sh's first part alone, codegen.RESIDENT_POLL_AHEAD against the default on four zoo archs (two near the 10 us target, two far from it),
# 2 sessions x 2 rounds each, bit for bit the launched step. gpu50.sh's sanitizers and tests with
# the setting on are not in it.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g52
timeout 125 python3 bench/microbench/resident_variants.py \
  --archs min_gru,gated_ssm,attention,mamba \
  --rounds 2 --sessions 2 --variants default,poll-ahead --out $OUT/g52/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g52/resident.log
echo "done $(date +%T)"
