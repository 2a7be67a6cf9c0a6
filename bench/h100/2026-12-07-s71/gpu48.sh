#!/usr/bin/env bash
# Session 71 (~400 s, one call on an H100, right after gpu47.sh on the warm machine): which launches
# run ~1.1 us faster (g44, g45): resident_spread.py, 4 sessions x 6 launches of min_gru and
# gated_ssm, each launch with the SM of every block (ResidentStepBinding.block_sms); then
# gpu46.sh's backoff on attention and mamba (gpu47.sh ran xlstm's).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g48
timeout 200 python3 bench/microbench/resident_spread.py --archs min_gru,gated_ssm --sessions 4 --launches 6 \
  --out $OUT/g48/spread.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g48/spread.log
timeout 200 python3 bench/microbench/resident_variants.py --archs attention,mamba --rounds 2 --sessions 2 \
  --variants default,backoff-64,backoff-256 --out $OUT/g48/backoff.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g48/backoff.log
echo "done $(date +%T)"
