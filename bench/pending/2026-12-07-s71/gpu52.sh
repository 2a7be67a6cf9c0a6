#!/usr/bin/env bash
# Session 71 (~130 s, one call; what six failed machine starts left of the session's device time):
# 1) codegen.RESIDENT_POLL_AHEAD against the default on three zoo archs (two near the 10 us target,
#    one far from it), 2 sessions x 2 rounds each, bit for bit the launched step (gpu50.sh's first
#    part, cut down); 2) the frame blocks' reads a frame (codegen.RESIDENT_POLL_COUNTS,
#    resident_spread.py --reads) over min_gru's launches: is a slow launch's frame one read later?
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g52
timeout 75 python3 bench/microbench/resident_variants.py --archs min_gru,gated_ssm,mamba \
  --rounds 2 --sessions 2 --variants default,poll-ahead --out $OUT/g52/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g52/resident.log
timeout 50 python3 bench/microbench/resident_spread.py --archs min_gru --sessions 3 --launches 3 --reads \
  --out $OUT/g52/reads.json 2>&1 | grep -v -e Warn -e "session = Session" | cut -c1-200 | tee $OUT/g52/reads.log
echo "done $(date +%T)"
